"""The CDS under a connect flood: honest connect latency and watches, this tree beside another
checkout (`--anchor-tree`, e.g. main's) measured in the same run.

For each tree: the CDS application (reconciler.cds.server, its CDS_LIMITS) is served in a process of
its own, with one config; `--flooders` processes (tests/support/flood.py, `connect`) open TCP
connections from one source IP at up to `--rate` a second each for `--seconds`, each closed unread
once 512 newer ones are open; meanwhile `--connects` honest connects (from other IPs, 8 at a
time, 0.1 s apart) and `--watchers` watches (each from its own IP, given 10 s to receive the
config) run. The row: honest connect p50/p99/max (ms), how many of those had a SYN
retransmitted (TCP_INFO: the server's listen queue dropped it), watches that received their
config.

    .venv/bin/python bench/cds_connect_flood_bench.py
    .venv/bin/python bench/cds_connect_flood_bench.py --anchor-tree /path/to/main --rate 8000

Loopback only. There is no coturn anchor (coturn has no CDS): the anchor is the other tree.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
SERVER = """
import asyncio, sys
from reconciler.cds.server import CDS_LIMITS, cds_app
from reconciler.cds.store import ConfigStore
from stunner_http.server import LIMITS_KEY, serve
from tests.reconciler.test_cds import make_config
async def main():
    store = ConfigStore()
    store.set("ns1/gw-a", make_config("ns1/gw-a", realm="v0"))
    app = cds_app(store)
    app[LIMITS_KEY] = CDS_LIMITS
    async with serve(app) as served:
        print(served.port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
asyncio.run(main())
"""
WATCH = "/api/v1/configs/ns1/gw-a?watch=true"
TCPI_TOTAL_RETRANS = 100


async def connect(port: int, ip: str) -> tuple[float, int]:
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)
        sock.bind((ip, 0))
        start = time.monotonic()
        await loop.sock_connect(sock, ("127.0.0.1", port))
        took = time.monotonic() - start
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        return took, int(struct.unpack_from("I", info, TCPI_TOTAL_RETRANS)[0])


async def watch(port: int, ip: str) -> bool:
    import aiohttp

    connector = aiohttp.TCPConnector(local_addr=(ip, 0))
    async with aiohttp.ClientSession(connector=connector) as session:
        try:
            async with (
                asyncio.timeout(10),
                session.ws_connect(f"ws://127.0.0.1:{port}{WATCH}") as ws,
            ):
                return "realm" in await ws.receive_str()
        except (TimeoutError, aiohttp.ClientError):
            return False


async def measure(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": f"{tree}:{HERE}", "PYTHONDONTWRITEBYTECODE": "1"}
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER], cwd=tree, env=env, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdout is not None and server.stdin is not None
    port = int(server.stdout.readline())
    flooders = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.flood",
                str(port),
                str(args.rate),
                str(args.seconds),
                "1",
                "connect",
            ],
            cwd=HERE,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for _ in range(args.flooders)
    ]
    try:
        await asyncio.sleep(1.0)  # the flood under way
        watches = [
            asyncio.create_task(watch(port, f"127.0.0.{10 + i}")) for i in range(args.watchers)
        ]
        results: list[tuple[float, int]] = []
        for start in range(0, args.connects, 8):
            batch = range(start, min(start + 8, args.connects))
            ips = [f"127.0.{1 + i // 250}.{1 + i % 250}" for i in batch]
            results += await asyncio.gather(*(connect(port, ip) for ip in ips))
            await asyncio.sleep(0.1)
        received = await asyncio.gather(*watches)
    finally:
        output = ""
        for flooder in flooders:
            flooder.terminate()
            output += flooder.communicate()[0]
        server.stdin.close()
        server.wait(10)
    times = sorted(took * 1000 for took, _ in results)
    return {
        "tree": str(tree),
        "p50_ms": statistics.median(times),
        "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))],
        "max_ms": times[-1],
        "syn_retransmitted": sum(1 for _, r in results if r),
        "connects": len(results),
        "watches": sum(received),
        "watchers": len(received),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--anchor-tree", type=Path, help="another checkout, measured first")
    parser.add_argument("--rate", type=int, default=8000, help="flood connections per second")
    parser.add_argument("--flooders", type=int, default=3, help="flooder processes, one IP")
    parser.add_argument("--seconds", type=float, default=20.0, help="the flood's bound")
    parser.add_argument("--connects", type=int, default=200)
    parser.add_argument("--watchers", type=int, default=5)
    args = parser.parse_args()
    trees = ([args.anchor_tree] if args.anchor_tree else []) + [HERE]
    rows = []
    sys.stdout.write(f"load average {os.getloadavg()}\n")
    for tree in trees:
        rows.append(asyncio.run(measure(tree, args)))
    sys.stdout.write(f"load average {os.getloadavg()}\n")
    anchor = rows[0]
    for row in rows:
        ratio = row["p99_ms"] / anchor["p99_ms"] if anchor["p99_ms"] else float("nan")
        sys.stdout.write(
            f"{row['tree']}: connect p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms "
            f"({ratio:.2f}x the first), max {row['max_ms']:.1f} ms; SYN retransmitted "
            f"{row['syn_retransmitted']} of {row['connects']}; watches {row['watches']} of "
            f"{row['watchers']}\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
