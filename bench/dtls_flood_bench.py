"""TURN-DTLS under a ClientHello flood: honest DTLS handshakes that complete, stunnerd side by
side with coturn's DTLS listener in one run.

For each server and flood: a flooder process sends epoch-0 ClientHellos without a cookie to the
DTLS port as fast as it can (or at most `--rate` per second) for `--duration` seconds, either
from one source (`one-source`, 127.0.0.2, one port) or from `--sources` spoofed source
addresses in turn (`spoofed`, 127.64.0.0 on, one port each, whole IPv4 packets on a raw socket:
root or CAP_NET_RAW). One second in, `--clients` honest clients (`openssl s_client -dtls1_2`,
each from its own source IP, 127.0.0.10 on) start a handshake each, spaced evenly over the
flood, each given `--timeout` seconds. The row: handshakes completed of tried, their time
(median and slowest, from the start of s_client to "CONNECTION ESTABLISHED"), datagrams the
flooder sent, and the server's CPU seconds during the run. A row without a flood (`none`) is the
anchor for the handshake time.

    .venv/bin/python bench/dtls_flood_bench.py                         # both floods, 12 s each
    .venv/bin/python bench/dtls_flood_bench.py --floods one-source --clients 4 --json out.json
    .venv/bin/python bench/dtls_flood_bench.py --stunnerd-tree /tmp/main   # another checkout

Needs coturn's `turnserver` and the `openssl` CLI. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from turn_bench import cpu_seconds, stop  # noqa: E402

from tests.support.flood import client_hello  # noqa: E402
from tests.support.packets import internet_checksum  # noqa: E402
from tests.support.ports import free_port  # noqa: E402

FLOODS = ("none", "one-source", "spoofed")
SERVERS = ("stunnerd", "coturn")
FLOOD_IP = "127.0.0.2"
SPOOFED_BASE = 0x7F400000  # 127.64.0.0
CLIENT_IP = "127.0.0.{}"  # 127.0.0.10 on


def flood(kind: str, port: int, rate: int, seconds: float, sources: int) -> None:
    """The flooder process: prints how many datagrams it sent."""
    hello = client_hello()
    destination = ("127.0.0.1", port)
    if kind == "one-source":
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((FLOOD_IP, 0))
        packets = [hello]
    else:  # whole IPv4 packets (IP_HDRINCL), a source address and port each; UDP checksum 0
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        packets = []
        for i in range(sources):
            source = SPOOFED_BASE + i
            ip = struct.pack(
                "!BBHHHBBH4s4s", 0x45, 0, 28 + len(hello), 0, 0, 64, 17, 0,
                source.to_bytes(4, "big"), socket.inet_aton("127.0.0.1"),
            )  # fmt: skip
            ip = ip[:10] + struct.pack("!H", internet_checksum(ip)) + ip[12:]
            udp = struct.pack("!HHHH", 1024 + i % 64000, port, 8 + len(hello), 0)
            packets.append(ip + udp + hello)
    sock.setblocking(False)
    sent, start = 0, time.monotonic()
    end = start + seconds
    while (now := time.monotonic()) < end:
        if rate and sent > (now - start) * rate:
            time.sleep(0.001)
            continue
        for _ in range(64):
            try:
                sock.sendto(packets[sent % len(packets)], destination)
            except OSError:
                pass
            sent += 1
    sys.stdout.write(json.dumps({"sent": sent, "seconds": time.monotonic() - start}) + "\n")


class Server:
    """stunnerd with one TURN-DTLS listener, or coturn with DTLS alone (no UDP/TCP/TLS)."""

    def __init__(
        self, name: str, workdir: Path, cert: str, key: str, tree: Path | None = None
    ) -> None:
        self.name, self.workdir, self.cert, self.key = name, workdir, cert, key
        self.tree = tree  # stunnerd's code from this checkout (PYTHONPATH), else this one's
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.workdir / f"{self.name}.log").open("wb")
        if self.name == "stunnerd":
            config = {
                "version": "v1",
                "admin": {"name": "bench", "loglevel": "all:WARN", "healthcheck_endpoint": ""},
                "auth": {"type": "static", "realm": "bench",
                         "credentials": {"username": "user", "password": "pass"}},
                "listeners": [{"name": "bench-dtls", "protocol": "TURN-DTLS",
                               "address": "127.0.0.1", "port": self.port, "routes": ["any"],
                               "cert": self.cert, "key": self.key}],
                "clusters": [{"name": "any", "type": "STATIC", "endpoints": ["127.0.0.0/8"]}],
            }  # fmt: skip
            path = self.workdir / "stunnerd.json"
            path.write_text(json.dumps(config))
            stunnerd = shutil.which("stunnerd", path=str(Path(sys.executable).parent))
            argv = [stunnerd or "stunnerd", "-c", str(path)]
        else:
            files = []
            for kind, text in (("cert", self.cert), ("key", self.key)):
                file = self.workdir / f"coturn.{kind}.pem"
                file.write_bytes(base64.b64decode(text))
                files.append(str(file))
            argv = [
                "turnserver", "-n", "--listening-ip", "127.0.0.1",
                "--listening-port", str(free_port()), "--tls-listening-port", str(self.port),
                "--cert", files[0], "--pkey", files[1], "--no-udp", "--no-tcp", "--no-tls",
                "--lt-cred-mech", "--user", "user:pass", "--realm", "bench", "--no-cli",
                "--no-stdout-log", "--log-file", "/dev/null", "--simple-log",
                "--pidfile", str(self.workdir / "turnserver.pid"),
            ]  # fmt: skip
        env = None
        if self.tree is not None:
            env = {**os.environ, "PYTHONPATH": str(self.tree), "PYTHONDONTWRITEBYTECODE": "1"}
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        # Ready when a handshake completes (DTLS has no connect to probe).
        ca = str(self.workdir / "ca.pem")
        for _ in range(40):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}")
            done, _ = asyncio.run(handshake(self.port, ca, "127.0.0.9", 2.0))
            if done:
                return
        raise RuntimeError(f"{self.name}: no DTLS handshake on {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, self.name)


async def handshake(port: int, ca: str, ip: str, timeout: float) -> tuple[bool, float]:
    """One honest `openssl s_client -dtls1_2` handshake: completed?, and its seconds."""
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        "timeout", str(timeout), "openssl", "s_client", "-dtls1_2", "-connect",
        f"127.0.0.1:{port}", "-bind", f"{ip}:0", "-CAfile", ca, "-brief",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await process.communicate()
    return b"CONNECTION ESTABLISHED" in output, time.monotonic() - started


async def measure(server: Server, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    ca = str(server.workdir / "ca.pem")
    assert server.proc is not None
    cpu = cpu_seconds(server.proc.pid)
    flooder = None
    if kind != "none":
        flooder = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--flood-worker", kind, str(server.port), str(args.rate),
            str(args.duration), str(args.sources), stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        await asyncio.sleep(1.0)
    spacing = max(0.0, (args.duration - 1.0 - args.timeout) / max(1, args.clients))
    tries = []
    for i in range(args.clients):
        ip = CLIENT_IP.format(10 + i)
        tries.append(asyncio.create_task(handshake(server.port, ca, ip, args.timeout)))
        await asyncio.sleep(spacing)
    results = await asyncio.gather(*tries)
    sent = 0
    if flooder is not None:
        output, _ = await flooder.communicate()
        sent = json.loads(output)["sent"]
    times = [seconds for done, seconds in results if done]
    return {
        "server": server.name,
        "flood": kind,
        "completed": len(times),
        "tried": len(results),
        "median_s": statistics.median(times) if times else None,
        "slowest_s": max(times) if times else None,
        "flood_sent": sent,
        "server_cpu_s": cpu_seconds(server.proc.pid) - cpu,
    }


def table(rows: list[dict[str, Any]]) -> str:
    anchor = {r["flood"]: r for r in rows if r["server"] == "coturn"}
    lines = [
        f"{'server':<9} {'flood':<11} {'handshakes':>10} {'vs coturn':>9} {'median s':>8} "
        f"{'slowest s':>9} {'flood sent':>10} {'cpu s':>6}"
    ]
    for r in rows:
        base = anchor.get(r["flood"])
        ratio = f"{r['completed'] / base['completed']:.2f}" if base and base["completed"] else "-"
        med = f"{r['median_s']:.2f}" if r["median_s"] is not None else "-"
        slow = f"{r['slowest_s']:.2f}" if r["slowest_s"] is not None else "-"
        lines.append(
            f"{r['server']:<9} {r['flood']:<11} {r['completed']:>4} of {r['tried']:<3} "
            f"{ratio:>9} {med:>8} {slow:>9} {r['flood_sent']:>10} {r['server_cpu_s']:>6.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--floods", default="none,one-source,spoofed")
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--duration", type=float, default=12.0, help="seconds of each flood")
    parser.add_argument("--rate", type=int, default=0, help="flood datagrams/s; 0: flat out")
    parser.add_argument("--sources", type=int, default=200_000, help="spoofed: source addresses")
    parser.add_argument("--clients", type=int, default=4, help="honest handshakes per flood")
    parser.add_argument("--timeout", type=float, default=8.0, help="seconds per handshake")
    parser.add_argument("--json", help="write the rows here too")
    parser.add_argument(
        "--stunnerd-tree", type=Path, help="run stunnerd from this checkout (e.g. main's)"
    )
    args = parser.parse_args(argv)
    for tool in ("turnserver", "openssl"):
        if shutil.which(tool) is None:
            sys.exit(f"dtls_flood_bench: `{tool}` is not installed")
    from stunnerd.transport.certificates import self_signed_certificate

    cert, key = self_signed_certificate("127.0.0.1")
    rows = []
    sys.stderr.write(f"load average {os.getloadavg()}\n")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "ca.pem").write_bytes(base64.b64decode(cert))
        for kind in args.floods.split(","):
            for name in args.servers.split(","):
                server = Server(name, workdir, cert, key, args.stunnerd_tree)
                server.start()
                try:
                    rows.append(asyncio.run(measure(server, kind, args)))
                finally:
                    server.stop()
                sys.stderr.write(table(rows[-1:]).splitlines()[1] + "\n")
    sys.stderr.write(f"load average {os.getloadavg()}\n")
    sys.stdout.write(table(rows) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--flood-worker":
        kind, port, rate, seconds, sources = sys.argv[2:7]
        flood(kind, int(port), int(rate), float(seconds), int(sources))
        sys.exit(0)
    sys.exit(main())
