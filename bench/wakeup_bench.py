"""Syscalls, wakeups and CPU per relayed packet: stunnerd against coturn under one uclient load.

A figure per CPU-second moves with whatever else the machine runs; counts per packet do not. For
each server in turn: `turnutils_uclient` (as turn_bench runs it) sends for `--window` + 8 s;
once it has sent for 2 s, `perf stat` counts, on every thread of the server's process tree for
`--window` s, its context switches, syscalls (all, and epoll_wait, recvmmsg, sendmmsg, recvmsg,
sendto, write) and task-clock, divided by the packets relayed meanwhile (twice the echoes back,
from uclient's progress lines). Also the server's CPU per thread from /proc. Needs `perf`
(linux-perf) with tracepoints and coturn's tools.

    .venv/bin/python bench/wakeup_bench.py                       # 200 clients x 50 pps
    .venv/bin/python bench/wakeup_bench.py --clients 50 --pps 1000
    .venv/bin/python bench/wakeup_bench.py --baseline /path/to/other/checkout --repeat 2

See bench/README.md (issue 30) for what it showed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import turn_bench as tb  # noqa: E402  (the servers, the peer, uclient's output)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.ports import free_port  # noqa: E402

SYSCALLS = ("epoll_wait", "epoll_pwait", "recvmmsg", "sendmmsg", "recvmsg", "sendto", "write")
EVENTS = ("context-switches", "task-clock", "raw_syscalls:sys_enter") + tuple(
    f"syscalls:sys_enter_{name}" for name in SYSCALLS
)


def threads(pid: int) -> dict[int, tuple[int, str]]:
    """Every thread of `pid` and its descendants: tid -> (its process, its name)."""
    out = {}
    for p in [pid, *tb.descendants(pid)]:
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                stat = Path(f"/proc/{p}/task/{tid}/stat").read_text()
                out[int(tid)] = (p, stat[stat.index("(") + 1 : stat.rindex(")")])
        except OSError:
            continue
    return out


def thread_cpu(tids: dict[int, tuple[int, str]]) -> dict[int, float]:
    """Each thread's own utime + stime (/proc/PID/task/TID/stat: /proc/TID/stat of a process's
    first thread is the whole process's)."""
    out = {}
    for tid, (pid, _) in tids.items():
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[tid] = (int(fields[11]) + int(fields[12])) / tb.CLK_TCK
    return out


def received_at(samples: list[tuple[float, int, int]], when: float) -> float:
    """uclient's received count at `when`, between its once-a-second progress lines."""
    before = None
    for sample in samples:
        if sample[0] >= when:
            if before is None:
                return sample[2]
            share = (when - before[0]) / (sample[0] - before[0])
            return before[2] + share * (sample[2] - before[2])
        before = sample
    return samples[-1][2] if samples else 0.0


