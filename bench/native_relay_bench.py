"""Native relay engine against today's Python path (and coturn), same traffic, same run.

Every server relays the same closed loop on 127.0.0.1: `relay_load` (bench/relay_load.c, a C
generator built here with gcc) keeps WINDOW packets per client in flight, clients -> server ->
echo peer -> server -> clients, and counts what arrives. Servers, each its own process:

- native: one `stunnerd.transport.native.NativeRelay` engine (its thread) in a small host process
  that mirrors each allocation, permission, channel and verdict as the TURN server will;
- stunnerd: today's stunnerd, `--udp-thread-num=1` (one process, the pure-Python UDP path),
  allocations made over TURN with long-term credentials;
- coturn: `turnserver`, if installed (the anchor of bench/turn_bench.py).

Reported per server: relayed packets/s (the peer's echoes plus the clients' receptions: each
round trip is two relayed packets), packets in flight or lost at the end, server CPU-seconds
(utime+stime from /proc) and relayed packets per server CPU-second, with the ratios.

    .venv/bin/python bench/native_relay_bench.py
    .venv/bin/python bench/native_relay_bench.py --clients 8 --window 32 --size 1000 --mode send
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import turn_bench  # noqa: E402  (bench/ is not a package)

from stunner_api.stun import Class, Message, Method, StunError, parse_message  # noqa: E402
from stunnerd.turn.auth import long_term_key  # noqa: E402

HERE = Path(__file__).resolve().parent
CHANNEL = 0x4000
HOST = "127.0.0.1"


def log(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


# --- the native host process ----------------------------------------------------------------


def host_native() -> int:
    """Run one engine; commands on stdin: "alloc CLIENT_PORT PEER_PORT MODE", "quit"."""
    from stunnerd.transport import native

    listener = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        listener.setsockopt(socket.SOL_SOCKET, option, 4 << 20)  # as stunnerd's listener
    listener.bind(("::", 0))
    engine = native.NativeRelay(listener)
    engine.start()
    sys.stdout.write(f"{listener.getsockname()[1]}\n")
    sys.stdout.flush()
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["alloc"]:
            client, peer = (HOST, int(words[1])), (HOST, int(words[2]))
            relay = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                relay.setsockopt(socket.SOL_SOCKET, option, 1 << 20)  # as turn._grow_buffers
            relay.bind(("0.0.0.0", 0))
            relay_port = relay.getsockname()[1]
            expires = time.monotonic() + 3600
            handle = engine.add_allocation(client, relay, expires)
            relay.close()  # the engine keeps its own duplicate (stunnerd.transport.native's plan)
            engine.set_permission(handle, HOST, expires)
            if words[3] == "chan":
                engine.bind_channel(handle, CHANNEL, peer, expires)
            engine.decide(peer, "bench")
            sys.stdout.write(f"{relay_port}\n")
        elif words[:1] == ["counters"]:
            sys.stdout.write(json.dumps(engine.counters().__dict__) + "\n")
        else:
            break
        sys.stdout.flush()
    engine.close()
    return 0


class NativeHost:
    name = "native"

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--host-native"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.pid = self.proc.pid

    def command(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def setup(self, client: socket.socket, peer: tuple[str, int], mode: str) -> None:
        self.command(f"alloc {client.getsockname()[1]} {peer[1]} {mode}")

    def stop(self) -> None:
        self.command("quit")
        self.proc.wait(timeout=5)


# --- TURN servers (stunnerd, coturn) ---------------------------------------------------------


def transact(sock: socket.socket, port: int, request: Message, key: bytes | None) -> Message:
    """A STUN request over UDP to HOST:port and its answer, retried as RFC 8489 retransmits."""
    data = request.encode(integrity_key=key)
    for attempt in range(5):
        sock.sendto(data, (HOST, port))
        sock.settimeout(0.5 * 2**attempt)
        try:
            while True:
                reply = parse_message(sock.recv(4096))
                if reply.transaction_id == request.transaction_id:
                    return reply
        except (TimeoutError, StunError):
            continue
    raise TimeoutError("no reply from the TURN server")


class TurnHost:
    def __init__(self, name: str, workdir: Path) -> None:
        self.name = name
        self.server = turn_bench.Server(name, workdir, udp_threads=1)
        self.server.start()
        self.port = self.server.port
        self.pid = self.server.pid
        self.key = long_term_key(turn_bench.USER, turn_bench.REALM, turn_bench.PASSWORD)

    def setup(self, client: socket.socket, peer: tuple[str, int], mode: str) -> None:
        attrs: dict[str, Any] = {"REQUESTED-TRANSPORT": 17, "LIFETIME": 3600}
        first = transact(client, self.port, Message(Method.ALLOCATE, Class.REQUEST), None)
        auth = {
            "USERNAME": turn_bench.USER,
            "REALM": first.attributes["REALM"],
            "NONCE": first.attributes["NONCE"],
        }
        steps = [(Method.ALLOCATE, attrs)]
        if mode == "chan":
            steps.append(
                (Method.CHANNEL_BIND, {"CHANNEL-NUMBER": CHANNEL, "XOR-PEER-ADDRESS": peer})
            )
        else:
            steps.append((Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": peer}))
        for method, attributes in steps:
            request = Message(method, Class.REQUEST, attributes={**attributes, **auth})
            reply = transact(client, self.port, request, self.key)
            if reply.message_class != Class.SUCCESS:
                raise RuntimeError(f"{self.name}: {method.name} failed: {reply.attributes}")
        client.setblocking(False)

    def stop(self) -> None:
        self.server.stop()


# --- one run ---------------------------------------------------------------------------------


def build_generator(workdir: Path) -> Path:
    binary = workdir / "relay_load"
    subprocess.run(
        ["gcc", "-O2", "-std=gnu11", str(HERE / "relay_load.c"), "-o", str(binary)], check=True
    )
    return binary


def udp_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, 1 << 20)
    sock.bind((HOST, 0))
    return sock


def run_one(
    host: NativeHost | TurnHost, generator: Path, args: argparse.Namespace
) -> dict[str, Any]:
    peer = udp_socket()
    clients = [udp_socket() for _ in range(args.clients)]
    try:
        for client in clients:
            host.setup(client, peer.getsockname(), args.mode)
        fds = [peer.fileno(), *(c.fileno() for c in clients)]
        argv = [str(generator), str(args.duration), str(args.window), str(args.size), args.mode]
        argv += [str(host.port), *map(str, fds)]
        cpu_before = turn_bench.cpu_seconds(host.pid)
        result = subprocess.run(argv, pass_fds=fds, capture_output=True, text=True, check=True)
        cpu = turn_bench.cpu_seconds(host.pid) - cpu_before
    finally:
        for sock in (peer, *clients):
            sock.close()
    counts = json.loads(result.stdout)
    relayed = counts["echoed"] + counts["received"]
    return {
        "server": host.name,
        "relayed_per_s": relayed / counts["seconds"],
        "in_flight_or_lost": counts["sent"] - counts["received"],
        "cpu_s": cpu,
        "relayed_per_cpu_s": relayed / cpu if cpu > 0 else None,
        **counts,
    }


def idle_allocations(count: int) -> str:
    """RSS of the engine's host process per idle allocation (permission and channel each)."""
    host = NativeHost()
    try:
        host.command("alloc 1 2 chan")  # the first one grows the tables' arrays
        before = turn_bench.rss_kib(host.pid)
        for i in range(count):
            host.command(f"alloc {3 + i} 2 chan")
        after = turn_bench.rss_kib(host.pid)
    finally:
        host.stop()
    return (
        f"native engine: {count} idle allocations (one permission and one channel each): RSS "
        f"{before / 1024:.1f} -> {after / 1024:.1f} MiB, "
        f"{(after - before) / count:.2f} KiB per allocation\n"
    )


