"""Machine-wide CPU of a relayed UDP load (issue 30): coturn, stunnerd with the kernel offload
off and on, and the same load with no relay at all, one generator, one peer, one run.

    sudo .venv/bin/python bench/machine_bench.py                      # the full run
    sudo .venv/bin/python bench/machine_bench.py --duration 5 --repeat 1 --no-max-rate

Offloaded relaying runs in the kernel, in the softirq of whatever process it interrupted (often
the sender), and is charged to no server process: so the figure here is the busy time of all
CPUs over the sending window (its wall time on every CPU minus /proc/stat's idle and iowait,
which a NO_HZ kernel clocks; its busy fields are tick-sampled and miss timer-driven work), per
relayed packet, beside the server process tree's own CPU. The generator's and the peer's cost is in
every such figure; the `direct` row (the same generator sending the same payload straight to
the same peer at the same rate) measures it, and the relay's share is a row's figure minus the
direct row's of the same repeat. The offload rows add the program's own cost from the kernel's
run-time statistics (kernel.bpf_stats_enabled=1 while measuring, restored after) and its
ns/packet per direction under BPF_PROG_TEST_RUN (bench/offload_bench.py's measure).

The generator is bench/machine_load.c (built here with gcc): open-loop ChannelData at a fixed
rate per client, or the bare payload straight to the peer; the echo peer (127.0.0.2) runs in the
same thread. It needs root (the offload, the BPF statistics, a network namespace of its own, so
that no one else's loopback traffic crosses the programs). See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import machine_figures as mf  # noqa: E402  (bench/ is not a package)
import turn_bench  # noqa: E402
from native_relay_bench import transact  # noqa: E402

from stunner_api.stun import Class, Message, Method  # noqa: E402
from stunnerd.turn.auth import long_term_key  # noqa: E402

CHANNEL = 0x4000
PEER_HOST = "127.0.0.2"  # not one of stunnerd's own addresses: the offload relays to it
STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
NETNS_MARK = "MACHINE_BENCH_NETNS"
SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33  # <asm-generic/socket.h>
SOCKET_BUFFER = 4 << 20  # the generator's and the peer's: a 40-ms stall at 50k pps is no loss
CASES = {  # name: (payload bytes, clients, pps per client)
    "udp-120B-c50x1000pps": (120, 50, 1000),
    "udp-1000B-c50x1000pps": (1000, 50, 1000),
    "udp-120B-c200x50pps": (120, 200, 50),
    "udp-1000B-c200x50pps": (1000, 200, 50),
}


def log(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# --- servers and sessions ---------------------------------------------------------------------


def server_for(row: str, workdir: Path, cpus: str | None) -> turn_bench.Server | None:
    """The server of a row: None (direct), coturn, or stunnerd (native path) with an offload
    engine (`stunnerd` = offload_engine None, `stunnerd-TC`, `stunnerd-XDP`)."""
    if row == mf.DIRECT:
        return None
    if row == mf.ANCHOR:
        return turn_bench.Server("coturn", workdir, cpus=cpus)
    engine = row.partition("-")[2] or "None"
    admin = {"offload_engine": engine, "offload_interfaces": ["lo"] if engine != "None" else []}
    return turn_bench.Server("stunnerd", workdir, admin=admin, cpus=cpus)


def bind_channel(sock: socket.socket, port: int, peer: tuple[str, int]) -> None:
    """Allocate with long-term credentials and bind CHANNEL to `peer` (the server is stopped
    after the run, the allocation with it)."""
    key = long_term_key(turn_bench.USER, turn_bench.REALM, turn_bench.PASSWORD)
    first = transact(sock, port, Message(Method.ALLOCATE, Class.REQUEST), None)
    auth = {
        "USERNAME": turn_bench.USER,
        "REALM": first.attributes["REALM"],
        "NONCE": first.attributes["NONCE"],
    }
    steps: list[tuple[Method, dict[str, Any]]] = [
        (Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17, "LIFETIME": 600}),
        (Method.CHANNEL_BIND, {"CHANNEL-NUMBER": CHANNEL, "XOR-PEER-ADDRESS": peer}),
    ]
    for method, attributes in steps:
        request = Message(method, Class.REQUEST, attributes={**attributes, **auth})
        reply = transact(sock, port, request, key)
        if reply.message_class != Class.SUCCESS:
            raise RuntimeError(f"{method.name} failed: {reply.attributes}")


def udp_socket(host: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for option in (SO_RCVBUFFORCE, SO_SNDBUFFORCE):  # past net.core.rmem_max: root
        sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
    sock.bind((host, 0))
    return sock


# --- the kernel's run-time statistics of the offload programs --------------------------------


def bpf_programs(pids: list[int]) -> dict[int, tuple[int, int]]:
    """prog_id -> (run_time_ns, run_cnt) of every BPF program the processes hold a descriptor
    of (from /proc/PID/fdinfo: the kernel prints both while kernel.bpf_stats_enabled is 1)."""
    found: dict[int, tuple[int, int]] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf-prog":
                        continue
                    info = dict(
                        line.split(":", 1)
                        for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines()
                        if ":" in line
                    )
                    found[int(info["prog_id"])] = (
                        int(info.get("run_time_ns", 0)),
                        int(info.get("run_cnt", 0)),
                    )
    return found


@contextlib.contextmanager
def bpf_stats() -> Iterator[None]:
    before = STATS_SYSCTL.read_text().strip()
    STATS_SYSCTL.write_text("1")
    try:
        yield
    finally:
        STATS_SYSCTL.write_text(before)


def test_run_ns(sizes: list[int], samples: int) -> dict[int, tuple[float, float]]:
    """The program's ns/packet under BPF_PROG_TEST_RUN, IPv4: size -> (client -> peer,
    peer -> client), medians of `samples` one-run calls (offload_bench's rows)."""
    import offload_bench as ob

    from stunnerd.offload import layout, program
    from tests.support.packets import udp_frame

    loaded = program.load()
    client, listener, relay, peer = ob.ADDRESSES["IPv4"]
    expires = time.monotonic_ns() + 3600 * 10**9
    out = {}
    try:
        loaded.maps["from_clients"].update(
            layout.client_key(client, listener, ob.CHANNEL),
            layout.Route(relay, peer, expires, 1).pack(),
        )
        loaded.maps["from_peers"].update(
            layout.peer_key(peer, relay),
            layout.Route(listener, client, expires, 1, channel=ob.CHANNEL).pack(),
        )
        for size in sizes:
            data = bytes(size)
            inbound = udp_frame(client, listener, ob.channel_data(data))
            outbound = udp_frame(peer, relay, data)
            out[size] = (
                ob.measure(loaded.fd, inbound, 1, samples, xdp=False)[0],
                ob.measure(loaded.fd, outbound, 1, samples, xdp=False)[0],
            )
    finally:
        loaded.close()
    return out


# --- one run ----------------------------------------------------------------------------------


def build_generator(workdir: Path) -> Path:
    binary = workdir / "machine_load"
    source = HERE / "machine_load.c"
    subprocess.run(["gcc", "-O2", "-std=gnu11", str(source), "-o", str(binary)], check=True)
    return binary


def run_one(
    row: str,
    case: tuple[int, int, float],
    args: argparse.Namespace,
    workdir: Path,
    generator: Path,
    pinned: bool,
) -> dict[str, Any]:
    """Start the row's server (none for direct), allocate, send for --duration, stop the
    server (its allocations end with it). Returns the generator's counts and what was read
    around it: the server tree's CPU, its programs' run-time statistics, `offload off`."""
    payload, clients, pps = case
    server = server_for(row, workdir, args.relay_cpu if pinned else None)
    peer = udp_socket(PEER_HOST)
    socks = [udp_socket("127.0.0.1") for _ in range(clients)]
    try:
        if server is not None:
            server.start()
            for sock in socks:
                bind_channel(sock, server.port, peer.getsockname())
        target = server.port if server is not None else peer.getsockname()[1]
        fds = [peer.fileno(), *(s.fileno() for s in socks)]
        argv = [str(generator), str(args.duration), str(pps), str(payload)]
        argv += ["turn" if server else "direct", str(target), *map(str, fds)]
        if pinned:
            argv = ["taskset", "-c", args.generator_cpu, *argv]
        tree = [server.pid, *turn_bench.descendants(server.pid)] if server else []
        cpu_before = turn_bench.cpu_seconds(server.pid) if server else 0.0
        progs_before = bpf_programs(tree)
        done = subprocess.run(argv, pass_fds=fds, capture_output=True, text=True, check=True)
        run: dict[str, Any] = json.loads(done.stdout)
        if server is not None:
            run["server_cpu_s"] = turn_bench.cpu_seconds(server.pid) - cpu_before
            after = bpf_programs(tree)
            if after:
                run["bpf_run_ns"] = sum(
                    ns - progs_before.get(i, (0, 0))[0] for i, (ns, _) in after.items()
                )
                run["bpf_run_cnt"] = sum(
                    n - progs_before.get(i, (0, 0))[1] for i, (_, n) in after.items()
                )
            assert server.log_path is not None
            text = server.log_path.read_text()
            off = [line for line in text.splitlines() if "offload off" in line]
            if off and row.startswith("stunnerd-"):
                log(f"  {row}: {off[0][:200]}")
                run["offload_off"] = off[0].partition("offload off")[2].strip(" :,")
    finally:
        for sock in (peer, *socks):
            sock.close()
        if server is not None:
            server.stop()
    return run


# --- the whole bench --------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Machine-wide CPU per relayed packet (/proc/stat, all CPUs), one generator "
        "(bench/machine_load.c) and one echo peer for every row: direct (no relay: the "
        "generator's and the peer's own cost, subtracted for the relay's share), coturn (the "
        "anchor of every ratio), stunnerd (native path, offload_engine None) and stunnerd-ENGINE "
        "per --engines; each run starts its server afresh, the rows alternate from repeat to "
        "repeat, the table gives medians. Then one core's maximum rate (--max-*). Needs root; "
        "runs in a network namespace of its own. Tables to stdout, progress to stderr.",
        epilog="The full run (about 15 minutes on a quiet 2-CPU machine): sudo "
        ".venv/bin/python bench/machine_bench.py --engines TC,XDP --json machine.json. "
        "See bench/README.md.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--cases", default=",".join(CASES), help=f"of {', '.join(CASES)}")
    p.add_argument("--engines", default="TC", help="offload engines, a row each: TC,XDP")
    p.add_argument("--no-coturn", action="store_true", help="leave coturn out (no ratios)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of sending per run")
    p.add_argument("--repeat", type=int, default=3, help="runs per row and case (medians)")
    p.add_argument(
        "--testrun-samples",
        type=int,
        default=20000,
        help="BPF_PROG_TEST_RUN one-run calls per direction (0: skip)",
    )
    p.add_argument("--no-max-rate", action="store_true", help="skip the one-core maximum rate")
    p.add_argument(
        "--max-rows",
        help="rows of the one-core maximum rate (default: direct, the kernel's limit, and each "
        "offload row of --engines)",
    )
    p.add_argument("--max-clients", type=int, default=20, help="clients at the maximum rate")
    p.add_argument("--max-start", type=float, default=20000, help="first offered pps (total)")
    p.add_argument("--max-step", type=float, default=1.3, help="offered rate x this per step")
    p.add_argument("--max-steps", type=int, default=14, help="at most this many steps")
    p.add_argument("--max-loss", type=float, default=1.0, help="loss %% that ends the steps")
    p.add_argument("--max-duration", type=float, default=3.0, help="seconds per step")
    p.add_argument("--max-payload", type=int, default=120, help="bytes at the maximum rate")
    p.add_argument("--generator-cpu", default="0", help="taskset CPU of generator and peer")
    p.add_argument("--relay-cpu", default="1", help="taskset CPU of the relay")
    p.add_argument(
        "--host-netns",
        action="store_true",
        help="run in the host's network namespace, not one of its own",
    )
    p.add_argument(
        "--idle-load",
        type=float,
        default=1.0,
        help="wait for the 1-minute load average to drop below this first",
    )
    p.add_argument("--idle-wait", type=float, default=30.0, help="... at most this many seconds")
    p.add_argument("--json", help="write every run's figures here")
    args = p.parse_args(argv)
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        p.error(f"--cases: unknown {', '.join(unknown)} (known: {', '.join(CASES)})")
    if args.max_rows is None:
        args.max_rows = ",".join(r for r in rows_of(args) if r == mf.DIRECT or "-" in r)
    return args


