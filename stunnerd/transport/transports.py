"""One transport per listener protocol: TURN-UDP, -TCP, -TLS and -DTLS sockets, each feeding
one `TurnServer`.

A transport binds its socket(s), frames packets and demultiplexes ChannelData (RFC 8656 §12)
from STUN; all TURN logic lives in `turn.py`, written once for every transport. The transport
registry in `listener.py` picks the transport of a listener's protocol.
"""

from __future__ import annotations

import asyncio
import collections
import fcntl
import logging
import socket
import ssl
from collections.abc import Callable, Container
from typing import TYPE_CHECKING, Any, Protocol, cast

from stunner_api import stun

from ..turn.allocation import Downstream
from ..turn.auth import nonce_binding
from ..turn.server import TurnServer
from ..turn.sockets import bound_socket, bound_udp_group
from ..turn.stateless import STRANGER_IPS as STRANGER_IPS  # native_udp takes it from here
from ..turn.stateless import UnsignedBudget, signed_nonce, unsigned_allocate
from ..turn.tcp_relay import PeerConnection

if TYPE_CHECKING:
    from .dtls import DtlsListenerProtocol

# `certificates` and `dtls` (cryptography, pyOpenSSL: ~12 MiB) are imported when a TLS or DTLS
# transport is made (the registry in `listener.py`, `DtlsTransport`), so a TURN-UDP/TCP stunnerd
# never loads them (bench/rss_bench.py).

log = logging.getLogger("stunner.listener")

MAX_STREAM_BUFFER = 4 * 65536  # a TCP client may have this much unframed data in flight


# Datagrams read from a UDP listener socket per turn of the event loop (issue 28 #6): asyncio's
# datagram transport reads one per turn, ~40k/s on a core here, below a spoofed flood's 80k/s
# (the kernel then drops honest clients' datagrams with the flood's); in batches one core
# reads 250k/s (bench/README.md).
READ_BATCH = 64
# Full batches read in a row from a UDP listener socket after which this process is behind (at
# least 16 x 64 datagrams were waiting each time: ~25 ms of a flood's work, above what a
# moment without the CPU leaves behind on a busy node): strangers' unsigned
# messages read meanwhile are dropped unanswered (issue 28) until a read empties the socket,
# so a flood the CPU cannot answer in full costs a read each, and established clients'
# packets behind it are not kept waiting. (The socket's memory use would say it sooner, but
# UDP gives back what was read in chunks of a quarter of its buffer.)
SHED_AFTER = 16


def has_integrity(data: bytes) -> bool:
    """Whether a STUN message carries MESSAGE-INTEGRITY: its attribute headers walked by their
    lengths (padded to 4) while a whole header fits; nothing is verified. The native engine's
    relay_has_integrity, byte for byte."""
    offset, end = 20, len(data)
    while offset + 4 <= end:
        if data[offset] == 0 and data[offset + 1] == 0x08:
            return True
        length = (data[offset + 2] << 8) | data[offset + 3]
        offset += 4 + length + (-length % 4)
    return False


