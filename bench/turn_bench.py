"""TURN relay benchmark: stunnerd against coturn, side by side in one run.

Same generator for both servers: coturn's `turnutils_uclient` -> TURN server -> `turnutils_peer`
(UDP echo), everything on 127.0.0.1. For each case and server: sent and received packets/s,
loss, RTT, server CPU-seconds (utime+stime from /proc, the server process and its children),
relayed packets per server CPU-second (each echoed packet counted twice: client->peer and
peer->client) and the stunnerd/coturn ratio of that figure. Then the allocation setup rate
(allocations/s, long-term auth, our own asyncio client) and the RSS per idle allocation.
`stunnerd` runs its native relay path (STUNNER_NATIVE=1); `--servers stunnerd,stunnerd-py,coturn`
adds the pure-Python path (STUNNER_NATIVE=0) to the same run.

    .venv/bin/python bench/turn_bench.py            # default matrix, < 5 minutes
    .venv/bin/python bench/turn_bench.py --quick    # 3 cases
    .venv/bin/python bench/turn_bench.py --cases 'udp-*-c10-*' --json out.json
    .venv/bin/python bench/turn_bench.py --cases 'tls-*'   # TURN-TLS (uclient -S), opt-in

See bench/README.md for the columns and the latest table.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import datetime
import fnmatch
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.support: the suite's free_port, as the other benches

from stunner_api.stun import Class, Message, Method, StunError, parse_message  # noqa: E402
from stunnerd.turn.auth import long_term_key  # noqa: E402
from tests.support.ports import free_port  # noqa: E402

USER = "user"
PASSWORD = "pass"
REALM = "stunner.l7mp.io"
CLK_TCK = os.sysconf("SC_CLK_TCK")
SERVERS = ("stunnerd", "stunnerd-base", "stunnerd-py", "coturn")
# the native relay path (STUNNER_NATIVE=1), the same from another checkout (--baseline), Python
STUNNERDS = ("stunnerd", "stunnerd-base", "stunnerd-py")
DEFAULT_SERVERS = "stunnerd,coturn"


def log(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


# --- cases -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    transport: str  # "udp" | "tcp" | "tls"
    method: str  # "chan" (ChannelData) | "send" (Send indications, uclient -s)
    size: int  # payload bytes (uclient -l)
    clients: int  # uclient -m
    pps: int  # per client

    @property
    def name(self) -> str:
        return f"{self.transport}-{self.method}-{self.size}-c{self.clients}-{self.pps}pps"


def full_matrix() -> list[Case]:
    loads = [(1, 1000), (10, 1000), (50, 1000), (100, 1000), (200, 50)]
    return [
        Case(t, m, s, c, p)
        for t in ("udp", "tcp")
        for m in ("chan", "send")
        for s in (120, 1000)
        for c, p in loads
    ]


def default_matrix() -> list[Case]:
    """The default, about 5 minutes at --duration 2: the media targets of issue 21 over UDP and
    TCP (120 B ChannelData and Send indications at 50 clients x 1000 pps, 120 B ChannelData at
    200 clients x 50 pps, audio-like), 1000 B ChannelData at 50 clients over UDP, and 120 B
    ChannelData at 10 and 100 clients over UDP and 10 over TCP. `--full` runs the whole 40-case
    product (about 15 minutes)."""
    cases = [Case("udp", "chan", 120, c, 1000) for c in (10, 50, 100)]
    cases += [Case("udp", "send", 120, 50, 1000), Case("udp", "chan", 1000, 50, 1000)]
    cases.append(Case("udp", "chan", 120, 200, 50))
    cases += [Case("tcp", "chan", 120, c, 1000) for c in (10, 50)]
    cases += [Case("tcp", "send", 120, 50, 1000), Case("tcp", "chan", 120, 200, 50)]
    return cases


def is_target(case: Case) -> bool:
    """A case the media targets hold for (issue 21): 50 x 1000 pps and 200 x 50 pps."""
    return (case.clients, case.pps) in ((50, 1000), (200, 50)) and case.transport != "tls"


def tls_cases() -> list[Case]:
    """TURN-TLS, selected by name only (`--cases 'tls-*'`): both servers then also listen
    for TLS on a port of their own, with a self-signed certificate."""
    return [Case("tls", "chan", 120, c, 1000) for c in (10, 50)]


def quick_matrix() -> list[Case]:
    return [
        Case("udp", "chan", 120, 10, 1000),
        Case("udp", "chan", 120, 50, 1000),
        Case("tcp", "chan", 120, 10, 1000),
    ]


# --- processes -------------------------------------------------------------------------------


def cpu_times(pid: int) -> tuple[float, float]:
    """(utime, stime) of `pid` and its live descendants, seconds (fields 14 and 15 of
    /proc/PID/stat)."""
    user = system = 0.0
    for p in [pid, *descendants(pid)]:
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        user += int(fields[11]) / CLK_TCK
        system += int(fields[12]) / CLK_TCK
    return user, system


def cpu_seconds(pid: int) -> float:
    return sum(cpu_times(pid))


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def socket_drops(pids: list[int]) -> int:
    """Datagrams the kernel dropped at the UDP sockets `pids` hold, their receive buffers full
    (the `drops` column of /proc/net/udp and udp6, by the sockets' inodes): where a run's loss
    happened, the server's sockets or the peer's."""
    inodes: set[str] = set()
    for p in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{p}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    total = 0
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) >= 13 and fields[9] in inodes:
                    total += int(fields[12])
    return total


def udp_rcvbuf_errors() -> int:
    """The network namespace's UDP receive-buffer drops (RcvbufErrors of /proc/net/snmp's Udp
    and /proc/net/snmp6's Udp6): every socket's, the generator's included."""
    total = 0
    with contextlib.suppress(OSError):
        lines = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines()]
        for names, values in zip(lines, lines[1:], strict=False):
            if names[0] == "Udp:" and values[0] == "Udp:" and "RcvbufErrors" in names:
                total += int(values[names.index("RcvbufErrors")])
                break
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/snmp6").read_text().splitlines():
            if line.startswith("Udp6RcvbufErrors"):
                total += int(line.split()[1])
    return total


