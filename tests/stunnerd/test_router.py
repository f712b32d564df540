"""Peer admission: listener routes to clusters, caches, STRICT_DNS resolution (endpoint
parsing: test_endpoints.py)."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from stunnerd.turn.router import CACHE_LIMIT, DnsResolver, Router, parse_peer_ip


@dataclass(frozen=True)
class Cluster:
    """Stands in for stunner_api.dataplane.ClusterConfig (structurally a ClusterSpec)."""

    name: str
    endpoints: Sequence[str] = field(default_factory=tuple)
    type: str = "STATIC"
    protocol: str = "UDP"


def router_with(routes: dict[str, list[str]], *clusters: Cluster) -> Router:
    router = Router()
    router.update(routes, clusters)
    return router


@pytest.mark.parametrize(
    ("text", "ip"),
    [
        ("10.0.0.1", "10.0.0.1"),
        ("::ffff:10.0.0.1", "10.0.0.1"),
        ("::FFFF:10.0.0.1", "10.0.0.1"),
        ("2001:db8::1", "2001:db8::1"),
        ("fe80::1%eth0", "fe80::1"),
    ],
)
def test_parse_peer_ip(text: str, ip: str) -> None:
    assert parse_peer_ip(text) == ipaddress.ip_address(ip)


@pytest.mark.parametrize("text", ["", "garbage", "10.0.0", "10.0.0.1:80", "[::1]", "1.2.3.4.5"])
def test_parse_peer_ip_garbage(text: str) -> None:
    assert parse_peer_ip(text) is None


# --- STATIC clusters --------------------------------------------------------------------------


def test_nothing_is_reachable_by_default() -> None:
    router = Router()
    assert not router.permits("udp", "10.0.0.1")
    assert not router.admits("udp", "10.0.0.1", 5000)
    router = router_with({"udp": []}, Cluster("open", ["0.0.0.0/0"]))
    assert not router.permits("udp", "10.0.0.1")  # no routes
    assert not router.permits("other", "10.0.0.1")  # unknown listener


def test_route_to_unknown_cluster_denies() -> None:
    router = router_with({"udp": ["missing"]}, Cluster("open", ["0.0.0.0/0"]))
    assert not router.permits("udp", "10.0.0.1")
    assert not router.admits("udp", "10.0.0.1", 1)


def test_ipv4_cidr() -> None:
    router = router_with({"udp": ["media"]}, Cluster("media", ["10.0.0.0/8"]))
    assert router.permits("udp", "10.1.2.3")
    assert router.admits("udp", "10.1.2.3", 1)
    assert router.admits("udp", "10.255.255.255", 65535)
    assert not router.permits("udp", "11.0.0.1")
    assert not router.admits("udp", "11.0.0.1", 5000)
    assert not router.permits("udp", "2001:db8::1")  # other family


def test_ipv6_cidr() -> None:
    router = router_with({"udp": ["v6"]}, Cluster("v6", ["2001:db8::/32:<1000-2000>"]))
    assert router.permits("udp", "2001:db8:ffff::1")
    assert router.admits("udp", "2001:db8:ffff::1", 1500)
    assert not router.admits("udp", "2001:db8:ffff::1", 2001)
    assert not router.permits("udp", "2001:db9::1")
    assert not router.permits("udp", "10.0.0.1")


@pytest.mark.parametrize(
    ("port", "admitted"),
    [(999, False), (1000, True), (1001, True), (1999, True), (2000, True), (2001, False)],
)
def test_port_range_boundaries(port: int, admitted: bool) -> None:
    router = router_with({"udp": ["media"]}, Cluster("media", ["10.0.0.0/24:<1000-2000>"]))
    assert router.admits("udp", "10.0.0.7", port) is admitted
    assert router.permits("udp", "10.0.0.7")  # permissions ignore ports


@pytest.mark.parametrize("port", [-1, 65536, 10**9])
def test_invalid_peer_port_denies(port: int) -> None:
    router = router_with({"udp": ["open"]}, Cluster("open", ["0.0.0.0/0"]))
    assert not router.admits("udp", "10.0.0.1", port)


def test_multiple_endpoints_and_routes() -> None:
    router = router_with(
        {"udp": ["a", "b"], "tcp": ["b"]},
        Cluster("a", ["10.0.0.1", "10.0.1.0/24:<1-2>"]),
        Cluster("b", ["192.168.0.0/16:<3478-3478>"]),
    )
    assert router.admits("udp", "10.0.0.1", 9)
    assert router.admits("udp", "10.0.1.9", 2)
    assert not router.admits("udp", "10.0.1.9", 3)
    assert router.admits("udp", "192.168.3.4", 3478)
    assert router.admits("tcp", "192.168.3.4", 3478)
    assert not router.permits("tcp", "10.0.0.1")  # cluster a is not routed from "tcp"


def test_overlapping_port_ranges_any_endpoint_admits() -> None:
    router = router_with(
        {"udp": ["a"]},
        Cluster("a", ["10.0.0.0/8:<1-10>", "10.0.0.5:<20-30>"]),
    )
    assert router.admits("udp", "10.0.0.5", 25)
    assert router.admits("udp", "10.0.0.5", 5)
    assert not router.admits("udp", "10.0.0.6", 25)


def test_bad_endpoint_is_skipped_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    router = router_with({"udp": ["a"]}, Cluster("a", ["dummy", "10.0.0.1"]))
    assert router.permits("udp", "10.0.0.1")
    assert "cluster a: endpoint ignored: invalid endpoint 'dummy'" in caplog.text


def test_tcp_clusters_admit_tcp_peers_only_and_unknown_types_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    router = router_with(
        {"udp": ["t", "x", "q"]},
        Cluster("t", ["10.0.0.0/8:<5000-5001>"], protocol="TCP"),
        Cluster("x", ["0.0.0.0/0"], type="LOGICAL_DNS"),
        Cluster("q", ["0.0.0.0/0"], protocol="QUIC"),
    )
    assert not router.permits("udp", "10.0.0.1")  # a UDP allocation's peer
    assert router.cluster_of("udp", "10.0.0.1", 5000) is None
    assert router.permits("udp", "10.0.0.1", "TCP")  # an RFC 6062 allocation's
    assert router.cluster_of("udp", "10.0.0.1", 5000, "TCP") == "t"
    assert router.cluster_of("udp", "10.0.0.1", 5002, "TCP") is None
    assert router.routes_protocol("udp", "TCP") and not router.routes_protocol("udp", "UDP")
    assert router.explain("udp", "10.0.0.1", 5000).code == "cluster-not-udp"
    assert router.explain("udp", "10.0.0.1", 5000, "TCP").cluster == "t"
    assert "cluster q: protocol QUIC is not relayed" in caplog.text
    assert "cluster x: unknown type 'LOGICAL_DNS'" in caplog.text


def test_type_and_protocol_are_case_insensitive() -> None:
    router = router_with({"udp": ["a"]}, Cluster("a", ["10.0.0.1"], type="static", protocol="udp"))
    assert router.permits("udp", "10.0.0.1")


@pytest.mark.parametrize("peer", ["::ffff:10.0.0.1", "::ffff:a00:1", "0:0:0:0:0:ffff:10.0.0.1"])
def test_ipv4_mapped_peer_is_matched_as_ipv4(peer: str) -> None:
    router = router_with({"udp": ["a"]}, Cluster("a", ["10.0.0.1:<5-6>"]))
    assert router.permits("udp", peer)
    assert router.admits("udp", peer, 5)
    assert not router.admits("udp", peer, 7)


@pytest.mark.parametrize("peer", ["::10.2.0.1", "::a02:1", "::ffff:10.2.0.1"])
def test_ipv4_peer_in_ipv6_spelling_never_passes_an_ipv6_range(peer: str) -> None:
    """Issue 31: ::10.2.0.1 is 10.2.0.1, which the route does not name; ::/0 does not admit it."""
    router = router_with({"udp": ["a"]}, Cluster("a", ["::/0", "10.1.0.0/16"]))
    assert not router.permits("udp", peer)
    assert not router.admits("udp", peer, 5000)
    assert router.permits("udp", peer.replace("10.2", "10.1").replace("a02", "a01"))


@pytest.mark.parametrize("peer", ["", "garbage", "10.0.0.1:5000", "10.0.0", "::g", "\x00"])
def test_garbage_peer_ip_denies(peer: str) -> None:
    router = router_with({"udp": ["open"]}, Cluster("open", ["0.0.0.0/0", "::/0"]))
    assert not router.permits("udp", peer)
    assert not router.admits("udp", peer, 5000)


def test_update_invalidates_cached_decisions() -> None:
    router = router_with({"udp": ["a"]}, Cluster("a", ["10.0.0.0/8"]))
    assert router.admits("udp", "10.0.0.1", 5000)
    assert router.permits("udp", "10.0.0.1")
    epoch = router.epoch
    router.update({"udp": ["a"]}, [Cluster("a", ["192.168.0.0/16"])])
    assert router.epoch > epoch
    assert not router.admits("udp", "10.0.0.1", 5000)
    assert not router.permits("udp", "10.0.0.1")
    router.update({"udp": []}, [Cluster("a", ["192.168.0.0/16"])])
    assert not router.admits("udp", "192.168.0.1", 5000)
    router.update({"udp": ["a"]}, [Cluster("a", ["192.168.0.0/16"])])
    assert router.admits("udp", "192.168.0.1", 5000)


def test_cache_is_bounded() -> None:
    router = router_with({"udp": ["open"]}, Cluster("open", ["0.0.0.0/0"]))
    for port in range(CACHE_LIMIT + 10):
        assert router.admits("udp", "10.0.0.1", port % 65536)
    assert len(router._admit_cache) <= CACHE_LIMIT


# --- STRICT_DNS clusters ----------------------------------------------------------------------


def dns_router() -> Router:
    return router_with(
        {"udp": ["dns"]},
        Cluster("dns", ["media.example", "backup.example:<1-2>"], type="STRICT_DNS"),
    )


def test_dns_domains_follow_the_config() -> None:
    router = dns_router()
    assert router.dns_domains() == {"media.example", "backup.example:<1-2>"}
    router.update({"udp": []}, [Cluster("a", ["10.0.0.1"])])
    assert router.dns_domains() == set()


def test_strict_dns_admits_only_resolved_addresses_on_any_port() -> None:
    router = dns_router()
    assert not router.permits("udp", "10.0.0.1")  # not resolved yet
    router.set_resolved("media.example", ["10.0.0.1", "2001:db8::1"])
    assert router.permits("udp", "10.0.0.1")
    assert router.admits("udp", "10.0.0.1", 1)
    assert router.admits("udp", "10.0.0.1", 65535)  # port ranges do not apply
    assert router.admits("udp", "::ffff:10.0.0.1", 80)
    assert router.admits("udp", "2001:db8::1", 80)
    assert not router.permits("udp", "10.0.0.2")  # equality, not a prefix


def test_strict_dns_new_addresses_invalidate_the_cache() -> None:
    router = dns_router()
    router.set_resolved("media.example", ["10.0.0.1"])
    assert router.admits("udp", "10.0.0.1", 5000)
    epoch = router.epoch
    router.set_resolved("media.example", ["10.0.0.1"])  # unchanged: caches kept
    assert router.epoch == epoch
    router.set_resolved("media.example", ["10.0.0.2"])
    assert router.epoch > epoch
    assert not router.admits("udp", "10.0.0.1", 5000)
    assert router.admits("udp", "10.0.0.2", 5000)


def test_strict_dns_ignores_unconfigured_domains_and_garbage_addresses() -> None:
    router = dns_router()
    router.set_resolved("evil.example", ["10.0.0.9"])
    assert not router.permits("udp", "10.0.0.9")
    router.set_resolved("media.example", ["not-an-ip", "10.0.0.3"])
    assert router.permits("udp", "10.0.0.3")


def test_update_keeps_resolved_addresses_of_domains_still_configured() -> None:
    router = dns_router()
    router.set_resolved("media.example", ["10.0.0.1"])
    router.set_resolved("backup.example:<1-2>", ["10.0.0.2"])
    router.update({"udp": ["dns2"]}, [Cluster("dns2", ["media.example"], type="STRICT_DNS")])
    assert router.permits("udp", "10.0.0.1")
    assert not router.permits("udp", "10.0.0.2")
    router.update({"udp": ["dns2"]}, [Cluster("dns2", ["other.example"], type="STRICT_DNS")])
    assert not router.permits("udp", "10.0.0.1")


class FakeDns:
    def __init__(self, zone: dict[str, list[str]]) -> None:
        self.zone = zone
        self.queries: list[str] = []

    async def __call__(self, domain: str) -> list[str]:
        self.queries.append(domain)
        if domain not in self.zone:
            raise OSError(f"host {domain!r} not found: NXDOMAIN")
        return list(self.zone[domain])


def test_resolver_pushes_addresses_and_keeps_them_on_failure() -> None:
    router = dns_router()
    fake = FakeDns({"media.example": ["10.0.0.1"], "backup.example:<1-2>": ["10.0.0.2"]})
    resolver = DnsResolver(router, resolve=fake)

    async def scenario() -> None:
        await resolver.resolve_now()
        assert sorted(fake.queries) == ["backup.example:<1-2>", "media.example"]
        assert router.permits("udp", "10.0.0.1") and router.permits("udp", "10.0.0.2")
        del fake.zone["media.example"]  # the lookup now fails
        fake.zone["backup.example:<1-2>"] = ["10.0.0.3"]
        await resolver.resolve_now()
        assert router.permits("udp", "10.0.0.1")  # last good addresses kept
        assert not router.permits("udp", "10.0.0.2")
        assert router.permits("udp", "10.0.0.3")

    asyncio.run(scenario())


def test_resolver_survives_a_hanging_lookup() -> None:
    router = dns_router()
    router.set_resolved("media.example", ["10.0.0.1"])

    async def resolve(domain: str) -> list[str]:
        if domain == "media.example":
            await asyncio.sleep(3600)
        return ["10.0.0.2"]

    async def scenario() -> None:
        await DnsResolver(router, resolve=resolve, timeout=0.05).resolve_now()

    asyncio.run(scenario())
    assert router.permits("udp", "10.0.0.1")
    assert router.permits("udp", "10.0.0.2")


def test_resolver_run_loops_until_cancelled() -> None:
    router = dns_router()
    fake = FakeDns({"media.example": ["10.0.0.1"]})

    async def scenario() -> None:
        task = asyncio.create_task(DnsResolver(router, interval=0.01, resolve=fake).run())
        while fake.queries.count("media.example") < 3:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(scenario(), 5))
    assert router.permits("udp", "10.0.0.1")


def test_resolver_with_real_getaddrinfo_resolves_localhost() -> None:
    router = router_with({"udp": ["local"]}, Cluster("local", ["localhost"], type="STRICT_DNS"))

    async def scenario() -> None:
        await DnsResolver(router).resolve_now()

    asyncio.run(scenario())
    assert router.permits("udp", "127.0.0.1")
    assert router.admits("udp", "127.0.0.1", 3478)
    assert not router.permits("udp", "10.0.0.1")
