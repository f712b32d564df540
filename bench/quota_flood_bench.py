"""Cluster-wide user quotas under a flood of usage reports (issue 28 #1, #2): N watchers report
every 0.3 s to a real reconciler's CDS; what that costs the reconciler and an honest watcher.

    .venv/bin/python bench/quota_flood_bench.py [--watchers 300] [--seconds 15]
        [--flood attack,pods] [--reconciler-from DIR]

The reconciler runs in its own process, in cluster mode (`python -m reconciler`, `--cds-auth`
required) against the fake API server of tests/ (in this process), with one Gateway of
`userQuota: 2` and two honest stunnerd pods: stunnerd's own CDS client and quota ledger
(stunnerd.process.sources, stunnerd.process.usage), each with the bound token of a Pod of the
Gateway; pod 1
holds one allocation of user-1. Each flood is measured for `--seconds` after the same time with
no flood (the anchor of the run), on a fresh reconciler:

- the reconciler's CPU seconds (utime + stime of its process), per 15 s;
- an honest watcher's config latency: a StaticService edit, and the time until a watcher of the
  Gateway's config (not reporting) has the config with it (fake API server watch -> render ->
  CDS), edits 0.3 s apart: p50, p99, max, and the edits it never got (within 5 s);
- the honest pods: seconds their CDS watch was down, and pod 2's others at the end (honest:
  `{'user-1': 1}`);
- the reconciler's log lines about watchers (issue 28 #9: one line per watcher is a flood too).

Floods (N watchers in a child process, each reporting every 0.3 s a user of its own, its count
going 1, 2, 1, ...: every report changes the sums, none reaches the quota's clamp for long):
- `attack`: the red team's run: the watchers show the Gateway account's token, bound to no pod;
- `pods`: N Pods of the Gateway (registered in the fake API server, each its own bound token):
  every report counts, the coalescing bounds the fan-out.

`--reconciler-from DIR` runs the reconciler from another checkout (the baseline: main's code);
everything else (the fake API server, the clients) is this checkout's. Check the load average
before you trust a run: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stunner_api.cds import USAGE_REPORT_KEY, config_path, encode_usage  # noqa: E402
from stunner_api.vocabulary import (  # noqa: E402
    APP_LABEL,
    APP_VALUE,
    CDS_TOKEN_AUDIENCE,
    CDS_TOKEN_FILE_ENV,
    RELATED_GATEWAY_NAME,
    RELATED_GATEWAY_NAMESPACE,
)
from stunnerd.process.sources import CdsSource  # noqa: E402
from stunnerd.process.usage import UsageReporter  # noqa: E402
from stunnerd.turn.ledger import LocalQuota  # noqa: E402
from tests.reconciler import clusterkit as k  # noqa: E402
from tests.support.fakeapi import FakeApiServer  # noqa: E402
from tests.support.ports import free_port  # noqa: E402

REPORT_EVERY = 0.3  # seconds: the red team's pace (under the CDS's 8 frames a second)
EDIT_EVERY = 0.3
LOST_AFTER = 5.0
WARM_UP = 5  # edits before the measurement starts
ID = f"{k.NS}/gw"


def say(text: str = "") -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def pod(name: str) -> dict[str, Any]:
    labels = {APP_LABEL: APP_VALUE, RELATED_GATEWAY_NAME: "gw", RELATED_GATEWAY_NAMESPACE: k.NS}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": k.NS, "labels": labels},
        "spec": {"serviceAccountName": "default", "containers": [{"name": "s", "image": "x"}]},
    }


def token(fake: FakeApiServer, bound: str = "") -> str:
    """A token of the Gateway's account for the CDS, bound to the pod `bound` ("": none)."""
    return fake.issue_token(k.NS, "default", (CDS_TOKEN_AUDIENCE,), pod=bound)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def flood_child(address: str, tokens_file: str) -> None:
    """Child process: a watcher per token, each reporting every REPORT_EVERY seconds."""
    tokens = Path(tokens_file).read_text().split()
    url = address.replace("http://", "ws://") + config_path(k.NS, "gw") + "?watch=true"
    stats = {"connected": 0, "reports": 0, "frames": 0, "closed": 0}

    async def one(i: int, shown: str) -> None:
        rng = random.Random(i)
        headers = {"Authorization": f"Bearer {shown}"}
        async with aiohttp.ClientSession() as session:
            while True:
                try:
                    async with session.ws_connect(url, headers=headers) as ws:
                        stats["connected"] += 1

                        async def read(ws: aiohttp.ClientWebSocketResponse = ws) -> None:
                            async for _ in ws:
                                stats["frames"] += 1

                        reader = asyncio.create_task(read())
                        await asyncio.sleep(rng.random() * REPORT_EVERY)
                        round = 0
                        while not ws.closed:
                            round += 1
                            counts = {f"flood-{i}": 1 + round % 2}  # changes the sums
                            await ws.send_str(encode_usage(USAGE_REPORT_KEY, counts)[0])
                            stats["reports"] += 1
                            await asyncio.sleep(REPORT_EVERY)
                        reader.cancel()
                except (aiohttp.ClientError, OSError, ConnectionError):
                    pass
                stats["closed"] += 1
                await asyncio.sleep(0.5)

    async def report() -> None:
        while True:
            await asyncio.sleep(0.5)
            sys.stdout.write(json.dumps(stats) + "\n")
            sys.stdout.flush()

    await asyncio.gather(report(), *(one(i, t) for i, t in enumerate(tokens)))