def rss_kib(pid: int) -> int:
    """VmRSS of `pid` and its live descendants, KiB."""
    total = 0
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def stop(proc: subprocess.Popen[bytes], name: str) -> None:
    """SIGTERM; for stunnerd (which drains on SIGTERM) a second signal, SIGINT, exits at once;
    SIGKILL after a short wait."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    if name in STUNNERDS:
        time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=3)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=3)


class Server:
    def __init__(
        self,
        name: str,
        workdir: Path,
        udp_threads: int | None = None,
        abuse_limits: bool = False,
        tls: bool = False,
        admin: dict[str, Any] | None = None,
        cpus: str | None = None,
        baseline: Path | None = None,
    ) -> None:
        self.name = name
        self.admin = admin or {}  # more of stunnerd's admin settings (machine_bench: offload)
        self.cpus = cpus  # run under `taskset -c CPUS` (machine_bench's one-core rate)
        self.baseline = baseline  # stunnerd-base: the checkout its stunnerd package comes from
        self.port = free_port()
        self.tls_port = free_port() if tls else None  # a TURN-TLS listener there
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self.workdir = workdir
        self.udp_threads = udp_threads  # stunnerd -u; None: its default
        # The throughput cases make every allocation from one source IP, so stunnerd's
        # per-source abuse limits are lifted there; the flood bench measures them (True).
        self.abuse_limits = abuse_limits

    def start(self) -> None:
        logfile = (self.workdir / f"{self.name}-{self.port}.log").open("wb")
        env = None
        if self.name in STUNNERDS:
            env = {**os.environ, "STUNNER_NATIVE": "0" if self.name == "stunnerd-py" else "1"}
            if self.name == "stunnerd-base":
                if self.baseline is None:
                    raise RuntimeError("stunnerd-base needs --baseline DIR")
                env["PYTHONPATH"] = str(self.baseline)
            config = {
                "version": "v1",
                "admin": {
                    "name": "bench",
                    "loglevel": "all:WARN",
                    "healthcheck_endpoint": "",
                    **self.admin,
                },
                "auth": {
                    "type": "static",
                    "realm": REALM,
                    "credentials": {"username": USER, "password": PASSWORD},
                },
                "listeners": [
                    {
                        "name": f"bench-{t}",
                        "protocol": f"TURN-{t.upper()}",
                        "address": "127.0.0.1",
                        "port": self.port,
                        "routes": ["allow-any"],
                    }
                    for t in ("udp", "tcp")
                ]
                + self._tls_listener(),
                "clusters": [
                    {"name": "allow-any", "type": "STATIC", "protocol": "UDP",
                     "endpoints": ["127.0.0.0/8"]}
                ],
            }  # fmt: skip
            path = self.workdir / f"stunnerd-{self.port}.json"
            path.write_text(json.dumps(config))
            stunnerd = shutil.which("stunnerd", path=str(Path(sys.executable).parent))
            argv = [stunnerd or "stunnerd", "-c", str(path)]
            if not self.abuse_limits:
                argv += ["--allocation-rate=1000000", "--error-rate=1000000",
                         "--error-rate-total=0", "--unauthenticated-rate=0"]  # fmt: skip
            if self.udp_threads is not None:
                argv.append(f"--udp-thread-num={self.udp_threads}")
        else:
            argv = [
                "turnserver", "-n", "--listening-ip", "127.0.0.1",
                "--listening-port", str(self.port), "--relay-ip", "127.0.0.1",
                "--lt-cred-mech", "--user", f"{USER}:{PASSWORD}", "--realm", REALM,
                "--no-tls", "--no-dtls", "--allow-loopback-peers", "--no-cli",
                "--no-stdout-log", "--log-file", "/dev/null", "--simple-log",
                "--pidfile", str(self.workdir / f"turnserver-{self.port}.pid"),
            ]  # fmt: skip
            if self.tls_port is not None:
                cert, key = self._tls_files()
                argv.remove("--no-tls")
                argv += ["--tls-listening-port", str(self.tls_port), "--cert", cert, "--pkey", key]
        if self.cpus is not None:
            argv = ["taskset", "-c", self.cpus, *argv]
        self.log_path = Path(logfile.name)
        self.proc = subprocess.Popen(argv, stdout=logfile, stderr=subprocess.STDOUT, env=env)
        logfile.close()
        self._wait_ready()

    def _tls_listener(self) -> list[dict[str, Any]]:
        if self.tls_port is None:
            return []
        from stunnerd.transport.certificates import self_signed_certificate

        cert, key = self_signed_certificate("127.0.0.1")  # base64 PEM, as the config has it
        return [
            {"name": "bench-tls", "protocol": "TURN-TLS", "address": "127.0.0.1",
             "port": self.tls_port, "routes": ["allow-any"], "cert": cert, "key": key}
        ]  # fmt: skip

    def _tls_files(self) -> tuple[str, str]:
        """coturn's certificate and key: PEM files in the work directory."""
        from stunnerd.transport.certificates import self_signed_certificate

        paths = []
        for kind, text in zip(("cert", "key"), self_signed_certificate("127.0.0.1"), strict=True):
            path = self.workdir / f"turnserver-{self.port}.{kind}.pem"
            path.write_bytes(base64.b64decode(text))
            paths.append(str(path))
        return paths[0], paths[1]

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}")
            with socket.socket() as sock:
                sock.settimeout(0.2)
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    time.sleep(0.3)
                    return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not listening on {self.port} after 10 s")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, self.name)


