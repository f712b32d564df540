"""Peer admission for the TURN relay: listener routes -> clusters -> endpoints (ANCHORS §1.4).

A listener's `routes` name clusters, and a peer is reachable only when one of those clusters
admits it. Nothing is reachable by default: an unknown listener, a listener without routes, or
a route naming no configured cluster admits no peer.

- STATIC clusters list endpoints "IP[/prefix][:<min-max>]". The peer IP must fall in the prefix
  and, for relayed packets, the peer port in the range.
- STRICT_DNS clusters list domain names, resolved in the background (`DnsResolver`). The peer IP
  must equal one of the current addresses of one of the domains; port ranges do not apply.

A cluster's `protocol` says which allocations it serves (Go STUNner v2's "TCP clusters"): a UDP
cluster admits the peers of UDP allocations (RFC 8656), a TCP cluster those of TCP allocations
(RFC 6062: Connect, and connections to a relay address), by the same endpoints and guards.

Whatever the routes say (issue 15), no peer is ever: unspecified (0.0.0.0/8, ::), multicast,
the limited broadcast address, or one of stunnerd's own listener or relay sockets (its listener
and public addresses with a listener's port or a relay port). Loopback (127.0.0.0/8, ::1) and
link-local (169.254.0.0/16, the cloud metadata address included; fe80::/10) peers are admitted
only by a STATIC endpoint inside such a range (the demo's 127.0.0.1/32) or a STRICT_DNS name
resolving to one, never by a wider range such as 0.0.0.0/0. An IPv4 address written as IPv6
(IPv4-mapped, IPv4-compatible, NAT64 64:ff9b::/96 and 64:ff9b:1::/48, 6to4 2002::/16) is judged
as the IPv4 address it carries. `PEER_POLICY` says so in words (`/status`). Those lists live in
`stunner_api.peer_admission`, whose `explain` says why a peer is refused (`Router.explain`,
computed only when a refusal is logged; `stunner explain` prints the same).

`Router` is pure: the resolver pushes addresses in with `set_resolved`. Decisions are cached per
(listener, peer) and the caches are dropped whenever the configuration or a resolution changes.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import mmap
import os
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from stunner_api.dataplane import uri_host_port
from stunner_api.endpoints import EndpointRange, IPAddress, parse_static_endpoint
from stunner_api.peer_admission import (
    ClusterSpec,
    Verdict,
    canonical_peer_ip,
    embedded_ipv4,
    explain,
    guarded,
    never_peer,
)
from stunner_api.peer_admission import parse_peer_ip as parse_peer_ip

log = logging.getLogger("stunner.router")

PEER_POLICY = (
    "never relayed to, whatever the routes say: unspecified (0.0.0.0/8, ::), multicast, "
    "broadcast, and stunnerd's own listener and relay addresses; loopback (127.0.0.0/8, ::1) "
    "and link-local (169.254.0.0/16, fe80::/10) only where a STATIC cluster endpoint lies "
    "inside such a range or a STRICT_DNS name resolves to one; IPv4 in IPv6 spellings "
    "(IPv4-mapped, NAT64, 6to4) is judged as its IPv4 address"
)

RELAY_PORTS = 65536  # one byte per UDP port


def relay_port_map(fd: int | None = None) -> tuple[int, mmap.mmap]:
    """The relay ports of every process of a stunnerd, one byte per port, in shared memory:
    the primary creates it (`fd` None) and hands the fd to its UDP workers, which map it too,
    so no process relays to another's relay socket."""
    if fd is None:
        fd = os.memfd_create("stunnerd-relay-ports")
        os.ftruncate(fd, RELAY_PORTS)
    return fd, mmap.mmap(fd, RELAY_PORTS)


CLUSTER_PROTOCOLS = ("UDP", "TCP")  # a UDP allocation's peers, a TCP allocation's (RFC 6062)
CACHE_LIMIT = 65536  # decisions cached per kind before the cache is dropped and refilled
# Peers whose dropped packets are logged (with the reason) between two route changes: the
# first few tell the operator why; past them a client spraying peers cannot flood the log.
REFUSED_PACKET_LOGS = 16
DNS_UPDATE_INTERVAL = 5.0  # Go STUNner's dnsUpdateInterval