class UdpListenerProtocol(asyncio.DatagramProtocol):
    def __init__(
        self, server: TurnServer, engine_limits_strangers: bool = False, engine: int = 0
    ) -> None:
        self.server = server
        self.engine = engine  # the native engine whose socket this is (Downstream.engine)
        self.transport: asyncio.DatagramTransport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.pins: ClientPins | None = None  # one process per listener: see ClientPins
        self.full_batches = 0  # batches in a row that found READ_BATCH datagrams (read_batch)
        self.behind = False  # full_batches reached SHED_AFTER
        # Strangers' STUN without MESSAGE-INTEGRITY: per source IP (--unauthenticated-rate,
        # issue 20) and in total (issue 28); None where the native engine has already spent
        # the tokens (and answered the unsigned Allocates itself).
        limits = server.context.limits
        self.unsigned: UnsignedBudget | None = (
            None if engine_limits_strangers else UnsignedBudget(limits, STRANGER_IPS)
        )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        # The measured hot path (bench/README.md), kept inline on purpose: every client packet
        # of every UDP allocation comes through here, and each extra Python call or attribute
        # hop costs ~0.1 us of a ~5 us budget. ChannelData from a client with an allocation
        # goes straight to that allocation, one dict lookup and one method call, without
        # passing through TurnServer.handle.
        if (
            data and (data[0] & 0xC0) == 0x40
        ):  # stun.is_channel_data, inline (TurnServer.handle_frame)
            server = self.server
            allocation = server.allocations.get(addr)
            if allocation is None:
                server.stats.dropped += 1  # a stranger's, as the native engine counts it
            elif server.additional:  # some dual allocation: its channel may be the other's
                server.handle_channel_data(data, addr)
            else:
                allocation.relay_channel_data(data)
            return
        allocation = self.server.allocations.get(addr)
        if allocation is not None:
            self.server.handle(data, allocation.downstream)
            if self.pins is not None:
                self.pins.pin(addr)
        elif (
            data[4:8] != stun.COOKIE_BYTES
            or data[0] & 0xC0
            or len(data) != 20 + ((data[2] << 8) | data[3])
            or data[3] & 3
            or len(data) > self.server.context.limits.max_udp_message
        ):
            # Garbage from a stranger, judged on its first bytes as the native engine judges
            # it (relay.c, plausible); parse_message would refuse it all the same.
            self.server.stats.dropped += 1
        elif self.server.context.error_answers.exhausted(addr):
            self.server.stats.rate_limited += 1  # a stranger over its error budget (turn.py)
        elif self.unsigned is not None and not self._nonce_verifies(data, addr):
            self._unsigned(data, addr)
        else:
            self.server.handle(data, self._downstream(addr))

    def _nonce_verifies(self, data: bytes, addr: Any) -> bool:
        """Whether a stranger's message is signed with a nonce of ours for its address: one
        HMAC, before the MESSAGE-INTEGRITY's (which needs the parse and the user's key). One
        that is not (unsigned, or a forged or stale nonce) spends the unsigned budgets."""
        nonce = signed_nonce(data)
        if nonce is None:
            return False
        server = self.server
        return server.context.nonces.is_valid(nonce, nonce_binding(server.name, (addr[0], addr[1])))

    def _unsigned(self, data: bytes, addr: Any) -> None:
        """A stranger's STUN without MESSAGE-INTEGRITY (the Python path): dropped while the
        process is behind (`behind`), then its source IP's budget and the process's (issues 20
        and 28), then an Allocate is answered with 401 at once and without state
        (`stateless`), anything else as any request."""
        server = self.server
        assert self.unsigned is not None
        if self.behind or not self.unsigned.admit(addr):
            server.stats.rate_limited += 1
            return
        if unsigned_allocate(data, server.context.limits.max_attributes):
            answer = server.unauthorized_answer(data, addr)
            if answer is not None:
                assert self.transport is not None
                self.transport.sendto(answer, addr)
                return
        server.handle(data, self._downstream(addr))

    def _downstream(self, addr: Any) -> Downstream:
        transport = self.transport
        assert transport is not None

        def send(data: bytes) -> None:
            transport.sendto(data, addr)

        return Downstream(addr, send, stream=False, engine=self.engine)

    def error_received(self, exc: Exception) -> None:
        log.debug("listener %s: %s", self.server.name, exc)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class ListenerSocket(asyncio.DatagramTransport):
    """The sending side of a UDP listener socket that the event loop reads in batches
    (`read_batch`) or a native engine reads: answers go out at once, and one the kernel cannot
    take (a full buffer, an ICMP error) is lost, as a UDP datagram may be."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock

    def sendto(self, data: Any, addr: Any = None) -> None:
        try:
            self._sock.sendto(data, addr)
        except OSError as exc:
            log.debug("listener socket: %s", exc)


class BatchReader(Protocol):
    """What `read_batch` hands datagrams to: a TURN-UDP or a TURN-DTLS listener protocol."""

    full_batches: int  # batches in a row that found READ_BATCH datagrams
    behind: bool  # full_batches reached SHED_AFTER: strangers' first messages are dropped

    def datagram_received(self, data: bytes, addr: Any) -> None: ...

    def error_received(self, exc: Exception) -> None: ...


def read_batch(sock: socket.socket, protocol: BatchReader) -> None:
    """Up to READ_BATCH datagrams waiting on a UDP listener socket, each to `protocol`, which
    is told first whether it is behind (SHED_AFTER full batches in a row)."""
    protocol.behind = protocol.full_batches >= SHED_AFTER
    receive, received = sock.recvfrom, protocol.datagram_received
    for _ in range(READ_BATCH):
        try:
            data, addr = receive(65536)
        except (BlockingIOError, InterruptedError):
            protocol.full_batches = 0
            return
        except OSError as exc:  # an ICMP error queued on the socket: nothing to read
            protocol.error_received(exc)
            continue
        received(data, addr)
    protocol.full_batches += 1


class ClientPins:
    """Established clients' traffic ahead of strangers' (issue 15), where one process serves
    the listener: a client with an allocation gets a UDP socket connected to it on the
    listener's address and port (SO_REUSEPORT), as coturn does. The kernel steers the client's
    5-tuple to that socket, so its packets queue apart from a flood of strangers filling the
    listener socket, and the event loop serves both. Replies still leave by the listener
    socket (the same address and port). Pinned when the client's first STUN message after its
    Allocate arrives; let go within a second of the allocation; skipped when no descriptor is
    free. Not used with UDP worker processes, where a connected socket in the SO_REUSEPORT
    group could move strangers' 5-tuples between processes mid-handshake."""

    SWEEP_INTERVAL = 1.0

    def __init__(
        self,
        listener: BatchReader,
        name: str,
        sock: socket.socket,
        live: Callable[[], Container[Any]],
    ) -> None:
        self.listener = listener
        self.name = name  # the listener's, for the log
        self.live = live  # the addresses that keep their socket (allocations, DTLS sessions)
        self.family = sock.family
        self.local = sock.getsockname()
        self.pinned: dict[Any, asyncio.DatagramTransport | None] = {}
        loop = asyncio.get_running_loop()
        self._sweeper = loop.call_later(self.SWEEP_INTERVAL, self._sweep)

    def pin(self, addr: Any) -> None:
        if addr in self.pinned:
            return
        self.pinned[addr] = None  # one attempt per allocation
        sock = socket.socket(self.family, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if self.family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(self.local)
            sock.connect(addr)
            sock.setblocking(False)
        except OSError as exc:
            log.debug("listener %s: no socket of its own for %s: %s", self.name, addr, exc)
            sock.close()
            return
        asyncio.get_running_loop().create_task(self._serve(addr, sock))

    async def _serve(self, addr: Any, sock: socket.socket) -> None:
        listener, name = self.listener, self.name
        try:
            transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
                lambda: _PinnedClient(listener, name, addr), sock=sock
            )
        except OSError:
            sock.close()
            return
        if addr in self.pinned:
            self.pinned[addr] = transport
        else:
            transport.close()  # the allocation went while the socket was being set up

    def _sweep(self) -> None:
        live = self.live()
        for addr in [a for a in self.pinned if a not in live]:
            transport = self.pinned.pop(addr)
            if transport is not None:
                transport.close()
        self._sweeper = asyncio.get_running_loop().call_later(self.SWEEP_INTERVAL, self._sweep)

    def close(self) -> None:
        self._sweeper.cancel()
        for transport in self.pinned.values():
            if transport is not None:
                transport.close()
        self.pinned.clear()


