"""Cluster-wide user quotas on the CDS: the pure board (reconciler.cds.quota) and the real
server (reconciler.cds.server, reconciler.cds.usage) spoken to by real WebSocket clients, where
the CDS checks no tokens (local mode): every watcher reports for itself. Who may report where
tokens are checked: tests/reconciler/test_cds_quota_attacks.py.

We test the board: each reporter is told the sum of the OTHER reporters' counts of its config,
per user, only when that changes and only when flushed; another config's reports do not mix in;
a config without a quota takes no report and forgets its reports when it loses it; each count is
clamped to the quota, so no sum passes it (issue 28 #2); a reporter's later watcher takes its
slot over (one report per pod); the cut to 1,024 users keeps the users the receiving pod holds
(issue 28 #2); its running totals equal a sum from scratch after random reports. Over real
sockets: two reporting watchers of one config get each other's counts, a third that sends
nothing gets its config and no usage frame, a watcher closing drops its counts; reports fan out
once per report interval, not once per report (issue 28 #1); sums stunnerd refused and a cut
that lost the pod's own users do not happen over the wire either; a report on a config without
a quota counts nothing, one before the config is published counts once it is with a quota; a
malformed report, a binary frame, and a report on a watch of every
config are closed with 1008 and the reason; a report flood is closed with 1008 while the budget
covers a reporter at its bound.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import aiohttp
import pytest

from reconciler.cds.quota import NO_OTHERS, UsageBoard, others_of
from reconciler.cds.server import HANDLERS_KEY, WATCH_BUDGET
from reconciler.cds.store import ConfigStore
from reconciler.cds.usage import NO_QUOTA
from stunner_api.cds import (
    MAX_USAGE_COUNT,
    MAX_USAGE_USERS,
    PING_PERIOD,
    REPORT_INTERVAL,
    USAGE_OTHERS_KEY,
    USAGE_REPORT_KEY,
    encode_usage,
    parse_usage,
    usage_key,
)
from stunner_api.dataplane import StunnerConfig, validate_config
from tests.reconciler.test_cds import STEP, eventually, make_config, run
from tests.reconciler.test_cds_hostile import ID, WATCH, cds, close_code, frame, upgraded


def quota_config(id: str, quota: int, realm: str = "v0") -> StunnerConfig:
    data = json.loads(make_config(id, realm=realm).to_json())
    data["admin"]["user_quota"] = quota
    return validate_config(data)


def others(counts: dict[str, int], held: dict[str, int] | None = None) -> str:
    """The frame a reporter holding `held` is sent."""
    return encode_usage(USAGE_OTHERS_KEY, counts, first=held or {})[0]


def test_others_is_the_sum_of_every_other_report() -> None:
    reports = {"a": {"u1": 1, "u2": 2}, "b": {"u1": 3}, "c": {"u2": 1, "u3": 4}}
    assert others_of(reports, "a") == {"u1": 3, "u2": 1, "u3": 4}
    assert others_of(reports, "b") == {"u1": 1, "u2": 3, "u3": 4}
    assert others_of(reports, "d") == {"u1": 4, "u2": 3, "u3": 4}
    assert others_of({"a": {"u1": 1}}, "a") == {}


def test_the_board_tells_each_reporter_its_others_when_flushed_and_changed() -> None:
    board: UsageBoard[str, str] = UsageBoard()
    assert board.report(ID, "a", "wa", {"u": 1}) is False  # no quota: nothing recorded
    board.set_quota(ID, 5)
    assert board.report(ID, "a", "wa", {"u": 1}) is True
    assert board.flush(ID) == []  # alone: its others are still {}
    board.report(ID, "b", "wb", {"u": 1})
    assert ID in board.dirty
    assert board.flush(ID) == [("wa", others({"u": 1}, {"u": 1}))] * 1 + [
        ("wb", others({"u": 1}, {"u": 1}))
    ]
    board.report(ID, "b", "wb", {"u": 1})
    assert ID not in board.dirty and board.flush(ID) == []  # nothing changed: nobody is told
    board.set_quota("ns/other", 5)
    board.report("ns/other", "x", "wx", {"u": 5})  # another config does not mix in
    assert board.flush(ID) == []
    board.report(ID, "a", "wa", {"u": 2, "v": 1})
    board.report(ID, "a", "wa", {"u": 3, "v": 1})  # two reports, one flush: the latest
    assert board.flush(ID) == [("wb", others({"u": 3, "v": 1}, {"u": 1}))]
    assert board.total(ID) == {"u": 4, "v": 1}
    board.drop("wa")  # gone: its counts no longer count
    assert board.flush(ID) == [("wb", NO_OTHERS)]
    board.drop("wa")
    board.drop("never-reported")
    assert board.reporters(ID) == 1 and "wa" not in board and "wb" in board
    with pytest.raises(ValueError, match="reported for ns/other"):
        board.report("ns/other", "b", "wb", {})
    board.set_quota(ID, 0)  # the config lost its quota: its reports are forgotten
    assert board.reporters(ID) == 0 and board.flush(ID) == []
    assert board.report(ID, "b", "wb", {"u": 1}) is False


def test_counts_are_clamped_to_the_quota_so_no_sum_passes_it() -> None:
    board: UsageBoard[str, str] = UsageBoard()
    board.set_quota(ID, 2)
    board.report(ID, "a", "wa", {"user-1": 1})
    board.report(ID, "z1", "wz1", {"zz": MAX_USAGE_COUNT, "user-1": 5})
    board.report(ID, "z2", "wz2", {"zz": MAX_USAGE_COUNT})
    told = dict(board.flush(ID))
    # Each frame is one stunnerd takes (no count past MAX_USAGE_COUNT), and no count passes
    # the quota: at the quota a user is refused, whatever more the others hold.
    assert parse_usage(told["wa"], USAGE_OTHERS_KEY) == {"user-1": 2, "zz": 2}
    assert parse_usage(told["wz2"], USAGE_OTHERS_KEY) == {"user-1": 2, "zz": 2}
    assert board.total(ID) == {"user-1": 3, "zz": 4}  # each pod's count up to the quota
    board.set_quota(ID, 3)  # a higher quota counts more of each report
    told = dict(board.flush(ID))
    assert parse_usage(told["wa"], USAGE_OTHERS_KEY) == {"user-1": 3, "zz": 3}
    assert board.total(ID) == {"user-1": 4, "zz": 6}
    board.set_quota(ID, 1 << 40)  # a quota past what a frame holds: the sums stay within it
    told = dict(board.flush(ID))
    assert parse_usage(told["wa"], USAGE_OTHERS_KEY) == {"user-1": 5, "zz": MAX_USAGE_COUNT}


def test_a_reporter_counts_once_its_latest_watcher_holds_its_slot() -> None:
    board: UsageBoard[str, str] = UsageBoard()
    board.set_quota(ID, 5)
    board.report(ID, "pod", "old", {"u": 1})
    board.report(ID, "b", "wb", {"v": 1})
    assert dict(board.flush(ID)) == {"old": others({"v": 1}), "wb": others({"u": 1})}
    board.report(ID, "pod", "new", {"u": 1})  # the pod reconnected: still one report
    assert board.total(ID) == {"u": 1, "v": 1}
    assert board.flush(ID) == [("new", others({"v": 1}))]  # the new connection is told anew
    board.drop("old")  # the old connection noticed gone: the pod still counts
    assert board.total(ID) == {"u": 1, "v": 1} and "old" not in board and "new" in board
    board.remove("pod")  # the pod is gone
    assert board.total(ID) == {"v": 1}
    assert board.flush(ID) == [("wb", NO_OTHERS)]


def test_the_cut_to_the_user_bound_keeps_the_users_the_pod_holds() -> None:
    board: UsageBoard[str, str] = UsageBoard()
    board.set_quota(ID, 2)
    board.report(ID, "a", "wa", {"user-1": 1})
    board.report(ID, "b", "wb", {"user-1": 1})
    for z in range(2):  # 1,200 made-up users at the largest count, from two reporters
        board.report(
            ID, f"z{z}", f"wz{z}", {f"made-up-{z}-{i:03d}": MAX_USAGE_COUNT for i in range(600)}
        )
    told = {w: parse_usage(text, USAGE_OTHERS_KEY) for w, text in board.flush(ID)}
    for pod in ("wa", "wb"):
        assert 0 < len(told[pod]) < 1201  # cut to the bounds (users, bytes) ...
        assert told[pod]["user-1"] == 1  # ... the user it holds first
    assert "user-1" in told["wz0"]  # another pod's: its count is 2 (the quota) like the rest


def test_the_running_totals_and_the_frames_are_those_made_from_scratch() -> None:
    rng = random.Random(28)
    board: UsageBoard[str, str] = UsageBoard()
    quota = 3
    board.set_quota(ID, quota)
    reports: dict[str, dict[str, int]] = {}
    told: dict[str, str] = {}
    for _ in range(500):
        reporter = f"p{rng.randrange(6)}"
        if rng.random() < 0.1:
            board.remove(reporter)
            reports.pop(reporter, None)
            told.pop(f"w{reporter}", None)
        else:
            counts = {f"u{rng.randrange(8)}": rng.randrange(6) for _ in range(rng.randrange(5))}
            board.report(ID, reporter, f"w{reporter}", counts)
            reports[reporter] = {u: n for u, n in counts.items() if n > 0}
        told.update(board.flush(ID))
    clamped = {r: {u: min(n, quota) for u, n in c.items()} for r, c in reports.items()}
    assert board.total(ID) == others_of(clamped, None)
    for reporter in reports:
        want = {u: min(n, quota) for u, n in others_of(clamped, reporter).items()}
        assert told.get(f"w{reporter}", NO_OTHERS) == others(want, reports[reporter])


def test_frames_are_bounded_and_parsed_strictly() -> None:
    text, omitted = encode_usage(USAGE_REPORT_KEY, {"a": 1, "b": 3, "zero": 0})
    assert (text, omitted) == ('{"quotaUsageReport":{"b":3,"a":1}}', 0)
    assert usage_key(text) == USAGE_REPORT_KEY and usage_key(" " + text) == USAGE_REPORT_KEY
    assert usage_key(make_config(ID).to_json()) is None
    assert parse_usage(text, USAGE_REPORT_KEY) == {"b": 3, "a": 1}
    assert encode_usage(USAGE_REPORT_KEY, {"a": 1, "b": 3}, first={"a"})[0] == (
        '{"quotaUsageReport":{"a":1,"b":3}}'
    )
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
        ('{"quotaUsageReport":{"u":2147483648}}', "positive integer"),
        ('{"quotaUsageReport":{},"x":1}', "is not"),
        ('{"quotaUsageOthers":{}}', "is not"),
        ("{", "not JSON"),
        ('{"quotaUsageReport":{"u":1}}' + " " * 20000, "bytes"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_usage(bad, USAGE_REPORT_KEY)
    assert parse_usage('{"quotaUsageReport":{"u":2147483647}}', USAGE_REPORT_KEY) == {
        "u": MAX_USAGE_COUNT
    }


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
            store.set(ID, quota_config(ID, 5))
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
                store.set(ID, quota_config(ID, 5, realm="v1"))
                # The silent watcher (Go's stunnerd) got its configs and nothing else.
                assert "v1" in await silent.receive_str(timeout=STEP)
                with pytest.raises(asyncio.TimeoutError):
                    await silent.receive_str(timeout=0.3)
                await b.close()
                assert await _next_usage(a) == {}  # b went away: its counts no longer count
                assert store.usage.reporters(ID) == 1

    run(main)


def test_reports_fan_out_once_per_interval_not_once_per_report() -> None:
    """Issue 28 #1: every report was summed again and sent to every other reporter, so R
    reporters reporting, one after another as they do (here: each report handled before the
    next is sent), made R x R frames. Now each reporter is told at most once per interval
    (and at once after a quiet spell), however many reports arrive meanwhile, and still hears
    the final sums."""
    reporters, rounds = 12, 6  # two frames a round: within the budget's burst (16)

    async def main() -> None:
        async with cds() as (store, served, _app):
            store.set(ID, quota_config(ID, 1000))
            url = served.address.replace("http://", "ws://") + WATCH
            received = [0] * reporters
            last: list[dict[str, int]] = [{} for _ in range(reporters)]
            handled = [asyncio.Event() for _ in range(reporters)]
            async with aiohttp.ClientSession() as session:
                sockets = [await session.ws_connect(url, autoping=False) for _ in range(reporters)]

                async def read(i: int) -> None:
                    async for message in sockets[i]:
                        if message.type == aiohttp.WSMsgType.PONG:
                            handled[i].set()
                        elif message.type == aiohttp.WSMsgType.PING:
                            await sockets[i].pong(message.data)
                        elif usage_key(message.data) == USAGE_OTHERS_KEY:
                            received[i] += 1
                            last[i] = parse_usage(message.data, USAGE_OTHERS_KEY)

                readers = [asyncio.create_task(read(i)) for i in range(reporters)]
                start = time.monotonic()
                for round in range(1, rounds + 1):  # every report changes the sums
                    for i, ws in enumerate(sockets):
                        handled[i].clear()
                        await ws.send_str(_report({f"user-{i}": round}))
                        await ws.ping()  # answered once the report before it is handled
                        await asyncio.wait_for(handled[i].wait(), STEP)
                final = {f"user-{i}": rounds for i in range(reporters)}
                assert store.usage.total(ID) == final
                await eventually(
                    lambda: all(
                        last[i] == {u: n for u, n in final.items() if u != f"user-{i}"}
                        for i in range(reporters)
                    ),
                    "the final sums told",
                )
                elapsed = time.monotonic() - start
                for task in readers:
                    task.cancel()
                for ws in sockets:
                    await ws.close()
            flushes = elapsed / REPORT_INTERVAL + 2  # at once, then at most once an interval
            assert sum(received) <= reporters * flushes, (received, elapsed)

    run(main)


def test_no_sum_over_the_wire_passes_what_stunnerd_takes() -> None:
    """Issue 28 #2: two reports of 2^31-1 summed to a count stunnerd refuses (it kept its old
    sums). Counts are clamped to the quota: every frame sent parses."""

    async def main() -> None:
        async with cds() as (store, served, _app):
            store.set(ID, quota_config(ID, 2))
            url = served.address.replace("http://", "ws://") + WATCH
            async with aiohttp.ClientSession() as session:
                pod, z1, z2 = [await session.ws_connect(url) for _ in range(3)]
                await pod.send_str(_report({"user-1": 1}))
                for z in (z1, z2):
                    await z.send_str(_report({"zz": MAX_USAGE_COUNT}))
                await eventually(lambda: store.usage.reporters(ID) == 3, "three reporters")
                while True:
                    text = await pod.receive_str(timeout=STEP)
                    if usage_key(text) != USAGE_OTHERS_KEY:
                        continue
                    counts = parse_usage(text, USAGE_OTHERS_KEY)  # what stunnerd does
                    if "zz" in counts and counts["zz"] >= 2:
                        break
                assert counts == {"zz": 2}  # at the quota: refused there, and no more

    run(main)


def test_the_cut_over_the_wire_keeps_the_users_the_pod_holds() -> None:
    """Issue 28 #2: 1,200 made-up users at 2^31-1 pushed user-1 out of the 1,024-user cut, and
    the pod holding it admitted it as if no other pod did."""

    async def main() -> None:
        async with cds() as (store, served, _app):
            store.set(ID, quota_config(ID, 2))
            url = served.address.replace("http://", "ws://") + WATCH
            async with aiohttp.ClientSession() as session:
                a, b, z1, z2 = [await session.ws_connect(url) for _ in range(4)]
                await a.send_str(_report({"user-1": 1}))
                await b.send_str(_report({"user-1": 1}))
                for n, z in enumerate((z1, z2)):
                    made_up = {f"made-up-{n}-{i:03d}": MAX_USAGE_COUNT for i in range(600)}
                    await z.send_str(_report(made_up))
                await eventually(lambda: store.usage.reporters(ID) == 4, "four reporters")
                while True:
                    counts = await _next_usage(a)
                    if len(counts) > MAX_USAGE_USERS // 2:  # the made-up users are in
                        break
                assert counts.get("user-1") == 1

    run(main)


def test_a_report_on_a_config_without_a_quota_counts_nothing() -> None:
    async def main() -> None:
        async with cds() as (store, served, _app):
            store.set(ID, make_config(ID, realm="v0"))
            url = served.address.replace("http://", "ws://") + WATCH
            async with (
                aiohttp.ClientSession() as session,
                session.ws_connect(url) as a,
                session.ws_connect(url) as b,
            ):
                for ws in (a, b):
                    assert "v0" in await ws.receive_str(timeout=STEP)
                await a.send_str(_report({}))  # stunnerd's last report: quietly taken
                await a.send_str(_report({"alice": 1}))
                await b.send_str(_report({"alice": 1}))
                await eventually(lambda: store.usage.refused[NO_QUOTA] == 2, "refused")
                assert store.usage.reporters(ID) == 0
                # The quota comes: the same watchers' reports count from then on.
                store.set(ID, quota_config(ID, 2, realm="v1"))
                await a.send_str(_report({"alice": 1}))
                await b.send_str(_report({"alice": 1}))
                assert await _next_usage(a) == {"alice": 1}
                # ... and go: forgotten, and nothing more is sent.
                store.set(ID, quota_config(ID, 0, realm="v2"))
                assert store.usage.reporters(ID) == 0 and store.usage.total(ID) == {}

    run(main)


def test_a_report_before_the_config_is_published_counts_once_it_is() -> None:
    """A restarted reconciler hears the pods' tables (sent again only when they change) before
    its first render: they are held, and count once the config comes with a quota."""

    async def main() -> None:
        async with cds() as (store, served, _app):
            url = served.address.replace("http://", "ws://") + WATCH
            async with (
                aiohttp.ClientSession() as session,
                session.ws_connect(url) as a,
                session.ws_connect(url) as b,
            ):
                await a.send_str(_report({"alice": 1}))
                await b.send_str(_report({"bob": 1}))
                await eventually(lambda: store.usage.held == 2, "held")
                assert store.usage.total(ID) == {}
                store.set(ID, quota_config(ID, 2))
                assert store.usage.total(ID) == {"alice": 1, "bob": 1}
                assert await _next_usage(a) == {"bob": 1}

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
            store.set(ID, quota_config(ID, 2))
            reader, writer = await upgraded(served, path)
            writer.write(send)
            data = b""
            while reason not in data:
                chunk = await asyncio.wait_for(reader.read(4096), STEP)
                assert chunk, data
                data += chunk
            assert store.usage.reporters(ID) == 0
            writer.close()

    run(main)


def test_a_report_flood_is_closed_with_1008() -> None:
    async def main() -> None:
        async with cds() as (store, served, app):
            store.set(ID, quota_config(ID, 2))
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