@dataclass(frozen=True, slots=True)
class _Matcher:
    """One cluster, parsed once per update."""

    name: str
    protocol: str = "UDP"
    endpoints: tuple[EndpointRange, ...] = ()
    domains: tuple[str, ...] = ()


def _build_matcher(cluster: ClusterSpec) -> _Matcher | None:
    """The matcher of a UDP or TCP cluster, or None (with a warning) for one that admits
    nothing."""
    kind, protocol = cluster.type.upper(), cluster.protocol.upper()
    if protocol not in CLUSTER_PROTOCOLS:
        log.warning(
            "cluster %s: protocol %s is not relayed by this dataplane; it admits no peer",
            cluster.name,
            cluster.protocol,
        )
        return None
    if kind == "STRICT_DNS":
        return _Matcher(cluster.name, protocol, domains=tuple(d for d in cluster.endpoints if d))
    if kind != "STATIC":
        log.warning("cluster %s: unknown type %r; it admits no peer", cluster.name, cluster.type)
        return None
    endpoints = []
    for text in cluster.endpoints:
        try:
            endpoints.append(parse_static_endpoint(text))
        except ValueError as exc:
            log.warning("cluster %s: endpoint ignored: %s", cluster.name, exc)
    return _Matcher(cluster.name, protocol, endpoints=tuple(endpoints))


