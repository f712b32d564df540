"""Config discovery service figures (issue 11), as percentiles:

1. edit -> watcher: a manifest file edit reaches a stunnerd-style watcher (stunnerd's own
   `CdsSource`) over the CDS watch, through the whole local-mode pipeline (file poll -> render ->
   publish -> WebSocket). Target: p99 <= 1 s over 100 edits. Edits are spaced wider than the
   render throttle window (250 ms, as Go's --throttle-timeout), as a person editing would; the
   latency includes the file poll interval (100 ms).
2. fan-out: 200 watchers of one config on one CDS (in a separate process, on stunnerd's watch
   URL); each update must reach all of them in <= 1 s. Reported: per update, the time until the
   last watcher has the frame; and, for reference, the same with 200 of stunnerd's `CdsSource`
   clients in that one process, where the 200 config parses queue on one CPU.

    .venv/bin/python bench/cds_bench.py [--edits 100] [--watchers 200] [--updates 50]

Check the load average before you trust a run: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from websockets.asyncio.client import connect

from reconciler.cds import ConfigStore, cds_app, serve
from reconciler.demo import EXAMPLE, prepare
from reconciler.local import LocalSettings, run_local
from stunner_api.dataplane import StunnerConfig, validate_config
from stunnerd.sources import CdsSource

GATEWAY_ID = "stunner/local-gateway"
TARGET = 1.0  # seconds


def say(text: str = "") -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def percentiles(samples: Sequence[float]) -> str:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return (
        f"n={len(ordered)} p50={1000 * statistics.median(ordered):.1f} ms "
        f"p90={1000 * at(0.90):.1f} ms p99={1000 * at(0.99):.1f} ms "
        f"max={1000 * ordered[-1]:.1f} ms"
    )


def verdict(samples: Sequence[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return "PASS" if p99 <= TARGET else "FAIL"


async def edit_to_watcher(edits: int) -> list[float]:
    """Latency from a UDPRoute file write to stunnerd's CDS client yielding the new config."""
    manifests = Path(tempfile.mkdtemp(prefix="cds-bench-"))
    try:
        route = prepare(manifests, 3478, 10000)
        original = route.read_text()
        settings = LocalSettings(manifests, cds_port=0, auth_port=0)
        async with run_local(settings) as local:
            namespace, name = GATEWAY_ID.split("/")
            source = CdsSource(local.cds_address, namespace, name, env={"STUNNER_ADDR": "1"})
            watch = source.watch()
            async with contextlib.aclosing(watch):
                await asyncio.wait_for(anext(watch), 10)
                samples = []
                for edit in range(1, edits + 1):
                    port = 10000 + edit
                    await asyncio.sleep(0.3)  # wider than the throttle window
                    start = time.perf_counter()
                    route.write_text(original.replace("port: 10000", f"port: {port}"))
                    wanted = f":<{port}-{port}>"
                    while True:
                        config = await asyncio.wait_for(anext(watch), 10)
                        if any(wanted in e for c in config.clusters for e in c.endpoints):
                            break
                    samples.append(time.perf_counter() - start)
                return samples
    finally:
        shutil.rmtree(manifests, ignore_errors=True)


def config(version: int) -> StunnerConfig:
    return validate_config(
        {
            "version": "v1",
            "admin": {"name": GATEWAY_ID},
            "auth": {
                "type": "static",
                "realm": f"v{version}",
                "credentials": {"username": "user-1", "password": "pass-1"},
            },
            "listeners": [
                {"name": f"{GATEWAY_ID}/udp", "address": "127.0.0.1", "port": 3478, "routes": ["r"]}
            ],
            "clusters": [{"name": "r", "endpoints": ["10.0.0.0/8"]}],
        }
    )


