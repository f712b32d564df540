"""The kernel offload of one stunnerd process (issue 30): the program, its links, its routes.

`KernelOffload` follows `admin.offload_engine` and `admin.offload_interfaces` at every apply:
`None` (the default) leaves nothing loaded; `TC` loads the TC program and attaches it at the
tcx ingress of the named interfaces (all of this host's Ethernet and loopback interfaces when
none is named); `XDP` loads the XDP program and links it to them, in driver mode where the
driver has XDP, else generic (`modes` says which, per interface); `Auto` is TC first, then XDP
where TC cannot run (as Go STUNner's). Where it cannot run (no CAP_BPF or CAP_NET_ADMIN, a
kernel before 6.6 for TC, an interface that holds another XDP program, a verifier refusal, no
object built) it logs one WARNING naming the engine and why, `reason` says it, and stunnerd
relays as without it.

Each UDP process (the primary and every UDP worker) has its own: its program and maps die with
it, so a process that exits, however, leaves nothing that relays (its tcx links are never
pinned); tcx runs every process's program on the hook in turn, and a datagram none of them owns
goes up the stack.

`AllocationRoutes` are one allocation's entries in the maps, written only from what stunnerd
decided: `sync(planned)` makes them exactly the channels `plan_channels` finds offloadable (a
bound channel, a live permission for its peer, a peer some route admits and that is none of
stunnerd's own addresses, one family), each until the earliest of the channel's, the
permission's and the allocation's expiry. Every change re-syncs (a bind, a permission, a
refresh, an expiry sweep, a route change: `Router.watch`), and `close()` empties them at the
allocation's end. What the kernel relayed is read from its counters per channel slot and handed
to `count(cluster, usage)` on every `collect()` and at every removal.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from . import attach, layout, netlink, program
from .layout import Address, Route, Usage

log = logging.getLogger("stunner.offload")

SLOTS = 65536  # channels offloaded at once per process (the `usage` map's size)
# admin.offload_engine -> the hooks tried, in order.
ENGINES = {"TC": ("TC",), "XDP": ("XDP",), "Auto": ("TC", "XDP")}


def all_interfaces() -> list[str]:
    """This host's interfaces the program can run on (an Ethernet header: Ethernet, loopback)."""
    return sorted(
        name
        for _, name in socket.if_nameindex()
        if attach.interface_type(name) in (attach.ARPHRD_ETHER, attach.ARPHRD_LOOPBACK)
    )


