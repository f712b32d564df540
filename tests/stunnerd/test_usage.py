"""Cluster-wide user quotas, stunnerd's pure parts: the ledger counting the other pods'
allocations, and the reporter's frames (stunnerd.process.usage). Real sockets:
tests/stunnerd/test_cluster_quota.py.

We test: an Allocate is admitted while own + others < quota, and the CDS gone (others cleared)
each pod counts its own only; every count change is signalled; the reporter sends nothing
without a quota, the whole table at once on a connection, the levels after a change, one empty
report when the quota is removed; a usage frame sets others, one it refuses (malformed, a count
past the bound) clears them and turns `shared` off until a good one (logged once), and others
are cleared on disconnect. Over real sockets with the real CDS: the reports travel on
stunnerd's CDS watch, another pod's counts arrive and count, a dropped connection clears them and
the table is sent again at once on reconnect, usage frames are never taken for configs, and
stopping the watch is not logged as the CDS being unreachable.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest

from stunner_api.cds import (
    USAGE_OTHERS_KEY,
    USAGE_REPORT_KEY,
    config_path,
    encode_usage,
    parse_usage,
)
from stunnerd.process.sources import CdsSource
from stunnerd.process.usage import UsageReporter
from stunnerd.turn.ledger import GRANTED, OVER_QUOTA, LocalQuota
from tests.cds_server import run_cds_server
from tests.reconciler.test_cds import eventually
from tests.support.turnclient import HOST, free_port, make_config

ID = "testns/gw"


def test_the_other_pods_allocations_count_toward_the_quota() -> None:
    quota = LocalQuota()
    changes: list[dict[str, int]] = []
    quota.on_change = lambda: changes.append(dict(quota.counts))
    quota.others = {"alice": 1}
    assert quota.try_acquire("alice", 2) == GRANTED
    assert quota.try_acquire("alice", 2) == OVER_QUOTA  # 1 here + 1 on another pod
    assert quota.try_acquire("bob", 2) == GRANTED  # others are per user
    assert quota.try_acquire("alice", 0) == GRANTED  # no quota: no limit
    quota.others = {}  # the CDS is unreachable: this pod's own count only
    assert quota.try_acquire("alice", 3) == GRANTED
    assert quota.try_acquire("alice", 3) == OVER_QUOTA
    quota.release("alice")
    assert changes[-1] == {"alice": 2, "bob": 1}
    assert len(changes) == 5  # every grant and release, no refusal


def _others(counts: dict[str, int]) -> str:
    return encode_usage(USAGE_OTHERS_KEY, counts)[0]


def test_the_reporter_sends_levels_only_with_a_quota() -> None:
    async def main() -> None:
        quota = LocalQuota()
        reporter = UsageReporter(quota, interval=0.0)
        quota.try_acquire("alice", 0)
        frames = reporter.frames()
        with pytest.raises(TimeoutError):  # no quota configured: nothing is sent
            await asyncio.wait_for(anext(frames), 0.1)
        frames = reporter.frames()
        reporter.set_enabled(True)
        first = parse_usage(await anext(frames), USAGE_REPORT_KEY)
        assert first == {"alice": 1}  # the whole table at once
        quota.try_acquire("bob", 0)
        quota.try_acquire("bob", 0)
        quota.release("alice")
        assert parse_usage(await anext(frames), USAGE_REPORT_KEY) == {"bob": 2}
        reporter.received(_others({"bob": 1}))
        assert quota.others == {"bob": 1}
        reporter.set_enabled(False)  # the quota was removed: one empty report, others gone
        assert parse_usage(await anext(frames), USAGE_REPORT_KEY) == {}
        assert quota.others == {}
        reporter.received(_others({"bob": 1}))
        assert quota.others == {}  # not counted without a quota
        # A new connection sends the table again at once (here: the empty one, once).
        reporter.set_enabled(True)
        assert parse_usage(await anext(reporter.frames()), USAGE_REPORT_KEY) == {"bob": 2}

    asyncio.run(main())


def test_a_refused_frame_makes_the_pod_count_alone_and_a_disconnect_clears_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 28 #2: a sum past what a frame may hold (two reports of 2^31-1 summed) was refused
    and the old others kept, so a user stayed refused after the reports were gone. A refused
    frame now clears others (the pod counts its own only) and says so, until a good frame."""

    async def main() -> None:
        quota = LocalQuota()
        reporter = UsageReporter(quota, interval=0.0)
        reporter.set_enabled(True)
        await anext(reporter.frames())  # connected
        reporter.received(_others({"alice": 2}))
        assert quota.others == {"alice": 2} and reporter.shared is True
        for refused in ('{"quotaUsageOthers":{"alice":-1}}', _others({"alice": 2**32 - 2})):
            reporter.received(refused)
            assert quota.others == {} and reporter.shared is False
            assert quota.try_acquire("alice", 2) == GRANTED  # its own count only
            quota.release("alice")
        reporter.received(_others({"alice": 1}))  # a frame it takes: shared again
        assert quota.others == {"alice": 1} and reporter.shared is True
        reporter.disconnected()
        assert quota.others == {} and reporter.shared is False
        reporter.disconnected()  # each failed retry: logged once, above

    asyncio.run(main())
    messages = [r.getMessage() for r in caplog.records]
    refusals = [m for m in messages if "refused a usage frame from the CDS" in m]
    assert len(refusals) == 1 and "positive integer" in refusals[0]  # once, not per frame
    assert sum("the CDS is unreachable" in m for m in messages) == 1


def test_reports_travel_on_the_cds_watch_and_again_after_a_reconnect(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Over real sockets: stunnerd's CdsSource with the reporter, against the real CDS."""

    async def main() -> None:
        async with run_cds_server() as cds:
            cds.set_config(ID, make_config(free_port(), [f"{HOST}/32"], user_quota=2))
            quota = LocalQuota()
            reporter = UsageReporter(quota, interval=0.0)
            reporter.set_enabled(True)
            assert quota.try_acquire("alice", 2) == GRANTED
            source = CdsSource(cds.address, "testns", "gw", retry_period=0.1)
            source.reporter = reporter
            configs: list[object] = []

            async def consume() -> None:
                async for config in source.watch():
                    configs.append(config)

            task = asyncio.create_task(consume())
            await eventually(lambda: cds.store.usage.total(ID) == {"alice": 1}, "the report")
            # Another pod reports: this one is told, and counts it.
            url = cds.address.replace("http://", "ws://") + config_path("testns", "gw")
            async with aiohttp.ClientSession() as session:
                other = await session.ws_connect(url + "?watch=true")
                await other.send_str(encode_usage(USAGE_REPORT_KEY, {"alice": 1})[0])
                await eventually(lambda: quota.others == {"alice": 1}, "the others")
                assert reporter.shared is True
                assert quota.try_acquire("alice", 2) == OVER_QUOTA
                await other.close()
            await eventually(lambda: quota.others == {}, "the other pod gone")
            # The CDS drops every connection: the pod counts its own, then reconnects and
            # sends its table again at once.
            sent = reporter.reports_sent
            await cds.disconnect_all()
            await eventually(lambda: reporter.reports_sent > sent, "a report after reconnect")
            await eventually(lambda: cds.store.usage.total(ID) == {"alice": 1}, "re-reported")
            assert len(configs) == 1  # usage frames are never taken for configs
            warned = _unreachable(caplog)
            assert warned == 1
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert _unreachable(caplog) == warned  # stopping the watch is no disconnection

    asyncio.run(main())


def _unreachable(caplog: pytest.LogCaptureFixture) -> int:
    return sum("the CDS is unreachable" in r.getMessage() for r in caplog.records)