async def watchers_child(address: str, count: int, client: str) -> None:
    """Child process: `count` watchers; prints "<version> <wall time>" per config received.

    `client` "frame": a bare WebSocket client of the watch URL stunnerd uses, timing the frame's
    arrival (the CDS's delivery). "stunnerd": stunnerd's `CdsSource`, timing the parsed and
    validated config (in one process here, so the 200 parses run one after another on one CPU,
    where 200 stunnerds would each use their own)."""
    namespace, name = GATEWAY_ID.split("/")
    source = CdsSource(address, namespace, name, retry_period=0.2)

    async def frames() -> None:
        async with connect(source.ws_url, compression=None, max_queue=None) as ws:
            async for frame in ws:
                now = time.time()
                version = json.loads(frame)["auth"]["realm"][1:]
                sys.stdout.write(f"{version} {now:.6f}\n")

    async def stunnerd() -> None:
        watcher = CdsSource(address, namespace, name, retry_period=0.2)
        async for received in watcher.watch():
            now = time.time()
            sys.stdout.write(f"{received.auth.realm[1:]} {now:.6f}\n")

    one = frames if client == "frame" else stunnerd
    await asyncio.gather(*(one() for _ in range(count)))


async def fan_out(watchers: int, updates: int, client: str) -> list[float]:
    """Per update: seconds until the last of `watchers` watchers has it."""
    store = ConfigStore()
    store.set(GATEWAY_ID, config(0))
    async with serve(cds_app(store)) as served:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            os.path.abspath(__file__),
            "--watchers-child",
            served.address,
            str(watchers),
            client,
            stdout=asyncio.subprocess.PIPE,
            limit=1 << 20,
        )
        assert child.stdout is not None
        received: dict[int, list[float]] = {}

        async def read() -> None:
            assert child.stdout is not None
            async for line in child.stdout:
                version, when = line.split()
                received.setdefault(int(version), []).append(float(when))

        reader = asyncio.create_task(read())
        try:

            async def all_have(version: int, timeout: float = 30) -> None:
                deadline = time.monotonic() + timeout
                while len(received.get(version, ())) < watchers:
                    if time.monotonic() > deadline:
                        got = len(received.get(version, ()))
                        raise RuntimeError(f"update {version}: {got}/{watchers} watchers")
                    await asyncio.sleep(0.005)

            await all_have(0)
            samples = []
            for version in range(1, updates + 1):
                await asyncio.sleep(0.2)
                start = time.time()
                store.set(GATEWAY_ID, config(version))
                await all_have(version)
                samples.append(max(received[version]) - start)
            return samples
        finally:
            reader.cancel()
            child.terminate()
            await child.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--edits", type=int, default=100)
    parser.add_argument("--watchers", type=int, default=200)
    parser.add_argument("--updates", type=int, default=50)
    parser.add_argument("--watchers-child", nargs=3, metavar=("ADDRESS", "COUNT", "CLIENT"))
    args = parser.parse_args()
    if args.watchers_child:
        address, count, client = args.watchers_child
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(watchers_child(address, int(count), client))
        return 0
    if not EXAMPLE.is_dir():
        say(f"the bundled example is missing ({EXAMPLE}): run from a checkout")
        return 1
    say(f"command: {' '.join([sys.executable, *sys.argv])}")
    say(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs")
    edits = asyncio.run(edit_to_watcher(args.edits))
    say(f"edit -> stunnerd's CDS watch ({args.edits} edits): {percentiles(edits)}")
    say(f"  target p99 <= {TARGET:.0f} s: {verdict(edits)}")
    fan = asyncio.run(fan_out(args.watchers, args.updates, "frame"))
    say(
        f"update -> all {args.watchers} watchers' frames ({args.updates} updates), the last: "
        f"{percentiles(fan)}"
    )
    say(f"  target p99 <= {TARGET:.0f} s: {verdict(fan)}")
    parsed = asyncio.run(fan_out(args.watchers, args.updates, "stunnerd"))
    say(
        f"update -> all {args.watchers} stunnerd CdsSource clients in ONE process, parsed "
        f"(their parses serialised on one CPU), the last: {percentiles(parsed)}"
    )
    return 0 if verdict(edits) == verdict(fan) == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
