"""A UDP worker process, `python -m stunnerd.process.worker_process CONTROL_FD INDEX`.

It serves the sockets the primary hands it, one per TURN-UDP listener, with the config the
primary last synced; it has no config source, admin server or other listeners of its own.
It ignores SIGINT and SIGTERM (a terminal's Ctrl-C or a process-group signal must not cut
allocations short while the primary drains) and exits when the primary says so or its control
channel closes, which is also what happens when the primary dies.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import mmap
import signal
import socket
import sys
from collections.abc import Sequence
from functools import partial
from typing import Any

from stunner_api.dataplane import ConfigError, ListenerConfig, StunnerConfig, validate_config

from ..surface import logs
from ..surface.runtime import cpu_seconds, event_loop_factory, rss_bytes
from ..transport.listener import Listener
from ..turn.auth import NonceManager
from ..turn.ledger import FULL, Quota, Reservations
from ..turn.limits import Limits
from ..turn.router import relay_port_map
from ..turn.server import ServerContext
from .channel import Channel, Received
from .core import ApplyError, Build, DataplaneCore, Plan

log = logging.getLogger("stunner.stunnerd")

STATS_INTERVAL = 1.0
ANSWER_TIMEOUT = 5.0


class PrimaryAnswers:
    """Questions a worker asks the primary over its control channel, matched by id."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Received]] = {}

    async def ask(self, body: dict[str, Any], sock: socket.socket | None = None) -> Received | None:
        """Post `body` (handing `sock` over) with a fresh id; the answer, or None after
        ANSWER_TIMEOUT (logged)."""
        request_id = next(self._ids)
        answer = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = answer
        self.channel.post({**body, "id": request_id}, sock, hand_over=True)
        try:
            return await asyncio.wait_for(answer, ANSWER_TIMEOUT)
        except TimeoutError:
            log.error("no answer from the primary to %r", body["op"])
            return None
        finally:
            self._waiting.pop(request_id, None)

    def answered(self, message: Received) -> None:
        answer = self._waiting.get(int(message.body["id"]))
        if answer is not None and not answer.done():
            answer.set_result(message)
        elif message.sock is not None:
            message.sock.close()  # a reserved socket nobody waits for any more


class PrimaryQuota:
    """The `Quota` of a worker: `admin.user_quota`, --max-allocations and the drain are held in
    the primary's `LocalQuota`, and an Allocate waits for its answer (FULL when none comes)."""

    def __init__(self, answers: PrimaryAnswers) -> None:
        self.answers = answers

    async def acquire(self, user_id: str, quota: int) -> str:
        answer = await self.answers.ask({"op": "acquire", "user": user_id, "quota": quota})
        if answer is None:
            return FULL
        return str(answer.body["refusal"])

    def release(self, user_id: str) -> None:
        self.answers.channel.post({"op": "release", "user": user_id})


class ReservationClient(Reservations):
    """Reserved relay ports held in the primary: a token is claimed in whichever process the
    client's next Allocate reaches."""

    def __init__(self, answers: PrimaryAnswers) -> None:
        super().__init__()
        self.answers = answers

    async def reserve(self, token: bytes, sock: socket.socket) -> None:
        """Hand the socket to the primary and wait until it holds it: the client may send the
        token on as soon as it is answered."""
        await self.answers.ask({"op": "reserve", "token": token.hex()}, sock)

    async def claim(self, token: bytes) -> socket.socket | None:
        answer = await self.answers.ask({"op": "claim", "token": token.hex()})
        return answer.sock if answer is not None else None