@contextlib.contextmanager
def running(
    names: tuple[str, ...],
    workdir: Path,
    udp_threads: int | None,
    tls: bool = False,
    baseline: Path | None = None,
) -> Iterator[dict[str, Server]]:
    servers: dict[str, Server] = {}
    try:
        for name in names:
            servers[name] = Server(name, workdir, udp_threads, tls=tls, baseline=baseline)
            servers[name].start()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


# --- one uclient run -------------------------------------------------------------------------

UCLIENT_PROGRESS = re.compile(r"msz=\d+, tot_send_msgs=(\d+), tot_recv_msgs=(\d+)")
_TOTAL = re.compile(r"start_mclient: tot_send_msgs=(\d+), tot_recv_msgs=(\d+)")
_LOST = re.compile(r"Total lost packets (\d+) \(([\d.]+)%\)")
_RTT = re.compile(r"Average round trip delay ([\d.]+) ms")


PROBE = Path(__file__).resolve().parent / "turn_probe.py"
PROBE_NICE = -10  # the probe's priority when the bench may raise it (root): see turn_probe.py


def start_probe(
    case: Case, server: Server, peer_port: int, duration: float
) -> subprocess.Popen[bytes]:
    """turn_probe.py through the same server and transport as the load, at 50 pps."""
    port = server.tls_port if case.transport == "tls" else server.port
    argv = [sys.executable, str(PROBE), "--transport", case.transport, "--port", str(port),
            "--peer-port", str(peer_port), "--rate", "50",
            "--duration", f"{duration:.2f}"]  # fmt: skip
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, preexec_fn=_raise_priority
    )


def _raise_priority() -> None:
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, PROBE_NICE)


def probe_result(proc: subprocess.Popen[bytes] | None, timeout: float) -> dict[str, Any]:
    if proc is None:
        return {"error": "the load never started sending"}
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"error": "timed out"}
    try:
        return cast(dict[str, Any], json.loads(out.decode() or "{}"))
    except ValueError:
        return {"error": "no result"}