def table(rows: list[dict[str, Any]]) -> str:
    anchors = {row["server"]: row for row in rows}
    lines = [
        "| server | relayed pkt/s | in flight or lost | CPU-s | relayed pkt/CPU-s "
        "| pkt/s vs stunnerd | pkt/CPU-s vs stunnerd | pkt/CPU-s vs coturn |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def ratio(row: dict[str, Any], anchor: str, key: str) -> str:
        base = anchors.get(anchor, {}).get(key)
        return f"{row[key] / base:.2f}x" if base and row[key] else ""

    for row in rows:
        per_cpu = row["relayed_per_cpu_s"]
        lines.append(
            f"| {row['server']} | {row['relayed_per_s']:.0f} | {row['in_flight_or_lost']} "
            f"| {row['cpu_s']:.2f} | {per_cpu:.0f} | "
            f"{ratio(row, 'stunnerd', 'relayed_per_s')} | "
            f"{ratio(row, 'stunnerd', 'relayed_per_cpu_s')} | "
            f"{ratio(row, 'coturn', 'relayed_per_cpu_s')} |"
        )
    return "\n".join(lines)


def median_rows(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    out = []
    for rows in zip(*runs, strict=True):
        merged = dict(rows[0])
        for key in ("relayed_per_s", "in_flight_or_lost", "cpu_s", "relayed_per_cpu_s"):
            merged[key] = statistics.median(row[key] for row in rows)
        out.append(merged)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--window", type=int, default=32, help="packets in flight per client")
    parser.add_argument("--size", type=int, default=120, help="payload bytes (<= 1200)")
    parser.add_argument("--mode", choices=("chan", "send"), default="chan")
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=1, help="runs per server; medians shown")
    parser.add_argument("--servers", default="native,stunnerd,coturn")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument(
        "--idle-allocations", type=int, default=0, help="also measure RSS per idle allocation"
    )
    parser.add_argument("--host-native", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.host_native:
        return host_native()
    servers = [s for s in args.servers.split(",") if s]
    if "coturn" in servers and shutil.which("turnserver") is None:
        log("turnserver is not installed: coturn skipped")
        servers.remove("coturn")
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", "bench/native_relay_bench.py"])
    command += " " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    runs: list[list[dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="native-relay-bench-") as tmp:
        workdir = Path(tmp)
        generator = build_generator(workdir)
        for repeat in range(args.repeat):
            rows = []
            for name in servers:
                host: NativeHost | TurnHost = (
                    NativeHost() if name == "native" else TurnHost(name, workdir)
                )
                try:
                    log(f"run {repeat + 1}/{args.repeat}: {name}")
                    rows.append(run_one(host, generator, args))
                finally:
                    host.stop()
            runs.append(rows)
    rows = median_rows(runs)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()
    sys.stdout.write(
        f"{when}, `{command.strip()}`, {os.cpu_count()} CPUs, load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.clients} clients x {args.window} "
        f"in flight, {args.size} B {args.mode}, {args.duration:g} s, median of {args.repeat}\n\n"
    )
    sys.stdout.write(table(rows) + "\n")
    if args.idle_allocations:
        sys.stdout.write("\n" + idle_allocations(args.idle_allocations))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