class WorkerDataplane:
    """The listeners, auth and routes of one worker, reconciled to each sync (`DataplaneCore`)."""

    def __init__(
        self,
        nonces: NonceManager,
        users: Quota,
        log_override: bool,
        reservations: Reservations | None = None,
        limits: Limits | None = None,
        relay_ports: mmap.mmap | None = None,
    ) -> None:
        reservations = reservations if reservations is not None else Reservations()
        self.core = DataplaneCore(
            nonces,
            users,
            reservations,
            logs.LevelControl.OVERRIDDEN if log_override else logs.LevelControl.PROCESS,
            limits,
            relay_ports,
            logging.DEBUG,
        )
        self.handed: dict[tuple[str, int], socket.socket] = {}  # sockets not yet served

    @property
    def listeners(self) -> dict[str, Listener]:
        return self.core.listeners

    @property
    def context(self) -> ServerContext | None:
        return self.core.context

    def hand(self, name: str, generation: int, sock: socket.socket) -> None:
        old = self.handed.pop((name, generation), None)
        if old is not None:
            old.close()
        self.handed[(name, generation)] = sock

    async def sync(self, config: StunnerConfig, wanted: dict[str, int]) -> None:
        """Run exactly the listener generations in `wanted`, on the sockets handed for them."""
        configs = {lc.name: lc for lc in config.listeners}
        to_stop = [
            listener
            for name, listener in self.listeners.items()
            if wanted.get(name) != listener.generation or name not in configs
        ]
        stopping = {listener.name for listener in to_stop}
        builds: dict[str, Build] = {}
        for name, generation in wanted.items():
            if (name in self.listeners and name not in stopping) or name not in configs:
                continue
            if (name, generation) not in self.handed:
                log.error("listener %s: no socket for generation %d", name, generation)
                continue
            builds[name] = partial(self._on_handed_socket, configs[name], generation)
        try:
            await self.core.apply(config, Plan(to_stop, builds, rollback=False))
        except ApplyError as exc:  # the primary applied it, so this is not expected
            log.error("UDP worker: %s (keeping the previous config)", exc)
        for key in [key for key in self.handed if wanted.get(key[0]) != key[1]]:
            self.handed.pop(key).close()

    def report(self) -> dict[str, Any]:
        return {
            "op": "stats",
            "listeners": {
                name: {
                    "generation": listener.generation,
                    "stats": listener.stats().to_dict(),
                    "active": len(listener.server.allocations),
                }
                for name, listener in self.listeners.items()
            },
            "clusters": {
                name: counters.to_dict() for name, counters in self.core.cluster_counters().items()
            },
            "cpu": cpu_seconds(),
            "rss": rss_bytes(),
        }

    def _on_handed_socket(
        self, config: ListenerConfig, generation: int, context: ServerContext
    ) -> Listener:
        """The worker's copy of a listener, on the socket the primary handed for it (taken
        only now: a sync refused before it leaves the socket for the next one)."""
        sock = self.handed.pop((config.name, generation))
        return Listener(config, context, sock=sock, generation=generation)

    async def close(self) -> None:
        await self.core.close()
        for sock in self.handed.values():
            sock.close()
        self.handed.clear()


async def serve(channel: Channel, log_override: bool, relay_ports: mmap.mmap | None = None) -> None:
    hello = await channel.receive()
    if hello is None or hello.body.get("op") != "hello":
        log.error("UDP worker: no hello from the primary")
        return
    answers = PrimaryAnswers(channel)
    dataplane = WorkerDataplane(
        NonceManager(bytes.fromhex(hello.body["secret"])),
        PrimaryQuota(answers),
        log_override,
        ReservationClient(answers),
        Limits.from_dict(hello.body.get("limits", {})),
        relay_ports,
    )
    reporter = asyncio.get_running_loop().create_task(_report(channel, dataplane))
    try:
        while (message := await channel.receive()) is not None:
            body = message.body
            op = body.get("op")
            if op == "socket" and message.sock is not None:
                dataplane.hand(str(body["listener"]), int(body["generation"]), message.sock)
            elif op == "sync":
                try:
                    config = validate_config(body["config"]) if body["config"] else None
                except ConfigError as exc:
                    log.error("UDP worker: refusing a config from the primary: %s", exc)
                    continue
                if config is not None:
                    await dataplane.sync(config, {k: int(v) for k, v in body["listeners"].items()})
                channel.post({"op": "synced", "seq": body["seq"]})
            elif op == "report":
                channel.post(dataplane.report())
            elif op in ("acquired", "reserved", "claimed"):
                answers.answered(message)
            elif op == "exit":
                break
    finally:
        reporter.cancel()
        await dataplane.close()
        channel.post(dataplane.report())
        await channel.flush()
        channel.close()


async def _report(channel: Channel, dataplane: WorkerDataplane) -> None:
    while True:
        await asyncio.sleep(STATS_INTERVAL)
        channel.post(dataplane.report())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stunnerd.process.worker_process")
    parser.add_argument("control_fd", type=int)
    parser.add_argument("index", type=int)
    parser.add_argument("--log", default=logs.DEFAULT_LEVEL_SPEC)
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    parser.add_argument("--log-override", action="store_true")
    parser.add_argument("--relay-ports-fd", type=int)
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    logs.setup(args.log, args.log_format)

    async def run() -> None:
        relay_ports = None
        if args.relay_ports_fd is not None:
            relay_ports = relay_port_map(args.relay_ports_fd)[1]
        await serve(Channel(socket.socket(fileno=args.control_fd)), args.log_override, relay_ports)

    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
