"""Why a peer is admitted or refused (issue 23): one pure decision, in words.

`explain` takes what a listener routes to (cluster names), the dataplane's clusters, the
peer's IP (and port, when a packet is relayed) and says which cluster admits the peer, or
which rule refuses it, with a reason code, the words, and the setting that would allow it.
stunnerd's router (`stunnerd.turn.router`) logs it when it refuses a peer; `stunner explain` prints
it per listener. The per-packet fast path stays in the router; a test holds both to the same
answers.

The built-in exclusions (issue 15) live here so both sides read the same lists.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from stunner_api.dataplane import StunnerConfig
from stunner_api.endpoints import IPAddress, normalize_ip, parse_static_endpoint
from stunner_api.vocabulary import LISTENER_PROTOCOL_TABLE

_net = ipaddress.ip_network
NEVER_PEERS = (  # whatever the routes say
    (_net("0.0.0.0/8"), "unspecified"),
    (_net("::/128"), "unspecified"),
    (_net("224.0.0.0/4"), "multicast"),
    (_net("ff00::/8"), "multicast"),
    (_net("255.255.255.255/32"), "broadcast"),
)
GUARDED_PEERS = (  # only where a cluster names such a range explicitly
    _net("127.0.0.0/8"),
    _net("::1/128"),
    _net("169.254.0.0/16"),
    _net("fe80::/10"),
)
METADATA_ADDRESSES = frozenset(
    {ipaddress.IPv4Address("169.254.169.254"), ipaddress.IPv6Address("fd00:ec2::254")}
)
_EMBEDDING_V4 = (  # IPv6 prefixes that carry an IPv4 address, and the bit offset of it
    (_net("::/96"), 96),  # IPv4-compatible (deprecated)
    (_net("64:ff9b::/96"), 96),  # NAT64 well-known prefix
    (_net("64:ff9b:1::/48"), 96),  # NAT64 local use (RFC 8215)
    (_net("2002::/16"), 16),  # 6to4
)

# Reason codes: one per rule.
ADMITTED = "admitted"
NOT_AN_IP = "not-an-ip"
NEVER = "never-a-peer"  # unspecified, multicast, broadcast
EMBEDDED_GUARDED = "ipv4-in-ipv6-loopback"  # an IPv6 spelling of a loopback/link-local IPv4
OWN_ADDRESS = "own-address"  # stunnerd's own listener or relay socket
NO_ROUTES = "no-routes"  # the listener routes to no cluster
NOT_UDP = "cluster-not-udp"  # the only routed clusters are of the other protocol (UDP/TCP)
GUARDED = "loopback-or-link-local"  # loopback, link-local, cloud metadata
PORT_RANGE = "port-outside-range"  # the IP is named, the port is outside the range
NOT_RESOLVED = "dns-not-resolved"  # a STRICT_DNS cluster whose names have no address yet
NO_ROUTE = "no-route"  # no routed cluster names the peer
STUN_ONLY = "stun-only"  # the Gateway serves STUN only: no relay at all
REASONS = (
    STUN_ONLY,
    NOT_AN_IP,
    NEVER,
    EMBEDDED_GUARDED,
    OWN_ADDRESS,
    NO_ROUTES,
    NOT_UDP,
    GUARDED,
    PORT_RANGE,
    NOT_RESOLVED,
    NO_ROUTE,
)


class ClusterSpec(Protocol):
    """What is read of a cluster config (stunner_api.dataplane.ClusterConfig fits)."""

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str: ...  # "STATIC" | "STRICT_DNS"
    @property
    def protocol(self) -> str: ...  # "UDP" | "TCP"
    @property
    def endpoints(self) -> Sequence[str]: ...


@dataclass(frozen=True, slots=True)
class Verdict:
    """An admission (`cluster` set, `code` ADMITTED) or a refusal: `code` (one of REASONS),
    `reason` in words, and `allow`: the setting that would admit the peer ("" when none can)."""

    code: str
    reason: str
    allow: str = ""
    cluster: str = ""

    @property
    def admitted(self) -> bool:
        return self.code == ADMITTED


def parse_peer_ip(text: str) -> IPAddress | None:
    """The peer address from a socket string ("10.0.0.1", "::ffff:10.0.0.1", "fe80::1%eth0"),
    or None when it is not an IP address."""
    try:
        return normalize_ip(ipaddress.ip_address(text))
    except (ValueError, TypeError):
        return None


def canonical_peer_ip(text: str) -> str:
    """A peer's IP as the policy judges it and the relay reaches it: an IPv4-mapped
    (`::ffff:10.0.0.1`) or IPv4-compatible (`::10.0.0.1`, RFC 4291 §2.5.5.1) IPv6 spelling
    becomes the IPv4 address it carries (`10.0.0.1`), in any spelling (`::ffff:a00:1`), as
    coturn does before its checks; any other text is returned as it is. An IPv4 address is
    returned unparsed; socket.inet_ntop writes a carried address dotted, so a relay path may
    skip text without a '.'."""
    if ":" not in text:
        return text
    try:
        address = ipaddress.IPv6Address(text)
    except ValueError:
        return text
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    if int(address) >> 32 == 0 and int(address) > 1:  # ::a.b.c.d, neither :: nor ::1
        return str(ipaddress.IPv4Address(int(address)))
    return text


def embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (IPv4-compatible, NAT64, 6to4), or None."""
    if isinstance(ip, ipaddress.IPv4Address) or ip == ipaddress.IPv6Address("::1"):
        return None
    for prefix, offset in _EMBEDDING_V4:
        if ip in prefix:
            return ipaddress.IPv4Address((int(ip) >> (128 - offset - 32)) & 0xFFFFFFFF)
    return None


