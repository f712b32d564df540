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

3. with `--ping-flood N` (issue 20 #4), instead: the fan-out to `--watchers` honest watchers
   with no flood, then with N connections (another process) sending masked WebSocket pings as
   fast as they can, reconnecting whenever the CDS closes them (1008, past the frame budget).
   Reported: the delivery percentiles of both, the flooding connections closed, and the ERROR
   lines the CDS logged. Target: the same p99 <= 1 s.

    .venv/bin/python bench/cds_bench.py [--edits 100] [--watchers 200] [--updates 50]
    .venv/bin/python bench/cds_bench.py --ping-flood 8 [--watchers 20] [--updates 50]

Check the load average before you trust a run: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from websockets.asyncio.client import connect

from reconciler.cds.server import HANDLERS_KEY, cds_app, serve
from reconciler.cds.store import ConfigStore
from reconciler.demo_example import EXAMPLE, prepare
from reconciler.local import LocalSettings, run_local
from stunner_api.dataplane import StunnerConfig, validate_config
from stunnerd.process.sources import CdsSource

GATEWAY_ID = "stunner/local-gateway"
TARGET = 1.0  # seconds


def say(text: str = "", end: str = "\n") -> None:
    sys.stdout.write(text + end)
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


def masked(opcode: int, payload: bytes) -> bytes:
    mask = os.urandom(4)
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + body


async def flood_child(address: str, count: int) -> None:
    """Child process: `count` connections flooding the watch URL with pings, reconnecting."""
    host, port = address.removeprefix("http://").rsplit(":", 1)
    namespace, name = GATEWAY_ID.split("/")
    path = f"/api/v1/configs/{namespace}/{name}?watch=true"
    burst = masked(0x9, b"flood") * 4096
    connections = 0

    async def to_eof(reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(OSError):
            await reader.read(-1)  # what the CDS sends (pongs, a close), until it closes

    async def one() -> None:
        nonlocal connections
        while True:
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(
                    (
                        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                        "Sec-WebSocket-Version: 13\r\n\r\n"
                    ).encode()
                )
                await reader.readuntil(b"\r\n\r\n")
                connections += 1
                drain = asyncio.create_task(to_eof(reader))
                while not drain.done():
                    writer.write(burst)
                    await writer.drain()
                writer.close()
            except (OSError, asyncio.IncompleteReadError):
                await asyncio.sleep(0.01)

    async def report() -> None:
        while True:
            await asyncio.sleep(0.5)
            sys.stdout.write(f"{connections}\n")
            sys.stdout.flush()

    await asyncio.gather(report(), *(one() for _ in range(count)))


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


async def fan_out(
    watchers: int, updates: int, client: str, flood: int = 0
) -> tuple[list[float], str]:
    """Per update: seconds until the last of `watchers` watchers has it; and, with `flood`
    flooding connections, what the flood did."""
    store = ConfigStore()
    store.set(GATEWAY_ID, config(0))
    app = cds_app(store)
    errors = _Errors()
    logging.getLogger().addHandler(errors)
    flooder: asyncio.subprocess.Process | None = None
    flooded = [0]
    async with serve(app) as served:
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
            if flood:
                flooder = await asyncio.create_subprocess_exec(
                    sys.executable,
                    os.path.abspath(__file__),
                    "--flood-child",
                    served.address,
                    str(flood),
                    stdout=asyncio.subprocess.PIPE,
                )

                async def count_floods() -> None:
                    assert flooder is not None and flooder.stdout is not None
                    async for line in flooder.stdout:
                        flooded[0] = int(line)

                flood_reader = asyncio.create_task(count_floods())
                await asyncio.sleep(2.0)  # the flood under way
            samples = []
            for version in range(1, updates + 1):
                await asyncio.sleep(0.2)
                start = time.time()
                store.set(GATEWAY_ID, config(version))
                await all_have(version)
                samples.append(max(received[version]) - start)
            guard = getattr(app[HANDLERS_KEY], "guard", None)  # None before issue 20
            closed = "?" if guard is None else guard.flooding
            what = (
                f"{flooded[0]} flooding connections made, {closed} closed with 1008, "
                f"{errors.count} ERROR log lines"
            )
            return samples, what
        finally:
            logging.getLogger().removeHandler(errors)
            reader.cancel()
            child.terminate()
            await child.wait()
            if flooder is not None:
                flood_reader.cancel()
                flooder.terminate()
                await flooder.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--edits", type=int, default=100)
    parser.add_argument("--watchers", type=int, default=200)
    parser.add_argument("--updates", type=int, default=50)
    parser.add_argument("--ping-flood", type=int, default=0, metavar="N")
    parser.add_argument("--watchers-child", nargs=3, metavar=("ADDRESS", "COUNT", "CLIENT"))
    parser.add_argument("--flood-child", nargs=2, metavar=("ADDRESS", "COUNT"))
    args = parser.parse_args()
    if args.flood_child:
        address, count = args.flood_child
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(flood_child(address, int(count)))
        return 0
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
    if args.ping_flood:
        quiet, _ = asyncio.run(fan_out(args.watchers, args.updates, "frame"))
        say(f"update -> all {args.watchers} watchers, no flood: {percentiles(quiet)}")
        flooded, what = asyncio.run(fan_out(args.watchers, args.updates, "frame", args.ping_flood))
        say(f"update -> all {args.watchers} watchers, {args.ping_flood} flooding: ", end="")
        say(f"{percentiles(flooded)}")
        say(f"  {what}")
        say(f"  target p99 <= {TARGET:.0f} s: {verdict(flooded)}")
        return 0 if verdict(flooded) == "PASS" else 1
    edits = asyncio.run(edit_to_watcher(args.edits))
    say(f"edit -> stunnerd's CDS watch ({args.edits} edits): {percentiles(edits)}")
    say(f"  target p99 <= {TARGET:.0f} s: {verdict(edits)}")
    fan, _ = asyncio.run(fan_out(args.watchers, args.updates, "frame"))
    say(
        f"update -> all {args.watchers} watchers' frames ({args.updates} updates), the last: "
        f"{percentiles(fan)}"
    )
    say(f"  target p99 <= {TARGET:.0f} s: {verdict(fan)}")
    parsed, _ = asyncio.run(fan_out(args.watchers, args.updates, "stunnerd"))
    say(
        f"update -> all {args.watchers} stunnerd CdsSource clients in ONE process, parsed "
        f"(their parses serialised on one CPU), the last: {percentiles(parsed)}"
    )
    return 0 if verdict(edits) == verdict(fan) == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
