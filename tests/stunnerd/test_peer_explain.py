"""Issue 23, "why is my peer refused?": the one pure decision, every reason, and the router
held to the same answers.

We test: each reason code comes out of `explain` for the rule it names, with words and the
setting that would allow the peer; and for every case stunnerd's `Router` (the per-packet fast
path) admits exactly when `explain` does, through the same cluster; a real stunnerd refusing a
real TURN client logs the reason.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from dataclasses import dataclass, field

import pytest

from stunner_api import peer_admission as pa
from stunner_api.stun import Class
from stunnerd.turn.router import Router
from tests.support.turnclient import (
    HOST,
    RawClient,
    error_code,
    free_port,
    make_config,
    running_stunner,
)


@dataclass
class Cluster:
    name: str
    endpoints: list[str] = field(default_factory=list)
    type: str = "STATIC"
    protocol: str = "UDP"


WIDE = Cluster("wide", ["0.0.0.0/0", "::/0"])
MEDIA = Cluster("media", ["10.0.0.0/8:<10000-20000>"])
LOOP = Cluster("loop", ["127.0.0.1/32"])
DNS = Cluster("dns", ["media.example"], type="STRICT_DNS")
TCP = Cluster("tcp", ["10.0.0.0/8"], protocol="TCP")
CLUSTERS = [WIDE, MEDIA, LOOP, DNS, TCP]
OWN = {("10.9.9.9", 3478)}
RESOLVED = {"media.example": frozenset({ipaddress.ip_address("192.0.2.7")})}

# routes, peer ip, peer port, expected code, expected cluster, words the reason must contain
CASES = [
    (["media"], "10.1.2.3", 15000, pa.ADMITTED, "media", "10.0.0.0/8"),
    (["media"], "10.1.2.3", None, pa.ADMITTED, "media", "media"),
    (["media"], "10.1.2.3", 9, pa.PORT_RANGE, "", "10000-20000"),
    (["media"], "192.168.1.1", 15000, pa.NO_ROUTE, "", "no routed cluster names"),
    (["nosuch"], "10.1.2.3", None, pa.NO_ROUTE, "", "none configured"),
    ([], "10.1.2.3", None, pa.NO_ROUTES, "", "routes to no cluster"),
    (["wide"], "224.0.0.1", None, pa.NEVER, "", "multicast"),
    (["wide"], "0.0.0.0", 5, pa.NEVER, "", "unspecified"),
    (["wide"], "255.255.255.255", None, pa.NEVER, "", "broadcast"),
    (["wide"], "127.0.0.1", None, pa.GUARDED, "", "loopback"),
    (["wide"], "169.254.169.254", None, pa.GUARDED, "", "metadata"),
    (["wide"], "fe80::1", None, pa.GUARDED, "", "link-local"),
    (["media"], "127.0.0.1", None, pa.GUARDED, "", "no routed cluster has one"),
    (["loop"], "127.0.0.1", 5, pa.ADMITTED, "loop", "127.0.0.1/32"),
    (["wide"], "64:ff9b::7f00:1", None, pa.EMBEDDED_GUARDED, "", "127.0.0.1"),
    (["wide"], "10.9.9.9", 3478, pa.OWN_ADDRESS, "", "stunnerd's own"),
    (["wide"], "10.9.9.9", 3479, pa.ADMITTED, "wide", "wide"),
    (["tcp"], "10.1.2.3", None, pa.NOT_UDP, "", "TCP"),
    (["dns"], "192.0.2.7", 5, pa.ADMITTED, "dns", "resolves to"),
    (["dns"], "192.0.2.8", 5, pa.NO_ROUTE, "", "no routed cluster"),
    (["wide"], "not-an-ip", None, pa.NOT_AN_IP, "", "not a peer address"),
]


def _is_own(ip: pa.IPAddress, port: int) -> bool:
    return (str(ip), port) in OWN


@pytest.mark.parametrize(("routes", "ip", "port", "code", "cluster", "words"), CASES)
def test_explain_names_the_rule(
    routes: list[str], ip: str, port: int | None, code: str, cluster: str, words: str
) -> None:
    verdict = pa.explain(routes, CLUSTERS, ip, port, resolved=RESOLVED, is_own=_is_own)
    assert (verdict.code, verdict.cluster) == (code, cluster), verdict
    assert words in verdict.reason, verdict
    assert verdict.admitted == (code == pa.ADMITTED)
    if code in (pa.PORT_RANGE, pa.NO_ROUTE, pa.NO_ROUTES, pa.GUARDED, pa.NOT_UDP):
        assert verdict.allow, verdict  # the setting that would allow it


def test_every_reason_is_covered() -> None:
    covered = {case[3] for case in CASES}
    assert set(pa.REASONS) - covered == {pa.NOT_RESOLVED, pa.STUN_ONLY}
    # offline (no resolutions known) a STRICT_DNS cluster cannot be judged: said so
    verdict = pa.explain(["dns"], CLUSTERS, "192.0.2.7", None)
    assert verdict.code == pa.NOT_RESOLVED and "media.example" in verdict.reason


def test_a_stun_only_gateway_refuses_every_peer_on_every_listener() -> None:
    config = make_config(3478, ["0.0.0.0/0"], auth={"type": "none"})
    verdicts = pa.explain_config(config, "10.0.0.1", 5)
    assert [v.code for _, v in verdicts] == [pa.STUN_ONLY, pa.STUN_ONLY]
    config = make_config(3478, ["0.0.0.0/0"], address="10.9.9.9")
    verdicts = pa.explain_config(config, "10.9.9.9", 3478)  # a listener's own address
    assert [v.code for _, v in verdicts] == [pa.OWN_ADDRESS, pa.OWN_ADDRESS]
    assert all(v.admitted for _, v in pa.explain_config(config, "10.9.9.9", 3479))


def test_a_guarded_peer_names_the_endpoint_that_would_allow_it() -> None:
    verdict = pa.explain(["wide"], CLUSTERS, "127.0.0.1", None)
    assert "0.0.0.0/0" in verdict.reason and "127.0.0.1/32" in verdict.allow


@pytest.mark.parametrize(("routes", "ip", "port", "code", "cluster", "words"), CASES)
def test_the_router_admits_exactly_what_explain_admits(
    routes: list[str], ip: str, port: int | None, code: str, cluster: str, words: str
) -> None:
    router = Router()
    router.update({"l": routes}, CLUSTERS, OWN)
    router.set_resolved("media.example", ["192.0.2.7"])
    fast = router.permits("l", ip) if port is None else router.cluster_of("l", ip, port)
    assert fast == ((cluster or None) if port is not None else code == pa.ADMITTED)
    assert router.explain("l", ip, port).code == code


def test_stunnerd_logs_why_it_refused_a_peer(caplog: pytest.LogCaptureFixture) -> None:
    """A real TURN client, refused on CreatePermission and ChannelBind by an in-process
    stunnerd: the log line names the rule, not "no route to endpoint"."""

    async def main() -> None:
        port = free_port()
        config = make_config(port, [f"{HOST}/32:<10000-10010>"], protocols=("TURN-UDP",))
        async with running_stunner(config):
            client = await RawClient.connect((HOST, port))
            assert (await client.allocate()).message_class == Class.SUCCESS
            assert error_code(await client.create_permission(("127.0.0.2", 9))) == 403
            assert error_code(await client.channel_bind(0x4000, (HOST, 9))) == 403
            assert (await client.channel_bind(0x4001, (HOST, 10005))).message_class == (
                Class.SUCCESS
            )
            client.close()

    with caplog.at_level(logging.INFO, logger="stunner"):
        asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records if "denied" in r.getMessage()]
    assert len(lines) == 2, lines
    permission, channel = lines
    assert "peer 127.0.0.2: loopback-or-link-local" in permission
    assert "a loopback address" in permission and "(allowed by: a STATIC endpoint" in permission
    assert f"peer {HOST}:9: port-outside-range: port 9 is outside 10000-10010" in channel
    assert "no route to endpoint" not in "".join(lines)