def rows_of(args: argparse.Namespace) -> list[str]:
    engines = [f"stunnerd-{e.strip()}" for e in args.engines.split(",") if e.strip()]
    return [mf.DIRECT, *([] if args.no_coturn else [mf.ANCHOR]), "stunnerd", *engines]


def relay_cases(args: argparse.Namespace, workdir: Path, generator: Path) -> dict[str, Any]:
    rows, clk = rows_of(args), os.sysconf("SC_CLK_TCK")
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    raw = []
    for case in args.cases.split(","):
        for repeat in range(args.repeat):
            order = rows[repeat % len(rows) :] + rows[: repeat % len(rows)]  # alternating
            got = {}
            for row in order:
                log(f"{case} run {repeat + 1}/{args.repeat}: {row} (load {load_average()})")
                got[row] = run_one(row, CASES[case], args, workdir, generator, pinned=False)
            for row in rows:
                fig = mf.figures(got[row], got[mf.DIRECT], clk)
                runs.setdefault((case, row), []).append(fig)
                raw.append({"case": case, "row": row, "repeat": repeat, **got[row], **fig})
    medians = {key: mf.medians(value) for key, value in runs.items()}
    off = {r["row"]: r["offload_off"] for r in raw if r.get("offload_off")}
    return {"medians": medians, "raw": raw, "rows": rows, "offload_off": off}


