"""TURN allocation state (RFC 8656 §2.2): one client's relay socket, permissions and channels.

An allocation knows its listener only through a narrow handle (`ListenerScope`): the name the
peer policy is keyed by, the policy, and the counters it adds to. Both directions of relayed
traffic are checked here against the policy, packet by packet, and counted; the requests that
create and change allocations are `turn.TurnServer`'s.

Where an allocation's relay socket is served is the listener's `RelayPath`: an asyncio datagram
endpoint here, or the native engine of a TURN-UDP listener (`native_udp`), which also mirrors
the allocation's state through the one observer interface `AllocationMirror`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import socket
import time
from collections.abc import Callable, MutableMapping
from typing import Any, Protocol, cast

from stunner_api import stun
from stunner_api.bandwidth import AllocationCap, bucket_rate
from stunner_api.stun import FAMILY_IPV4, FAMILY_IPV6, Address

from .counters import ClusterCounters, ListenerCounters

log = logging.getLogger("stunner.turn")


def canonical_address(addr: tuple[Any, ...]) -> Address:
    """(ip, port) of a socket address; an IPv4-mapped IPv6 address becomes plain IPv4."""
    ip: str = addr[0]
    if ip.startswith("::ffff:") and "." in ip:
        ip = ip[7:]
    return ip, addr[1]


def address_family(ip: str) -> int:
    return FAMILY_IPV6 if ":" in ip else FAMILY_IPV4


class Downstream:
    """The client side of one 5-tuple: where replies and relayed data to that client go."""

    __slots__ = ("remote", "address", "send", "relay", "stream", "engine", "splice")

    def __init__(
        self,
        remote: Any,
        send: Callable[[bytes], None],
        stream: bool,
        relay: Callable[[bytes], bool | None] | None = None,
        engine: int = 0,
        splice: Callable[[Any], None] | None = None,
    ) -> None:
        self.remote = remote  # the address as the socket reports it: the allocation key
        self.address = canonical_address(remote)  # what XOR-MAPPED-ADDRESS reports
        self.send = send  # answers: always sent
        # Relayed data (ChannelData, Data indications): False when the transport dropped it
        # (a TCP/TLS client past --stream-latency-bound, issue 21), else sent like an answer.
        self.relay: Callable[[bytes], bool | None] = relay or send
        self.stream = stream
        # TURN-UDP on the native path: which of the listener's engines (one per socket of its
        # SO_REUSEPORT group) the kernel steers this 5-tuple to; its allocation lives there.
        self.engine = engine
        # TURN-TCP/TLS: makes this connection the data connection of an RFC 6062 peer
        # connection (`tcp_relay.PeerConnection`) after its ConnectionBind; None elsewhere.
        self.splice = splice


class PeerPolicy(Protocol):
    """Which cluster, if any, admits a peer for a listener (`router.Router`)."""

    def cluster_of(
        self, listener: str, ip: str, port: int, protocol: str = "UDP"
    ) -> str | None: ...

    def log_refused_packet(self, listener: str, ip: str, port: int, protocol: str = "UDP") -> None:
        """A permitted peer's packet dropped because no route admits it: why (rate-bounded)."""


class RelaySocket(Protocol):
    """An allocation's relay socket as the allocation uses it: an asyncio datagram transport,
    or the native engine's allocation (`native_glue.NativeAllocation`)."""

    def sendto(self, data: bytes, addr: Address) -> None: ...

    def close(self) -> None: ...


class AllocationMirror(Protocol):
    """Told of every change to an allocation's relay state (the native engine mirrors it)."""

    def refreshed(self, expires_at: float) -> None: ...

    def permitted(self, ip: str, expires_at: float) -> None: ...

    def bound(self, channel: int, peer: Address, expires_at: float) -> None: ...

    def forgotten(self, ips: list[str], channels: list[int]) -> None: ...

    def limited(self, rate: float, burst: float) -> None:
        """Its bandwidth cap (bytes per second and burst bytes; 0: none) changed."""


class RelayPath(Protocol):
    """Serves a new allocation's bound relay socket (taking it over) and returns it."""

    async def open(self, allocation: Allocation, sock: socket.socket) -> RelaySocket: ...


class AsyncioRelayPath:
    """The pure-Python path: the allocation reads its relay socket through asyncio."""

    async def open(self, allocation: Allocation, sock: socket.socket) -> RelaySocket:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: allocation, sock=sock)
        return transport