class HonestPod:
    """An honest stunnerd's quota side over its CDS watch; counts the time its watch is down."""

    def __init__(self, address: str, token_file: Path) -> None:
        self.quota = LocalQuota()
        self.reporter = UsageReporter(self.quota)
        self.reporter.set_enabled(True)
        env = {CDS_TOKEN_FILE_ENV: str(token_file), "STUNNER_ADDR": "127.0.0.1"}
        self.source = CdsSource(address, k.NS, "gw", env=env, retry_period=0.2)
        self.source.reporter = self.reporter
        self.down = 0.0
        self.tasks = [asyncio.create_task(self._watch()), asyncio.create_task(self._clock())]

    async def _watch(self) -> None:
        async for _ in self.source.watch():
            pass

    async def _clock(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            if not self.reporter.shared:
                self.down += now - last
            last = now

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()


@contextlib.asynccontextmanager
async def reconciler(
    fake: FakeApiServer, tmp: Path, source: Path | None
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str, list[str]]]:
    port = free_port()
    kubeconfig = fake.write_kubeconfig(tmp / "kubeconfig")
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "reconciler",
        "--kubeconfig",
        str(kubeconfig),
        f"--config-discovery-address=127.0.0.1:{port}",
        "--metrics-bind-address=0",
        "--health-probe-bind-address=0",
        "--zap-log-level=INFO",
        cwd=str(source) if source is not None else None,
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    lines: list[str] = []

    async def read() -> None:
        assert process.stderr is not None
        async for line in process.stderr:
            lines.append(line.decode(errors="replace").rstrip())

    reader = asyncio.create_task(read())
    try:
        yield process, f"http://127.0.0.1:{port}", lines
    finally:
        process.terminate()
        await process.wait()
        reader.cancel()