def max_rates(args: argparse.Namespace, workdir: Path, generator: Path) -> dict[str, Any]:
    clk, results, raw = os.sysconf("SC_CLK_TCK"), {}, []
    short = argparse.Namespace(**{**vars(args), "duration": args.max_duration})
    for row in args.max_rows.split(","):
        steps = []
        for step in range(args.max_steps):
            offered = args.max_start * args.max_step**step
            case = (args.max_payload, args.max_clients, offered / args.max_clients)
            log(f"max rate: {row} at {offered:,.0f} pps offered (load {load_average()})")
            run = run_one(row, case, short, workdir, generator, pinned=True)
            fig = mf.figures(run, None, clk)
            steps.append((offered, fig))
            raw.append({"row": row, "offered": offered, **run, **fig})
            if mf.max_rate(steps, args.max_loss)["stopped_by"] != mf.LAST_STEP:
                break
        off = any(r.get("offload_off") for r in raw if r["row"] == row)
        results[f"{row} (offload off)" if off else row] = mf.max_rate(steps, args.max_loss)
    return {"results": results, "raw": raw}


def idle_busy_pct(seconds: float = 1.0) -> float:
    """How busy all CPUs are with nothing of the bench running: the others' share of every
    figure (this bench cannot subtract it; on a quiet machine it is ~0)."""
    start, before = time.monotonic(), Path("/proc/stat").read_text().splitlines()[0]
    time.sleep(seconds)
    end, after = time.monotonic(), Path("/proc/stat").read_text().splitlines()[0]
    cpus = os.sysconf("SC_NPROCESSORS_ONLN")
    busy, total = mf.busy_seconds(before, after, os.sysconf("SC_CLK_TCK"), end - start, cpus)
    return 100.0 * busy / total if total > 0 else 0.0