class ListenerScope:
    """What an allocation needs of its listener; no way back to the server."""

    __slots__ = ("name", "policy", "stats", "cluster_counters", "relay_path")

    def __init__(
        self,
        name: str,
        policy: PeerPolicy,
        stats: ListenerCounters,
        cluster_counters: MutableMapping[str, ClusterCounters],
    ) -> None:
        self.name = name
        self.policy = policy
        self.stats = stats  # the listener's counters
        self.cluster_counters = cluster_counters  # shared by every listener of the process
        self.relay_path: RelayPath = AsyncioRelayPath()  # the native transport swaps it


class Allocation(asyncio.DatagramProtocol):
    """One TURN allocation: its relay socket, permissions and channel bindings (RFC 8656 §2.2)."""

    def __init__(
        self,
        scope: ListenerScope,
        downstream: Downstream,
        username: str,
        user_id: str,
        family: int,
        lifetime: int,
    ) -> None:
        self.scope = scope
        self.downstream = downstream
        self.username = username
        self.user_id = user_id
        self.family = family
        self.expires_at = time.monotonic() + lifetime
        # Nothing of it expires before this (its own expiry, its permissions', its channels'):
        # the sweep passes it by until then (issue 30: every allocation, every second).
        self.due = self.expires_at
        self.permissions: dict[str, float] = {}  # peer IP -> expiry
        self.channels: dict[int, tuple[Address, float]] = {}  # channel -> (peer, expiry)
        self.channel_by_peer: dict[Address, int] = {}
        self.relay: RelaySocket | None = None
        self.mirror: AllocationMirror | None = None  # set by a RelayPath that mirrors state
        self.relayed_address: Address = ("", 0)
        # Sessions (stunner_api.sessions): its id, when it was made, and what it relayed on the
        # Python path (rx from the client, tx to it; the native engine counts per listener).
        self.id = secrets.token_hex(6)
        self.created = time.monotonic()
        self.rx_packets = self.rx_bytes = self.tx_packets = self.tx_bytes = 0
        self.hard_expiry = math.inf  # auth.strict_expiry: its credential's expiry (monotonic)
        # auth.allocation_bandwidth_limit: what it may relay, each direction (None: no cap)
        self.cap: AllocationCap | None = None

    # --- relay socket events: data from peers -------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.relay = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        """RFC 8656 §11.3 and §12.7: relay a peer's datagram to the client, if admitted."""
        peer = (addr[0], addr[1])
        scope = self.scope
        cluster = scope.policy.cluster_of(scope.name, peer[0], peer[1])
        if cluster is None or peer[0] not in self.permissions:
            self._dropped(peer, peer[0] in self.permissions)
            return
        cap = self.cap
        if cap is not None and not cap.to_client.admit(len(data), time.monotonic()):
            scope.stats.bandwidth_dropped += 1
            return
        counters = scope.cluster_counters[cluster]
        counters.rx_packets += 1
        counters.rx_bytes += len(data)
        channel = self.channel_by_peer.get(peer)
        if channel is not None:
            packet = stun.pack_channel_data(channel, data, self.downstream.stream)
        else:
            packet = stun.data_indication(peer, data)
        if self.downstream.relay(packet) is False:
            return  # dropped late, and counted, by the stream transport
        stats = scope.stats
        stats.tx_packets += 1
        stats.tx_bytes += len(packet)
        self.tx_packets += 1
        self.tx_bytes += len(data)

    def _dropped(self, peer: Address, permitted: bool) -> None:
        """A packet to or from `peer` dropped: reason forbidden when the peer has a permission
        but no route admits it (removed or narrowed since: logged with why, as the native
        engine's path logs it), else invalid (no permission), as the native engine counts."""
        scope = self.scope
        if permitted:
            scope.stats.forbidden_dropped += 1
            scope.policy.log_refused_packet(scope.name, peer[0], peer[1])
        else:
            scope.stats.dropped += 1

    def error_received(self, exc: Exception) -> None:
        # ICMP errors from peers (port unreachable): nothing to do for a UDP relay.
        log.debug("relay %s: %s", self.relayed_address, exc)

    # --- data from the client -----------------------------------------------------------

    def relay_to_peer(self, peer: Address, payload: bytes) -> None:
        scope = self.scope
        cluster = scope.policy.cluster_of(scope.name, peer[0], peer[1])
        if cluster is None or self.relay is None or peer[0] not in self.permissions:
            self._dropped(peer, peer[0] in self.permissions and self.relay is not None)
            return
        cap = self.cap
        if cap is not None and not cap.to_peers.admit(len(payload), time.monotonic()):
            scope.stats.bandwidth_dropped += 1
            return
        if payload:
            self.relay.sendto(payload, peer)
        else:
            _send_empty(self.relay, peer)
        counters = scope.cluster_counters[cluster]
        counters.tx_packets += 1
        counters.tx_bytes += len(payload)
        self.rx_packets += 1
        self.rx_bytes += len(payload)

    def relay_channel_data(self, data: bytes) -> None:
        """RFC 8656 §12.6: ChannelData from the client goes to the channel's peer."""
        stats = self.scope.stats
        stats.rx_packets += 1
        stats.rx_bytes += len(data)
        if len(data) < 4:
            return
        channel, length = stun.CHANNEL_HEADER.unpack_from(data)
        binding = self.channels.get(channel)
        if binding is None or len(data) < 4 + length:
            stats.dropped += 1
            return
        self.relay_to_peer(binding[0], data[4 : 4 + length])

    # --- state (every change is told to the mirror, if any) ---------------------------------

    def cap_expiry(self, at: float) -> None:
        """Never past `at` (auth.strict_expiry: its credential's expiry), whatever Refresh asks."""
        self.hard_expiry = at
        self.expires_at = min(self.expires_at, at)
        self.due = min(self.due, self.expires_at)

    def limit_bandwidth(self, bits_per_second: int) -> None:
        """Cap what it relays at `bits_per_second` each way (0: no cap); in place, its buckets
        kept while the cap is the same (stunner_api.bandwidth)."""
        cap = self.cap
        if (cap.bits_per_second if cap is not None else 0) == bits_per_second:
            return
        self.cap = AllocationCap(bits_per_second, time.monotonic()) if bits_per_second else None
        if self.mirror is not None:
            self.mirror.limited(*bucket_rate(bits_per_second))

    def refresh(self, lifetime: int) -> None:
        self.expires_at = min(time.monotonic() + lifetime, self.hard_expiry)
        self.due = min(self.due, self.expires_at)
        if self.mirror is not None:
            self.mirror.refreshed(self.expires_at)

    def permit(self, ip: str, expires_at: float) -> None:
        self.permissions[ip] = expires_at
        self.due = min(self.due, expires_at)
        if self.mirror is not None:
            self.mirror.permitted(ip, expires_at)

    def bind(self, channel: int, peer: Address, expires_at: float) -> None:
        self.channels[channel] = (peer, expires_at)
        self.channel_by_peer[peer] = channel
        self.due = min(self.due, expires_at)
        if self.mirror is not None:
            self.mirror.bound(channel, peer, expires_at)

    def expire(self, now: float) -> bool:
        """Drop expired permissions and channels; True if the allocation itself expired."""
        if now < self.due:
            return False
        if now >= self.expires_at:
            return True
        ips = [ip for ip, expiry in self.permissions.items() if expiry <= now]
        for ip in ips:
            del self.permissions[ip]
        channels = [c for c, (_, expiry) in self.channels.items() if expiry <= now]
        for channel in channels:
            peer, _ = self.channels.pop(channel)
            self.channel_by_peer.pop(peer, None)
        if self.mirror is not None and (ips or channels):
            self.mirror.forgotten(ips, channels)
        self.due = min(
            self.expires_at,
            *self.permissions.values(),
            *(expiry for _, expiry in self.channels.values()),
        )
        return False

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
            self.relay = None


def _send_empty(relay: RelaySocket, peer: Address) -> None:
    """Relay a zero-length datagram (issue 20 #14: ChannelData of length 0, a Send indication
    with an empty DATA), as coturn (write_to_peerchannel, handle_turn_send) and pion/turn
    (handleChannelData: RelaySocket.WriteTo) and the native engine do. asyncio's datagram
    transport silently skips an empty `sendto` (CPython 3.11), so it goes out on its socket."""
    get_extra_info = getattr(relay, "get_extra_info", None)
    held = get_extra_info("socket") if get_extra_info is not None else None
    if held is None:  # the native engine's allocation: its send takes an empty payload
        relay.sendto(b"", peer)
        return
    sock = socket.socket(held.family, held.type, fileno=held.fileno())  # not a duplicate
    try:
        sock.sendto(b"", peer)
    except OSError as exc:  # a full buffer or an ICMP error: a UDP datagram is lost
        log.debug("relay %s: %s", peer, exc)
    finally:
        sock.detach()
