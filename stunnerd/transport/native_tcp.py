"""TURN-TCP on the native relay engine (issue 21): C frames the streams and carries the media,
Python keeps the protocol.

`NativeTcpTransport` is the TURN-TCP transport when `stunnerd.transport.native` is available
(built, and
STUNNER_NATIVE is not 0); TURN-TLS stays on the Python path (`transports.TcpTransport`: the TLS
session is Python's ssl). The split is the TURN-UDP one (`native_udp`):

- Python accepts (the listening socket is read here), so the per-source and total caps of
  `TcpTransport.admit` hold as on the Python path, and hands each admitted connection to the
  engine serving the fewest (`NativeRelay.add_stream`: the engine keeps a duplicate, Python
  closes its own). There is one engine, each with its thread, per UDP process of the listener
  (`-u`, by default one per usable CPU), as coturn spreads TCP connections over its relay
  threads (issue 21: with one engine thread TURN-TCP lost twice what coturn lost on a busy
  node). A connection and its allocation stay on one engine.
- The engine's thread reads each connection and frames it (RFC 8656 §12.5: STUN by the
  header's length, ChannelData by its length padded to 4; a framing error closes it, as
  `TcpConnectionProtocol` does). It relays ChannelData and plain Send indications of a client
  with an allocation, and its peers' datagrams back (ChannelData padded, or Data indications);
  every other frame (every STUN request) is handed up whole with the connection's handle and
  served here by the same `TurnServer` calls as on the Python path (a full queue to Python
  holds the connection back, unread, rather than drop a request). Python's answers are
  written back through the engine (`stream_send`), in one queue with relayed frames, so their
  order on the stream is kept.
- Allocations are keyed by the connection's remote address, as on the Python path, and added
  to the engine with their stream (`open`); permissions, channels and peer verdicts are
  mirrored as for UDP (`native_udp.NativeAllocation`).
- A connection's close (EOF, reset, a framing error, or one Python asked for) comes up as an
  event after every frame it handed up before; it runs `TurnServer.connection_lost`.
- Deadlines (`Limits.stream_deadline` for the first message and for a frame begun,
  `idle_timeout` without an allocation) are kept by a sweep over the engine's per-stream
  progress (`NativeRelay.streams`) several times per deadline.
- RFC 6062 data connections go back to Python: Python keeps its own descriptor of a new
  connection until its first frame is served (one more descriptor per connection for at most
  `Limits.stream_deadline`), and only while the connections and the descriptors so kept stay
  within the connection cap: past it the oldest kept one is let go (that connection can no
  longer become a data connection: its ConnectionBind gets 400), so `--fd-reserve` stays free.
  When that frame is a ConnectionBind, the engine lets go of the
  connection once the answer is written (`close_stream`: its close does not end the TCP
  connection while Python holds it), and at its SOURCE_CLOSED Python serves the connection as
  a plain byte pipe to its peer (`tcp_relay.DataConnection`); otherwise Python closes its copy.
- Bounded delay: `Limits.stream_latency_bound` and `stream_high_water` are the engine's
  (relaycore/stream.c): late relayed frames are dropped and counted ("latency"), never
  queued for seconds; a queue past the high-water mark drops ("backpressure").
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import socket
import time
from typing import Any, cast

from stunner_api.stun import FRAMING_ERRORS as STREAM_FRAMING_ERRORS

from ..turn.allocation import Allocation, Downstream, RelaySocket
from ..turn.server import TurnServer
from ..turn.sockets import bound_socket
from ..turn.tcp_relay import DataConnection, PeerConnection
from . import native
from .native_glue import NativeAllocation, NativeEngines, relayed_peer
from .transports import MAX_STREAM_BUFFER, TcpConnectionProtocol, TcpTransport

log = logging.getLogger("stunner.listener")

BACKLOG = 100  # asyncio's create_server default, as on the Python path
ACCEPTS_PER_WAKEUP = 64
# The engine's close reasons (stream.c) that are the client's framing: the Python path's words
# (stun.stream_frame_length), and a frame announced longer than the engine's stream buffer.
FRAMING_ERRORS = STREAM_FRAMING_ERRORS | {"a frame longer than the stream buffer"}
ACCEPT_PAUSE = 1.0  # out of descriptors: accept again after this (asyncio's ACCEPT_RETRY_DELAY)
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class NativeConnection:
    """A TURN-TCP connection an engine serves: what Python keeps of it (which engine, its
    handle there). Quacks as the `TcpConnectionProtocol` that `TcpTransport.admit` counts (its
    `source`)."""

    __slots__ = ("engine", "handle", "downstream", "source", "held", "peer")

    def __init__(self, engine: int, downstream: Downstream, held: socket.socket) -> None:
        self.engine = engine
        self.handle = 0
        self.downstream = downstream
        self.source = downstream.address[0]
        self.held: socket.socket | None = held  # Python's descriptor, until the first frame
        self.peer: PeerConnection | None = None  # RFC 6062: bound by a ConnectionBind

    @property
    def key(self) -> tuple[int, int]:
        return (self.engine, self.handle)


class NativeTcpTransport(NativeEngines, TcpTransport):
    """TURN-TCP with the native relay engine (see the module docstring)."""

    def __init__(self, server: TurnServer, engines: int = 1) -> None:
        super().__init__(server)
        self._engines = max(1, engines)
        self._sock: socket.socket | None = None
        # (engine, stream handle) -> connection
        self._streams: dict[tuple[int, int], NativeConnection] = {}
        self._by_remote: dict[Any, NativeConnection] = {}
        self._load: list[int] = []  # connections per engine
        # Connections whose descriptor Python keeps until their first frame, oldest first.
        self._holding: dict[NativeConnection, None] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        limits = server.context.limits
        self._sweep_every = max(0.05, min(1.0, limits.stream_deadline / 4, limits.idle_timeout / 4))

    async def start(self, port: int) -> None:
        sock = bound_socket(socket.SOCK_STREAM, self.server.bind_ip, port)
        relays: list[native.NativeRelay] = []
        try:
            sock.listen(BACKLOG)
            limits = self.server.context.limits
            for _ in range(self._engines):
                relay = native.NativeRelay(None)
                relays.append(relay)
                relay.stream_limits(
                    limits.stream_latency_bound, limits.stream_high_water, MAX_STREAM_BUFFER
                )
                relay.watch_relay_ports(self.server.router.relay_ports)
                relay.start()
        except (OSError, RuntimeError, ValueError) as exc:
            for relay in relays:
                relay.close()
            sock.close()
            raise OSError(f"the native relay engine cannot start: {exc}") from None
        self._sock, self.relays, self._load = sock, relays, [0] * len(relays)
        loop = asyncio.get_running_loop()
        for engine, relay in enumerate(relays):
            relay.attach(loop, functools.partial(self._handed_up, engine))
            self.unwatch_on_stop.append(self.server.router.watch(relay.clear_verdicts))
        loop.add_reader(sock.fileno(), self._accept)
        self.server.scope.relay_path = self
        self._sweeper = loop.call_later(self._sweep_every, self._sweep)

    async def stop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._sock is not None:
            loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self.stop_engines()  # an engine closes every connection it holds
        for connection in list(self._streams.values()):
            self._forget_connection(connection)
            held = self._unhold(connection)
            if held is not None:
                held.close()

    # --- accepting ------------------------------------------------------------------------

    def _accept(self) -> None:
        sock = self._sock
        if sock is None:
            return
        for _ in range(ACCEPTS_PER_WAKEUP):
            try:
                conn, remote = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:  # as asyncio does: pause, then go on
                    log.warning("listener %s: cannot accept: %s", self.server.name, exc)
                    loop = asyncio.get_running_loop()
                    loop.remove_reader(sock.fileno())
                    loop.call_later(ACCEPT_PAUSE, self._resume_accepting, sock)
                return
            self._adopt(conn, remote)  # the engine keeps a duplicate

    def _resume_accepting(self, sock: socket.socket) -> None:
        if self._sock is sock:
            asyncio.get_running_loop().add_reader(sock.fileno(), self._accept)

    def _adopt(self, conn: socket.socket, remote: Any) -> None:
        if not self.relays:
            conn.close()
            return
        engine = self._load.index(min(self._load))  # the engine serving the fewest
        relay = self.relays[engine]
        downstream = Downstream(remote, _discard, stream=True)
        connection = NativeConnection(engine, downstream, conn)
        downstream.splice = functools.partial(self._splice, connection)
        admitted = cast(TcpConnectionProtocol, connection)  # admit counts its `source`
        if not self.admit(admitted):
            conn.close()
            return
        try:
            connection.handle = relay.add_stream(conn)
        except OSError as exc:
            log.warning("listener %s: cannot serve %s: %s", self.server.name, remote, exc)
            self.release(admitted)
            conn.close()
            return
        self._holding[connection] = None
        while self._holding and len(self._connections) + len(self._holding) > self._cap:
            oldest = next(iter(self._holding))  # out of descriptors to spare: let it go
            oldest.downstream.splice = None
            held = self._unhold(oldest)
            if held is not None:
                held.close()
        connection.downstream.send = functools.partial(_send, relay, connection.handle)
        self._streams[connection.key] = connection
        self._by_remote[remote] = connection
        self._load[engine] += 1

    def _splice(self, connection: NativeConnection, peer: PeerConnection) -> None:
        """A ConnectionBind: the engine lets go once the answer (queued next) is written."""
        connection.peer = peer
        relay = self.relays[connection.engine]
        asyncio.get_running_loop().call_soon(relay.close_stream, connection.handle)

    def _unhold(self, connection: NativeConnection) -> socket.socket | None:
        held, connection.held = connection.held, None
        self._holding.pop(connection, None)
        return held

    def _let_go(self, connection: NativeConnection) -> None:
        """After the first frame: Python's descriptor is kept only for a data connection."""
        held = self._unhold(connection)
        if held is None:
            return
        if connection.peer is None:
            held.close()
            return
        peer = connection.peer
        loop = asyncio.get_running_loop()
        task = loop.create_task(loop.connect_accepted_socket(lambda: DataConnection(peer), held))
        task.add_done_callback(functools.partial(_adopted, held, peer))

    def _forget_connection(self, connection: NativeConnection) -> None:
        if self._streams.pop(connection.key, None) is not None and self._load:
            self._load[connection.engine] -= 1
        self._by_remote.pop(connection.downstream.remote, None)
        if connection.held is not None and connection.peer is None:
            held = self._unhold(connection)
            if held is not None:
                held.close()  # closed before its first frame was served
        self.release(cast(TcpConnectionProtocol, connection))
        self.server.connection_lost(connection.downstream.remote)

    # --- deadlines ------------------------------------------------------------------------

    def _sweep(self) -> None:
        """Close what `TcpConnectionProtocol` closes at its deadlines: no first message within
        `stream_deadline`, a frame begun and unfinished for that long, and no message for
        `idle_timeout` without an allocation."""
        if not self.relays:
            return
        self._sweeper = asyncio.get_running_loop().call_later(self._sweep_every, self._sweep)
        limits = self.server.context.limits
        now = time.monotonic()
        for engine, progress in self._progress():
            connection = self._streams.get((engine, progress.handle))
            if connection is None:
                continue
            if not progress.first_done:
                deadline, why = progress.opened + limits.stream_deadline, "deadline passed"
            elif progress.buffered:
                deadline, why = progress.frame_started + limits.stream_deadline, "deadline passed"
            elif connection.downstream.remote in self.server.allocations:
                continue  # silence is the allocation's business
            else:
                deadline, why = progress.last_frame + limits.idle_timeout, "idle"
            if now >= deadline:
                log.debug("listener %s: closing %s: %s", self.server.name, connection.source, why)
                self.relays[engine].close_stream(progress.handle)

    def _progress(self) -> list[tuple[int, native.StreamProgress]]:
        return [(k, p) for k, relay in enumerate(self.relays) for p in relay.streams()]

    def streams(self) -> list[native.StreamProgress]:
        """Every connection's progress, over all engines."""
        return [progress for _, progress in self._progress()]

    # --- RelayPath --------------------------------------------------------------------------

    async def open(self, allocation: Allocation, sock: socket.socket) -> RelaySocket:
        connection = self._by_remote.get(allocation.downstream.remote)
        if not self.relays or connection is None:
            sock.close()
            raise OSError("the connection is gone")
        relay = self.relays[connection.engine]
        try:
            with sock:  # the engine keeps a duplicate: one descriptor per allocation
                sockname = sock.getsockname()
                handle = relay.add_allocation(
                    allocation.downstream.remote, sock, allocation.expires_at, connection.handle
                )
        except (KeyError, ValueError) as exc:  # its connection closed meanwhile
            raise OSError(str(exc)) from None
        forget = functools.partial(self._forget, connection.engine)
        relayed = NativeAllocation(relay, handle, sockname, forget)
        allocation.mirror = relayed
        self.engine_allocations[(connection.engine, handle)] = allocation
        return relayed

    def _forget(self, engine: int, handle: int) -> None:
        self.engine_allocations.pop((engine, handle), None)

    # --- what the engine handed up ----------------------------------------------------------

    def _handed_up(self, engine: int, batch: list[native.HandedUp]) -> None:
        for packet in batch:
            try:
                if packet.source == native.SOURCE_STREAM:
                    self._frame(engine, packet)
                elif packet.source == native.SOURCE_CLOSED:
                    self._closed(engine, packet)
                elif packet.source == native.SOURCE_PEER:
                    self.from_peer(engine, packet)
            except Exception:  # a bug must not take the listener down
                log.exception("listener %s: error handling a packet", self.server.name)

    def _frame(self, engine: int, packet: native.HandedUp) -> None:
        """A whole frame the engine did not relay: what `TcpConnectionProtocol.data_received`
        does with it."""
        connection = self._streams.get((engine, packet.handle))
        if connection is None:
            return
        data, downstream = packet.data, connection.downstream
        allocation = self.server.allocations.get(downstream.remote)
        if allocation is not None and allocation.mirror is not None:
            peer = relayed_peer(allocation, data)
            if peer is not None and self.decided(engine, peer, packet) != native.UP:
                return
        self.server.handle_frame(data, downstream)
        if connection.held is not None and connection.peer is None:
            self._let_go(connection)  # not a data connection: the engine's alone

    def _closed(self, engine: int, packet: native.HandedUp) -> None:
        connection = self._streams.get((engine, packet.handle))
        if connection is None:
            return
        if connection.held is not None and connection.peer is not None:
            self._forget_connection(connection)
            self._let_go(connection)  # a data connection: Python's from now on
            return
        reason = packet.data.decode(errors="replace")
        framing = reason in FRAMING_ERRORS
        if framing:
            self.server.stats.framing_dropped += 1
        log.log(
            logging.INFO if framing else logging.DEBUG,
            "listener %s: closing %s: %s",
            self.server.name,
            connection.downstream.address,
            reason,
        )
        self._forget_connection(connection)


def _adopted(held: socket.socket, peer: PeerConnection, task: asyncio.Future[Any]) -> None:
    if task.cancelled() or task.exception() is not None:
        held.close()
        peer.client_lost()


def _discard(data: bytes) -> None:
    """The send of a connection not (yet) in the engine."""


def _send(relay: native.NativeRelay, handle: int, data: bytes) -> None:
    """A connection's send: queued in the engine, in order with relayed frames (a drop past
    the high-water mark is counted there, as "backpressure")."""
    relay.stream_send(handle, data)
