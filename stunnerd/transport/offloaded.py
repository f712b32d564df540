"""The kernel offload of one TURN-UDP listener's allocations (issue 30): what the native UDP
transport (`native_udp`) tells the kernel, and what it counts of what the kernel relayed.

`OffloadedAllocations.sync(handle, allocation)` runs after every change the allocation's mirror is
told of (a bind, a permission, a refresh, an expiry sweep) and, through `sync_all`, after every
router invalidation (a route, config or DNS change): the allocation's routes in the kernel become
exactly the channels `stunnerd.offload.engine.plan_channels` finds offloadable now, or none when the
offload is off or the allocation is capped (auth.allocation_bandwidth_limit: the kernel has no
bucket, so a capped allocation stays with the native engine, which enforces it; a cap set in place
takes its routes back out of the kernel). `forget` empties them at the allocation's end, `close` at
the listener's. What the kernel relayed is counted as the native engine counts what it relays
itself: a client's datagram (payload and the 4-byte ChannelData header) on the listener, the payload
on the peer's cluster and on the allocation itself (what `stunner sessions` shows); every second
(`sweep`) and at every removal.

An allocation is known by its `Key`: the engine it lives in (a listener runs one per socket of
its SO_REUSEPORT group, all in this process) and the engine's handle for it; the process's one
program carries every engine's allocations, as they share the listener's address.
"""

from __future__ import annotations

from collections.abc import Callable

from ..offload.engine import AllocationRoutes, plan_channels
from ..offload.layout import Address, Usage
from ..turn.allocation import Allocation
from ..turn.server import TurnServer

CHANNEL_HEADER = 4
Key = tuple[int, int]  # (engine, the engine's handle)


class OffloadedAllocations:
    """The kernel routes of one listener's allocations, by engine and handle (`Key`)."""

    def __init__(self, server: TurnServer, listener_address: Callable[[], Address | None]) -> None:
        self.server = server
        self._listener_address = listener_address  # the listener socket's, while it runs
        self._routes: dict[Key, AllocationRoutes] = {}

    def idle(self, key: Key) -> bool:
        """Nothing to sync for `key`: the offload is off and it has no routes in the kernel
        (every request's change asks; issue 30: the allocations' set-up is Python's work)."""
        return not self.server.context.offload.active and key not in self._routes

    def sync(self, key: Key, allocation: Allocation | None, relay: Address | None) -> None:
        """Make the allocation's routes in the kernel what stunnerd decides now."""
        offload = self.server.context.offload
        routes = self._routes.get(key)
        listener = self._listener_address()
        if (
            allocation is None
            or relay is None
            or listener is None
            or not offload.active
            or allocation.cap is not None  # capped: the engine's buckets see every packet
        ):
            if routes is not None:
                self.forget(key)
            return
        if routes is None:
            routes = AllocationRoutes(
                offload,
                allocation.downstream.address,
                listener,
                relay,
                lambda cluster, used: self._count(cluster, used, allocation),
            )
            self._routes[key] = routes
        router, name = self.server.router, self.server.name
        routes.sync(
            plan_channels(
                allocation.channels,
                allocation.permissions,
                allocation.expires_at,
                lambda peer: router.cluster_of(name, peer[0], peer[1]),
                router.is_own_ip,
            )
        )

    def forget(self, key: Key) -> None:
        routes = self._routes.pop(key, None)
        if routes is not None:
            routes.close()

    def close(self) -> None:
        for key in list(self._routes):
            self.forget(key)

    def sweep(self) -> None:
        for routes in self._routes.values():
            routes.collect()

    def _count(self, cluster: str, used: Usage, allocation: Allocation) -> None:
        # the allocation's own (sessions, issue 29): payload bytes, as the engine counts them
        allocation.rx_packets += used.to_peer_packets
        allocation.rx_bytes += used.to_peer_bytes
        allocation.tx_packets += used.to_client_packets
        allocation.tx_bytes += used.to_client_bytes
        stats = self.server.stats
        rx_bytes = used.to_peer_bytes + CHANNEL_HEADER * used.to_peer_packets
        tx_bytes = used.to_client_bytes + CHANNEL_HEADER * used.to_client_packets
        stats.rx_packets += used.to_peer_packets
        stats.rx_bytes += rx_bytes
        stats.tx_packets += used.to_client_packets
        stats.tx_bytes += tx_bytes
        stats.offloaded_rx_packets += used.to_peer_packets
        stats.offloaded_rx_bytes += rx_bytes
        stats.offloaded_tx_packets += used.to_client_packets
        stats.offloaded_tx_bytes += tx_bytes
        counters = self.server.scope.cluster_counters[cluster]
        counters.tx_packets += used.to_peer_packets
        counters.tx_bytes += used.to_peer_bytes
        counters.rx_packets += used.to_client_packets
        counters.rx_bytes += used.to_client_bytes