class _PinnedClient(asyncio.DatagramProtocol):
    """What a pinned client's own socket receives goes the listener's way."""

    def __init__(self, listener: BatchReader, name: str, addr: Any) -> None:
        self.listener = listener
        self.name = name
        self.addr = addr  # as the listener socket reports it: the allocation (session) key

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.listener.datagram_received(data, self.addr)

    def error_received(self, exc: Exception) -> None:
        log.debug("listener %s: %s", self.name, exc)


SIOCOUTQNSD = 0x894B  # linux/sockios.h: bytes a TCP socket has not sent yet


def kernel_unsent(sock: socket.socket | None) -> int:
    """Bytes a TCP socket holds not yet sent (SIOCOUTQNSD: what waits for the peer's window,
    not what is in flight, so a long round trip is not taken for delay); 0 when the socket is
    gone or the ioctl is refused."""
    if sock is None:
        return 0
    try:
        return int.from_bytes(
            fcntl.ioctl(sock.fileno(), SIOCOUTQNSD, b"\0\0\0\0"), "little", signed=True
        )
    except (OSError, ValueError):
        return 0


class WriteAges:
    """How long the oldest byte written to a stream has been waiting (issue 21): every relayed
    packet written is marked (arrival time, bytes written so far); what is still queued, in
    asyncio's buffer and in the kernel unsent (SIOCOUTQNSD), is the tail of
    what was written, so the oldest mark past what has left is the oldest waiting byte (bytes
    sent and not yet acknowledged count as gone: they wait for the network, not for us). One
    ioctl and a few deque operations per packet. Over TLS the kernel holds ciphertext, a little
    more than the plaintext counted here, so the age is overestimated by at most the record
    overhead's share (about 20% for 120-byte packets): the bound errs on the early side."""

    __slots__ = ("written", "marks")

    def __init__(self) -> None:
        self.written = 0
        self.marks: collections.deque[tuple[float, int]] = collections.deque()

    def oldest(self, now: float, queued: int) -> float:
        """Seconds the oldest still-queued byte has waited, given `queued` bytes still queued."""
        marks = self.marks
        if queued <= 0:
            marks.clear()
            return 0.0
        left = self.written - queued  # everything up to here has left the queues
        while marks and marks[0][1] <= left:
            marks.popleft()
        return now - marks[0][0] if marks else 0.0

    def wrote(self, now: float, size: int) -> None:
        self.written += size
        self.marks.append((now, self.written))