def run_uclient(
    case: Case,
    server: Server,
    peer_port: int,
    duration: float,
    probe_peer: int | None = None,
    peer_pid: int | None = None,
) -> dict[str, Any]:
    interval = max(1, round(1000 / case.pps))
    count = max(10, round(duration * 1000 / interval))
    argv = ["turnutils_uclient", "-c", "-m", str(case.clients), "-n", str(count),
            "-z", str(interval), "-l", str(case.size), "-e", "127.0.0.1",
            "-r", str(peer_port), "-u", USER, "-w", PASSWORD]  # fmt: skip
    if case.transport == "tls":
        assert server.tls_port is not None
        argv += ["-t", "-S", "-p", str(server.tls_port)]
    else:
        argv += ["-p", str(server.port)]
    if case.transport == "tcp":
        argv.append("-t")
    if case.method == "send":
        argv.append("-s")
    argv.append("127.0.0.1")
    timeout = 3 * duration + 30 + case.clients * 0.05
    samples: list[tuple[float, int, int]] = []  # (monotonic, sent, received), ~1/s
    lines: list[str] = []
    user0, system0 = cpu_times(server.pid)
    server_pids = [server.pid, *descendants(server.pid)]
    drops0 = (
        socket_drops(server_pids),
        socket_drops([peer_pid] if peer_pid else []),
        udp_rcvbuf_errors(),
    )
    setup_cpu: float | None = None  # the server's CPU until uclient starts sending
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    probe: subprocess.Popen[bytes] | None = None
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            lines.append(line)
            match = UCLIENT_PROGRESS.search(line)
            if match:
                samples.append((time.monotonic(), int(match[1]), int(match[2])))
                if setup_cpu is None and int(match[1]) > 0:
                    setup_cpu = cpu_seconds(server.pid) - user0 - system0
                if probe is None and probe_peer is not None and int(match[1]) > 0:
                    # the load is sending: the probe's call runs through most of its window
                    probe = start_probe(case, server, probe_peer, max(1.0, 0.75 * duration))
        proc.wait(timeout=5)
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    end = time.monotonic()
    probed = probe_result(probe, timeout=duration + 15) if probe_peer is not None else {}
    user1, system1 = cpu_times(server.pid)
    cpu = (user1 - user0) + (system1 - system0)
    server_pids = [server.pid, *descendants(server.pid)]
    drops1 = (
        socket_drops(server_pids),
        socket_drops([peer_pid] if peer_pid else []),
        udp_rcvbuf_errors(),
    )
    text = "".join(lines)
    total = _TOTAL.search(text)
    result: dict[str, Any] = {
        "server": server.name, "case": case.name, "cpu_s": cpu,
        "sys_pct": 100.0 * (system1 - system0) / cpu if cpu > 0 else None,
        "setup_cpu_s": setup_cpu,
        "wall_s": end - start, "messages_per_client": count, "load1": os.getloadavg()[0],
        "timed_out": total is None,
        # receive-buffer drops during the run: the server's sockets, the echo peer's, and the
        # whole namespace's (the generator's sockets and anyone else's on the machine too)
        "server_drops": drops1[0] - drops0[0], "peer_drops": drops1[1] - drops0[1],
        "udp_rcvbuf_errors": drops1[2] - drops0[2],
        **{f"probe_{k}": v for k, v in probed.items()},
    }  # fmt: skip
    if total is None:
        for key in ("sent", "received", "sent_pps", "peak_sent_pps", "recv_pps", "loss_pct",
                    "rtt_ms", "relayed_per_cpu_s", "sending_relayed_per_cpu_s"):  # fmt: skip
            result[key] = None
        return result
    sent, received = int(total[1]), int(total[2])
    lost = _LOST.search(text)
    rtt = _RTT.search(text)
    # The sending window: from the last progress sample with nothing sent to the first one
    # at the final count (or the end of the run): 1 s resolution, so the rates are lower
    # bounds of the mean rate while sending.
    t0 = start
    for t, s, _ in samples:
        if s == 0:
            t0 = t
    t1 = next((t for t, s, _ in samples if s >= sent), end)
    r1 = next((t for t, _, r in samples if r >= received), end)
    result.update(
        sent=sent,
        received=received,
        sent_pps=sent / max(t1 - t0, 1e-3),
        peak_sent_pps=max(
            (
                (b[1] - a[1]) / (b[0] - a[0])
                for a, b in zip(samples, samples[1:], strict=False)
                if b[0] - a[0] > 0.5
            ),
            default=None,
        ),
        recv_pps=received / max(r1 - t0, 1e-3),
        loss_pct=float(lost[2]) if lost else 100.0 * (sent - received) / max(sent, 1),
        rtt_ms=float(rtt[1]) if rtt else None,
        relayed_per_cpu_s=2 * received / cpu if cpu > 0 else None,
        # the same from the first packet sent on: the relaying, without the allocations
        sending_relayed_per_cpu_s=(
            2 * received / (cpu - setup_cpu)
            if setup_cpu is not None and cpu - setup_cpu > 0
            else None
        ),
        progress=[(round(t - start, 2), s, r) for t, s, r in samples],
    )
    return result


# --- allocations (own client) ----------------------------------------------------------------


