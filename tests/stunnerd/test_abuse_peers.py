"""Issue 15 items 9 and 11: no relay to stunnerd itself or to special ranges; sockets bind the
listener's address.

We test: whatever the routes say (0.0.0.0/0, ::/0), unspecified, multicast and broadcast peers
are refused, and loopback and link-local ones (169.254.169.254 included) unless a cluster names
such a range, in every IPv6 spelling (IPv4-mapped, NAT64, 6to4); stunnerd's own listener
and relay sockets are never peers, over a real TURN client too, at every address of the host
when a listener binds the wildcard; `/status` says so; listener,
relay and health sockets bind the configured address, not the wildcard.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest

from stunner_api.stun import Class, Message, Method
from stunnerd.turn.router import PEER_POLICY, Router
from tests.support.turnclient import (
    HOST,
    RawClient,
    error_code,
    free_port,
    make_config,
    running_stunner,
)


class Cluster:
    def __init__(self, *endpoints: str) -> None:
        self.name, self.type, self.protocol = "c", "STATIC", "UDP"
        self.endpoints = list(endpoints)


def router(*endpoints: str, own: tuple[tuple[str, int], ...] = ()) -> Router:
    r = Router()
    r.update({"l": ["c"]}, [Cluster(*endpoints)], own)
    return r


REFUSED = [
    "0.0.0.0", "0.1.2.3", "::", "224.0.0.1", "239.255.255.250", "ff02::1",
    "255.255.255.255", "127.0.0.1", "127.9.9.9", "::1", "169.254.169.254", "fe80::1",
    "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::ffff:0.0.0.0",
    "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "64:ff9b:1::7f00:1", "2002:7f00:1::1",
    "2002:a9fe:a9fe::1", "::127.0.0.1",
]  # fmt: skip


@pytest.mark.parametrize("peer", REFUSED)
def test_special_peers_are_refused_whatever_the_routes_say(peer: str) -> None:
    r = router("0.0.0.0/0", "::/0")
    assert not r.permits("l", peer)
    assert r.cluster_of("l", peer, 5000) is None


@pytest.mark.parametrize("peer", ["10.1.2.3", "8.8.8.8", "2001:db8::1", "64:ff9b::808:808"])
def test_ordinary_peers_stay_admitted_by_a_wide_route(peer: str) -> None:
    r = router("0.0.0.0/0", "::/0")
    assert r.permits("l", peer) and r.cluster_of("l", peer, 5000) == "c"


def test_a_cluster_naming_a_loopback_or_link_local_range_admits_it() -> None:
    r = router("127.0.0.1/32", "169.254.169.254/32", "::1/128")
    for peer in ("127.0.0.1", "::ffff:127.0.0.1", "169.254.169.254", "::1"):
        assert r.cluster_of("l", peer, 5000) == "c", peer
    assert r.cluster_of("l", "127.0.0.2", 5000) is None
    assert router("0.0.0.0/0").cluster_of("l", "0.0.0.0", 5000) is None  # never, even so


def test_own_listener_and_relay_sockets_are_never_peers() -> None:
    r = router("10.0.0.0/8", own=(("10.0.0.5", 3478), ("10.0.0.9", 443)))
    assert r.cluster_of("l", "10.0.0.5", 3478) is None
    assert r.cluster_of("l", "::ffff:10.0.0.5", 3478) is None
    assert r.cluster_of("l", "10.0.0.5", 443) is None  # any listener's port, any own address
    assert r.cluster_of("l", "10.0.0.5", 40000) == "c"
    r.relay_ports[40000] = 1  # an allocation's relay socket: checked per packet, not cached
    assert r.cluster_of("l", "10.0.0.5", 40000) is None
    assert r.cluster_of("l", "10.0.0.6", 40000) == "c"
    r.relay_ports[40000] = 0
    assert r.cluster_of("l", "10.0.0.5", 40000) == "c"


def test_a_wildcard_listener_makes_every_host_address_its_own() -> None:
    """A listener (and its relay sockets) on 0.0.0.0 answers on every address of the host, so
    each of them is stunnerd itself; addresses elsewhere stay peers."""
    r = router("127.0.0.0/8", "192.0.2.0/24", own=(("0.0.0.0", 3478), ("", 3478)))
    for own in ("127.0.0.1", "127.0.0.2", "::ffff:127.0.0.3"):  # Linux: all of 127/8 is local
        assert r.cluster_of("l", own, 3478) is None, own
        assert r.cluster_of("l", own, 40000) == "c", own  # any other port is an ordinary peer
    assert r.cluster_of("l", "192.0.2.1", 3478) == "c"  # not an address of this host
    r.relay_ports[40000] = 1
    assert r.cluster_of("l", "127.0.0.2", 40000) is None
    assert r.cluster_of("l", "192.0.2.1", 40000) == "c"
    r.relay_ports[40000] = 0
    # An unset public address ("") is no wildcard: a specific listener address stays specific.
    specific = router("127.0.0.0/8", own=(("127.0.0.1", 3478), ("", 3478)))
    assert specific.cluster_of("l", "127.0.0.2", 3478) == "c"


@pytest.mark.usefixtures("relay_path")  # the Python path and the native engine (conftest.py)
def test_a_client_cannot_reach_a_wildcard_stunnerd_at_another_host_address() -> None:
    async def main() -> None:
        port = free_port()
        config = make_config(port, ["127.0.0.0/8"], address="0.0.0.0", protocols=("TURN-UDP",))
        async with running_stunner(config):
            first, second = (
                await RawClient.connect((HOST, port)),
                await RawClient.connect((HOST, port)),
            )
            assert (await first.allocate()).message_class == Class.SUCCESS
            relayed = (await second.allocate()).attributes["XOR-RELAYED-ADDRESS"]
            assert error_code(await first.channel_bind(0x4000, ("127.0.0.2", port))) == 403
            assert error_code(await first.channel_bind(0x4001, ("127.0.0.2", relayed[1]))) == 403
            ordinary = await first.channel_bind(0x4002, ("127.0.0.2", 9))
            assert ordinary.message_class == Class.SUCCESS
            for client in (first, second):
                client.close()

    asyncio.run(main())


def test_a_client_cannot_reach_stunnerd_itself_through_the_relay() -> None:
    async def main() -> None:
        port, health = free_port(), free_port()
        config = make_config(
            port, [f"{HOST}/32"], admin={"healthcheck_endpoint": f"http://{HOST}:{health}"}
        )
        async with running_stunner(config) as stunner:
            first, second = (
                await RawClient.connect((HOST, port)),
                await RawClient.connect((HOST, port)),
            )
            assert (await first.allocate()).message_class == Class.SUCCESS
            relayed = (await second.allocate()).attributes["XOR-RELAYED-ADDRESS"]
            assert error_code(await first.channel_bind(0x4000, (HOST, port))) == 403
            assert error_code(await first.channel_bind(0x4001, relayed)) == 403
            assert (await first.channel_bind(0x4002, (HOST, 9))).message_class == Class.SUCCESS
            # Sockets bind 127.0.0.1, not the wildcard: 127.0.0.2 reaches none of them.
            listener = stunner.listeners["testns/gw/turn-udp"]
            allocation = next(iter(listener.server.allocations.values()))
            assert allocation.relay is not None
            assert allocation.relay.get_extra_info("sockname")[0] == HOST
            stray = await RawClient.connect(("127.0.0.2", port))
            with pytest.raises(TimeoutError):
                await stray.request(Message(Method.BINDING, Class.REQUEST), sign=False, timeout=0.3)
            for blocked in (port, health):
                with pytest.raises(ConnectionRefusedError):
                    await asyncio.open_connection("127.0.0.2", blocked)
            url = f"http://{HOST}:{health}/status"
            status = await asyncio.to_thread(lambda: json.load(urllib.request.urlopen(url)))
            assert status["peerPolicy"] == PEER_POLICY
            for client in (first, second, stray):
                client.close()

    asyncio.run(main())


def test_a_wildcard_listener_still_binds_dual_stack() -> None:
    async def main() -> None:
        port = free_port()
        async with running_stunner(make_config(port, [f"{HOST}/32"], address="0.0.0.0")):
            reader, writer = await asyncio.open_connection("127.0.0.2", port)
            writer.write(Message(Method.BINDING, Class.REQUEST).encode())
            assert len(await asyncio.wait_for(reader.read(1000), 2)) > 20
            writer.close()
            await writer.wait_closed()

    asyncio.run(main())


def test_no_process_relays_to_another_process_relay_socket() -> None:
    """With a UDP worker, allocations live in two processes; none reaches any relay socket of
    either (the relay ports are shared memory)."""
    from .test_workers import pooled_stunner

    async def main() -> None:
        port = free_port()
        async with pooled_stunner(make_config(port, [f"{HOST}/32"], protocols=("TURN-UDP",))):
            clients = [await RawClient.connect((HOST, port)) for _ in range(10)]
            relayed = []
            for client in clients:
                answer = await client.allocate()
                assert answer.message_class == Class.SUCCESS, answer.attributes
                relayed.append(answer.attributes["XOR-RELAYED-ADDRESS"])
            for n, address in enumerate(relayed[1:]):
                assert error_code(await clients[0].channel_bind(0x4000 + n, address)) == 403
                assert error_code(await clients[-1].channel_bind(0x4000 + n, relayed[0])) == 403
            for client in clients:
                client.close()

    asyncio.run(main())
