"""IPv4 peers written as IPv6 (issue 31): an IPv4-mapped (`::ffff:a.b.c.d`) or IPv4-compatible
(`::a.b.c.d`) XOR-PEER-ADDRESS is the IPv4 peer it carries, canonicalized before every check.

We test over real sockets on 127.0.0.1 and ::1, on both relay paths: on an IPv4 allocation such
a peer is permitted, bound and relayed to as its IPv4 address (it got 443 before); a route that
refuses 10.2.0.1 refuses ::ffff:10.2.0.1 and ::10.2.0.1 alike (403); on an IPv6 allocation an
IPv4 peer in any spelling is of the other family (443), even where a route admits all of ::/0,
so the IPv6 spelling never slips past the IPv4 policy.
"""

from __future__ import annotations

import asyncio

import pytest

from stunner_api.peer_admission import canonical_peer_ip
from stunner_api.stun import Class
from tests.support.turnclient import (
    RawClient,
    error_code,
    free_port,
    make_config,
    running_stunner,
    start_peer,
)

pytestmark = pytest.mark.usefixtures("relay_path")  # both relay paths: conftest.py


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("::ffff:10.0.0.1", "10.0.0.1"),
        ("::10.0.0.1", "10.0.0.1"),
        ("::ffff:a00:1", "10.0.0.1"),
        ("::a00:1", "10.0.0.1"),
        ("0:0:0:0:0:ffff:10.0.0.1", "10.0.0.1"),
        ("::ffff:127.0.0.1", "127.0.0.1"),
        ("10.0.0.1", "10.0.0.1"),
        ("2001:db8::1", "2001:db8::1"),
        ("::1", "::1"),
        ("::", "::"),
        ("64:ff9b::10.0.0.1", "64:ff9b::10.0.0.1"),  # NAT64: an IPv6 peer (judged as IPv4)
        ("not-an-ip", "not-an-ip"),
    ],
)
def test_canonical_peer_ip(text: str, canonical: str) -> None:
    assert canonical_peer_ip(text) == canonical
    assert canonical_peer_ip(canonical_peer_ip(text)) == canonical_peer_ip(text)


def test_mapped_peer_on_an_ipv4_allocation_is_its_ipv4_address() -> None:
    async def main() -> None:
        peer = await start_peer(echo=True)
        port = free_port()
        config = make_config(
            port,
            [f"127.0.0.1/32:<{peer.port}-{peer.port}>", "10.1.0.0/16"],
            protocols=("TURN-UDP",),
        )
        async with running_stunner(config):
            client = await RawClient.connect(("127.0.0.1", port))
            assert (await client.allocate()).message_class == Class.SUCCESS
            mapped = ("::ffff:127.0.0.1", peer.port)
            assert (await client.create_permission(mapped)).message_class == Class.SUCCESS
            client.send_indication(mapped, b"sent to a mapped peer")
            data = await asyncio.wait_for(client.indications.get(), 5)
            assert data.attributes["DATA"] == b"sent to a mapped peer"
            assert data.attributes["XOR-PEER-ADDRESS"] == ("127.0.0.1", peer.port)
            compatible = ("::127.0.0.1", peer.port)
            assert (await client.channel_bind(0x4000, compatible)).message_class == Class.SUCCESS
            client.send_channel_data(0x4000, b"over a channel")
            assert await asyncio.wait_for(client.channel_data.get(), 5) == (
                0x4000,
                b"over a channel",
            )
            # The same policy as the IPv4 spelling: 10.1/16 admitted, 10.2/16 refused.
            for spelling in ("10.2.0.1", "::ffff:10.2.0.1", "::10.2.0.1"):
                assert error_code(await client.create_permission((spelling, 5000))) == 403
            for spelling in ("10.1.0.1", "::ffff:10.1.0.1", "::10.1.0.1"):
                response = await client.create_permission((spelling, 5000))
                assert response.message_class == Class.SUCCESS, spelling
            client.close()
        peer.close()

    asyncio.run(main())


def test_ipv4_peer_in_any_spelling_on_an_ipv6_allocation_is_443() -> None:
    async def main() -> None:
        port = free_port()
        config = make_config(port, ["::/0", "10.1.0.0/16"], address="::1", protocols=("TURN-UDP",))
        async with running_stunner(config):
            client = await RawClient.connect(("::1", port))
            response = await client.allocate(**{"REQUESTED-ADDRESS-FAMILY": 2})
            assert response.message_class == Class.SUCCESS, response.attributes
            # ::/0 admits every IPv6 address, yet ::10.2.0.1 is 10.2.0.1: not an IPv6 peer.
            for spelling in ("10.2.0.1", "::ffff:10.2.0.1", "::10.2.0.1", "::ffff:10.1.0.1"):
                assert error_code(await client.create_permission((spelling, 5000))) == 443
            assert (await client.create_permission(("2001:db8::5", 5000))).message_class == (
                Class.SUCCESS
            )
            client.close()

    asyncio.run(main())
