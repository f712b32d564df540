"""What any stunnerd process needs of its runtime: the event loop, its CPU and memory use.

The primary (`cli`) and every UDP worker process (`worker`) use these; this module imports
nothing of ours, so neither has to import the other.
"""

from __future__ import annotations

import asyncio
import os
import resource
from collections.abc import Callable


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed (the packet path runs in its C event loop), else asyncio's
    own; STUNNER_EVENT_LOOP=asyncio forces the latter."""
    if os.environ.get("STUNNER_EVENT_LOOP", "").lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def cpu_seconds() -> float:
    """User and system CPU time of this process."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_bytes() -> int:
    """Resident memory of this process now (its peak where /proc is missing)."""
    try:
        with open(f"/proc/{os.getpid()}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
