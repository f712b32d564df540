"""UDP worker processes (`--udp-thread-num N` on the Python relay path): N sockets per TURN-UDP
listener, N processes. (On the native path one process serves the N sockets, an engine thread
each: `native_udp.NativeUdpTransport`.)

Go stunnerd reads each UDP listener with N goroutines on N SO_REUSEPORT sockets. A Python
process has one GIL, so here the N sockets are served by N processes: the primary (this
process: config, admin servers, TCP/TLS/DTLS listeners, and the first socket of each UDP
listener) and N-1 workers (`stunnerd.process.worker_process`).

- The primary binds all N sockets of a listener before any is read (`Listener`), keeps a copy
  of each, and hands socket i to worker i over the worker's control channel. The kernel hashes
  a client's 5-tuple to one socket, so an allocation lives in the worker that got its Allocate.
  A worker that dies is respawned and given the same sockets: the group never changes shape,
  so no other client's flow moves.
- `sync` is level-based: the worker is told the whole current config and which listener
  generations to run, and answers once it runs exactly those.
- Nonces are stateless and keyed by a secret the primary shares, so they verify in any process.
  `admin.user_quota` is counted in the primary's ledger; workers ask it (`acquire`). Relay
  ports reserved by EVEN-PORT are held by the primary too (`reserve` hands the socket over,
  `claim` hands it to the process that got the token's Allocate): see `ledger.py`.
- Workers push their counters every second; `/status` and the metrics add them up.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import os
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from stunner_api.dataplane import StunnerConfig

from ..transport.listener import Listener
from ..turn.counters import ClusterCounters, ListenerCounters, merge
from ..turn.ledger import GRANTED, LocalQuota, Reservations
from ..turn.limits import Limits
from ..turn.router import relay_port_map
from .channel import Channel, Received

log = logging.getLogger("stunner.stunnerd")

SYNC_TIMEOUT = 10.0
RESPAWN_DELAY = 1.0
EXIT_TIMEOUT = 5.0
REPORT_TIMEOUT = 2.0


# --- how many ----------------------------------------------------------------------------


def cgroup_cpu_limit(cpu_max: str) -> float | None:
    """Cores allowed by a cgroup v2 `cpu.max` ("200000 100000" -> 2.0; "max 100000" -> None)."""
    parts = cpu_max.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def usable_cpus() -> int:
    """CPUs this process may run on (affinity), capped by the container's cgroup CPU limit."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as cpu_max:
            limit = cgroup_cpu_limit(cpu_max.read())
    except OSError:
        limit = None
    if limit is not None:
        cpus = min(cpus, max(1, math.ceil(limit)))
    return max(1, cpus)


def udp_process_count(requested: int | None, cpus: int) -> int:
    """Sockets serving each UDP listener: by default one per usable core (issue 21: an engine
    thread per CPU, as coturn runs one relay thread per CPU: on a busy node one engine thread
    got half the CPU coturn's got, and lost packets coturn did not; bench/README.md). On the
    native path they are engine threads of the one process (issue 30), on the Python path
    processes. 0 or 1 means one; more than the cores is capped at the cores (the operator
    passes Go's default of 16)."""
    if requested is None:
        return cpus
    return max(1, min(requested, cpus))


# --- the pool ----------------------------------------------------------------------------


@dataclass
class WorkerCounters:
    """A worker's last report: per-listener (generation, stats, active allocations), per-cluster
    counters, its CPU seconds and RSS."""

    listeners: dict[str, tuple[int, ListenerCounters, int]] = field(default_factory=dict)
    clusters: dict[str, ClusterCounters] = field(default_factory=dict)
    cpu_seconds: float = 0.0
    rss_bytes: int = 0

    @classmethod
    def from_report(cls, body: dict[str, Any]) -> WorkerCounters:
        listeners = {
            name: (
                int(entry["generation"]),
                ListenerCounters.from_dict(entry["stats"]),
                int(entry["active"]),
            )
            for name, entry in body.get("listeners", {}).items()
        }
        clusters = {
            name: ClusterCounters.from_dict(values) for name, values in body["clusters"].items()
        }
        return cls(listeners, clusters, float(body["cpu"]), int(body["rss"]))


