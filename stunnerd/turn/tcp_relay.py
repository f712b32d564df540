"""RFC 6062 TCP allocations: the relay side of a TURN-TCP/TLS client's TCP allocation.

A TCP allocation's relay is a listening TCP socket on its relayed transport address
(`TcpRelay`), from which it also dials its peers (Connect: SO_REUSEADDR/SO_REUSEPORT, so the
peer sees the relayed address; an ephemeral port where the kernel refuses that). Every peer
connection (`PeerConnection`), dialed or accepted, gets a CONNECTION-ID and waits, unread (the
kernel holds what the peer sends), for the ConnectionBind that ties it to a new client
connection to the same listener (the data connection); `Limits.peer_connection_timeout` after
it was made it is closed if none came. Bound, the two are a plain byte pipe: what one side
sends is written to the other, each side's write buffer bounded by `Limits.stream_high_water`
(past it the other side is no longer read until it drains), and either side's close closes
the other. The allocation's end closes all of them.

Its bandwidth cap (auth.allocation_bandwidth_limit, issue 29) holds here too, each direction on
its own bucket, but a byte stream cannot lose bytes mid-stream: it is paced, not dropped
(`stunner_api.bandwidth.TokenBucket.pace`): what a read brings past the bucket waits here (at
most one read, 256 KiB), written on as the bucket refills every PACING_TICK, and the side that
sent is not read meanwhile, so TCP's flow control holds the sender. A side is read again only
when neither its peer's full write buffer nor the cap holds it (`hold`, `release`).

Admission: a peer is reachable only through a routed cluster of protocol TCP (Go STUNner v2's
"TCP clusters", `router.Router.cluster_of(..., "TCP")`): checked on every Connect (403) and
every inbound connection (closed at once, as is one from an IP without a permission). Counted
in the existing families: what a data connection carries is the listener's rx/tx and the
cluster's tx/rx, one packet per read.

The requests (Allocate, Connect, ConnectionBind) are `turn.TurnServer`'s; the transports turn
a client connection into a data connection through `Downstream.splice`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import socket
import time
from collections.abc import Callable, MutableMapping
from typing import Protocol, cast

from stunner_api.stun import Address, Class, Message, Method

from .allocation import Allocation, ListenerScope, canonical_address

log = logging.getLogger("stunner.turn")

PACING_TICK = 0.02  # seconds between a capped stream's writes while its bucket is empty
TRANSPORT_TCP = 6  # REQUESTED-TRANSPORT of a TCP allocation (RFC 6062 §5.1)


class ClientSide(Protocol):
    """The data connection as its peer connection uses it (an asyncio transport)."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class PeerConnection(asyncio.Protocol):
    """One TCP connection between a TCP allocation's relayed address and a peer."""

    def __init__(self, relay: TcpRelay, peer: Address | None, cluster: str | None) -> None:
        self.relay = relay
        self.peer: Address = peer or ("", 0)
        self.cluster = cluster or ""
        self.connection_id = 0
        self.transport: asyncio.Transport | None = None
        self.client: ClientSide | None = None
        self._expiry: asyncio.TimerHandle | None = None
        # Why each side ("peer", "client") is not read: "backpressure" (the other side's write
        # buffer is full), "cap" (its direction's bucket is empty, till its timer fires).
        self._holds: dict[str, set[str]] = {"peer": set(), "client": set()}
        self._paced: dict[str, asyncio.TimerHandle] = {}
        self._waiting: dict[str, bytearray] = {"peer": bytearray(), "client": bytearray()}

    # --- the peer's side ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.pause_reading()  # held by the kernel until bound
        high = self.relay.scope_limits_high_water
        self.transport.set_write_buffer_limits(high=high, low=high // 2)
        if not self.peer[0]:  # accepted on the relayed address: a ConnectionAttempt
            self.relay.accepted(self, canonical_address(transport.get_extra_info("peername")))

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client is None:
            return
        scope = self.relay.scope
        counters = scope.cluster_counters[self.cluster]
        counters.rx_packets += 1
        counters.rx_bytes += len(data)
        scope.stats.tx_packets += 1
        scope.stats.tx_bytes += len(data)
        self._forward("peer", data)

    def eof_received(self) -> bool | None:
        return None  # close: TURN relays connections, not half-closes

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_expiry()
        self._stop_pacing()
        self.relay.forget(self)
        client, self.client = self.client, None
        if client is not None:
            client.close()

    def pause_writing(self) -> None:
        self.hold("client", "backpressure")

    def resume_writing(self) -> None:
        self.release("client", "backpressure")

    # --- reading a side, held by backpressure or by the cap -------------------------------

    def _reader(self, side: str) -> ClientSide | asyncio.Transport | None:
        return self.transport if side == "peer" else self.client

    def hold(self, side: str, reason: str) -> None:
        """Stop reading `side` ("peer" or "client") for `reason` until it is released."""
        holds = self._holds[side]
        reader = self._reader(side)
        if not holds and reader is not None:
            reader.pause_reading()
        holds.add(reason)

    def release(self, side: str, reason: str) -> None:
        """`reason` no longer holds `side`: read it again unless another reason does."""
        holds = self._holds[side]
        if reason not in holds:
            return
        holds.discard(reason)
        reader = self._reader(side)
        if not holds and reader is not None:
            reader.resume_reading()

    def _writer(self, side: str) -> ClientSide | asyncio.Transport | None:
        """Where what is read from `side` goes."""
        return self.client if side == "peer" else self.transport

    def _forward(self, side: str, data: bytes) -> None:
        """`data` read from `side` to the other, through the allocation's cap."""
        waiting = self._waiting[side]
        if self.relay.allocation.cap is None and not waiting:
            writer = self._writer(side)
            if writer is not None:
                writer.write(data)
            return
        waiting += data
        if side not in self._paced:
            self.hold(side, "cap")
            self._pace(side)

    def _pace(self, side: str) -> None:
        """Write what of `side`'s waiting bytes its bucket holds; the rest a tick later. Empty:
        `side` is read again once the bucket is not."""
        self._paced.pop(side, None)
        waiting, writer, cap = self._waiting[side], self._writer(side), self.relay.allocation.cap
        if writer is None:
            waiting.clear()
            return
        if cap is None:  # lifted in place
            size = len(waiting)
            wait = 0.0
        else:
            bucket, now = (cap.to_client if side == "peer" else cap.to_peers), time.monotonic()
            size = min(len(waiting), max(0, math.ceil(bucket.refilled(now))))
            wait = bucket.pace(size, now)
        if size:
            writer.write(bytes(waiting[:size]))
            del waiting[:size]
        if not waiting and wait <= 0:
            self.release(side, "cap")
            return
        loop = asyncio.get_running_loop()
        self._paced[side] = loop.call_later(max(wait, PACING_TICK), self._pace, side)

    def _stop_pacing(self) -> None:
        for timer in self._paced.values():
            timer.cancel()
        self._paced.clear()

    # --- pending: waiting for its ConnectionBind ------------------------------------------

    def wait_for_bind(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        self._expiry = loop.call_later(timeout, self._unbound)

    def _unbound(self) -> None:
        self._expiry = None
        log.info(
            "relay %s: connection %d with peer %s closed: no ConnectionBind in time",
            _fmt(self.relay.allocation.relayed_address),
            self.connection_id,
            _fmt(self.peer),
        )
        self.close()

    def _cancel_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    # --- bound: a byte pipe ---------------------------------------------------------------

    def bind(self, client: ClientSide) -> None:
        """Tie this peer connection to its data connection; the peer is read from now on."""
        self._cancel_expiry()
        if self.transport is None or self.transport.is_closing():
            client.close()  # the peer went away meanwhile
            return
        self.client = client
        self.transport.resume_reading()

    def from_client(self, data: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        scope = self.relay.scope
        scope.stats.rx_packets += 1
        scope.stats.rx_bytes += len(data)
        counters = scope.cluster_counters[self.cluster]
        counters.tx_packets += 1
        counters.tx_bytes += len(data)
        self._forward("client", data)

    def client_lost(self) -> None:
        self.client = None
        self.close()

    def close(self) -> None:
        self._cancel_expiry()
        self._stop_pacing()
        if self.transport is not None:
            self.transport.close()


class DataConnection(asyncio.Protocol):
    """A data connection taken back from the native engine (`native_tcp`): its bytes go to
    its peer connection, as `transports.TcpConnectionProtocol` does in pipe mode."""

    def __init__(self, peer: PeerConnection) -> None:
        self.peer = peer
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        high = self.peer.relay.scope_limits_high_water
        self.transport.set_write_buffer_limits(high=high, low=high // 2)
        self.peer.bind(self.transport)

    def data_received(self, data: bytes) -> None:
        self.peer.from_client(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.peer.client_lost()

    def pause_writing(self) -> None:
        self.peer.hold("peer", "backpressure")

    def resume_writing(self) -> None:
        self.peer.release("peer", "backpressure")


class TcpRelay:
    """A TCP allocation's relayed transport address: its listening socket and its peer
    connections. Quacks as the allocation's `RelaySocket` (a Send indication is dropped)."""

    def __init__(
        self,
        allocation: Allocation,
        scope: ListenerScope,
        pending: MutableMapping[int, PeerConnection],
        max_connections: int,
        timeout: float,
        high_water: int,
    ) -> None:
        self.allocation = allocation
        self.scope = scope
        self.scope_limits_high_water = high_water
        self.pending = pending  # the listener's: CONNECTION-ID -> connection awaiting its bind
        self.max_connections = max_connections
        self.timeout = timeout
        self.connections: set[PeerConnection] = set()
        self.connecting: set[Address] = set()
        self._server: asyncio.Server | None = None
        self.closed = False

    async def open(self, bind_ip: str) -> int:
        """Listen on a new port of `bind_ip`; returns the port."""
        family = socket.AF_INET6 if ":" in bind_ip else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            _reusable(sock)
            sock.bind((bind_ip, 0))
            sock.listen(16)
            sock.setblocking(False)
            loop = asyncio.get_running_loop()
            self._server = await loop.create_server(
                lambda: PeerConnection(self, None, None), sock=sock
            )
        except OSError:
            sock.close()
            raise
        self._bind_ip = bind_ip
        return int(sock.getsockname()[1])

    def busy_with(self, peer: Address) -> bool:
        """Whether a connection with `peer` exists or is being made (446)."""
        return peer in self.connecting or any(c.peer == peer for c in self.connections)

    def full(self) -> bool:
        return len(self.connections) + len(self.connecting) >= self.max_connections

    async def connect(self, peer: Address, cluster: str) -> int | None:
        """Dial `peer` from the relayed address; its CONNECTION-ID, or None on failure or
        timeout (447)."""
        self.connecting.add(peer)
        sock = socket.socket(
            socket.AF_INET6 if ":" in peer[0] else socket.AF_INET, socket.SOCK_STREAM
        )
        sock.setblocking(False)
        try:
            try:
                _reusable(sock)
                sock.bind((self._bind_ip, self.allocation.relayed_address[1]))
            except OSError:
                sock.bind((self._bind_ip, 0))  # the peer then sees another port of ours
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(self.timeout):
                await loop.sock_connect(sock, peer)
                _, connection = await loop.create_connection(
                    lambda: PeerConnection(self, peer, cluster), sock=sock
                )
        except (OSError, TimeoutError) as exc:
            sock.close()
            log.info(
                "relay %s: Connect to %s failed: %s",
                _fmt(self.allocation.relayed_address),
                _fmt(peer),
                exc or "timeout",
            )
            return None
        finally:
            self.connecting.discard(peer)
        if self.closed:
            connection.close()
            return None
        return self._pend(connection)

    def accepted(self, connection: PeerConnection, peer: Address) -> None:
        """A peer connected to the relayed address (RFC 6062 §5.3): admitted only from an IP
        with a permission and by a routed TCP cluster, within the cap; then announced to the
        client with a ConnectionAttempt indication."""
        allocation, scope = self.allocation, self.scope
        connection.peer = peer
        permitted = peer[0] in allocation.permissions
        cluster = scope.policy.cluster_of(scope.name, peer[0], peer[1], "TCP")
        if self.closed or not permitted or cluster is None or self.full():
            if permitted and cluster is None:
                scope.stats.forbidden_dropped += 1
            else:
                scope.stats.dropped += 1
            log.info(
                "relay %s: connection from %s refused: %s",
                _fmt(allocation.relayed_address),
                _fmt(peer),
                "no permission"
                if not permitted
                else ("no TCP cluster admits it" if cluster is None else "too many connections"),
            )
            assert connection.transport is not None
            connection.transport.abort()
            return
        connection.cluster = cluster
        connection_id = self._pend(connection)
        indication = Message(Method.CONNECTION_ATTEMPT, Class.INDICATION, secrets.token_bytes(12))
        indication.attributes["XOR-PEER-ADDRESS"] = peer
        indication.attributes["CONNECTION-ID"] = connection_id
        data = indication.encode(fingerprint=True)
        allocation.downstream.send(data)
        scope.stats.tx_packets += 1
        scope.stats.tx_bytes += len(data)

    def _pend(self, connection: PeerConnection) -> int:
        connection_id = secrets.randbits(32)
        while connection_id == 0 or connection_id in self.pending:
            connection_id = secrets.randbits(32)
        connection.connection_id = connection_id
        self.pending[connection_id] = connection
        self.connections.add(connection)
        connection.wait_for_bind(self.timeout)
        return connection_id

    def forget(self, connection: PeerConnection) -> None:
        self.connections.discard(connection)
        if self.pending.get(connection.connection_id) is connection:
            del self.pending[connection.connection_id]

    def recheck(self) -> None:
        """After a change of the routes or clusters: close every peer connection no routed TCP
        cluster admits any more (counted as forbidden), as a UDP allocation drops each packet."""
        scope = self.scope
        for connection in list(self.connections):
            ip, port = connection.peer
            if not ip:
                continue  # accepted, not yet judged
            cluster = scope.policy.cluster_of(scope.name, ip, port, "TCP")
            if cluster is not None:
                connection.cluster = cluster
                continue
            scope.stats.forbidden_dropped += 1
            log.info(
                "relay %s: connection with peer %s closed: no routed TCP cluster admits it now",
                _fmt(self.allocation.relayed_address),
                _fmt(connection.peer),
            )
            connection.close()

    # --- RelaySocket ------------------------------------------------------------------------

    def sendto(self, data: bytes, addr: Address) -> None:
        """A Send indication or ChannelData on a TCP allocation: not relayed (RFC 6062 §4)."""
        self.scope.stats.dropped += 1

    def close(self) -> None:
        self.closed = True
        if self._server is not None:
            self._server.close()
            self._server = None
        for connection in list(self.connections):
            connection.close()


Splice = Callable[[PeerConnection], None]


def _reusable(sock: socket.socket) -> None:
    """The relayed address is shared by the allocation's listening socket and its dials."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)


def _fmt(address: Address) -> str:
    ip, port = address
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