def never_peer(ip: IPAddress) -> str | None:
    """Why `ip` is never a peer ("multicast", ...), or None."""
    for network, reason in NEVER_PEERS:
        if ip in network:
            return reason
    return None


def guarded(ip: IPAddress) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """The loopback or link-local range `ip` is in, or None."""
    for network in GUARDED_PEERS:
        if ip in network:
            return network
    return None


def _guard_words(ip: IPAddress) -> str:
    if ip in METADATA_ADDRESSES:
        return "the cloud metadata address (link-local)"
    return "a loopback address" if ip.is_loopback else "a link-local address"


def _peer(ip: IPAddress, port: int | None) -> str:
    if port is None:
        return str(ip)
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def explain(
    routes: Sequence[str],
    clusters: Sequence[ClusterSpec],
    peer_ip: str,
    peer_port: int | None = None,
    *,
    resolved: Mapping[str, frozenset[IPAddress]] | None = None,
    is_own: Callable[[IPAddress, int], bool] | None = None,
    protocol: str = "UDP",
) -> Verdict:
    """Whether a listener routing to `routes` admits the peer, and why (see the module doc).

    `peer_port` None: CreatePermission (any port). `resolved`: the current addresses of the
    STRICT_DNS names (None: unknown, offline). `is_own(ip, port)`: whether the address is one
    of stunnerd's own sockets (checked only with a port, as the router does). `protocol`: the
    allocation's, UDP (RFC 8656) or TCP (RFC 6062); only clusters of that protocol admit."""
    ip = parse_peer_ip(canonical_peer_ip(peer_ip))
    if ip is None or (peer_port is not None and not 0 <= peer_port <= 65535):
        return Verdict(NOT_AN_IP, f"{peer_ip!r} (port {peer_port}) is not a peer address")
    carried = embedded_ipv4(ip)
    never = never_peer(ip) or (never_peer(carried) if carried is not None else None)
    if never:
        return Verdict(NEVER, f"{ip} is {never}: never relayed to, whatever the routes say")
    if carried is not None and guarded(carried):
        return Verdict(
            EMBEDDED_GUARDED,
            f"{ip} is an IPv6 spelling of {carried}, {_guard_words(carried)}: never relayed to",
            f"name the peer as {carried} (and see {GUARDED})",
        )
    if peer_port is not None and is_own is not None and is_own(ip, peer_port):
        return Verdict(
            OWN_ADDRESS,
            f"{_peer(ip, peer_port)} is stunnerd's own listener or relay socket: never relayed to",
        )
    route_kind = "TCPRoute" if protocol == "TCP" else "UDPRoute"  # what renders such clusters
    if not routes:
        return Verdict(
            NO_ROUTES,
            "the listener routes to no cluster",
            f"a {route_kind} attached to this listener, with a backend naming the peer",
        )
    by_name = {c.name: c for c in clusters}
    guard = guarded(ip)
    found: dict[str, str] = {}  # reason code -> (first) words, most specific kept
    allow: dict[str, str] = {}
    for name in routes:
        cluster = by_name.get(name)
        if cluster is None:
            continue
        if cluster.protocol.upper() != protocol:
            found.setdefault(
                NOT_UDP, f"cluster {name} is {cluster.protocol}, not {protocol}: not relayed"
            )
            allow.setdefault(NOT_UDP, f"a {protocol} cluster naming the peer")
            continue
        kind = cluster.type.upper()
        if kind == "STRICT_DNS":
            names = [d for d in cluster.endpoints if d]
            if resolved is None:
                found.setdefault(
                    NOT_RESOLVED,
                    f"cluster {name} names {', '.join(names)} (STRICT_DNS): only a running "
                    "stunnerd knows what they resolve to",
                )
                continue
            if any(ip in resolved.get(d, ()) for d in names):
                return Verdict(ADMITTED, f"{name} (STRICT_DNS) resolves to {ip}", cluster=name)
            if not any(resolved.get(d) for d in names):
                found.setdefault(NOT_RESOLVED, f"cluster {name}: {', '.join(names)} unresolved")
            continue
        if kind != "STATIC":
            continue
        for text in cluster.endpoints:
            try:
                endpoint = parse_static_endpoint(text)
            except ValueError:
                continue
            if not endpoint.contains(ip):
                continue
            network = endpoint.network
            if guard is not None and not (
                network.version == guard.version and network.subnet_of(guard)  # type: ignore[arg-type]
            ):
                found.setdefault(
                    GUARDED,
                    f"{ip} is {_guard_words(ip)}; cluster {name}'s endpoint {text} covers it "
                    f"but is wider than {guard}",
                )
                allow.setdefault(
                    GUARDED,
                    f"an endpoint inside {guard} in cluster {name}, "
                    f"e.g. {ip}/{network.max_prefixlen}",
                )
                continue
            if peer_port is None or endpoint.admits(ip, peer_port):
                return Verdict(ADMITTED, f"endpoint {text} of cluster {name}", cluster=name)
            found.setdefault(
                PORT_RANGE,
                f"port {peer_port} is outside {endpoint.port_min}-{endpoint.port_max} "
                f"(endpoint {text} of cluster {name})",
            )
            allow.setdefault(
                PORT_RANGE,
                f"a port range including {peer_port} on that endpoint "
                "(the backendRef's port and endPort)",
            )
    if guard is not None and GUARDED not in found and PORT_RANGE not in found:
        return Verdict(
            GUARDED,
            f"{ip} is {_guard_words(ip)}: admitted only by an endpoint inside {guard}, and "
            "no routed cluster has one",
            f"a STATIC endpoint inside {guard} (e.g. {ip}/{guard.max_prefixlen}) in a routed "
            "cluster",
        )
    for code in (PORT_RANGE, GUARDED, NOT_RESOLVED, NOT_UDP):
        if code in found:
            return Verdict(code, found[code], allow.get(code, ""))
    named = [n for n in routes if n in by_name]
    empty = [n for n in named if not by_name[n].endpoints]
    note = (
        f"; {', '.join(empty)} has no endpoints (a Service backend's come from its "
        "EndpointSlices: none known offline)"
        if empty
        else ""
    )
    return Verdict(
        NO_ROUTE,
        f"no routed cluster names {ip} (routes: {', '.join(named) or 'none configured'}){note}",
        f"an endpoint covering {ip} in a routed cluster (a backend of a {route_kind} of this "
        "listener, e.g. a StaticService prefix)",
    )


