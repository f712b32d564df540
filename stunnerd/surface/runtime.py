"""What any stunnerd process needs of its runtime: the event loop, its CPU and memory use.

The primary (`cli`) and every UDP worker process (`worker_process`) use these; this module imports
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


def port_holders(port: int, stream: bool) -> list[str]:
    """ "PID (name)" of the processes holding a TCP (`stream`) or UDP socket bound to `port`,
    as far as /proc lets us see (processes of other users stay hidden); [] elsewhere."""
    inodes: set[str] = set()
    for table in ("tcp", "tcp6") if stream else ("udp", "udp6"):
        try:
            with open(f"/proc/net/{table}") as lines:
                next(lines, None)
                for line in lines:
                    fields = line.split()
                    if len(fields) > 9 and int(fields[1].rpartition(":")[2], 16) == port:
                        inodes.add(fields[9])
        except (OSError, ValueError):
            continue
    inodes.discard("0")
    holders = []
    targets = {f"socket:[{inode}]" for inode in inodes}
    for pid in os.listdir("/proc") if targets else []:
        if not pid.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if not any(os.readlink(f"/proc/{pid}/fd/{fd}") in targets for fd in fds):
                continue
            with open(f"/proc/{pid}/comm") as comm:
                holders.append(f"{pid} ({comm.read().strip()})")
        except OSError:
            continue
    return holders
