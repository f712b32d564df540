"""RFC 8656 address families (issue 31): an IPv4 client gets an IPv6 relay, an IPv6 client an
IPv4 one, and a client that asks gets both (two XOR-RELAYED-ADDRESS), as
`admin.relay_address_family` allows; otherwise 440, or ADDRESS-ERROR-CODE 440 for the family
of a dual request that is not relayed.

We test over real sockets on 127.0.0.1 and ::1 (a loopback listener's relay in the other family
is the other loopback), on both relay paths: the native engine serves a relay of its listener's
family only, so a relay in the other family, and both halves of a dual allocation, are served on
the Python path; each test relays data both ways through such an allocation, which is how we
see that the engine handed its client's packets up rather than losing them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stunner_api.stun import Class
from tests.support.turnclient import (
    RawClient,
    RawTcpClient,
    error_code,
    free_port,
    make_config,
    running_stunner,
    start_peer,
)

pytestmark = pytest.mark.usefixtures("relay_path")  # both relay paths: conftest.py

IPV4, IPV6 = 0x01, 0x02


def relayed_addresses(response: object) -> list[tuple[str, int]]:
    return [v for n, v in response.attribute_list if n == "XOR-RELAYED-ADDRESS"]  # type: ignore[attr-defined]


async def echo_through(client: RawClient, channel: int, peer: tuple[str, int], text: bytes) -> None:
    bound = await client.channel_bind(channel, peer)
    assert bound.message_class == Class.SUCCESS, bound.attributes
    client.send_channel_data(channel, text)
    assert await asyncio.wait_for(client.channel_data.get(), 5) == (channel, text)


def test_an_ipv4_client_gets_an_ipv6_relay_and_relays_to_an_ipv6_peer() -> None:
    async def main() -> None:
        peer6 = await start_peer(echo=True, host="::1")
        port = free_port()
        config = make_config(
            port,
            [f"::1/128:<{peer6.port}-{peer6.port}>", "127.0.0.1/32"],
            protocols=("TURN-UDP",),
            admin={"relay_address_family": "DualStack"},
        )
        async with running_stunner(config):
            client = await RawClient.connect(("127.0.0.1", port))
            response = await client.allocate(**{"REQUESTED-ADDRESS-FAMILY": IPV6})
            assert response.message_class == Class.SUCCESS, response.attributes
            relayed = response.attributes["XOR-RELAYED-ADDRESS"]
            assert relayed[0] == "::1"
            assert response.attributes["XOR-MAPPED-ADDRESS"][0] == "127.0.0.1"
            assert error_code(await client.create_permission(("127.0.0.1", 5000))) == 443
            await echo_through(client, 0x4001, ("::1", peer6.port), b"v4 client, v6 relay")
            assert peer6.received[0][1][:2] == relayed
            # Refresh names the allocation's family, or 443.
            refresh = await client.refresh(600)
            assert refresh.message_class == Class.SUCCESS
            client.close()
        peer6.close()

    asyncio.run(main())


def test_an_ipv6_client_gets_an_ipv4_relay() -> None:
    async def main() -> None:
        peer = await start_peer(echo=True)
        port = free_port()
        config = make_config(
            port,
            [f"127.0.0.1/32:<{peer.port}-{peer.port}>"],
            address="::1",
            protocols=("TURN-UDP",),
            admin={"relay_address_family": "DualStack"},
        )
        async with running_stunner(config):
            client = await RawClient.connect(("::1", port))
            response = await client.allocate()  # no family named: IPv4 (RFC 8656 §7.2)
            assert response.message_class == Class.SUCCESS, response.attributes
            assert response.attributes["XOR-RELAYED-ADDRESS"][0] == "127.0.0.1"
            await echo_through(client, 0x4002, ("127.0.0.1", peer.port), b"v6 client, v4 relay")
            client.close()
        peer.close()

    asyncio.run(main())


async def dual_stack_echo(protocol: str) -> tuple[Any, Any, int, dict[str, Any]]:
    """Echo peers on 127.0.0.1 and ::1, and a DualStack listener of `protocol` routed to both:
    (peer4, peer6, the listener's port, its config)."""
    peer4 = await start_peer(echo=True)
    peer6 = await start_peer(echo=True, host="::1")
    port = free_port()
    routes = [f"127.0.0.1/32:<{peer4.port}-{peer4.port}>", f"::1/128:<{peer6.port}-{peer6.port}>"]
    config = make_config(
        port, routes, protocols=(protocol,), admin={"relay_address_family": "DualStack"}
    )
    return peer4, peer6, port, config


def test_a_dual_allocation_relays_to_peers_of_both_families(relay_path: str) -> None:
    """On the Python path. The native engine holds one relay per client (and would drop a Send
    indication to a peer of the other family): there a dual request gets its listener's family
    alone, with ADDRESS-ERROR-CODE 440 naming the other, and relays as a single allocation."""

    async def main() -> None:
        peer4, peer6, port, config = await dual_stack_echo("TURN-UDP")
        to4, to6 = ("127.0.0.1", peer4.port), ("::1", peer6.port)
        async with running_stunner(config) as stunner:
            client = await RawClient.connect(("127.0.0.1", port))
            response = await client.allocate(**{"ADDITIONAL-ADDRESS-FAMILY": IPV6})
            assert response.message_class == Class.SUCCESS, response.attributes
            relayed = relayed_addresses(response)
            if relay_path == "native":
                assert [ip for ip, _ in relayed] == ["127.0.0.1"]
                error = response.attributes["ADDRESS-ERROR-CODE"]
                assert error[:2] == (IPV6, 440)
                assert "native engine" in error[2]
                assert error_code(await client.create_permission(to6)) == 443
                await echo_through(client, 0x4001, to4, b"v4 alone")
            else:
                assert [ip for ip, _ in relayed] == ["127.0.0.1", "::1"]
                assert "ADDRESS-ERROR-CODE" not in response.attributes
                both = await client.create_permission(to4, to6)
                assert both.message_class == Class.SUCCESS, both.attributes
                await echo_through(client, 0x4001, to4, b"to the v4 peer")
                await echo_through(client, 0x4002, to6, b"to the v6 peer")
                assert peer4.received[-1][1][:2] == relayed[0]
                assert peer6.received[-1][1][:2] == relayed[1]
                # A channel number is one peer's, across both families.
                assert error_code(await client.channel_bind(0x4001, to6)) == 400
                client.send_indication(to6, b"indicated")  # the answer comes on its channel
                assert await asyncio.wait_for(client.channel_data.get(), 5) == (
                    0x4002,
                    b"indicated",
                )
                # Deleting the allocation frees both relay ports.
                server = next(iter(stunner.listeners.values())).server
                assert len(server.additional) == 1
                assert (await client.refresh(0)).message_class == Class.SUCCESS
                assert server.additional == {}
                assert not stunner.router.relay_ports[relayed[1][1]]
            client.close()
        peer4.close()
        peer6.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("family", "listener", "requested", "code"),
    [
        ("", "127.0.0.1", {"REQUESTED-ADDRESS-FAMILY": IPV6}, 440),  # the default: its own
        ("IPv4", "127.0.0.1", {"REQUESTED-ADDRESS-FAMILY": IPV6}, 440),
        ("IPv6", "127.0.0.1", {"REQUESTED-ADDRESS-FAMILY": IPV4}, 440),
        ("DualStack", "127.0.0.1", {"REQUESTED-ADDRESS-FAMILY": 0x03}, 440),  # no such family
        ("DualStack", "127.0.0.1", {"ADDITIONAL-ADDRESS-FAMILY": IPV4}, 400),
        (
            "DualStack",
            "127.0.0.1",
            {"ADDITIONAL-ADDRESS-FAMILY": IPV6, "REQUESTED-ADDRESS-FAMILY": IPV4},
            400,
        ),
    ],
)
def test_refused_families(family: str, listener: str, requested: dict[str, int], code: int) -> None:
    async def main() -> None:
        port = free_port()
        config = make_config(
            port,
            ["0.0.0.0/0"],
            address=listener,
            protocols=("TURN-UDP",),
            admin={"relay_address_family": family},
        )
        async with running_stunner(config):
            client = await RawClient.connect((listener, port))
            assert error_code(await client.allocate(**requested)) == code
            client.close()

    asyncio.run(main())


