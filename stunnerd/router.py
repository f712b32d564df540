"""Peer admission for the TURN relay: listener routes -> clusters -> endpoints (ANCHORS §1.4).

A listener's `routes` name clusters, and a peer is reachable only when one of those clusters
admits it. Nothing is reachable by default: an unknown listener, a listener without routes, or
a route naming no configured cluster admits no peer.

- STATIC clusters list endpoints "IP[/prefix][:<min-max>]". The peer IP must fall in the prefix
  and, for relayed packets, the peer port in the range.
- STRICT_DNS clusters list domain names, resolved in the background (`DnsResolver`). The peer IP
  must equal one of the current addresses of one of the domains; port ranges do not apply.

This dataplane relays UDP only, so only UDP clusters admit peers; TCP clusters are accepted in
the config and admit nothing (a warning says so).

`Router` is pure: the resolver pushes addresses in with `set_resolved`. Decisions are cached per
(listener, peer) and the caches are dropped whenever the configuration or a resolution changes.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from stunner_api.endpoints import (
    EndpointRange,
    IPAddress,
    normalize_ip,
    parse_static_endpoint,
)

log = logging.getLogger("stunner.router")

CACHE_LIMIT = 65536  # decisions cached per kind before the cache is dropped and refilled
DNS_UPDATE_INTERVAL = 5.0  # Go STUNner's dnsUpdateInterval


def parse_peer_ip(text: str) -> IPAddress | None:
    """The peer address from a socket string ("10.0.0.1", "::ffff:10.0.0.1", "fe80::1%eth0"),
    or None when it is not an IP address."""
    try:
        return normalize_ip(ipaddress.ip_address(text))
    except (ValueError, TypeError):
        return None


class ClusterSpec(Protocol):
    """What the router reads of a cluster config (stunner_api.dataplane.ClusterConfig fits)."""

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str: ...  # "STATIC" | "STRICT_DNS"
    @property
    def protocol(self) -> str: ...  # "UDP" | "TCP"
    @property
    def endpoints(self) -> Sequence[str]: ...


@dataclass(frozen=True, slots=True)
class _Matcher:
    """One cluster, parsed once per update."""

    name: str
    endpoints: tuple[EndpointRange, ...] = ()
    domains: tuple[str, ...] = ()


def _build_matcher(cluster: ClusterSpec) -> _Matcher | None:
    """The matcher of a UDP cluster, or None (with a warning) for one that admits nothing."""
    kind, protocol = cluster.type.upper(), cluster.protocol.upper()
    if protocol != "UDP":
        log.warning(
            "cluster %s: protocol %s is not relayed by this dataplane; it admits no peer",
            cluster.name,
            cluster.protocol,
        )
        return None
    if kind == "STRICT_DNS":
        return _Matcher(cluster.name, domains=tuple(d for d in cluster.endpoints if d))
    if kind != "STATIC":
        log.warning("cluster %s: unknown type %r; it admits no peer", cluster.name, cluster.type)
        return None
    endpoints = []
    for text in cluster.endpoints:
        try:
            endpoints.append(parse_static_endpoint(text))
        except ValueError as exc:
            log.warning("cluster %s: endpoint ignored: %s", cluster.name, exc)
    return _Matcher(cluster.name, endpoints=tuple(endpoints))


class Router:
    """Decides which peers each listener may reach. Single-threaded (one asyncio loop)."""

    def __init__(self) -> None:
        self._routes: dict[str, tuple[_Matcher, ...]] = {}
        self._domains: set[str] = set()
        self._resolved: dict[str, frozenset[IPAddress]] = {}
        self._admit_cache: dict[tuple[str, str, int], str | None] = {}
        self._permit_cache: dict[tuple[str, str], bool] = {}
        self.epoch = 0  # bumped whenever cached decisions are dropped
        self._watchers: list[Callable[[], None]] = []

    def _invalidate(self) -> None:
        self.epoch += 1
        self._admit_cache.clear()
        self._permit_cache.clear()
        for dropped in list(self._watchers):
            dropped()

    def watch(self, dropped: Callable[[], None]) -> Callable[[], None]:
        """Call `dropped` whenever cached decisions are dropped (a native relay engine clears
        the verdicts it cached); returns the call that stops watching."""
        self._watchers.append(dropped)
        return lambda: self._watchers.remove(dropped)

    def update(self, routes: Mapping[str, Sequence[str]], clusters: Sequence[ClusterSpec]) -> None:
        """Install a new configuration: listener name -> routed cluster names, and clusters.

        Resolved addresses are kept for domains that stay configured.
        """
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
        if port is None:
            return any(endpoint.contains(ip) for endpoint in matcher.endpoints)
        return any(endpoint.admits(ip, port) for endpoint in matcher.endpoints)

    def _decide(self, listener: str, peer_ip: str, peer_port: int | None) -> str | None:
        """The name of the first routed cluster that admits the peer, or None."""
        ip = parse_peer_ip(peer_ip)
        if ip is None:
            log.debug("listener %s: peer %r is not an IP address", listener, peer_ip)
            return None
        for matcher in self._routes.get(listener, ()):
            if self._matches(matcher, ip, peer_port):
                return matcher.name
        return None

    def permits(self, listener: str, peer_ip: str) -> bool:
        """CreatePermission/ChannelBind: whether a routed cluster admits `peer_ip` on any port."""
        key = (listener, peer_ip)
        decision = self._permit_cache.get(key)
        if decision is None:
            decision = self._decide(listener, peer_ip, None) is not None
            if len(self._permit_cache) >= CACHE_LIMIT:
                self._permit_cache.clear()
            self._permit_cache[key] = decision
        return decision

    def admits(self, listener: str, peer_ip: str, peer_port: int) -> bool:
        """Per relayed packet, either direction: whether a routed cluster admits IP and port."""
        return self.cluster_of(listener, peer_ip, peer_port) is not None

    def cluster_of(self, listener: str, peer_ip: str, peer_port: int) -> str | None:
        """Per relayed packet: the routed cluster admitting IP and port (None: drop it).
        Cached; the cache is cleared by every update."""
        key = (listener, peer_ip, peer_port)
        try:
            return self._admit_cache[key]
        except KeyError:
            pass
        valid_port = isinstance(peer_port, int) and 0 <= peer_port <= 65535
        cluster = self._decide(listener, peer_ip, peer_port) if valid_port else None
        if len(self._admit_cache) >= CACHE_LIMIT:
            self._admit_cache.clear()
        self._admit_cache[key] = cluster
        return cluster


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