class Worker:
    """One worker process as the primary sees it."""

    def __init__(self, index: int, process: asyncio.subprocess.Process, channel: Channel) -> None:
        self.index = index
        self.process = process
        self.channel = channel
        self.sent: dict[str, int] = {}  # listener -> generation whose socket it was handed
        self.synced = 0  # the last sync sequence number it acknowledged
        self.counters = WorkerCounters()
        self.users: collections.Counter[str] = collections.Counter()  # quota held in the ledger
        self.acked = asyncio.Event()
        self.reported = asyncio.Event()


class WorkerPool:
    """`size` worker processes that serve socket 1..size of every TURN-UDP listener."""

    def __init__(
        self,
        size: int,
        secret: bytes,
        users: LocalQuota,
        log_spec: str,
        log_format: str = "text",
        log_override: bool = False,
        limits: Limits | None = None,
    ) -> None:
        self.size = size
        self.limits = limits or Limits()
        # The relay ports of every process, shared (router.relay_port_map).
        self.relay_ports_fd, self.relay_ports = relay_port_map()
        self.users = users
        self.reservations = Reservations()  # EVEN-PORT reservations of every process
        self.secret = secret  # the nonce key: the primary's NonceManager uses it too
        self._log_args = ["--log", log_spec, "--log-format", log_format]
        if log_override:
            self._log_args.append("--log-override")
        self.workers: dict[int, Worker] = {}
        self.retired = WorkerCounters()  # what workers that died had counted
        self._state: tuple[dict[str, Any], dict[str, tuple[int, list[socket.socket]]]] | None
        self._state = None
        self._seq = 0
        self._closing = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await asyncio.gather(*(self._spawn(index) for index in range(self.size)))
        log.info("started %d UDP worker process(es)", self.size)

    async def _spawn(self, index: int) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with theirs:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "stunnerd.process.worker_process",
                str(theirs.fileno()),
                str(index + 1),
                *self._log_args,
                "--relay-ports-fd",
                str(self.relay_ports_fd),
                pass_fds=(theirs.fileno(), self.relay_ports_fd),
                stdin=asyncio.subprocess.DEVNULL,
            )
        worker = Worker(index, process, Channel(ours))
        worker.channel.post(
            {"op": "hello", "secret": self.secret.hex(), "limits": self.limits.to_dict()}
        )
        self.workers[index] = worker
        self._keep(self._serve(worker))

    def _keep(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- level-based sync ---------------------------------------------------------------

    async def sync(self, config: StunnerConfig | None, listeners: Iterable[Listener]) -> None:
        """Make every worker run `config` with exactly these listeners' UDP sockets; returns
        once each live worker has said so (or SYNC_TIMEOUT passed: a stuck worker is logged)."""
        sockets = {lst.name: (lst.generation, lst.worker_sockets) for lst in listeners}
        sockets = {name: entry for name, entry in sockets.items() if entry[1]}
        self._state = (config.to_dict() if config is not None else {}, sockets)
        self._seq += 1
        workers = [w for w in self.workers.values() if not w.channel.closed]
        for worker in workers:
            self._send_state(worker)
        waits = [self._wait_synced(worker, self._seq) for worker in workers]
        await asyncio.gather(*waits)

    def _send_state(self, worker: Worker) -> None:
        if self._state is None:
            return
        config, sockets = self._state
        for name, (generation, group) in sockets.items():
            if worker.sent.get(name) != generation:
                worker.channel.post(
                    {"op": "socket", "listener": name, "generation": generation},
                    group[worker.index],
                )
                worker.sent[name] = generation
        worker.sent = {name: gen for name, gen in worker.sent.items() if name in sockets}
        listeners = {name: generation for name, (generation, _) in sockets.items()}
        worker.channel.post(
            {"op": "sync", "seq": self._seq, "config": config, "listeners": listeners}
        )

    async def _wait_synced(self, worker: Worker, seq: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SYNC_TIMEOUT
        while worker.synced < seq and not worker.channel.closed:
            worker.acked.clear()
            try:
                await asyncio.wait_for(worker.acked.wait(), deadline - loop.time())
            except TimeoutError:
                log.error("UDP worker %d did not apply the config in time", worker.index + 1)
                return

    # --- messages from a worker -----------------------------------------------------------

    async def _serve(self, worker: Worker) -> None:
        while (message := await worker.channel.receive()) is not None:
            try:
                self._handle(worker, message)
            except (KeyError, TypeError, ValueError) as exc:
                log.error("UDP worker %d: bad message %r: %r", worker.index + 1, message, exc)
        await self._lost(worker)

    def _handle(self, worker: Worker, message: Received) -> None:
        body = message.body
        op = body["op"]
        if op == "stats":
            worker.counters = WorkerCounters.from_report(body)
            worker.reported.set()
        elif op == "synced":
            worker.synced = int(body["seq"])
            worker.acked.set()
        elif op == "acquire":
            user, request_id = str(body["user"]), int(body["id"])
            refusal = self.users.try_acquire(user, int(body["quota"]))
            if refusal == GRANTED:
                worker.users[user] += 1
            if request_id:
                worker.channel.post({"op": "acquired", "id": request_id, "refusal": refusal})
        elif op == "release":
            user = str(body["user"])
            if worker.users[user] > 0:
                worker.users[user] -= 1
                self.users.release(user)
        elif op == "reserve" and message.sock is not None:
            self.reservations.hold(bytes.fromhex(str(body["token"])), message.sock)
            worker.channel.post({"op": "reserved", "id": int(body["id"])})
            return
        elif op == "claim":
            sock = self.reservations.take(bytes.fromhex(str(body["token"])))
            worker.channel.post({"op": "claimed", "id": int(body["id"])}, sock, hand_over=True)
        if message.sock is not None:
            message.sock.close()  # a socket only comes with a reservation

    async def _lost(self, worker: Worker) -> None:
        """The worker's channel closed: it exited or crashed. Forget its allocations, keep its
        counters, and (unless we are closing) start a new one on the same sockets."""
        worker.channel.close()
        worker.acked.set()  # nobody waits for a sync or a report from it any more
        worker.reported.set()
        for user, count in worker.users.items():
            for _ in range(count):
                self.users.release(user)
        _fold(self.retired, worker.counters)
        worker.counters = WorkerCounters()
        try:
            code = await asyncio.wait_for(worker.process.wait(), EXIT_TIMEOUT)
        except TimeoutError:
            worker.process.kill()
            code = await worker.process.wait()
        if self._closing:
            return
        log.error("UDP worker %d exited (code %s): restarting it", worker.index + 1, code)
        await asyncio.sleep(RESPAWN_DELAY)
        if self._closing:
            return
        try:
            await self._spawn(worker.index)
        except OSError as exc:
            log.error("cannot restart UDP worker %d: %s", worker.index + 1, exc)
            return
        self._send_state(self.workers[worker.index])

    # --- counters -----------------------------------------------------------------------

    async def refresh(self) -> None:
        """Ask every live worker for its counters now and wait for them (at most
        REPORT_TIMEOUT): a drain must not miss an allocation made within the last second."""
        workers = [w for w in self.workers.values() if not w.channel.closed]
        for worker in workers:
            worker.reported.clear()
            worker.channel.post({"op": "report"})
        waits = [asyncio.wait_for(w.reported.wait(), REPORT_TIMEOUT) for w in workers]
        for outcome in await asyncio.gather(*waits, return_exceptions=True):
            if isinstance(outcome, TimeoutError):
                log.warning("a UDP worker did not report its counters in time")

    def reports(self) -> list[WorkerCounters]:
        """Every live worker's last report, and what the dead ones had counted."""
        return [w.counters for w in self.workers.values()] + [self.retired]

    async def close(self) -> None:
        """Tell every worker to stop (closing its channel) and wait for the processes."""
        self._closing = True
        for worker in self.workers.values():
            worker.channel.post({"op": "exit"})
        for worker in self.workers.values():
            await worker.channel.flush()
        for worker in self.workers.values():
            try:
                await asyncio.wait_for(worker.process.wait(), EXIT_TIMEOUT)
            except TimeoutError:
                log.error("UDP worker %d did not exit: killing it", worker.index + 1)
                worker.process.kill()
                await worker.process.wait()
        for task in list(self._tasks):
            task.cancel()
        self.reservations.close()
        for worker in self.workers.values():
            worker.channel.close()


def _fold(into: WorkerCounters, counters: WorkerCounters) -> None:
    for name, (generation, stats, _active) in counters.listeners.items():
        kept = into.listeners.get(name)
        if kept is not None and kept[0] == generation:
            kept[1].add(stats)
        else:
            merged = ListenerCounters()
            merged.add(stats)
            into.listeners[name] = (generation, merged, 0)
    merge(into.clusters, counters.clusters, ClusterCounters)
    into.cpu_seconds += counters.cpu_seconds
