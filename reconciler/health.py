"""Cluster mode's liveness and readiness (/healthz, /readyz), answered from the probes' own
thread (`metrics.ServedInThread`) whatever the event loop is doing.

Alive: the event loop turned within `loop_stall` seconds (a heartbeat task stamps the time; a
wedged loop stops stamping). Ready: every watched kind listed and fresh, the first render
done, and this replica not standing by (--cds-leader-only and not the leader).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

HEARTBEAT = 1.0  # seconds between two beats of the event loop


class Health:
    """The probes' answers (see the module's docstring); each is (ok, why)."""

    def __init__(
        self,
        freshness: Callable[[], tuple[bool, str]],
        rendered: Callable[[], bool],
        standing_by: Callable[[], str | None],
        *,
        loop_stall: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.freshness = freshness  # the cache's: (fresh, why)
        self.rendered = rendered  # whether the first render is done
        self.standing_by = standing_by  # why this replica serves no CDS now, or None
        self.loop_stall = loop_stall
        self.clock = clock
        self.heartbeat = clock()  # the event loop's last turn (`beat`)

    def alive(self) -> tuple[bool, str]:
        """Whether the event loop still turns (from the probes' thread)."""
        stalled = self.clock() - self.heartbeat
        if stalled > self.loop_stall:
            return False, f"event loop stalled for {stalled:.0f} s"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        fresh, why = self.freshness()
        if not fresh:
            return False, why
        if not self.rendered():
            return False, "first render pending"
        standby = self.standing_by()
        if standby is not None:
            return False, standby
        return True, why

    async def beat(self) -> None:
        """On the event loop, for ever: stamp its turns."""
        while True:
            self.heartbeat = self.clock()
            await asyncio.sleep(min(HEARTBEAT, self.loop_stall / 4))
