"""Listener transports: TURN-UDP, -TCP, -TLS and -DTLS sockets, each feeding one `TurnServer`.

The transport only frames packets and demultiplexes ChannelData (RFC 8656 §12) from STUN;
all TURN logic lives in `turn.py`, written once for both transports.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import socket
from typing import Any, cast

from stunner_api.dataplane import ListenerConfig

from . import stun, tls
from .runtime import port_holders
from .turn import Downstream, ServerContext, TurnServer

log = logging.getLogger("stunner.listener")

MAX_STREAM_BUFFER = 4 * 65536  # a TCP client may have this much unframed data in flight
SWEEP_INTERVAL = 1.0


class UdpListenerProtocol(asyncio.DatagramProtocol):
    def __init__(self, server: TurnServer) -> None:
        self.server = server
        self.transport: asyncio.DatagramTransport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        # Hot path first: ChannelData from a client with an allocation.
        if data and (data[0] & 0xC0) == 0x40:
            allocation = self.server.allocations.get(addr)
            if allocation is not None:
                allocation.relay_channel_data(data)
            return
        allocation = self.server.allocations.get(addr)
        if allocation is not None:
            self.server.handle(data, allocation.downstream)
        else:
            self.server.handle(data, self._downstream(addr))

    def _downstream(self, addr: Any) -> Downstream:
        transport = self.transport
        assert transport is not None

        def send(data: bytes) -> None:
            transport.sendto(data, addr)

        return Downstream(addr, send, stream=False)

    def error_received(self, exc: Exception) -> None:
        log.debug("listener %s: %s", self.server.name, exc)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class TcpConnectionProtocol(asyncio.Protocol):
    """One TURN-over-TCP client connection: RFC 8656 framing, padded ChannelData."""

    def __init__(self, server: TurnServer, connections: set[TcpConnectionProtocol]) -> None:
        self.server = server
        self.connections = connections
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.downstream: Downstream | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.connections.add(self)
        remote = transport.get_extra_info("peername")
        self.downstream = Downstream(remote, self.transport.write, stream=True)

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        server, downstream = self.server, self.downstream
        assert downstream is not None
        while True:
            try:
                length = stun.stream_frame_length(buffer)
            except stun.StunError as exc:
                log.info("listener %s: closing %s: %s", server.name, downstream.address, exc)
                self.close()
                return
            if length is None or len(buffer) < length:
                break
            frame = bytes(buffer[:length])
            del buffer[:length]
            if (frame[0] & 0xC0) == 0x40:
                server.handle_channel_data(frame, downstream.remote)
            else:
                server.handle(frame, downstream)
        if len(buffer) > MAX_STREAM_BUFFER:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        if self.downstream is not None:
            self.server.connection_lost(self.downstream.remote)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


_GENERATIONS = itertools.count(1)


class Listener:
    """A running listener: its socket(s), its TURN server and its housekeeping timer.

    A TURN-UDP listener with `udp_sockets` > 1 binds that many sockets on its port with
    SO_REUSEPORT, reads the first and keeps the others in `worker_sockets` for the UDP worker
    processes (the kernel hashes each client's 5-tuple to one socket, so to one process). A
    worker builds its Listener around the socket it was handed (`sock`), under the primary's
    `generation` for that listener.
    """

    def __init__(
        self,
        config: ListenerConfig,
        context: ServerContext,
        udp_sockets: int = 1,
        sock: socket.socket | None = None,
        generation: int | None = None,
    ) -> None:
        self.config = config
        self.server = TurnServer(config.name, config.address, context)
        self.generation = generation if generation is not None else next(_GENERATIONS)
        self.worker_sockets: list[socket.socket] = []
        self._udp_sockets = udp_sockets
        self._given_socket = sock
        self._udp: UdpListenerProtocol | None = None
        self._tcp: asyncio.Server | None = None
        self._dtls: tls.DtlsListenerProtocol | None = None
        self._connections: set[TcpConnectionProtocol] = set()
        self._sweeper: asyncio.TimerHandle | None = None

    @property
    def name(self) -> str:
        return self.config.name

    async def start(self) -> None:
        try:
            await self._start()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            stream = self.config.protocol in ("TURN-TCP", "TURN-TLS")
            kind = "TCP" if stream else "UDP"
            holders = port_holders(self.config.port, stream)
            held = f" (held by process {', '.join(holders)})" if holders else ""
            raise OSError(
                exc.errno, f"{kind} port {self.config.port} is already in use{held}"
            ) from None
        level = logging.DEBUG if self._given_socket is not None else logging.INFO
        log.log(  # a UDP worker's copy of a listener is the primary's, already logged
            level,
            "listener %s (%s) serving on port %d, relay address %s",
            self.name,
            self.config.protocol,
            self.config.port,
            self.config.address,
        )

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        port = self.config.port
        protocol = self.config.protocol
        if protocol == "TURN-UDP":
            if self._given_socket is not None:
                sock = self._given_socket
                sock.setblocking(False)
            else:
                sock, *self.worker_sockets = _bound_udp_group(port, self._udp_sockets)
            _, self._udp = await loop.create_datagram_endpoint(
                lambda: UdpListenerProtocol(self.server), sock=sock
            )
        elif protocol == "TURN-TCP":
            sock = _bound_socket(socket.SOCK_STREAM, port)
            self._tcp = await loop.create_server(
                lambda: TcpConnectionProtocol(self.server, self._connections), sock=sock
            )
        elif protocol == "TURN-TLS":
            context = tls.server_ssl_context(self.config.cert, self.config.key)
            sock = _bound_socket(socket.SOCK_STREAM, port)
            self._tcp = await loop.create_server(
                lambda: TcpConnectionProtocol(self.server, self._connections),
                sock=sock,
                ssl=context,
                ssl_handshake_timeout=tls.HANDSHAKE_TIMEOUT,
            )
        elif protocol == "TURN-DTLS":
            # The context first: a bad certificate is refused before the port is taken.
            cert, key = self.config.cert, self.config.key
            dtls = tls.DtlsListenerProtocol(self.server, cert, key)
            sock = _bound_socket(socket.SOCK_DGRAM, port)
            _, self._dtls = await loop.create_datagram_endpoint(lambda: dtls, sock=sock)
        else:
            raise ValueError(f"listener {self.name}: protocol {protocol} is not supported yet")
        self._sweeper = loop.call_later(SWEEP_INTERVAL, self._sweep)

    def _sweep(self) -> None:
        self.server.sweep()
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_INTERVAL, self._sweep)

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._udp is not None and self._udp.transport is not None:
            self._udp.transport.close()
            await self._udp.closed  # the port is free once the socket is really closed
        for sock in self.worker_sockets:
            sock.close()  # the workers have let go of their copies (WorkerPool.sync) first
        self.worker_sockets = []
        if self._dtls is not None:
            self._dtls.close()  # close_notify to each client, then the socket
            await self._dtls.closed
        if self._tcp is not None:
            self._tcp.close()
            for connection in list(self._connections):
                connection.close()
            await self._tcp.wait_closed()
        self.server.close()
        log.log(
            logging.DEBUG if self._given_socket is not None else logging.INFO,
            "listener %s stopped",
            self.name,
        )


def _bound_udp_group(port: int, count: int) -> list[socket.socket]:
    """`count` UDP sockets on `port`, in one SO_REUSEPORT group when there are several: all
    bound before any is read, so the kernel's 5-tuple hash does not move as the group forms."""
    if count <= 1:
        return [_bound_socket(socket.SOCK_DGRAM, port)]
    if port != 0:
        # A port already held by another SO_REUSEPORT group of this user would quietly be
        # shared with it: try a plain bind first, so "address in use" is reported as always.
        _bound_socket(socket.SOCK_DGRAM, port).close()
    group = [_bound_socket(socket.SOCK_DGRAM, port, reuse_port=True)]
    try:
        port = group[0].getsockname()[1]  # port 0: the group shares the one the kernel chose
        for _ in range(count - 1):
            group.append(_bound_socket(socket.SOCK_DGRAM, port, reuse_port=True))
    except OSError:
        for sock in group:
            sock.close()
        raise
    return group


def _bound_socket(kind: socket.SocketKind, port: int, reuse_port: bool = False) -> socket.socket:
    """A socket on the wildcard address and `port`: dual-stack where the host has IPv6.

    As in Go STUNner, the listener's `address` is the relay address it advertises, not the
    address it binds.
    """
    if socket.has_ipv6:
        try:
            sock = socket.socket(socket.AF_INET6, kind)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            return _bind(sock, ("::", port), kind, reuse_port)
        except OSError as exc:
            if exc.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                raise  # port in use, permission: the caller reports it
    return _bind(socket.socket(socket.AF_INET, kind), ("0.0.0.0", port), kind, reuse_port)


def _bind(
    sock: socket.socket, address: tuple[str, int], kind: socket.SocketKind, reuse_port: bool
) -> socket.socket:
    try:
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if kind == socket.SOCK_STREAM:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        else:
            for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                sock.setsockopt(socket.SOL_SOCKET, option, 4 << 20)
        sock.bind(address)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