class Router:
    """Decides which peers each listener may reach. Single-threaded (one asyncio loop)."""

    def __init__(self, relay_ports: bytearray | mmap.mmap | None = None) -> None:
        self._routes: dict[str, tuple[_Matcher, ...]] = {}
        # As configured, for `explain` (refusals only, never per packet).
        self._route_names: dict[str, tuple[str, ...]] = {}
        self._clusters: tuple[ClusterSpec, ...] = ()
        # stunnerd's own sockets: its addresses, the ports of its listeners, and the ports
        # of its relay sockets (a byte per port the allocations mark, `relay_port_map`).
        self.own_ips: frozenset[str] = frozenset()
        self.own_ports: frozenset[int] = frozenset()
        # The ports of its HTTP servers (health check, metrics; the daemon sets them as they
        # start): an RFC 6062 TCP peer on one of its own addresses never reaches them, even
        # when a TCP cluster covers the pod's address.
        self.service_ports: frozenset[int] = frozenset()
        # A listener on 0.0.0.0 or :: (and its relay sockets) answers on every address of the
        # host: then each of those is stunnerd's own too (`is_own_ip`), looked up once each.
        self._any_address = False
        self._host_addresses: dict[str, bool] = {}
        self.relay_ports = relay_ports if relay_ports is not None else bytearray(RELAY_PORTS)
        self._domains: set[str] = set()
        self._resolved: dict[str, frozenset[IPAddress]] = {}
        # UDP and TCP peers: each protocol's decisions in a cache of its own.
        self._admit_cache: dict[tuple[str, str, int], str | None] = {}
        self._tcp_admit_cache: dict[tuple[str, str, int], str | None] = {}
        self._permit_cache: dict[tuple[str, str, str], bool] = {}
        # (listener, peer, protocol) whose dropped packets were logged since the last change
        self._refusals_logged: set[tuple[str, str, int, str]] = set()
        self.epoch = 0  # bumped whenever cached decisions are dropped
        self._watchers: list[Callable[[], None]] = []

    def _invalidate(self) -> None:
        self.epoch += 1
        self._admit_cache.clear()
        self._tcp_admit_cache.clear()
        self._permit_cache.clear()
        self._refusals_logged.clear()
        for dropped in list(self._watchers):
            dropped()

    def watch(self, dropped: Callable[[], None]) -> Callable[[], None]:
        """Call `dropped` whenever cached decisions are dropped (a native relay engine clears
        the verdicts it cached); returns the call that stops watching."""
        self._watchers.append(dropped)
        return lambda: self._watchers.remove(dropped)

    def update(
        self,
        routes: Mapping[str, Sequence[str]],
        clusters: Sequence[ClusterSpec],
        own: Iterable[tuple[str, int]] = (),
    ) -> None:
        """Install a new configuration: listener name -> routed cluster names, clusters, and
        stunnerd's own (address, port) pairs (its listeners', public ones included).

        Resolved addresses are kept for domains that stay configured.
        """
        own = list(own)
        own_ips: set[str] = set()
        for text, _ in own:
            ip = parse_peer_ip(text)
            if ip is not None:  # every spelling a socket may report
                own_ips.update((str(ip), text))
                if isinstance(ip, ipaddress.IPv4Address):
                    own_ips.add(f"::ffff:{ip}")
        self.own_ips = frozenset(own_ips)
        self.own_ports = frozenset(port for _, port in own)
        self._any_address = any(
            ip is not None and ip.is_unspecified for ip in (parse_peer_ip(t) for t, _ in own)
        )
        self._host_addresses.clear()
        matchers: dict[str, _Matcher | None] = {c.name: _build_matcher(c) for c in clusters}
        table: dict[str, tuple[_Matcher, ...]] = {}
        for listener, names in routes.items():
            routed = []
            for name in names:
                if name not in matchers:
                    log.warning("listener %s: route to unknown cluster %s ignored", listener, name)
                    continue
                matcher = matchers[name]
                if matcher is not None:
                    routed.append(matcher)
            table[listener] = tuple(routed)
        domains = {d for m in matchers.values() if m is not None for d in m.domains}
        self._routes = table
        self._route_names = {listener: tuple(names) for listener, names in routes.items()}
        self._clusters = tuple(clusters)
        self._domains = domains
        self._resolved = {d: ips for d, ips in self._resolved.items() if d in domains}
        self._invalidate()

    def dns_domains(self) -> set[str]:
        """The STRICT_DNS domain names of the current configuration."""
        return set(self._domains)

    def set_resolved(self, domain: str, addresses: Iterable[str]) -> None:
        """Record the current addresses of `domain` (the resolver's callback)."""
        if domain not in self._domains:
            log.debug("resolved domain %s is no longer configured; ignored", domain)
            return
        parsed = set()
        for text in addresses:
            ip = parse_peer_ip(text)
            if ip is None:
                log.debug("domain %s: resolved address %r is not an IP; ignored", domain, text)
            else:
                parsed.add(ip)
        new = frozenset(parsed)
        if self._resolved.get(domain) == new:
            return
        self._resolved[domain] = new
        log.info("domain %s resolved to [%s]", domain, ", ".join(sorted(map(str, new))))
        self._invalidate()

    def _matches(self, matcher: _Matcher, ip: IPAddress, port: int | None) -> bool:
        for domain in matcher.domains:
            if ip in self._resolved.get(domain, ()):
                return True
        guard = guarded(ip)
        for endpoint in matcher.endpoints:
            network = endpoint.network
            if guard is not None and not (
                network.version == guard.version and network.subnet_of(guard)  # type: ignore[arg-type]
            ):
                continue  # a loopback or link-local peer needs an endpoint naming its range
            if endpoint.contains(ip) if port is None else endpoint.admits(ip, port):
                return True
        return False

    def _decide(
        self, listener: str, peer_ip: str, peer_port: int | None, protocol: str = "UDP"
    ) -> str | None:
        """The name of the first routed cluster of `protocol` that admits the peer, or None."""
        ip = parse_peer_ip(canonical_peer_ip(peer_ip))  # ::ffff:10.0.0.1 is 10.0.0.1
        if ip is None:
            log.debug("listener %s: peer %r is not an IP address", listener, peer_ip)
            return None
        carried = embedded_ipv4(ip)
        refusal = never_peer(ip)
        if carried is not None:  # an IPv4 address in an IPv6 spelling: never loopback etc.
            refusal = (
                refusal
                or never_peer(carried)
                or ("embedded loopback" if guarded(carried) else None)
            )
        if refusal:
            log.debug("listener %s: peer %s refused: %s", listener, peer_ip, refusal)
            return None
        if peer_port is not None and self._own_port(peer_port) and self.is_own_ip(str(ip)):
            log.debug("listener %s: peer %s:%d is stunnerd itself", listener, peer_ip, peer_port)
            return None
        for matcher in self._routes.get(listener, ()):
            if matcher.protocol == protocol and self._matches(matcher, ip, peer_port):
                return matcher.name
        return None

    def routes_protocol(self, listener: str, protocol: str) -> bool:
        """Whether `listener` routes to any cluster of `protocol` (a TCP Allocate on a listener
        routing to no TCP cluster is refused at once, as Go STUNner's HasRoutedCluster does)."""
        return any(m.protocol == protocol for m in self._routes.get(listener, ()))

    def explain(
        self, listener: str, peer_ip: str, peer_port: int | None = None, protocol: str = "UDP"
    ) -> Verdict:
        """Why `listener` admits or refuses the peer of a `protocol` allocation, in words
        (`stunner_api.peer_admission`): computed when a refusal is logged, never per packet."""

        def is_own(ip: IPAddress, port: int) -> bool:
            own_port = self._own_port(port) or bool(self.relay_ports[port])
            return own_port and self.is_own_ip(str(ip))

        return explain(
            self._route_names.get(listener, ()),
            self._clusters,
            peer_ip,
            peer_port,
            resolved=self._resolved,
            is_own=is_own,
            protocol=protocol,
        )

    def log_refused_packet(
        self, listener: str, peer_ip: str, peer_port: int, protocol: str = "UDP"
    ) -> None:
        """A relayed packet of a permitted peer dropped because no route admits it (now): its
        reason at INFO, as a refused CreatePermission's, the same on the Python and the native
        path. Once per listener and peer until the routes change, for REFUSED_PACKET_LOGS
        peers at most; the reason is computed only then, never per packet."""
        key = (listener, peer_ip, peer_port, protocol)
        logged = self._refusals_logged
        if (
            key in logged
            or len(logged) >= REFUSED_PACKET_LOGS
            or not log.isEnabledFor(logging.INFO)
        ):
            return
        logged.add(key)
        why = self.explain(listener, peer_ip, peer_port, protocol)
        log.info(
            "listener %s: packets of peer %s dropped: %s: %s%s",
            listener,
            uri_host_port(peer_ip, peer_port),
            why.code,
            why.reason,
            f" (allowed by: {why.allow})" if why.allow else "",
        )

    def _own_port(self, port: int) -> bool:
        return port in self.own_ports or port in self.service_ports

    def is_own_ip(self, peer_ip: str) -> bool:
        """Whether `peer_ip` reaches stunnerd's own sockets: a listener's address or public
        address, or, when a listener binds the wildcard address, any address of this host."""
        if peer_ip in self.own_ips:
            return True
        if not self._any_address:
            return False
        own = self._host_addresses.get(peer_ip)
        if own is None:
            own = is_host_address(peer_ip)
            if len(self._host_addresses) >= CACHE_LIMIT:
                self._host_addresses.clear()
            self._host_addresses[peer_ip] = own
        return own

    def permits(self, listener: str, peer_ip: str, protocol: str = "UDP") -> bool:
        """CreatePermission/ChannelBind: whether a routed cluster of `protocol` admits `peer_ip`
        on any port."""
        key = (listener, peer_ip, protocol)
        decision = self._permit_cache.get(key)
        if decision is None:
            decision = self._decide(listener, peer_ip, None, protocol) is not None
            if len(self._permit_cache) >= CACHE_LIMIT:
                self._permit_cache.clear()
            self._permit_cache[key] = decision
        return decision

    def admits(self, listener: str, peer_ip: str, peer_port: int) -> bool:
        """Per relayed packet, either direction: whether a routed cluster admits IP and port."""
        return self.cluster_of(listener, peer_ip, peer_port) is not None

    def cluster_of(
        self, listener: str, peer_ip: str, peer_port: int, protocol: str = "UDP"
    ) -> str | None:
        """Per relayed packet (UDP), per TCP connection to or from a peer (TCP): the routed
        cluster of `protocol` admitting IP and port (None: drop it). Cached; the cache is
        cleared by every update."""
        key = (listener, peer_ip, peer_port)
        cache = self._admit_cache if protocol == "UDP" else self._tcp_admit_cache
        try:
            cluster = cache[key]
        except KeyError:
            pass
        else:
            # Relay ports come and go between reconciles: checked per packet, not cached.
            if cluster is not None and self.relay_ports[peer_port] and self.is_own_ip(peer_ip):
                return None
            return cluster
        valid_port = isinstance(peer_port, int) and 0 <= peer_port <= 65535
        cluster = self._decide(listener, peer_ip, peer_port, protocol) if valid_port else None
        if len(cache) >= CACHE_LIMIT:
            cache.clear()
        cache[key] = cluster
        if cluster is not None and self.relay_ports[peer_port] and self.is_own_ip(peer_ip):
            return None
        return cluster


