"""What the two native transports (native_udp, native_tcp) share of the C engine: an
allocation's relay socket inside the engine and the mirror of its state (`NativeAllocation`),
the engines, their allocations, a peer's packet they hand up and their counters as a listener's
(`NativeEngines`), the decision a packet an engine hands up gets (`decide_and_reinject`), and
the peer a client's packet is for as Python's state says (`relayed_peer`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stunner_api import stun
from stunner_api.stun import Address

from ..turn.allocation import Allocation
from ..turn.counters import ClusterCounters, ListenerCounters
from ..turn.server import TurnServer
from . import native


def _unchanged(handle: int) -> None:
    """No kernel routes to re-sync (TURN-TCP)."""


class NativeAllocation:
    """An allocation's relay socket inside the engine, and the mirror of its state."""

    __slots__ = ("engine", "handle", "sockname", "_forget", "_changed")

    def __init__(
        self,
        engine: native.NativeRelay,
        handle: int,
        sockname: Any,
        forget: Any,
        changed: Any = None,
    ) -> None:
        self.engine = engine
        self.handle = handle
        self.sockname = sockname  # the relay socket's address (as an asyncio transport says)
        self._forget = forget
        # TURN-UDP: the kernel offload re-syncs the allocation's routes after every change
        self._changed = changed or _unchanged

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.sockname if name == "sockname" else default

    def traffic(self) -> tuple[int, int, int, int]:
        """What the engine relayed for it: rx packets, rx bytes (from the client), tx packets,
        tx bytes (to it); zeros once it is gone (sessions, issue 29)."""
        try:
            return self.engine.allocation_traffic(self.handle)
        except (KeyError, ValueError, OSError):
            return (0, 0, 0, 0)

    # RelaySocket: what Python relays itself, already decided and counted
    def sendto(self, data: bytes, addr: Address) -> None:
        self.engine.send(self.handle, addr, data)

    def close(self) -> None:
        self._forget(self.handle)
        try:
            self.engine.remove_allocation(self.handle)
        except (KeyError, ValueError):  # already gone, or the engine closed with its listener
            pass

    # AllocationMirror
    def refreshed(self, expires_at: float) -> None:
        self.engine.refresh_allocation(self.handle, expires_at)
        self._changed(self.handle)

    def permitted(self, ip: str, expires_at: float) -> None:
        self.engine.set_permission(self.handle, ip, expires_at)
        self._changed(self.handle)

    def bound(self, channel: int, peer: Address, expires_at: float) -> None:
        self.engine.bind_channel(self.handle, channel, peer, expires_at)
        self._changed(self.handle)

    def limited(self, rate: float, burst: float) -> None:
        self.engine.set_bandwidth(self.handle, rate, burst)
        self._changed(self.handle)  # the kernel offload declines a capped allocation

    def forgotten(self, ips: list[str], channels: list[int]) -> None:
        for ip in ips:
            self.engine.remove_permission(self.handle, ip)
        for channel in channels:
            self.engine.remove_channel(self.handle, channel)
        self._changed(self.handle)


class NativeEngines:
    """What a transport on native engines keeps of them, the same for TURN-UDP and TURN-TCP:
    its engines (`relays`), its allocations by (engine, handle) (`engine_allocations`), what to
    undo when they stop (`unwatch_on_stop`), a peer's packet an engine handed up (`from_peer`:
    the router decides, the verdict is installed, the packet re-injected and, if it goes up,
    given to its allocation), and the engines' counters as a listener's (their total, or the
    last one kept after they stopped; empty before any ran). Mixed in before the Python
    transport it extends, whose `server` it reads."""

    server: TurnServer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.relays: list[native.NativeRelay] = []
        self.engine_allocations: dict[tuple[int, int], Allocation] = {}  # (engine, handle) -> it
        self.unwatch_on_stop: list[Callable[[], None]] = []
        self.last_counters: native.NativeCounters | None = None  # after stop

    def from_peer(self, engine: int, packet: native.HandedUp) -> None:
        """A peer's packet `engine` had no verdict for: decided, and relayed up if allowed."""
        allocation = self.engine_allocations.get((engine, packet.handle))
        if allocation is None:
            return  # removed while its packet waited
        if self.decided(engine, (packet.address[0], packet.address[1]), packet) != native.UP:
            return
        allocation.datagram_received(packet.data, packet.address)

    def decided(self, engine: int, peer: Address, packet: native.HandedUp) -> int:
        """The router's verdict for `peer` installed in `engine`, and `packet` decided again."""
        return decide_and_reinject(self.relays[engine], self.server, peer, packet)

    def stop_engines(self) -> None:
        """Stop and close every engine (and what each holds), keeping their last counters; the
        engines' cluster counters outlive them in the process's, as Python's do."""
        relays, self.relays = self.relays, []
        if not relays:
            return
        for unwatch in self.unwatch_on_stop:
            unwatch()
        self.unwatch_on_stop = []
        self.last_counters = native.NativeCounters.total([relay.counters() for relay in relays])
        for relay in relays:
            relay.close()
        for name, counters in self.last_counters.cluster_counters().items():
            self.server.scope.cluster_counters[name].add(counters)
        self.last_counters.clusters = {}

    def engine_counters(self) -> native.NativeCounters | None:
        """The engines' total while they run, the last one after; None before any ran."""
        if self.relays:
            return native.NativeCounters.total([relay.counters() for relay in self.relays])
        return self.last_counters

    def listener_counters(self) -> ListenerCounters:
        """What the engines consumed of the listener's traffic (Python's is the server's)."""
        counted = self.engine_counters()
        return counted.listener() if counted is not None else ListenerCounters()

    def cluster_counters(self) -> dict[str, ClusterCounters]:
        """The engines' per-cluster counters while they run (then they are in the process's)."""
        counted = self.engine_counters()
        return counted.cluster_counters() if counted is not None else {}


def decide_and_reinject(
    relay: native.NativeRelay, server: TurnServer, peer: Address, packet: native.HandedUp
) -> int:
    """Install the router's verdict for `peer` in `relay` and let it decide `packet` again
    (the TURN-UDP and TURN-TCP transports alike)."""
    router = server.router
    own = router.is_own_ip(peer[0])  # not a relay socket of ours: checked per packet
    cluster = router.cluster_of(server.name, *peer)
    relay.decide(peer, cluster, own)
    if cluster is None:  # the engine drops this one and the peer's next ones: say why once
        router.log_refused_packet(server.name, *peer)
    return relay.reinject(packet)


def relayed_peer(allocation: Allocation, data: bytes) -> Address | None:
    """The peer a client's ChannelData or Send indication is for, as Python's state says."""
    if len(data) >= 4 and stun.is_channel_data(data):
        binding = allocation.channels.get(int.from_bytes(data[:2], "big"))
        return binding[0] if binding is not None else None
    if data[:2] == stun.SEND_INDICATION_PREFIX:
        relay = stun.parse_send_indication(data)
        if relay is not None:
            return relay[0]
    return None