@pytest.mark.parametrize(("family", "served"), [("", IPV4), ("IPv6", IPV6)])
def test_dual_request_where_one_family_is_relayed(family: str, served: int) -> None:
    """ADDRESS-ERROR-CODE 440 names the family not relayed; the other is allocated. With
    `IPv6` alone, an Allocate that names no family gets IPv6."""

    async def main() -> None:
        port = free_port()
        config = make_config(
            port, ["0.0.0.0/0"], protocols=("TURN-UDP",), admin={"relay_address_family": family}
        )
        async with running_stunner(config):
            client = await RawClient.connect(("127.0.0.1", port))
            response = await client.allocate(**{"ADDITIONAL-ADDRESS-FAMILY": IPV6})
            assert response.message_class == Class.SUCCESS, response.attributes
            relayed = relayed_addresses(response)
            assert len(relayed) == 1
            assert (":" in relayed[0][0]) == (served == IPV6)
            missing = IPV4 if served == IPV6 else IPV6
            assert response.attributes["ADDRESS-ERROR-CODE"][:2] == (missing, 440)
            other = await RawClient.connect(("127.0.0.1", port))
            plain = await other.allocate()
            assert plain.message_class == Class.SUCCESS
            assert (":" in plain.attributes["XOR-RELAYED-ADDRESS"][0]) == (served == IPV6)
            other.close()
            client.close()

    asyncio.run(main())


def test_turn_tcp_an_ipv4_client_gets_an_ipv6_relay_and_a_dual_one_in_python(
    relay_path: str,
) -> None:
    """TURN-TCP: the native TCP engine serves a relay of the other family too, and, holding
    one relay per client like the UDP one, declines a dual request's second family."""

    async def main() -> None:
        peer4, peer6, port, config = await dual_stack_echo("TURN-TCP")
        to4, to6 = ("127.0.0.1", peer4.port), ("::1", peer6.port)
        async with running_stunner(config):
            single = await RawTcpClient.connect(("127.0.0.1", port))
            response = await single.allocate(**{"REQUESTED-ADDRESS-FAMILY": IPV6})
            assert response.attributes["XOR-RELAYED-ADDRESS"][0] == "::1", response.attributes
            await echo_through(single, 0x4001, to6, b"tcp client, v6 relay")
            single.close()
            dual = await RawTcpClient.connect(("127.0.0.1", port))
            response = await dual.allocate(**{"ADDITIONAL-ADDRESS-FAMILY": IPV6})
            relayed = relayed_addresses(response)
            if relay_path == "native":
                assert len(relayed) == 1
                assert response.attributes["ADDRESS-ERROR-CODE"][:2] == (IPV6, 440)
            else:
                assert [ip for ip, _ in relayed] == ["127.0.0.1", "::1"]
                await echo_through(dual, 0x4002, to6, b"tcp dual, v6 peer")
            await echo_through(dual, 0x4003, to4, b"tcp dual, v4 peer")
            dual.close()
        peer4.close()
        peer6.close()

    asyncio.run(main())