class TcpConnectionProtocol(asyncio.Protocol):
    """One TURN-over-TCP client connection: RFC 8656 framing, padded ChannelData.

    Bounded (issue 15): the connection is refused past the per-source or total cap; it is
    closed when its first complete message, or any frame once begun, takes longer than
    `stream_deadline`, and when it has no allocation and sent no message for `idle_timeout`;
    past `stream_high_water` bytes queued toward a client that does not read, what is sent
    to it is dropped and counted (`backpressure_dropped`) until the queue drains to half; and
    a relayed packet is dropped (`latency_dropped`) while the oldest byte queued toward the
    client has waited longer than `stream_latency_bound` (issue 21: `WriteAges`), so a slow
    reader or a busy CPU costs packets, never seconds of delay. Answers are never dropped for
    latency. One timer per connection, re-armed only when it fires, keeps the per-packet cost
    at a clock read.

    RFC 6062: after a ConnectionBind the connection is a data connection (`splice`): from then
    on its bytes go unframed to its peer connection (`pipe`), and the peer's to it, without
    deadlines; the peer connection's close closes it and its close the peer connection."""

    def __init__(self, server: TurnServer, owner: TcpTransport) -> None:
        self.server = server
        self.owner = owner
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.downstream: Downstream | None = None
        self.source = ""
        self.paused = False  # the client is not reading: drop what is sent to it
        self._deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._first_done = False
        self._frame_started = 0.0
        self._bound = server.context.limits.stream_latency_bound
        self._ages = WriteAges()
        self._socket: socket.socket | None = None
        self.pipe: PeerConnection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        remote = transport.get_extra_info("peername")
        self.downstream = Downstream(
            remote, self._send, stream=True, relay=self._relay, splice=self._splice
        )
        self._socket = transport.get_extra_info("socket")
        self.source = self.downstream.address[0]
        if not self.owner.admit(self):
            self.transport.abort()
            return
        limits = self.server.context.limits
        self.transport.set_write_buffer_limits(
            high=limits.stream_high_water, low=limits.stream_high_water // 2
        )
        self._set_deadline(self._now() + limits.stream_deadline)

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _send(self, data: bytes) -> None:
        if self.paused:
            self.server.stats.backpressure_dropped += 1
            return
        assert self.transport is not None
        self.transport.write(data)
        if self._bound > 0:
            self._ages.wrote(self._now(), len(data))

    def _relay(self, data: bytes) -> bool:
        """Relayed data toward the client: dropped (False) past the high-water mark, and
        while what is queued toward the client has waited longer than the latency bound."""
        if self._bound > 0 and not self.paused:
            transport = self.transport
            assert transport is not None
            queued = transport.get_write_buffer_size() + kernel_unsent(self._socket)
            if self._ages.oldest(self._now(), queued) > self._bound:
                self.server.stats.latency_dropped += 1
                return False
        if self.paused:
            self.server.stats.backpressure_dropped += 1
            return False
        self._send(data)
        return True

    def pause_writing(self) -> None:
        self.paused = True
        if self.pipe is not None:
            self.pipe.hold("peer", "backpressure")

    def resume_writing(self) -> None:
        self.paused = False
        if self.pipe is not None:
            self.pipe.release("peer", "backpressure")

    def _splice(self, peer: PeerConnection) -> None:
        """This connection is now `peer`'s data connection (after its ConnectionBind)."""
        assert self.transport is not None
        self.pipe = peer
        self.paused = False  # its own flow control from now on: the pipe's
        self._set_deadline(None)
        peer.bind(self.transport)

    def _set_deadline(self, deadline: float | None) -> None:
        self._deadline = deadline
        if deadline is not None and self._timer is None:
            self._timer = asyncio.get_running_loop().call_at(deadline, self._check_deadline)

    def _check_deadline(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None:
            return
        downstream = self.downstream
        if self._first_done and not self.buffer and downstream is not None:
            if downstream.remote in self.server.allocations:
                self._deadline = None  # allocated since the deadline was set: no idle limit
                return
        if self._now() < deadline:
            self._set_deadline(deadline)
            return
        log.debug(
            "listener %s: closing %s: %s",
            self.server.name,
            self.source,
            "idle" if self._first_done and not self.buffer else "deadline passed",
        )
        self.close()

    def _after_data(self, received: bool) -> None:
        """Move the deadline after data came in: a frame in progress has `stream_deadline`
        from its first byte (the first message from the connection's start), an idle
        connection without allocation `idle_timeout`, one with an allocation none."""
        if received:
            self._first_done = True
        if not self._first_done:
            return  # the first message's deadline runs from connection_made
        limits = self.server.context.limits
        if self.buffer:
            if received or self._frame_started == 0.0:
                self._frame_started = self._now()
            self._set_deadline(self._frame_started + limits.stream_deadline)
            return
        self._frame_started = 0.0
        assert self.downstream is not None
        if self.downstream.remote in self.server.allocations:
            self._set_deadline(None)  # the per-packet case: no clock read
        else:
            self._set_deadline(self._now() + limits.idle_timeout)

    def data_received(self, data: bytes) -> None:
        if self.pipe is not None:
            self.pipe.from_client(data)
            return
        buffer = self.buffer
        buffer += data
        server, downstream = self.server, self.downstream
        assert downstream is not None
        received = False
        while True:
            try:
                length = stun.stream_frame_length(buffer)
            except stun.StunError as exc:  # out of step, or garbage: what follows is too
                log.info("listener %s: closing %s: %s", server.name, downstream.address, exc)
                server.stats.framing_dropped += 1
                self.close()
                return
            if length is None or len(buffer) < length:
                break
            frame = bytes(buffer[:length])
            del buffer[:length]
            received = True
            server.handle_frame(frame, downstream)
            if self.pipe is not None:  # a ConnectionBind: what follows it is the peer's
                if buffer:
                    self.pipe.from_client(bytes(buffer))
                    buffer.clear()
                return
        if len(buffer) > MAX_STREAM_BUFFER:
            self.close()
            return
        self._after_data(received)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.owner.release(self)
        if self.pipe is not None:
            self.pipe.client_lost()
        if self.downstream is not None:
            self.server.connection_lost(self.downstream.remote)

    def close(self) -> None:
        if self.transport is not None:
            if self.paused:
                self.transport.abort()  # a client that does not read gets no flush either
            else:
                self.transport.close()


class Transport:
    """The socket side of a listener: `start` binds and serves, `stop` lets go of the port."""

    worker_sockets: list[socket.socket]  # TURN-UDP: the sockets the UDP workers serve

    def __init__(self, server: TurnServer) -> None:
        self.server = server
        self.worker_sockets = []

    async def start(self, port: int) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    def sweep(self) -> None:
        """Every second, after the TURN server's sweep (the kernel offload's counters)."""


class UdpTransport(Transport):
    """TURN-UDP. With `sockets` > 1 it binds that many sockets on its port with SO_REUSEPORT,
    reads the first and keeps the others in `worker_sockets` for the UDP worker processes (the
    kernel hashes each client's 5-tuple to one socket, so to one process). A worker serves the
    socket it was handed (`given`)."""

    def __init__(self, server: TurnServer, sockets: int, given: socket.socket | None) -> None:
        super().__init__(server)
        self._sockets = sockets
        self._given = given
        self._protocol: UdpListenerProtocol | None = None
        self._sock: socket.socket | None = None

    async def start(self, port: int) -> None:
        sock = self.listener_socket(port)
        self._protocol = protocol = UdpListenerProtocol(self.server)
        protocol.connection_made(ListenerSocket(sock))
        asyncio.get_running_loop().add_reader(sock.fileno(), read_batch, sock, protocol)
        self._sock = sock
        if self._given is None and not self.worker_sockets:
            server = self.server
            protocol.pins = ClientPins(protocol, server.name, sock, lambda: server.allocations)

    def listener_socket(self, port: int) -> socket.socket:
        """The socket this process reads: the one handed to a worker, or the first of a newly
        bound group (the others go to `worker_sockets`)."""
        if self._given is not None:
            sock = self._given
            sock.setblocking(False)
        else:
            sock, *self.worker_sockets = bound_udp_group(self.server.bind_ip, port, self._sockets)
        return sock

    async def stop(self) -> None:
        if self._protocol is not None and self._protocol.pins is not None:
            self._protocol.pins.close()
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()  # the port is free at once
            self._sock = None
        if self._protocol is not None:
            self._protocol.connection_lost(None)
        for sock in self.worker_sockets:
            sock.close()  # the workers have let go of their copies (WorkerPool.sync) first
        self.worker_sockets = []


class TcpTransport(Transport):
    """TURN-TCP, and TURN-TLS with an `ssl_context`: RFC 8656 framing per connection."""

    def __init__(self, server: TurnServer, ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__(server)
        self._ssl = ssl_context
        self._server: asyncio.Server | None = None
        self._connections: set[TcpConnectionProtocol] = set()
        self._per_source: dict[str, int] = {}
        limits = server.context.limits
        self._cap = limits.stream_connection_cap()
        self._cap_per_source = limits.connections_per_source

    def admit(self, connection: TcpConnectionProtocol) -> bool:
        """Count a new connection, or refuse it past the per-source or total cap."""
        count = self._per_source.get(connection.source, 0)
        if len(self._connections) >= self._cap or count >= self._cap_per_source:
            log.debug(
                "listener %s: connection from %s refused: cap", self.server.name, connection.source
            )
            self.server.stats.dropped += 1
            return False
        self._connections.add(connection)
        self._per_source[connection.source] = count + 1
        return True

    def release(self, connection: TcpConnectionProtocol) -> None:
        if connection in self._connections:
            self._connections.discard(connection)
            left = self._per_source.get(connection.source, 1) - 1
            if left > 0:
                self._per_source[connection.source] = left
            else:
                self._per_source.pop(connection.source, None)

    async def start(self, port: int) -> None:
        handshake_timeout = None
        if self._ssl is not None:
            from .dtls import HANDSHAKE_TIMEOUT  # TLS and DTLS share the handshake bound

            handshake_timeout = HANDSHAKE_TIMEOUT
        sock = bound_socket(socket.SOCK_STREAM, self.server.bind_ip, port)
        self._server = await asyncio.get_running_loop().create_server(
            lambda: TcpConnectionProtocol(self.server, self),
            sock=sock,
            ssl=self._ssl,
            ssl_handshake_timeout=handshake_timeout,
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for connection in list(self._connections):
                connection.close()
            await self._server.wait_closed()


class DtlsTransport(Transport):
    """TURN-DTLS: one UDP socket, a DTLS session per client (`dtls.py`)."""

    def __init__(self, server: TurnServer, cert: str, key: str) -> None:
        from .dtls import DtlsListenerProtocol

        super().__init__(server)
        self.protocol: DtlsListenerProtocol = DtlsListenerProtocol(server, cert, key)
        self._sock: socket.socket | None = None
        self._pins: ClientPins | None = None

    async def start(self, port: int) -> None:
        (sock,) = bound_udp_group(self.server.bind_ip, port, 1)  # SO_REUSEPORT: ClientPins
        self.protocol.connection_made(ListenerSocket(sock))
        sessions = self.protocol.sessions
        self._pins = ClientPins(self.protocol, self.server.name, sock, lambda: sessions)
        self.protocol.pins = self._pins
        # In batches, as TURN-UDP's socket: a ClientHello flood costs a read and a budget
        # lookup per datagram, and `behind` says when to stop answering them.
        asyncio.get_running_loop().add_reader(sock.fileno(), read_batch, sock, self.protocol)
        self._sock = sock

    async def stop(self) -> None:
        if self._sock is not None:
            self.protocol.close()  # close_notify to each client
            if self._pins is not None:
                self._pins.close()
                self._pins = None
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
            self.protocol.connection_lost(None)