class KernelOffload:
    """The offload of this process: off, or the program attached to `interfaces`."""

    def __init__(self, log_level: int = logging.WARNING) -> None:
        # A UDP worker tells at DEBUG what its primary, applying the same config with the same
        # privileges, has already told at WARNING and INFO: one warning per stunnerd.
        self.log_level = log_level
        self.loaded: program.LoadedProgram | None = None
        self.attachments: dict[str, attach.Attachment] = {}
        self.requested: tuple[str, tuple[str, ...]] = ("None", ())
        self.reason: str | None = "admin.offload_engine is None"
        self.reason_code = "disabled"  # the metric's label: a short word for `reason`
        self._free = list(range(SLOTS - 1, -1, -1))
        self._read: dict[int, Usage] = {}  # slot -> the kernel's count when last read
        self._routes: set[AllocationRoutes] = set()
        self._warned: set[str] = set()

    @property
    def active(self) -> bool:
        return self.loaded is not None

    @property
    def interfaces(self) -> list[str]:
        return sorted(self.attachments)

    @property
    def engine(self) -> str | None:
        """The hook the program runs at (TC, XDP), while it is loaded."""
        return self.loaded.hook if self.loaded is not None else None

    @property
    def modes(self) -> dict[str, str]:
        """Per interface, how the program runs there: tcx, or XDP's driver or generic mode."""
        return {name: a.mode for name, a in sorted(self.attachments.items())}

    def configure(self, engine: str, interfaces: list[str]) -> None:
        """Follow the config (in place: routes already installed stay when it stays on)."""
        requested = (engine, tuple(sorted(interfaces)))
        if requested == self.requested:
            return
        self.requested = requested
        if engine == "None":
            self._stop("admin.offload_engine is None", "disabled")
            return
        hooks = ENGINES.get(engine)
        if hooks is None:
            self._stop(f"offload engine {engine} is not available (TC, XDP, Auto are)", "engine")
            self._warn(self.reason or "")
            return
        if not program.OBJECT.exists():
            self._stop(
                f"the offload program was not built ({program.OBJECT.name} is missing)",
                "not_built",
            )
            self._warn(self.reason or "")
            return
        failures: list[tuple[str, str]] = []
        for hook in hooks:
            try:
                self._start(hook, list(interfaces) or all_interfaces())
            except Exception as exc:  # whatever it is, the config applies and stunnerd relays
                why, code = attach.why_not(exc, hook)
                self._stop(why, code)
                failures.append((f"{hook}: {why}", code))
                continue
            self.reason, self.reason_code = None, ""
            level = logging.INFO if self.log_level >= logging.WARNING else self.log_level
            where = ", ".join(f"{name} ({mode})" for name, mode in self.modes.items())
            log.log(level, "offload: %s on %s", hook, where)
            return
        self.reason, self.reason_code = "; ".join(f for f, _ in failures), failures[0][1]
        self._warn(self.reason)

    def _start(self, hook: str, wanted: list[str]) -> None:
        """The program for `hook` loaded (the other hook's unloaded) and attached to `wanted`."""
        if self.loaded is not None and self.loaded.hook != hook:
            self._stop("the offload engine changed", "stopped")
        if self.loaded is None:
            self.loaded = program.load(entries={"usage": SLOTS}, hook=hook)
        for name in [n for n in self.attachments if n not in wanted]:
            self.attachments.pop(name).close()
        for name in wanted:
            if name not in self.attachments:
                link = attach.attach_tc if hook == "TC" else attach.attach_xdp
                self.attachments[name] = link(self.loaded.fd, name)

    def _warn(self, reason: str) -> None:
        if reason not in self._warned:
            self._warned.add(reason)
            log.log(self.log_level, "offload off, relaying in user space: %s", reason)

    def _stop(self, reason: str, code: str) -> None:
        for routes in list(self._routes):
            routes.close()
        for attachment in self.attachments.values():
            attachment.close()
        self.attachments.clear()
        if self.loaded is not None:
            self.loaded.close()
            self.loaded = None
        self.reason, self.reason_code = reason, code

    def close(self) -> None:
        self._stop("stunnerd stopped", "stopped")

    # --- for AllocationRoutes -----------------------------------------------------------------

    def claim(self, routes: AllocationRoutes) -> int | None:
        if self.loaded is None or not self._free:
            return None
        self._routes.add(routes)
        slot = self._free.pop()
        self._read[slot] = self._usage(slot)  # a slot is reused: count from here
        return slot

    def release(self, slot: int) -> Usage:
        """What the slot counted since it was last read; the slot is free again."""
        used = self.read(slot)
        self._read.pop(slot, None)
        self._free.append(slot)
        return used

    def read(self, slot: int) -> Usage:
        """What the kernel counted in `slot` since the last read."""
        now = self._usage(slot)
        used = now.since(self._read.get(slot, Usage()))
        self._read[slot] = now
        return used

    def _usage(self, slot: int) -> Usage:
        if self.loaded is None:
            return self._read.get(slot, Usage())
        packed = self.loaded.maps["usage"].lookup(layout.SLOT.pack(slot))
        return Usage.unpack(packed) if packed else Usage()

    def write(self, name: str, key: bytes, value: bytes) -> None:
        if self.loaded is not None:
            self.loaded.maps[name].update(key, value)

    def delete(self, name: str, key: bytes) -> None:
        if self.loaded is not None:
            self.loaded.maps[name].delete(key)

    def forget(self, routes: AllocationRoutes) -> None:
        self._routes.discard(routes)


@dataclass(frozen=True)
class Planned:
    """A channel to offload: its peer, the peer's cluster, until when (time.monotonic())."""

    peer: Address
    cluster: str
    expires_at: float


def plan_channels(
    channels: Mapping[int, tuple[Address, float]],
    permissions: Mapping[str, float],
    expires_at: float,
    cluster_of: Callable[[Address], str | None],
    is_own: Callable[[str], bool],
) -> dict[int, Planned]:
    """The channels of an allocation the kernel may relay now, as stunnerd decided them."""
    planned = {}
    for channel, (peer, channel_expiry) in channels.items():
        permission = permissions.get(peer[0])
        if permission is None or is_own(peer[0]):
            continue
        cluster = cluster_of(peer)
        if cluster is None:
            continue
        planned[channel] = Planned(peer, cluster, min(channel_expiry, permission, expires_at))
    return planned


