"""What the two native transports (native_udp, native_tcp) share of the C engine: an
allocation's relay socket inside the engine and the mirror of its state (`NativeAllocation`),
the engines' counters as a listener's (`EngineCounted`), the decision a packet the engine hands
up gets (`decide_and_reinject`), and the peer a client's packet is for as Python's state says
(`relayed_peer`).
"""

from __future__ import annotations

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


class EngineCounted:
    """The counters of a transport whose native engines count its traffic (`_counters`: their
    total, or the last one kept after they stopped; None before any ran)."""

    def _counters(self) -> native.NativeCounters | None:
        raise NotImplementedError

    def listener_counters(self) -> ListenerCounters:
        """What the engines consumed of the listener's traffic (Python's is the server's)."""
        counted = self._counters()
        return counted.listener() if counted is not None else ListenerCounters()

    def cluster_counters(self) -> dict[str, ClusterCounters]:
        """The engines' per-cluster counters while they run (then they are in the process's)."""
        counted = self._counters()
        return counted.cluster_counters() if counted is not None else {}


def decide_and_reinject(
    relay: native.NativeRelay, server: TurnServer, peer: Address, packet: native.HandedUp
) -> int:
    """Install the router's verdict for `peer` in `relay` and let it decide `packet` again
    (the TURN-UDP and TURN-TCP transports alike)."""
    router = server.router
    own = router.is_own_ip(peer[0])  # not a relay socket of ours: checked per packet
    relay.decide(peer, router.cluster_of(server.name, *peer), own)
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
