"""Cluster-wide user quotas on the CDS: the pure board (reconciler.cds_quota) and the real
server (reconciler.cds) spoken to by real WebSocket clients.

We test: each reporting watcher is told the sum of the OTHER watchers' counts of its config,
per user, and only when that changes; another config's reports do not mix in; a watcher that
goes away drops its counts; a watcher that never reports is never told. Over real sockets: two
reporting watchers of one config get each other's counts, a third that sends nothing gets its
config and no usage frame, a watcher closing drops its counts from the others'; a malformed
report, a binary frame, and a report on a watch of every config are closed with 1008 and the
reason; a report flood is closed with 1008 while the budget covers a reporter at its bound.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from reconciler.cds import HANDLERS_KEY, WATCH_BUDGET
from reconciler.cds_quota import UsageBoard, others_of
from reconciler.cds_store import ConfigStore
from stunner_api.cds import (
    PING_PERIOD,
    REPORT_INTERVAL,
    USAGE_OTHERS_KEY,
    USAGE_REPORT_KEY,
    encode_usage,
    parse_usage,
    usage_key,
)
from tests.reconciler.test_cds import STEP, eventually, make_config, run
from tests.reconciler.test_cds_hostile import ID, WATCH, cds, close_code, frame, upgraded


def test_others_is_the_sum_of_every_other_report() -> None:
    reports = {"a": {"u1": 1, "u2": 2}, "b": {"u1": 3}, "c": {"u2": 1, "u3": 4}}
    assert others_of(reports, "a") == {"u1": 3, "u2": 1, "u3": 4}
    assert others_of(reports, "b") == {"u1": 1, "u2": 3, "u3": 4}
    assert others_of(reports, "d") == {"u1": 4, "u2": 3, "u3": 4}
    assert others_of({"a": {"u1": 1}}, "a") == {}


def test_the_board_tells_each_reporter_its_others_when_they_change() -> None:
    board: UsageBoard[str] = UsageBoard()
    assert board.report("ns/gw", "a", {"u": 1}) == []  # alone: its others are still {}
    assert board.report("ns/gw", "b", {"u": 1}) == [("a", {"u": 1}), ("b", {"u": 1})]
    assert board.report("ns/gw", "b", {"u": 1}) == []  # nothing changed: nobody is told
    assert board.report("ns/other", "x", {"u": 5}) == []  # another config does not mix in
    assert board.report("ns/gw", "a", {"u": 2, "v": 1}) == [("b", {"u": 2, "v": 1})]
    assert board.total("ns/gw") == {"u": 3, "v": 1}
    assert board.drop("a") == [("b", {})]  # gone: its counts no longer count
    assert board.drop("a") == []
    assert board.drop("never-reported") == []
    assert board.reporters("ns/gw") == 1 and "a" not in board and "b" in board
    with pytest.raises(ValueError, match="reported for ns/x"):
        board.report("ns/x", "b", {})


def test_frames_are_bounded_and_parsed_strictly() -> None:
    text, omitted = encode_usage(USAGE_REPORT_KEY, {"a": 1, "b": 3, "zero": 0})
    assert (text, omitted) == ('{"quotaUsageReport":{"b":3,"a":1}}', 0)
    assert usage_key(text) == USAGE_REPORT_KEY and usage_key(" " + text) == USAGE_REPORT_KEY
    assert usage_key(make_config(ID).to_json()) is None
    assert parse_usage(text, USAGE_REPORT_KEY) == {"b": 3, "a": 1}
    # Past the bounds, the users with the fewest allocations are left out.
    many = {f"user-{i:05d}-" + "x" * 40: 1 + i % 3 for i in range(2000)}
    text, omitted = encode_usage(USAGE_OTHERS_KEY, many)
    kept = parse_usage(text, USAGE_OTHERS_KEY)
    assert omitted == 2000 - len(kept) > 0 and min(kept.values()) >= max(
        n for u, n in many.items() if u not in kept
    )
    for bad, why in [
        ("[]", "is not"),
        ('{"quotaUsageReport":{"u":0}}', "positive integer"),
        ('{"quotaUsageReport":{"u":1.5}}', "positive integer"),
        ('{"quotaUsageReport":{"u":true}}', "positive integer"),
        ('{"quotaUsageReport":{},"x":1}', "is not"),
        ('{"quotaUsageOthers":{}}', "is not"),
        ("{", "not JSON"),
        ('{"quotaUsageReport":{"u":1}}' + " " * 20000, "bytes"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_usage(bad, USAGE_REPORT_KEY)


def test_the_budget_covers_a_reporter_at_its_bound() -> None:
    # Reports at most every REPORT_INTERVAL, a ping and a pong every PING_PERIOD.
    assert WATCH_BUDGET.rate >= 1 / REPORT_INTERVAL + 2 / PING_PERIOD
    assert WATCH_BUDGET.rate < 100  # a flood (thousands a second) is still closed


async def _next_usage(ws: Any) -> dict[str, int]:
    while True:
        text = await ws.receive_str(timeout=STEP)
        if usage_key(text) == USAGE_OTHERS_KEY:
            return parse_usage(text, USAGE_OTHERS_KEY)


def _report(counts: dict[str, int]) -> str:
    return encode_usage(USAGE_REPORT_KEY, counts)[0]


def test_reporting_watchers_are_told_each_others_counts_and_a_silent_one_configs_only() -> None:
    async def main() -> None:
        async with cds() as (store, served, _app):
            store.set(ID, make_config(ID, realm="v0"))
            url = served.address.replace("http://", "ws://") + WATCH
            async with (
                aiohttp.ClientSession() as session,
                session.ws_connect(url) as a,
                session.ws_connect(url) as b,
                session.ws_connect(url) as silent,
            ):
                for ws in (a, b, silent):
                    assert "v0" in await ws.receive_str(timeout=STEP)
                await a.send_str(_report({"alice": 1}))
                await b.send_str(_report({"alice": 1, "bob": 2}))
                assert await _next_usage(a) == {"alice": 1, "bob": 2}
                assert await _next_usage(b) == {"alice": 1}
                await eventually(lambda: store.usage.total(ID) == {"alice": 2, "bob": 2}, "the sum")
                store.set(ID, make_config(ID, realm="v1"))
                # The silent watcher (Go's stunnerd) got its configs and nothing else.
                assert "v1" in await silent.receive_str(timeout=STEP)
                with pytest.raises(asyncio.TimeoutError):
                    await silent.receive_str(timeout=0.3)
                await b.close()
                assert await _next_usage(a) == {}  # b went away: its counts no longer count
                assert store.usage.reporters(ID) == 1

    run(main)


@pytest.mark.parametrize(
    ("path", "send", "reason"),
    [
        (WATCH, frame(0x1, b'{"quotaUsageReport":[1]}'), b"is not"),
        (WATCH, frame(0x1, b'{"version":"v1"}'), b"is not"),
        (WATCH, frame(0x2, b"\x00\x01"), b"unexpected BINARY"),
        ("/api/v1/configs?watch=true", frame(0x1, b'{"quotaUsageReport":{}}'), b"one config"),
    ],
    ids=["not-an-object", "no-report", "binary", "watch-of-all"],  # the frames' masks are random
)
def test_a_frame_that_is_no_valid_report_is_closed_with_the_reason(
    path: str, send: bytes, reason: bytes
) -> None:
    async def main() -> None:
        async with cds() as (store, served, _app):
            reader, writer = await upgraded(served, path)
            writer.write(send)
            data = await asyncio.wait_for(reader.read(4096), STEP)
            assert reason in data, data
            assert store.usage.reporters(ID) == 0
            writer.close()

    run(main)


def test_a_report_flood_is_closed_with_1008() -> None:
    async def main() -> None:
        async with cds() as (store, served, app):
            reader, writer = await upgraded(served)
            report = json.dumps({USAGE_REPORT_KEY: {"u": 1}}).encode()
            writer.write(frame(0x1, report) * 100)
            assert await close_code(reader) == 1008
            assert app[HANDLERS_KEY].guard.flooding == 1
            writer.close()
            await eventually(lambda: store.usage.reporters(ID) == 0, "the counts dropped")

    run(main)


def test_a_store_without_watchers_has_no_reports() -> None:
    assert ConfigStore().usage.total(ID) == {}
