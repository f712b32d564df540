"""Cluster mode's probes (reconciler.health): what /healthz and /readyz answer, from the state
they are handed, with the clock passed in (no waiting)."""

from __future__ import annotations

import asyncio

from reconciler.health import Health


class State:
    """What the probes read: the cache's freshness, the first render, a standby reason."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.fresh = (True, "every watched kind fresh")
        self.rendered = True
        self.standby: str | None = None

    def health(self, loop_stall: float = 30.0) -> Health:
        return Health(
            lambda: self.fresh,
            lambda: self.rendered,
            lambda: self.standby,
            loop_stall=loop_stall,
            clock=lambda: self.now,
        )


def test_alive_until_the_event_loop_stops_turning_for_longer_than_the_stall() -> None:
    state = State()
    health = state.health(loop_stall=30.0)
    assert health.alive() == (True, "ok")
    state.now += 30.0
    assert health.alive() == (True, "ok")  # at the stall, not beyond it
    state.now += 15.0
    assert health.alive() == (False, "event loop stalled for 45 s")
    health.heartbeat = state.now  # the loop turned again
    assert health.alive() == (True, "ok")


def test_the_heartbeat_stamps_the_loops_turns() -> None:
    state = State()
    health = state.health()

    async def main() -> None:
        beat = asyncio.create_task(health.beat())
        state.now += 100.0
        while health.heartbeat != state.now:  # its first turn stamps the clock's time
            await asyncio.sleep(0)
        beat.cancel()

    asyncio.run(main())
    assert health.alive() == (True, "ok")


def test_ready_names_the_first_thing_missing() -> None:
    state = State()
    health = state.health()
    assert health.ready() == (True, "every watched kind fresh")
    state.standby = "standing by: the CDS is served by the leader only (--cds-leader-only)"
    assert health.ready() == (False, state.standby)
    state.rendered = False
    assert health.ready() == (False, "first render pending")
    state.fresh = (False, "Gateway not listed yet")
    assert health.ready() == (False, "Gateway not listed yet")


def test_liveness_does_not_depend_on_readiness() -> None:
    """A replica standing by, or waiting for its first list, is alive (the kubelet must not
    restart it for that)."""
    state = State()
    state.fresh, state.rendered, state.standby = (False, "stale"), False, "standing by"
    health = state.health()
    assert health.ready()[0] is False
    assert health.alive() == (True, "ok")
