"""`clusterkit.settled`, which most cluster-mode tests start from, waits for the reconciler's rest,
not for a time without writes: on a loaded machine a render, or the Lease, can take longer than
the quiet time, and a test that looked then saw a half-done reconciler (test_cluster_scale's
own-writes test rendered parts again; test_cluster_writes' Dataplane edit landed before the
first pass, so no Deployment was ever updated). Here each delay is forced, longer than `quiet`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from reconciler.kube.lease import LeaseElector
from reconciler.render import Plan, Renderer
from reconciler.store import Snapshot
from tests.reconciler import clusterkit as k
from tests.support.fakeapi import FakeApiServer

QUIET = 0.4  # settled()'s default
DELAY = 3 * QUIET  # longer than the quiet time: no test of a duration, a forced order


def test_settled_waits_for_a_render_slower_than_its_quiet_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every render after the first (the one its writes' answers trigger) is slow: settled
    returns only once none is under way. A render then renders no part again, though the slow
    one, which ran beside the first pass's status writes, stamped its conditions later than
    what was written (`render.core._members_hold`)."""
    original = Renderer.render
    lock = threading.Lock()
    counts = {"started": 0, "finished": 0}

    def slow(self: Renderer, snapshot: Snapshot, now: datetime) -> Plan:
        with lock:
            counts["started"] += 1
            first = counts["started"] == 1
        if not first:
            time.sleep(DELAY)
        try:
            return original(self, snapshot, now)
        finally:
            with lock:
                counts["finished"] += 1

    monkeypatch.setattr(Renderer, "render", slow)

    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake, quiet=QUIET)
                with lock:
                    assert counts["started"] >= 2  # the slow one ran
                    assert counts["finished"] == counts["started"], counts
                assert running.mode.idle
                # A render now finds everything it planned written and cached.
                renders = running.mode.reconciler.renders
                running.mode.reconciler.trigger()
                await running.rendered(renders + 1)
                assert running.mode.renderer.rendered_parts == 0

    asyncio.run(main())


def test_settled_waits_for_a_lease_won_later_than_its_quiet_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first render is done long before the Lease is won, and nothing is written until
    then: settled returns only once this replica leads and its first pass is written."""
    original = LeaseElector.try_acquire_or_renew
    rounds: list[float] = []

    def late(self: LeaseElector) -> bool:
        rounds.append(time.monotonic())
        if len(rounds) == 1:
            time.sleep(DELAY)
        return original(self)

    monkeypatch.setattr(LeaseElector, "try_acquire_or_renew", late)
    lease = {"lease_duration": 1.5 * DELAY, "renew_deadline": DELAY, "retry_period": 0.2}

    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path, leader_elect=True, **lease) as running:
                await k.settled(running, fake, quiet=QUIET)
                assert running.mode.leading
                assert k.get(fake, "apps/v1", "Deployment", "gw") is not None
                assert k.get(fake, "v1", "Service", "gw") is not None
                assert (k.get(fake, k.GW, "Gateway", "gw") or {}).get("status")

    asyncio.run(main())