def bring_loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", 0x1))  # SIOCSIFFLAGS, IFF_UP


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        sys.stdout.write(
            "machine_bench: skipped, needs root (the offload, kernel.bpf_stats_enabled)" + "\n"
        )
        return 0
    if not args.host_netns and shutil.which("unshare") is None:
        log("no unshare (util-linux): running in the host's network namespace")
    if not args.host_netns and os.environ.get(NETNS_MARK) != "1" and shutil.which("unshare"):
        env = {**os.environ, NETNS_MARK: "1"}
        cmd = ["unshare", "--net", sys.executable, __file__, *(argv or sys.argv[1:])]
        return subprocess.run(cmd, env=env).returncode
    if os.environ.get(NETNS_MARK) == "1":
        bring_loopback_up()
    for name in ("coturn",) if not args.no_coturn else ():
        if shutil.which("turnserver") is None:
            sys.stdout.write(
                f"machine_bench: skipped, needs {name}'s turnserver (apt-get install coturn)" + "\n"
            )
            return 0
    turn_bench.wait_idle(args.idle_load, args.idle_wait)
    idle = idle_busy_pct()
    started = load_average()
    log(f"load average at start: {started}; {os.cpu_count()} CPUs; {idle:.0f} % busy idle")
    with tempfile.TemporaryDirectory(prefix="machine-bench-") as tmp, bpf_stats():
        workdir = Path(tmp)
        generator = build_generator(workdir)
        relay = relay_cases(args, workdir, generator)
        maxed = None if args.no_max_rate else max_rates(args, workdir, generator)
        sizes = sorted({CASES[c][0] for c in args.cases.split(",")})
        testrun = {}
        try:
            testrun = test_run_ns(sizes, args.testrun_samples) if args.testrun_samples else {}
        except Exception as error:  # the object not built, a verifier refusal: said, not fatal
            log(f"BPF_PROG_TEST_RUN skipped: {error}")
    ended = load_average()
    offload_rows = [r for r in relay["rows"] if r.startswith("stunnerd-")]
    out = [
        f"machine_bench: {os.cpu_count()} CPUs, {args.duration:g} s per run, medians of "
        f"{args.repeat}; load average {started} at start, {ended} at the end; the machine "
        f"was {idle:.0f} % busy before the bench ran anything (1 s, all CPUs: other work)",
        "",
        mf.table(relay["medians"], offload_rows, relay["offload_off"]),
    ]
    if testrun:
        out += [
            "BPF_PROG_TEST_RUN, IPv4, ns/packet (median of "
            f"{args.testrun_samples} one-run calls, the kernel's clock included):",
            "",
        ]
        out += [
            f"- {size} B: client -> peer {i:.0f}, peer -> client {o:.0f}"
            for size, (i, o) in testrun.items()
        ]
        out.append("")
    if maxed is not None:
        out += [
            f"One core's maximum rate ({args.max_payload} B, {args.max_clients} clients, generator"
            f" and peer on CPU {args.generator_cpu}, relay on CPU {args.relay_cpu}; loss limit "
            f"{args.max_loss:g} %, {args.max_duration:g} s per step):",
            "",
            mf.max_table(maxed["results"]),
        ]
    sys.stdout.write("\n".join(out) + "\n")
    if args.json:
        keyed = {f"{c}/{r}": m for (c, r), m in relay["medians"].items()}
        data = {"medians": keyed, "runs": relay["raw"], "max_rate": maxed, "testrun": testrun}
        Path(args.json).write_text(json.dumps(data, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
