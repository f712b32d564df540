"""Address families beyond loopback (issue 31): in a network namespace of the test's own, a
listener at 10.30.0.1 on a veth whose other end is a second namespace holding the client and
the peers. The listener's relay in IPv6 is the host's own IPv6 address the kernel picks
(fd30::1, from the default route; nothing is sent to learn it), and an IPv4 client's IPv6 relay
carries data to an IPv6 peer on the other side. Without an IPv6 route the host has no IPv6
relay address: the IPv6 request gets 440, a dual one its IPv4 half with ADDRESS-ERROR-CODE 440.
Root only (skipped otherwise), on the Python path and the native engine alike.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from stunner_api.stun import FAMILY_IPV4, FAMILY_IPV6, Class
from stunnerd.turn.relay_addresses import other_family_address
from tests.support.netns import ip, loopback_up, run_in_new_namespace, veth_pair
from tests.support.turnclient import (
    RawClient,
    error_code,
    free_port,
    make_config,
    running_stunner,
    start_peer,
)


def families(native: str) -> None:
    """Inside the namespace: print what the test checks, as JSON."""
    os.environ["STUNNER_NATIVE"] = native
    loopback_up()
    pair = veth_pair(
        {"v4": "10.30.0.1/24", "v6": "fd30::1/64"}, {"v4": "10.30.0.2/24", "v6": "fd30::2/64"}
    )
    out: dict[str, object] = {}
    try:
        out["before"] = other_family_address("10.30.0.1", FAMILY_IPV6)
        ip("-6", "route", "add", "default", "via", "fd30::2", "dev", "xs")
        ip("route", "add", "default", "via", "10.30.0.2", "dev", "xs")
        out["v6"] = other_family_address("10.30.0.1", FAMILY_IPV6)
        out["v4"] = other_family_address("fd30::1", FAMILY_IPV4)
        out.update(asyncio.run(relay(pair)))
    finally:
        pair.close()
    sys.stdout.write(json.dumps(out) + "\n")


async def relay(pair: object) -> dict[str, object]:
    with pair.inside():  # type: ignore[attr-defined]
        peer = await start_peer(echo=True, host="fd30::2")
    port = free_port()
    config = make_config(
        port,
        [f"fd30::2/128:<{peer.port}-{peer.port}>"],
        address="10.30.0.1",
        protocols=("TURN-UDP",),
        admin={"relay_address_family": "DualStack"},
    )
    out: dict[str, object] = {}
    async with running_stunner(config):
        server = ("10.30.0.1", port)
        with pair.inside():  # type: ignore[attr-defined]
            _, client = await asyncio.get_running_loop().create_datagram_endpoint(
                lambda: RawClient(server), local_addr=("10.30.0.2", 0)
            )
        response = await client.allocate(**{"REQUESTED-ADDRESS-FAMILY": FAMILY_IPV6})
        out["relayed"] = response.attributes.get("XOR-RELAYED-ADDRESS", ("", 0))[0]
        out["mapped"] = response.attributes.get("XOR-MAPPED-ADDRESS", ("", 0))[0]
        bound = await client.channel_bind(0x4001, ("fd30::2", peer.port))
        out["bound"] = bound.message_class == Class.SUCCESS
        client.send_channel_data(0x4001, b"across the veth")
        out["echo"] = list(await asyncio.wait_for(client.channel_data.get(), 5))[1].decode()
        out["peer_saw"] = peer.received[0][1][0] if peer.received else ""
        client.close()
    peer.close()
    return out


@pytest.mark.parametrize("native", ["0", "1"])
def test_an_ipv4_client_gets_the_hosts_ipv6_address_as_its_relay(native: str) -> None:
    result = json.loads(run_in_new_namespace(__name__, "families", native).splitlines()[-1])
    assert result["before"] is None  # no IPv6 route yet: no IPv6 relay address
    assert result["v6"] == "fd30::1"
    assert result["v4"] == "10.30.0.1"
    assert result["relayed"] == "fd30::1"
    assert result["mapped"] == "10.30.0.2"
    assert result["bound"]
    assert result["echo"] == "across the veth"
    assert result["peer_saw"] == "fd30::1"


def refused() -> None:
    loopback_up()
    with_route = {"v4": "10.31.0.1/24", "v6": "fd31::1/64"}
    pair = veth_pair(with_route, {"v4": "10.31.0.2/24", "v6": "fd31::2/64"})
    try:
        sys.stdout.write(json.dumps(asyncio.run(refused_requests())) + "\n")
    finally:
        pair.close()


async def refused_requests() -> dict[str, object]:
    port = free_port()
    config = make_config(
        port,
        ["0.0.0.0/0"],
        address="10.31.0.1",
        protocols=("TURN-UDP",),
        admin={"relay_address_family": "DualStack"},
    )
    async with running_stunner(config):
        client = await RawClient.connect(("10.31.0.1", port))
        v6 = error_code(await client.allocate(**{"REQUESTED-ADDRESS-FAMILY": FAMILY_IPV6}))
        dual = await client.allocate(**{"ADDITIONAL-ADDRESS-FAMILY": FAMILY_IPV6})
        client.close()
    return {
        "v6": v6,
        "dual_class": int(dual.message_class),
        "dual_error": list(dual.attributes.get("ADDRESS-ERROR-CODE", (0, 0, ""))[:2]),
    }


def test_a_host_without_an_ipv6_route_relays_ipv4_only() -> None:
    result = json.loads(run_in_new_namespace(__name__, "refused").splitlines()[-1])
    assert result["v6"] == 440
    assert result["dual_class"] == int(Class.SUCCESS)
    assert result["dual_error"] == [FAMILY_IPV6, 440]
