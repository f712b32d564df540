"""Relaying beyond the IPv4 + STATIC happy path: an IPv6 relay, and STRICT_DNS clusters.

We test: a listener whose address is IPv6 hands out an IPv6 relayed address (XOR-encoded with
the transaction id) and relays to an IPv6 peer, refusing IPv4 peers with 443; a STRICT_DNS
cluster admits exactly the addresses its name resolves to.
"""

from __future__ import annotations

import asyncio

import pytest

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


def test_ipv6_relay_to_an_ipv6_peer() -> None:
    async def main() -> None:
        peer = await start_peer(echo=True, host="::1")
        port = free_port()
        config = make_config(
            port, [f"::1/128:<{peer.port}-{peer.port}>"], address="::1", protocols=("TURN-UDP",)
        )
        async with running_stunner(config):
            client = await RawClient.connect(("::1", port))
            response = await client.allocate(**{"REQUESTED-ADDRESS-FAMILY": 2})
            assert response.message_class == Class.SUCCESS, response.attributes
            relayed = response.attributes["XOR-RELAYED-ADDRESS"]
            assert relayed[0] == "::1"
            assert response.attributes["XOR-MAPPED-ADDRESS"][0] == "::1"
            assert error_code(await client.create_permission(("127.0.0.1", peer.port))) == 443
            assert (
                await client.channel_bind(0x4001, ("::1", peer.port))
            ).message_class == Class.SUCCESS
            client.send_channel_data(0x4001, b"over ipv6")
            channel, payload = await asyncio.wait_for(client.channel_data.get(), 2)
            assert (channel, payload) == (0x4001, b"over ipv6")
            assert peer.received[0][0] == b"over ipv6"
            assert peer.received[0][1][:2] == relayed
            # An IPv4 allocation cannot be had from an IPv6 relay address.
            other = await RawClient.connect(("::1", port))
            assert error_code(await other.allocate(**{"REQUESTED-ADDRESS-FAMILY": 1})) == 440
            other.close()
            client.close()
        peer.close()

    asyncio.run(main())


def test_strict_dns_cluster_admits_what_the_name_resolves_to() -> None:
    async def main() -> None:
        peer = await start_peer(echo=True)
        port = free_port()
        config = make_config(
            port, ["localhost"], cluster_type="STRICT_DNS", protocols=("TURN-UDP",)
        )
        async with running_stunner(config) as stunner:
            for _ in range(100):  # the first resolution runs in the background
                if stunner.router.permits("testns/gw/turn-udp", "127.0.0.1"):
                    break
                await asyncio.sleep(0.02)
            client = await RawClient.connect(("127.0.0.1", port))
            await client.allocate()
            assert (
                await client.channel_bind(0x4000, ("127.0.0.1", peer.port))
            ).message_class == Class.SUCCESS
            assert error_code(await client.channel_bind(0x4001, ("127.0.0.5", peer.port))) == 403
            client.send_channel_data(0x4000, b"resolved")
            assert await asyncio.wait_for(client.channel_data.get(), 2) == (0x4000, b"resolved")
            client.close()
        peer.close()

    asyncio.run(main())