class _AllocClient(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None
        self.replies: asyncio.Queue[bytes] = asyncio.Queue()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.replies.put_nowait(data)


async def _transact(client: _AllocClient, request: Message, key: bytes | None) -> Message:
    assert client.transport is not None
    data = request.encode(integrity_key=key)
    for attempt in range(5):
        client.transport.sendto(data)
        reply = await reply_to(client.replies, request, time.monotonic() + 0.5 * (2**attempt))
        if reply is not None:
            return reply
    raise TimeoutError("no reply")


async def reply_to(
    replies: asyncio.Queue[bytes], request: Message, deadline: float
) -> Message | None:
    """The answer to `request` among `replies` before `deadline` (monotonic), or None."""
    while (left := deadline - time.monotonic()) > 0:
        try:
            raw = await asyncio.wait_for(replies.get(), left)
        except TimeoutError:
            return None
        try:
            reply = parse_message(raw)
        except StunError:
            continue
        if reply.transaction_id == request.transaction_id:
            return reply
    return None


async def _allocate(client: _AllocClient, key: bytes) -> bool:
    attrs: dict[str, Any] = {"REQUESTED-TRANSPORT": 17, "LIFETIME": 3600}
    first = await _transact(client, Message(Method.ALLOCATE, Class.REQUEST, attributes=attrs), None)
    if first.message_class == Class.SUCCESS:
        return True
    nonce = first.attributes.get("NONCE")
    realm = first.attributes.get("REALM", REALM)
    if nonce is None:
        return False
    attrs = {"USERNAME": USER, "REALM": realm, "NONCE": nonce, **attrs}
    second = await _transact(client, Message(Method.ALLOCATE, Class.REQUEST, attributes=attrs), key)
    return second.message_class == Class.SUCCESS


async def _allocations(port: int, count: int, concurrency: int) -> tuple[int, float, list[Any]]:
    """`count` allocations, each on its own UDP socket (one 5-tuple each), `concurrency` in
    flight. Returns (successes, seconds, transports: close them to let them go idle... later)."""
    loop = asyncio.get_running_loop()
    key = long_term_key(USER, REALM, PASSWORD)
    clients: list[_AllocClient] = []
    for _ in range(count):
        _, proto = await loop.create_datagram_endpoint(
            _AllocClient, remote_addr=("127.0.0.1", port)
        )
        clients.append(proto)
    semaphore = asyncio.Semaphore(concurrency)

    async def one(client: _AllocClient) -> bool:
        async with semaphore:
            try:
                return await _allocate(client, key)
            except TimeoutError:
                return False

    start = time.monotonic()
    results = await asyncio.gather(*(one(c) for c in clients))
    seconds = time.monotonic() - start
    return sum(results), seconds, [c.transport for c in clients]


def allocation_bench(server: Server, count: int, concurrency: int) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        await asyncio.sleep(0.5)
        rss0 = rss_kib(server.pid)
        cpu0 = cpu_seconds(server.pid)
        ok, seconds, transports = await _allocations(server.port, count, concurrency)
        cpu = cpu_seconds(server.pid) - cpu0
        await asyncio.sleep(1.0)  # idle allocations, client sockets still open
        rss1 = rss_kib(server.pid)
        for transport in transports:
            transport.close()
        return {
            "server": server.name, "allocations": count, "succeeded": ok,
            "seconds": seconds, "alloc_per_s": ok / seconds if seconds else None,
            "cpu_s": cpu, "alloc_per_cpu_s": ok / cpu if cpu > 0 else None,
            "rss_before_kib": rss0, "rss_after_kib": rss1,
            "rss_per_alloc_kib": (rss1 - rss0) / ok if ok else None,
            "load1": os.getloadavg()[0],
        }  # fmt: skip

    return asyncio.run(main())


# --- output ----------------------------------------------------------------------------------


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def run_label(row: dict[str, Any]) -> str:
    """The case name, with `#k` for the k-th of several repeats."""
    repeat = row.get("repeat")
    return row["case"] if repeat is None else f"{row['case']} #{repeat}"


def max_loss(by_repeat: dict[int, dict[str, dict[str, Any]]], server: str) -> str:
    losses = [
        runs[server]["loss_pct"]
        for runs in by_repeat.values()
        if runs.get(server, {}).get("loss_pct") is not None
    ]
    return fmt(max(losses), ".2f") if losses else "-"


def repeat_table(rows: list[dict[str, Any]]) -> str:
    """Per case and stunnerd path over its repeats: the ratios to coturn, their median, the
    worst loss."""
    out = [
        "| case | server | runs | ratio to coturn per run | median | max loss % "
        "| coturn max loss % |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    runs: dict[str, dict[int, dict[str, dict[str, Any]]]] = {}
    for row in rows:
        runs.setdefault(row["case"], {}).setdefault(row["repeat"], {})[row["server"]] = row
    for case, by_repeat in runs.items():
        for name in STUNNERDS:
            each = [
                ratio(
                    servers.get(name, {}).get("relayed_per_cpu_s"),
                    servers.get("coturn", {}).get("relayed_per_cpu_s"),
                )
                for servers in by_repeat.values()
            ]
            ratios = [r for r in each if r is not None]
            if not ratios:
                continue
            out.append(
                f"| {case} | {name} | {len(by_repeat)} "
                f"| {', '.join(format(r, '.2f') + 'x' for r in ratios)} "
                f"| {fmt(statistics.median(ratios), '.2f') + 'x'} "
                f"| {max_loss(by_repeat, name)} | {max_loss(by_repeat, 'coturn')} |"
            )
    return "\n".join(out)


def probe_cell(row: dict[str, Any]) -> str:
    if row.get("probe_error"):
        return f"({row['probe_error']})"
    return " / ".join(fmt(row.get(f"probe_{k}_ms"), ".1f") for k in ("p50", "p99", "max"))


def median_of(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [row[key] for row in rows if row.get(key) is not None]
    return statistics.median(values) if values else None


# The media targets (issue 21), per case over the medians of its runs: loss within 0.5
# percentage points of coturn's, the probe's p99 within 2 x coturn's + 5 ms, then efficiency.
LOSS_MARGIN_PP = 0.5
P99_FACTOR, P99_MARGIN_MS = 2.0, 5.0
EFFICIENCY = {"udp": 1.5, "tcp": 1.0}


def target_misses(
    case: Case, ours: dict[str, float | None], anchor: dict[str, float | None]
) -> list[str]:
    """What a stunnerd row misses of the targets (empty: all met), from median figures."""
    misses = []
    loss, anchor_loss = ours["loss_pct"], anchor["loss_pct"]
    if loss is None or anchor_loss is None or loss > anchor_loss + LOSS_MARGIN_PP:
        misses.append("loss")
    p99, anchor_p99 = ours["probe_p99_ms"], anchor["probe_p99_ms"]
    if p99 is None or anchor_p99 is None or p99 > P99_FACTOR * anchor_p99 + P99_MARGIN_MS:
        misses.append("p99")
    r = ratio(ours["relayed_per_cpu_s"], anchor["relayed_per_cpu_s"])
    if case.transport in EFFICIENCY and (r is None or r < EFFICIENCY[case.transport]):
        misses.append(f"efficiency<{EFFICIENCY[case.transport]}x")
    return misses


def summary_table(rows: list[dict[str, Any]], cases: list[Case]) -> str:
    """Per case and server, the medians over its runs, and for stunnerd on a target case
    (`is_target`) which targets are met."""
    out = [
        "| case | server | runs | loss % | probe p50 ms | probe p99 ms | probe max ms "
        "| relayed pkt/CPU-s | ratio to coturn | targets | set-up CPU-s "
        "| sending pkt/CPU-s | sending ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    keys = ("loss_pct", "probe_p50_ms", "probe_p99_ms", "probe_max_ms", "relayed_per_cpu_s",
            "setup_cpu_s", "sending_relayed_per_cpu_s")  # fmt: skip
    for case in cases:
        medians: dict[str, dict[str, float | None]] = {}
        runs: dict[str, int] = {}
        for name in SERVERS:
            mine = [r for r in rows if r["case"] == case.name and r["server"] == name]
            if mine:
                medians[name] = {k: median_of(mine, k) for k in keys}
                runs[name] = len(mine)
        anchor = medians.get("coturn")
        for name, m in medians.items():
            r = ratio(m["relayed_per_cpu_s"], anchor["relayed_per_cpu_s"]) if anchor else None
            sending = m["sending_relayed_per_cpu_s"]
            rs = ratio(sending, anchor["sending_relayed_per_cpu_s"]) if anchor else None
            verdict = ""
            if name in STUNNERDS and anchor and is_target(case):
                misses = target_misses(case, m, anchor)
                verdict = "met" if not misses else "MISSED: " + ", ".join(misses)
            out.append(
                f"| {case.name} | {name} | {runs[name]} | {fmt(m['loss_pct'], '.2f')} "
                f"| {fmt(m['probe_p50_ms'], '.1f')} | {fmt(m['probe_p99_ms'], '.1f')} "
                f"| {fmt(m['probe_max_ms'], '.1f')} | {fmt(m['relayed_per_cpu_s'], '.0f')} "
                f"| {fmt(r, '.2f') + 'x' if r and name != 'coturn' else ''} | {verdict} "
                f"| {fmt(m['setup_cpu_s'], '.2f')} | {fmt(sending, '.0f')} "
                f"| {fmt(rs, '.2f') + 'x' if rs and name != 'coturn' else ''} |"
            )
    return "\n".join(out)


def relay_table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| case | server | sent/s | peak sent/s | recv/s | loss % | RTT ms "
        "| probe p50 / p99 / max ms | probe loss % | CPU-s | sys % "
        "| relayed pkt/CPU-s | ratio to coturn | drops server / peer / all |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_case: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_case.setdefault(run_label(row), {})[row["server"]] = row
    for case, servers in by_case.items():
        anchor = servers.get("coturn", {}).get("relayed_per_cpu_s")
        for name in SERVERS:
            if name not in servers:
                continue
            row = servers[name]
            r = ratio(row["relayed_per_cpu_s"], anchor) if name in STUNNERDS else None
            status = " (timeout)" if row["timed_out"] else ""
            out.append(
                f"| {case} | {name}{status} | {fmt(row['sent_pps'], '.0f')} "
                f"| {fmt(row['peak_sent_pps'], '.0f')} "
                f"| {fmt(row['recv_pps'], '.0f')} | {fmt(row['loss_pct'], '.2f')} "
                f"| {fmt(row['rtt_ms'], '.3f')} | {probe_cell(row)} "
                f"| {fmt(row.get('probe_loss_pct'), '.1f')} | {fmt(row['cpu_s'], '.2f')} "
                f"| {fmt(row['sys_pct'], '.0f')} | {fmt(row['relayed_per_cpu_s'], '.0f')} "
                f"| {fmt(r, '.2f') + 'x' if r else ''} "
                f"| {row.get('server_drops', '-')} / {row.get('peer_drops', '-')} "
                f"/ {row.get('udp_rcvbuf_errors', '-')} |"
            )
    return "\n".join(out)


def alloc_table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| server | allocations ok | allocations/s | CPU-s | allocations/CPU-s | RSS before MiB "
        "| RSS after MiB | RSS per idle allocation KiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        out.append(
            f"| {row['server']} | {row['succeeded']}/{row['allocations']} "
            f"| {fmt(row['alloc_per_s'], '.0f')} | {fmt(row['cpu_s'], '.2f')} "
            f"| {fmt(row['alloc_per_cpu_s'], '.0f')} "
            f"| {row['rss_before_kib'] / 1024:.1f} | {row['rss_after_kib'] / 1024:.1f} "
            f"| {fmt(row['rss_per_alloc_kib'], '.1f')} |"
        )
    by = {row["server"]: row for row in rows}
    for name in STUNNERDS:
        if name not in by or "coturn" not in by:
            continue
        a = ratio(by[name]["alloc_per_s"], by["coturn"]["alloc_per_s"])
        c = ratio(by[name]["alloc_per_cpu_s"], by["coturn"]["alloc_per_cpu_s"])
        m = ratio(by[name]["rss_per_alloc_kib"], by["coturn"]["rss_per_alloc_kib"])
        out.append(
            f"| {name}/coturn | | {fmt(a, '.2f')}x | | {fmt(c, '.2f')}x | | | {fmt(m, '.2f')}x |"
        )
    return "\n".join(out)


# --- main ------------------------------------------------------------------------------------


def wait_idle(threshold: float, max_wait: float) -> None:
    deadline = time.monotonic() + max_wait
    while True:
        load = os.getloadavg()
        if load[0] < threshold:
            log(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}: idle enough")
            return
        if time.monotonic() >= deadline:
            log(f"WARNING: load average {load[0]:.2f} still >= {threshold} after "
                f"{max_wait:.0f} s; going on, figures are less trustworthy")  # fmt: skip
            return
        log(f"load average {load[0]:.2f} >= {threshold}, waiting (up to {max_wait:.0f} s)...")
        time.sleep(min(5.0, max(0.1, deadline - time.monotonic())))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="3 cases (UDP 10/50, TCP 10)")
    group.add_argument("--full", action="store_true", help="the full 40-case product")
    parser.add_argument(
        "--cases",
        default="",
        help="comma-separated glob patterns on case names, e.g. 'udp-*-c10-*'",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=2.0,
        help="nominal seconds of sending per case (default 2)",
    )
    parser.add_argument(
        "--idle-load",
        type=float,
        default=1.0,
        help="wait for the 1-min load average to drop below this (default 1.0)",
    )
    parser.add_argument(
        "--idle-wait",
        type=float,
        default=30.0,
        help="wait at most this many seconds for it (default 30)",
    )
    parser.add_argument(
        "--allocations",
        type=int,
        default=1000,
        help="allocations for the setup-rate and RSS test (0 skips; default 1000)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=50, help="allocations in flight (default 50)"
    )
    parser.add_argument(
        "--servers",
        default=DEFAULT_SERVERS,
        help="comma-separated subset of stunnerd (the native relay path), stunnerd-base "
        "(the same from --baseline), stunnerd-py (STUNNER_NATIVE=0: the pure-Python path) and "
        "coturn (default stunnerd,coturn)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        metavar="DIR",
        help="another checkout (its extension built in place) whose stunnerd runs as "
        "stunnerd-base, through PYTHONPATH, in the same run (added to --servers)",
    )
    parser.add_argument(
        "--udp-threads",
        type=int,
        default=None,
        metavar="N",
        help="stunnerd --udp-thread-num (default: stunnerd's own, one per usable CPU)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run every case N times (servers alternating) and add the median ratio per case",
    )
    parser.add_argument(
        "--contend",
        type=int,
        default=0,
        metavar="N",
        help="run N CPU-bound processes at the servers' priority for the whole relay run "
        "(a busy node; default 0)",
    )
    parser.add_argument("--json", type=Path, help="also write every measurement to this file")
    parser.add_argument("--list", action="store_true", help="list the selected cases and exit")
    return parser.parse_args(argv)  # fmt: skip


@contextlib.contextmanager
def contention(count: int) -> Iterator[None]:
    """`count` CPU-bound processes at this process's priority (the servers' too), stopped on
    the way out: the busy node a Kubernetes stunnerd shares (issue 21)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    if hogs:
        log(f"contention: {count} CPU-bound processes (pids {', '.join(str(h.pid) for h in hogs)})")
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop processes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.repeat < 1:
        log("--repeat must be at least 1")
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    cases = quick_matrix() if args.quick else full_matrix() if args.full else default_matrix()
    if args.cases:
        patterns = [p.strip() for p in args.cases.split(",") if p.strip()]
        pool = full_matrix() + tls_cases() if not args.quick else cases
        cases = [c for c in pool if any(fnmatch.fnmatch(c.name, p) for p in patterns)]
    if args.list:
        sys.stdout.write("".join(f"{c.name}\n" for c in cases))
        return 0
    wanted = args.servers.split(",") + (["stunnerd-base"] if args.baseline else [])
    names = tuple(n for n in SERVERS if n in wanted)
    for tool in ("turnutils_uclient", "turnutils_peer", "turnserver"):
        if shutil.which(tool) is None:
            log(f"{tool} not found: install coturn")
            return 2
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    wait_idle(args.idle_load, args.idle_wait)
    load_start = os.getloadavg()
    relay_rows: list[dict[str, Any]] = []
    alloc_rows: list[dict[str, Any]] = []
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="turn-bench-") as tmp:
        workdir = Path(tmp)
        if args.allocations > 0:
            with running(names, workdir, args.udp_threads, baseline=args.baseline) as servers:
                for name in names:
                    log(f"allocations: {args.allocations} against {name}...")
                    alloc_rows.append(
                        allocation_bench(servers[name], args.allocations, args.concurrency)
                    )
        peer_port, probe_peer_port = free_port(), free_port()
        peers = [
            subprocess.Popen(
                ["turnutils_peer", "-L", "127.0.0.1", "-p", str(port)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            for port in (peer_port, probe_peer_port)  # the load's echo, and the probe's own
        ]
        try:
            tls = any(case.transport == "tls" for case in cases)
            with (
                running(names, workdir, args.udp_threads, tls, args.baseline) as servers,
                contention(args.contend),
            ):
                for i, case in enumerate(cases):
                    for repeat in range(1, args.repeat + 1):
                        # alternate the order so neither server always runs on a warmer machine
                        order = names if (i + repeat) % 2 else names[::-1]
                        for name in order:
                            log(f"[{i + 1}/{len(cases)}] {case.name} on {name}"
                                f"{f' (run {repeat}/{args.repeat})' if args.repeat > 1 else ''}"
                                f" (load {os.getloadavg()[0]:.2f})...")  # fmt: skip
                            row = run_uclient(
                                case, servers[name], peer_port, args.duration, probe_peer_port,
                                peers[0].pid,
                            )  # fmt: skip
                            if args.repeat > 1:
                                row["repeat"] = repeat
                            relay_rows.append(row)
        finally:
            for peer in peers:
                stop(peer, "turnutils_peer")
    load_end = os.getloadavg()
    elapsed = time.monotonic() - t_start
    cmd = " ".join(["bench/turn_bench.py", *(argv if argv is not None else sys.argv[1:])])
    header = (
        f"{started}, `{cmd}`, {os.cpu_count()} CPUs, {elapsed:.0f} s; load average "
        f"{load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f} at start, "
        f"{load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f} at end; "
        f"{args.contend} CPU-bound contending processes\n"
    )
    out = [header]
    if relay_rows:
        out += [summary_table(relay_rows, cases), ""]
        out += [relay_table(relay_rows), ""]
        if args.repeat > 1:
            out += [repeat_table(relay_rows), ""]
    if alloc_rows:
        out += [alloc_table(alloc_rows), ""]
    sys.stdout.write("\n".join(out))
    if args.json:
        args.json.write_text(json.dumps({
            "started": started, "command": cmd, "elapsed_s": elapsed,
            "load_start": load_start, "load_end": load_end,
            "relay": relay_rows, "allocations": alloc_rows,
        }, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