class HonestWatcher:
    """A watcher of the Gateway's config that sends nothing (as Go's stunnerd, or the auth
    service), reconnecting when the CDS drops it, as stunnerd does."""

    def __init__(self, session: aiohttp.ClientSession, address: str, shown: str) -> None:
        self.session = session
        self.url = address.replace("http://", "ws://") + config_path(k.NS, "gw") + "?watch=true"
        self.headers = {"Authorization": f"Bearer {shown}"}
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.reconnects = 0

    async def next_config(self, timeout: float) -> str:
        """The next config frame (after a reconnect: the config as it is); TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if self.ws is None or self.ws.closed:
                if self.ws is not None:
                    self.reconnects += 1
                    await asyncio.sleep(min(left, 0.2))
                try:
                    self.ws = await self.session.ws_connect(
                        self.url, headers=self.headers, timeout=aiohttp.ClientWSTimeout(left)
                    )
                except (aiohttp.ClientError, OSError):
                    continue
            message = await self.ws.receive(timeout=max(0.01, deadline - time.monotonic()))
            if message.type == aiohttp.WSMsgType.TEXT:
                return str(message.data)


@dataclass
class Measured:
    cpu: float  # the reconciler's CPU-s per 15 s
    latencies: list[float]
    lost: int  # edits not received within LOST_AFTER
    reconnects: int  # the honest watcher's
    seconds: float  # the window (at least `seconds`: a lost edit waits LOST_AFTER)
    down: list[float]  # each honest pod's seconds without its CDS watch in the window


async def measure(
    fake: FakeApiServer,
    address: str,
    pid: int,
    seconds: float,
    edits: list[int],
    honest: list[HonestPod],
) -> Measured:
    """The figures of a window of at least `seconds` (after WARM_UP edits)."""
    latencies: list[float] = []
    lost = 0
    async with aiohttp.ClientSession() as session:
        watcher = HonestWatcher(session, address, token(fake))
        await watcher.next_config(10)  # the config as it is
        warm_up = WARM_UP
        start, cpu = time.monotonic(), cpu_seconds(pid)
        while warm_up >= 0 or time.monotonic() - start < seconds:
            if warm_up == 0:  # the reconciler's start (its first writes and their echoes) over
                latencies, lost, warm_up, watcher.reconnects = [], 0, -1, 0
                start, cpu = time.monotonic(), cpu_seconds(pid)
                for p in honest:
                    p.down = 0.0
            warm_up -= 1
            edits[0] += 1
            prefix = f"10.{edits[0] // 65536 % 256}.{edits[0] // 256 % 256}.{edits[0] % 256}/32"
            sent = time.monotonic()
            await asyncio.to_thread(k.set_peer, fake, prefix)
            try:
                while prefix not in await watcher.next_config(sent + LOST_AFTER - time.monotonic()):
                    pass
                latencies.append(time.monotonic() - sent)
            except TimeoutError:
                lost += 1
            await asyncio.sleep(EDIT_EVERY)
        used = cpu_seconds(pid) - cpu
        if watcher.ws is not None:
            await watcher.ws.close()
        window = time.monotonic() - start
        down = [p.down for p in honest]
        return Measured(used * 15 / window, latencies, lost, watcher.reconnects, window, down)


def percentiles(samples: Sequence[float]) -> str:
    if not samples:
        return "no samples"
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (
        f"p50 {1000 * statistics.median(ordered):.0f} ms, p99 {1000 * p99:.0f} ms, "
        f"max {1000 * ordered[-1]:.0f} ms (n={len(ordered)})"
    )


async def run(flood: str, watchers: int, seconds: float, source: Path | None) -> None:
    with tempfile.TemporaryDirectory(prefix="quota-flood-") as scratch, FakeApiServer() as fake:
        tmp = Path(scratch)
        for obj in (
            k.gateway_class(),
            k.gateway_config(userQuota=2),
            k.dataplane(),
            k.static_service(),
            k.gateway(),
            k.route(),
            pod("gw-pod-1"),
            pod("gw-pod-2"),
        ):
            fake.seed(obj)
        tokens = []
        for i in range(watchers):
            if flood == "pods":
                fake.seed(pod(f"gw-flood-{i}"))
                tokens.append(
                    fake.issue_token(k.NS, "default", (CDS_TOKEN_AUDIENCE,), pod=f"gw-flood-{i}")
                )
            else:
                tokens.append(fake.issue_token(k.NS, "default", (CDS_TOKEN_AUDIENCE,)))
        (tmp / "tokens").write_text("\n".join(tokens))
        async with reconciler(fake, tmp, source) as (process, address, log):
            while True:  # the CDS listening
                try:
                    _, writer = await asyncio.open_connection(*address[7:].split(":"))
                    writer.close()
                    break
                except OSError:
                    await asyncio.sleep(0.05)
            honest = []
            for name in ("gw-pod-1", "gw-pod-2"):
                path = tmp / f"{name}.token"
                path.write_text(token(fake, name))
                honest.append(HonestPod(address, path))
            deadline = time.monotonic() + 30
            while not all(p.reporter.shared for p in honest):
                assert time.monotonic() < deadline, "the honest pods never connected"
                await asyncio.sleep(0.05)
            honest[0].quota.try_acquire("user-1", 2)
            while honest[1].quota.others != {"user-1": 1}:
                assert time.monotonic() < deadline, (
                    f"the honest pods never shared their counts: {honest[1].quota.others}\n"
                    + "\n".join(log[-30:])
                )
                await asyncio.sleep(0.05)
            edits = [1000]  # the StaticService's own prefix is edit 1
            quiet = await measure(fake, address, process.pid, seconds, edits, honest)
            logged = len(log)
            child = await asyncio.create_subprocess_exec(
                sys.executable,
                os.path.abspath(__file__),
                "--flood-child",
                address,
                str(tmp / "tokens"),
                stdout=asyncio.subprocess.PIPE,
                limit=1 << 20,
            )
            stats: dict[str, int] = {}

            async def follow() -> None:
                assert child.stdout is not None
                async for line in child.stdout:
                    stats.update(json.loads(line))

            follower = asyncio.create_task(follow())
            try:
                while stats.get("connected", 0) < watchers:
                    assert time.monotonic() < deadline + 60, f"flood connected: {stats}"
                    await asyncio.sleep(0.1)
                flooded = await measure(fake, address, process.pid, seconds, edits, honest)
                others = dict(honest[1].quota.others)  # before the flood leaves
            finally:
                child.terminate()
                await child.wait()
                follower.cancel()
            watcher_lines = [
                line for line in log[logged:] if re.search(r"watcher|usage report", line)
            ]
            kinds: dict[str, int] = {}
            for line in watcher_lines:
                kind = re.sub(r".*?(WARNING|INFO|ERROR): ", r"\1 ", line)
                kind = re.sub(r"[0-9.:]+|\(.*", "", kind)[:60]
                kinds[kind] = kinds.get(kind, 0) + 1
            say(f"flood {flood!r}, {watchers} watchers reporting every {REPORT_EVERY} s:")
            for name, m in (("without it", quiet), ("with it", flooded)):
                say(f"  {name} ({m.seconds:.0f} s): reconciler {m.cpu:.2f} CPU-s per 15 s")
                say(
                    f"    honest watcher's config latency {percentiles(m.latencies)}, lost {m.lost}"
                )
                say(f"    it lost its watch {m.reconnects} times; the honest pods' watch was down")
                say(f"    {', '.join(f'{d:.1f} s' for d in m.down)}")
            honest_others = "the flood pods' too" if flood == "pods" else "{'user-1': 1}"
            shown = (
                others
                if len(others) <= 8
                else f"{len(others)} users, user-1: {others.get('user-1')}"
            )
            say(f"  pod 2's others at the end: {shown} ({honest_others})")
            say(f"  flood: {stats}")
            say(f"  reconciler log lines about watchers meanwhile: {len(watcher_lines)} {kinds}")
            for p in honest:
                p.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--watchers", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--flood", default="attack,pods")
    parser.add_argument("--reconciler-from", type=Path, default=None, metavar="DIR")
    parser.add_argument("--flood-child", nargs=2, metavar=("ADDRESS", "TOKENS"))
    args = parser.parse_args()
    if args.flood_child:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(flood_child(*args.flood_child))
        return 0
    say(f"command: {' '.join([sys.executable, *sys.argv])}")
    say(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs")
    if args.reconciler_from is not None:
        say(f"reconciler from {args.reconciler_from.resolve()}")
    for flood in args.flood.split(","):
        asyncio.run(run(flood, args.watchers, args.seconds, args.reconciler_from))
        say(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