def parse_peer(text: str) -> tuple[str, int | None]:
    """ "IP", "IP:PORT", "[IPv6]:PORT" or "IPv6" -> (ip, port or None); ValueError otherwise."""
    host, port_text = text, ""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"{text!r}: want IP, IP:PORT or [IPv6]:PORT")
        port_text = rest[1:]
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    if parse_peer_ip(host) is None:
        raise ValueError(f"{text!r}: {host!r} is not an IP address")
    if not port_text and text.endswith(":"):
        raise ValueError(f"{text!r}: empty port")
    if not port_text:
        return host, None
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{text!r}: port {port_text!r} is not 0-65535")
    return host, int(port_text)


def explain_config(
    config: StunnerConfig,
    peer_ip: str,
    peer_port: int | None = None,
    resolved: Mapping[str, frozenset[IPAddress]] | None = None,
) -> list[tuple[str, Verdict]]:
    """`explain` for each listener of a dataplane config (what `stunner explain` prints): the
    peer of a UDP allocation; and, on a TURN-TCP or TURN-TLS listener routing to a TCP cluster (a
    TCPRoute's), the peer of a TCP allocation too, as "<listener> (TCP allocations)".
    stunnerd's own addresses are the listeners' addresses and public addresses with their
    ports (the relay ports of live allocations only a running stunnerd knows)."""
    if config.auth.stun_only:
        words = "the Gateway serves STUN only (auth type none): every TURN request is refused"
        allow = "a GatewayConfig without stunMode (TURN authentication)"
        return [(lc.name, Verdict(STUN_ONLY, words, allow)) for lc in config.listeners]
    own: set[tuple[IPAddress, int]] = set()
    for lc in config.listeners:
        for address, port in ((lc.address, lc.port), (lc.public_address, lc.public_port)):
            ip = parse_peer_ip(address)
            if ip is not None:
                own.add((ip, port or lc.port))

    def is_own(ip: IPAddress, port: int) -> bool:
        return (ip, port) in own

    tcp_clusters = {c.name for c in config.clusters if c.protocol.upper() == "TCP"}
    out: list[tuple[str, Verdict]] = []
    for lc in config.listeners:
        facts = LISTENER_PROTOCOL_TABLE.get(lc.protocol)
        protocols = ["UDP"]
        if facts is not None and facts.stream and tcp_clusters.intersection(lc.routes):
            protocols.append("TCP")
        for protocol in protocols:
            name = lc.name if protocol == "UDP" else f"{lc.name} (TCP allocations)"
            verdict = explain(
                lc.routes,
                config.clusters,
                peer_ip,
                peer_port,
                resolved=resolved,
                is_own=is_own,
                protocol=protocol,
            )
            out.append((name, verdict))
    return out