@dataclass(frozen=True)
class Installed:
    planned: Planned
    slot: int
    client_key: bytes
    peer_key: bytes


def local_address(bound: Address, towards: str) -> str:
    """The address a socket bound to `bound` sends from towards `towards`: its own, or for a
    wildcard socket the one the kernel picks (a connected probe, no packet sent)."""
    if not ipaddress.ip_address(bound[0]).is_unspecified:
        return bound[0]
    family = socket.AF_INET6 if ":" in towards else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((towards, 9))
        return str(probe.getsockname()[0])


class AllocationRoutes:
    """One allocation's routes in the kernel (see the module docstring)."""

    def __init__(
        self,
        offload: KernelOffload,
        client: Address,
        listener: Address,
        relay: Address,
        count: Callable[[str, Usage], None],
    ) -> None:
        self.offload = offload
        self.client = client
        self.listener = (local_address(listener, client[0]), listener[1])
        self.relay = relay
        self.count = count
        self.installed: dict[int, Installed] = {}

    def sync(self, planned: Mapping[int, Planned]) -> None:
        """Make the kernel's routes exactly `planned` (channel -> what to offload)."""
        for channel, installed in list(self.installed.items()):
            plan = planned.get(channel)
            if plan is None or plan.peer != installed.planned.peer:
                self._remove(channel)
        for channel, plan in planned.items():
            current = self.installed.get(channel)
            if current is None or current.planned != plan:
                try:
                    self._install(channel, plan, current)
                except OSError as exc:  # a route lookup that failed: stunnerd relays it
                    log.debug("offload: channel %#x of %s: %s", channel, self.client, exc)
                    if channel in self.installed:
                        self._remove(channel)

    def _install(self, channel: int, plan: Planned, done: Installed | None) -> None:
        offload = self.offload
        if (
            ipaddress.ip_address(plan.peer[0]).version
            != ipaddress.ip_address(self.client[0]).version
        ):
            return  # a family change (RFC 6156) stays in user space
        to_peer, to_client = netlink.route_to(plan.peer[0]), netlink.route_to(self.client[0])
        if to_peer is None or to_client is None:  # no route there now: stunnerd's to relay
            if done is not None:
                self._remove(channel)
            return
        slot = done.slot if done is not None else offload.claim(self)
        if slot is None:
            return
        relay = (local_address(self.relay, plan.peer[0]), self.relay[1])
        expires_ns = int(plan.expires_at * 1e9)
        client_key = layout.client_key(self.client, self.listener, channel)
        peer_key = layout.peer_key(plan.peer, relay)
        try:
            offload.write(
                "from_clients",
                client_key,
                Route(relay, plan.peer, expires_ns, slot, to_peer.ifindex).pack(),
            )
            offload.write(
                "from_peers",
                peer_key,
                Route(
                    self.listener, self.client, expires_ns, slot, to_client.ifindex, channel
                ).pack(),
            )
        except OSError as exc:  # a full map: this channel stays in user space
            log.debug("offload: channel %#x of %s: %s", channel, self.client, exc)
            offload.delete("from_clients", client_key)
            if done is None:
                self.count(plan.cluster, offload.release(slot))
            return
        if done is not None and done.planned.cluster != plan.cluster:
            self.count(done.planned.cluster, offload.read(slot))
        self.installed[channel] = Installed(plan, slot, client_key, peer_key)

    def _remove(self, channel: int) -> None:
        done = self.installed.pop(channel)
        self.offload.delete("from_clients", done.client_key)
        self.offload.delete("from_peers", done.peer_key)
        self.count(done.planned.cluster, self.offload.release(done.slot))

    def collect(self) -> None:
        """Hand what the kernel relayed since the last collect to `count`."""
        for done in self.installed.values():
            used = self.offload.read(done.slot)
            if used != Usage():
                self.count(done.planned.cluster, used)

    def close(self) -> None:
        for channel in list(self.installed):
            self._remove(channel)
        self.offload.forget(self)
