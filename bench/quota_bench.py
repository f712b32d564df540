"""Cluster-wide user quotas: how wide the window is, and what a report costs the CDS.

    .venv/bin/python bench/quota_bench.py [--trials 40] [--pods 10] [--users 1000]

1. The window (README "Cluster-wide user quotas", "What holds"): the real CDS server
   (reconciler.cds.server) on 127.0.0.1 and two stunnerd config sources
   (stunnerd.process.sources.CdsSource)
   with their reporters (stunnerd.process.usage) over real WebSockets; the time from an allocation
   counted on pod A to pod B counting it among its others. "idle": the change comes after a
   quiet period (sent at once); "busy": right after the previous change (the report waits for
   REPORT_INTERVAL).
2. The CDS's work (reconciler.cds.quota.UsageBoard): per report (`report`, what the event loop
   does for each report frame besides parsing it: the running totals, O(the report)), and per
   flush (`flush`, at most once per REPORT_INTERVAL a config: every reporter's others), for
   `--pods` reporting pods of one Gateway, each with `--users` users.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import timeit

from reconciler.cds.quota import UsageBoard
from reconciler.cds.server import cds_app, serve
from reconciler.cds.store import ConfigStore
from stunner_api.cds import REPORT_INTERVAL
from stunner_api.dataplane import validate_config
from stunnerd.process.sources import CdsSource
from stunnerd.process.usage import UsageReporter
from stunnerd.turn.ledger import LocalQuota

ID = "bench/gw"


async def _pod(address: str) -> tuple[LocalQuota, UsageReporter, asyncio.Task[None]]:
    quota = LocalQuota()
    reporter = UsageReporter(quota)
    reporter.set_enabled(True)
    source = CdsSource(address, "bench", "gw", retry_period=0.1)
    source.reporter = reporter

    async def consume() -> None:
        async for _ in source.watch():
            pass

    return quota, reporter, asyncio.create_task(consume())


async def _until(predicate: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError
        await asyncio.sleep(0.0005)


async def window(trials: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"idle": [], "busy": []}
    store = ConfigStore()
    config = {
        "version": "v1",
        "admin": {"name": ID, "user_quota": 1000},
        "auth": {"type": "static", "credentials": {"username": "u", "password": "p"}},
    }
    store.set(ID, validate_config(config))
    async with serve(cds_app(store)) as served:
        (qa, _, ta), (qb, _, tb) = [await _pod(served.address) for _ in range(2)]
        await _until(lambda: store.usage.reporters(ID) == 2)
        for case, pause in (("idle", 0.5), ("busy", 0.0)):
            for _ in range(trials):
                await asyncio.sleep(pause)
                start = time.perf_counter()
                qa.try_acquire("alice", 0)
                n = qa.counts["alice"]
                await _until(lambda n=n: qb.others.get("alice", 0) == n)  # type: ignore[misc]
                out[case].append(time.perf_counter() - start)
        for task in (ta, tb):
            task.cancel()
    return out


def board_cost(pods: int, users: int) -> tuple[float, float]:
    """(seconds a report of one changed count costs, seconds a flush of every pod costs)."""
    board: UsageBoard[int, int] = UsageBoard()
    board.set_quota(ID, 1 << 20)
    counts = {f"user-{u:06d}": 1 + u % 3 for u in range(users)}
    for pod in range(pods):
        board.report(ID, pod, pod, counts)
    board.flush(ID)
    number, step = 20, [0]

    def report() -> None:
        step[0] += 1
        board.report(ID, 0, 0, dict(counts, **{"user-000000": 7 + step[0] % 2}))

    report_cost = timeit.timeit(report, number=number) / number

    def flush() -> None:
        report()
        board.flush(ID)

    return report_cost, timeit.timeit(flush, number=number) / number - report_cost


def _ms(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (
        f"median {1000 * statistics.median(ordered):.1f} ms, p99 {1000 * p99:.1f} ms, "
        f"max {1000 * ordered[-1]:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--pods", type=int, default=10)
    parser.add_argument("--users", type=int, default=1000)
    args = parser.parse_args()
    result = asyncio.run(window(args.trials))
    for case, values in result.items():
        print(f"window, {case}: {_ms(values)} ({len(values)} trials)")  # noqa: T201
    report, flush = board_cost(args.pods, args.users)
    print(  # noqa: T201
        f"CDS work, {args.pods} pods x {args.users} users: {1000 * report:.2f} ms a report, "
        f"{1000 * flush:.2f} ms a flush (at most 1 / {REPORT_INTERVAL} s)"
    )


if __name__ == "__main__":
    main()