def is_host_address(text: str) -> bool:
    """Whether `text` is an address of this host: the kernel lets a socket bind only those
    (EADDRNOTAVAIL otherwise), whatever the interfaces and however they change."""
    ip = parse_peer_ip(text)
    if ip is None:
        return False
    ip = embedded_ipv4(ip) or ip
    if ip.is_unspecified:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((str(ip), 0))
    except OSError:
        return False
    return True


async def resolve_with_getaddrinfo(domain: str) -> list[str]:
    """The IPv4 and IPv6 addresses of `domain`, via the event loop's getaddrinfo."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(domain, None, type=socket.SOCK_DGRAM)
    addresses: dict[str, None] = {}  # ordered and deduplicated
    for _family, _type, _proto, _name, sockaddr in infos:
        addresses[str(sockaddr[0])] = None
    return list(addresses)


class DnsResolver:
    """Re-resolves the router's STRICT_DNS domains every `interval` seconds.

    A failed or timed-out lookup keeps the last good addresses of that domain.
    """

    def __init__(
        self,
        router: Router,
        interval: float = DNS_UPDATE_INTERVAL,
        resolve: Callable[[str], Awaitable[list[str]]] | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.router = router
        self.interval = interval
        self.timeout = timeout
        self._resolve = resolve or resolve_with_getaddrinfo
        self._loop_task: asyncio.Task[None] | None = None
        self._pending: asyncio.Task[None] | None = None
        self._known: set[str] = set()

    async def _resolve_one(self, domain: str) -> None:
        try:
            addresses = await asyncio.wait_for(self._resolve(domain), self.timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure of one lookup must not stop the others
            log.debug("cannot resolve %s (keeping the last addresses): %r", domain, exc)
            return
        self.router.set_resolved(domain, addresses)

    async def resolve_now(self) -> None:
        """Resolve every configured domain once, concurrently."""
        domains = sorted(self.router.dns_domains())
        if domains:
            await asyncio.gather(*(self._resolve_one(domain) for domain in domains))

    async def run(self) -> None:
        """Resolve forever, every `interval` seconds, until cancelled."""
        while True:
            await self.resolve_now()
            await asyncio.sleep(self.interval)

    def follow(self) -> None:
        """After a router update: resolve in the background if there are domains, and resolve
        the domains new since the last call at once."""
        domains = self.router.dns_domains()
        if not domains:
            return
        loop = asyncio.get_running_loop()
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = loop.create_task(self.run())
        elif domains - self._known:
            self._pending = loop.create_task(self.resolve_now())
        self._known = domains

    def close(self) -> None:
        for task in (self._loop_task, self._pending):
            if task is not None:
                task.cancel()