def measure(server: tb.Server, peer_port: int, args: argparse.Namespace) -> dict[str, Any]:
    interval = max(1, round(1000 / args.pps))
    count = round((args.window + 8) * 1000 / interval)
    argv = ["turnutils_uclient", "-c", "-m", str(args.clients), "-n", str(count),
            "-z", str(interval), "-l", "120", "-e", "127.0.0.1", "-r", str(peer_port),
            "-u", tb.USER, "-w", tb.PASSWORD, "-p", str(server.port), "127.0.0.1"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    samples: list[tuple[float, int, int]] = []
    sending = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            match = tb.UCLIENT_PROGRESS.search(raw.decode(errors="replace"))
            if match:
                samples.append((time.monotonic(), int(match[1]), int(match[2])))
                if int(match[1]) > 0:
                    sending.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not sending.wait(args.clients * 0.5 + 60):
            raise RuntimeError("uclient never started sending")
        time.sleep(2.0)  # past the ramp
        tids = threads(server.pid)
        cpu0, t0 = thread_cpu(tids), time.monotonic()
        perf = subprocess.run(
            [
                "perf",
                "stat",
                "-x",
                ",",
                "-e",
                ",".join(EVENTS),
                "-t",
                ",".join(map(str, tids)),
                "--",
                "sleep",
                str(args.window),
            ],  # fmt: skip
            capture_output=True,
            text=True,
        )
        cpu1, t1 = thread_cpu(tids), time.monotonic()
        proc.wait(timeout=args.window + 120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=5)
    relayed = 2 * (received_at(samples, t1) - received_at(samples, t0))
    counts = {}
    for line in perf.stderr.splitlines():
        fields = line.split(",")
        if len(fields) > 3 and fields[0][:1].isdigit():
            counts[fields[2]] = float(fields[0])
    cpu = sum(cpu1.get(t, 0.0) - cpu0.get(t, 0.0) for t in tids)
    by_name: dict[str, float] = {}
    for tid, (_, name) in tids.items():
        by_name[name] = by_name.get(name, 0.0) + cpu1.get(tid, 0.0) - cpu0.get(tid, 0.0)
    per = {key: value / relayed for key, value in counts.items()} if relayed else {}
    return {
        "server": server.name,
        "relayed": relayed,
        "seconds": t1 - t0,
        "cpu_s": cpu,
        "relayed_per_cpu_s": relayed / cpu if cpu > 0 else None,
        "cpu_by_thread_name": by_name,
        "per_packet": per,
        "load1": os.getloadavg()[0],
    }


def table(rows: list[dict[str, Any]]) -> str:
    short = {"raw_syscalls:sys_enter": "syscalls", "context-switches": "context switches"}
    columns = ["context-switches", "raw_syscalls:sys_enter"] + [
        f"syscalls:sys_enter_{name}" for name in SYSCALLS
    ]
    names = [short.get(c, c.removeprefix("syscalls:sys_enter_")) for c in columns]
    out = [
        "| server | load | relayed pkt/CPU-s | task-clock us/pkt | "
        + " | ".join(f"{n}/pkt" for n in names)
        + " |",
        "|---|---:|---:|---:|" + "---:|" * len(columns),
    ]
    for row in rows:
        per = row["per_packet"]
        cells = [tb.fmt(per.get(c), ".3f") for c in columns]
        clock = per.get("task-clock")  # perf gives milliseconds
        out.append(
            f"| {row['server']} | {row['load1']:.1f} | {tb.fmt(row['relayed_per_cpu_s'], '.0f')} "
            f"| {tb.fmt(clock * 1000 if clock is not None else None, '.2f')} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="stunnerd,coturn")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        metavar="DIR",
        help="another checkout: its stunnerd as stunnerd-base (as turn_bench's)",
    )
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--pps", type=int, default=50)
    parser.add_argument("--window", type=float, default=5.0, help="seconds counted (default 5)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    for tool in ("perf", "turnutils_uclient", "turnutils_peer", "turnserver"):
        if shutil.which(tool) is None:
            tb.log(f"{tool} not found")
            return 2
    wanted = args.servers.split(",") + (["stunnerd-base"] if args.baseline else [])
    names = tuple(n for n in tb.SERVERS if n in wanted)
    rows: list[dict[str, Any]] = []
    workdir = Path(tempfile.mkdtemp(prefix="wakeup-bench-"))
    peer_port = free_port()
    peer = subprocess.Popen(
        ["turnutils_peer", "-p", str(peer_port), "-L", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with tb.running(names, workdir, None, baseline=args.baseline) as servers:
            for repeat in range(args.repeat):
                for name in names if repeat % 2 == 0 else names[::-1]:
                    tb.log(
                        f"{name}, run {repeat + 1}/{args.repeat} (load {os.getloadavg()[0]:.2f})"
                    )
                    rows.append(measure(servers[name], peer_port, args))
    finally:
        peer.terminate()
        peer.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    load = os.getloadavg()
    sys.stdout.write(
        f"{args.clients} clients x {args.pps} pps, 120 B ChannelData, {args.window:g} s counted "
        f"per run; load average at end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n\n"
        + table(rows)
        + "\n"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
