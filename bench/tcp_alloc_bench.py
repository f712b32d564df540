"""RFC 6062 TCP allocations: stunnerd against coturn, side by side in one run.

The generator is coturn's `turnutils_uclient -T` (TCP relay: pairs of clients over TURN-TCP,
each pair's allocations connected to each other through Connect, ConnectionAttempt and
ConnectionBind; its messages go client -> data connection -> peer connection -> the other
allocation's data connection -> the other client and back), everything on 127.0.0.1. For each
case and server: messages sent and received per second, loss, uclient's round-trip time, the
server's CPU-seconds (utime+stime from /proc, the process and its children), messages relayed
per server CPU-second, and stunnerd's ratio of that figure to coturn's. stunnerd runs its native
TURN-TCP path (STUNNER_NATIVE=1; the data connections' bytes are relayed in Python on both
paths); `--servers stunnerd,stunnerd-py,coturn` adds the pure-Python path.

    .venv/bin/python bench/tcp_alloc_bench.py                 # 4 cases, about a minute
    .venv/bin/python bench/tcp_alloc_bench.py --duration 4 --clients 2,10 --sizes 100,1000

See bench/README.md for the latest table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))  # turn_bench: the process helpers (bench/ is not a package)
sys.path.insert(0, str(BENCH.parent))

from turn_bench import cpu_seconds, stop  # noqa: E402

from tests.support.ports import free_port  # noqa: E402

USER, PASSWORD, REALM = "user", "pass", "stunner.l7mp.io"
INTERVAL_MS = 5  # uclient -z: 200 messages per second per client


def log(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def start(name: str, port: int, workdir: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    if name.startswith("stunnerd"):
        env["STUNNER_NATIVE"] = "0" if name == "stunnerd-py" else "1"
        config = {
            "version": "v1",
            "admin": {"name": "bench", "loglevel": "all:WARN", "healthcheck_endpoint": ""},
            "auth": {
                "type": "static",
                "realm": REALM,
                "credentials": {"username": USER, "password": PASSWORD},
            },
            "listeners": [
                {"name": "bench-tcp", "protocol": "TURN-TCP", "address": "127.0.0.1",
                 "port": port, "routes": ["tcp-backends"]}
            ],
            "clusters": [
                {"name": "tcp-backends", "type": "STATIC", "protocol": "TCP",
                 "endpoints": ["127.0.0.1/32"]}
            ],
        }  # fmt: skip
        path = workdir / f"stunnerd-{port}.json"
        path.write_text(json.dumps(config))
        stunnerd = shutil.which("stunnerd", path=str(Path(sys.executable).parent)) or "stunnerd"
        argv = [stunnerd, "-c", str(path), "--allocation-rate=1000000", "--error-rate=1000000",
                "--error-rate-total=0"]  # fmt: skip
    else:
        argv = [
            "turnserver", "-n", "--listening-ip", "127.0.0.1", "--listening-port", str(port),
            "--relay-ip", "127.0.0.1", "--lt-cred-mech", "--user", f"{USER}:{PASSWORD}",
            "--realm", REALM, "--no-tls", "--no-dtls", "--allow-loopback-peers", "--no-cli",
            "--no-stdout-log", "--log-file", "/dev/null", "--simple-log",
            "--pidfile", str(workdir / f"turnserver-{port}.pid"),
        ]  # fmt: skip
    logfile = open(workdir / f"{name}-{port}.log", "wb")  # noqa: SIM115  (the child keeps it)
    proc = subprocess.Popen(argv, stdout=logfile, stderr=subprocess.STDOUT, env=env)
    logfile.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # ready: its TCP port answers
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited: {(workdir / f'{name}-{port}.log').read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc
        except OSError:
            time.sleep(0.1)
    stop(proc, name)
    raise RuntimeError(f"{name} did not listen on {port}")


def uclient(port: int, clients: int, size: int, messages: int) -> dict[str, Any]:
    argv = [
        "turnutils_uclient", "-T", "-u", USER, "-w", PASSWORD, "-p", str(port),
        "-m", str(clients), "-n", str(messages), "-l", str(size), "-z", str(INTERVAL_MS),
        "127.0.0.1",
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=messages / 50 + 60)
    wall = time.monotonic() - started
    text = done.stdout + done.stderr
    totals = re.findall(r"tot_send_msgs=(\d+), tot_recv_msgs=(\d+)", text)
    lost = re.search(r"Total lost packets (\d+) \(([\d.]+)%\)", text)
    rtt = re.search(r"Average round trip delay ([\d.]+) ms", text)
    transmit = re.search(r"Total transmit time is (\d+)", text)
    if not totals or lost is None:
        raise RuntimeError(f"uclient failed (exit {done.returncode}): {text[-2000:]}")
    sent, received = (int(v) for v in totals[-1])
    seconds = max(1.0, float(transmit.group(1)) if transmit else wall)
    return {
        "sent": sent,
        "received": received,
        "loss_pct": 100.0 * (sent - received) / sent if sent else 0.0,
        "uclient_lost": int(lost.group(1)),
        "rtt_ms": float(rtt.group(1)) if rtt else float("nan"),
        "sent_per_s": sent / seconds,
        "wall_s": wall,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="stunnerd,coturn")
    parser.add_argument("--clients", default="2,10", help="uclient -m (pairs: even)")
    parser.add_argument("--sizes", default="100,1000", help="uclient -l, bytes")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds of sending")
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    for tool in ("turnutils_uclient", "turnserver"):
        if shutil.which(tool) is None:
            log(f"{tool} is not on PATH: apt-get install coturn")
            return 2
    servers = args.servers.split(",")
    messages = int(args.duration * 1000 / INTERVAL_MS)
    log(f"load average at start: {os.getloadavg()}")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tcp-alloc-bench-") as tmp:
        workdir = Path(tmp)
        procs: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
        try:
            for name in servers:
                port = free_port()
                procs[name] = (start(name, port, workdir), port)
            order = list(servers)
            for clients in (int(c) for c in args.clients.split(",")):
                for size in (int(s) for s in args.sizes.split(",")):
                    case = f"tcp-alloc-{size}-c{clients}-{1000 // INTERVAL_MS}pps"
                    order.reverse()  # alternate who goes first
                    for name in order:
                        proc, port = procs[name]
                        before = cpu_seconds(proc.pid)
                        figures = uclient(port, clients, size, messages)
                        cpu = cpu_seconds(proc.pid) - before
                        relayed = figures["received"] * 2  # each echo crosses the relay twice
                        figures.update(
                            case=case,
                            server=name,
                            cpu_s=cpu,
                            per_cpu_s=relayed / cpu if cpu > 0 else float("inf"),
                            load=os.getloadavg()[0],
                        )
                        log(f"{case} {name}: {figures}")
                        rows.append(figures)
        finally:
            for name, (proc, _) in procs.items():
                stop(proc, name)
    log(f"load average at end: {os.getloadavg()}")
    out = sys.stdout
    out.write(
        "| case | server | sent/s | loss | RTT ms | server CPU s | msgs per CPU-s "
        "| ratio to coturn |\n|---|---|---|---|---|---|---|---|\n"
    )
    anchor = {r["case"]: r["per_cpu_s"] for r in rows if r["server"] == "coturn"}
    for r in rows:
        base = anchor.get(r["case"])
        ratio = f"{r['per_cpu_s'] / base:.2f}" if base and r["server"] != "coturn" else "-"
        out.write(
            f"| {r['case']} | {r['server']} | {r['sent_per_s']:.0f} | {r['loss_pct']:.2f}% "
            f"| {r['rtt_ms']:.2f} | {r['cpu_s']:.2f} | {r['per_cpu_s']:.0f} | {ratio} |\n"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
