"""End-to-end: a standard TURN client (aioice) relays through stunnerd over real loopback sockets.

We test: relaying over TURN-UDP and TURN-TCP with no loss at a modest rate; static and ephemeral
auth; expired ephemeral usernames and wrong passwords refused; a peer outside the routes refused
with 403; a peer port outside the route's range dropped per packet.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aioice import stun as aioice_stun
from aioice.turn import create_turn_endpoint

from stunner_api.ice import ephemeral_password, ephemeral_username
from tests.support.turnclient import (
    HOST,
    PASSWORD,
    SECRET,
    USERNAME,
    free_port,
    make_config,
    running_stunner,
    start_peer,
)

pytestmark = pytest.mark.usefixtures("relay_path")  # both relay paths: conftest.py


class Receiver(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.errors: list[Exception] = []

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.received.append(data)

    def error_received(self, exc: Exception) -> None:
        self.errors.append(exc)


async def relay_through(
    port: int,
    transport: str,
    peer: tuple[str, int],
    count: int,
    username: str = USERNAME,
    password: str = PASSWORD,
) -> list[bytes]:
    turn, receiver = await create_turn_endpoint(
        Receiver,
        server_addr=(HOST, port),
        username=username,
        password=password,
        transport=transport,
    )
    try:
        for i in range(count):
            turn.sendto(b"packet-%04d" % i, peer)
            await asyncio.sleep(0.002)  # 500 packets/s
        deadline = time.monotonic() + 3
        while len(receiver.received) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return receiver.received
    finally:
        turn.close()
        await asyncio.sleep(0)


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_relays_to_admitted_peer_without_loss(transport: str) -> None:
    async def scenario() -> None:
        peer = await start_peer(echo=True)
        port = free_port()
        config = make_config(port, [f"{HOST}/32:<{peer.port}-{peer.port}>"])
        async with running_stunner(config) as stunner:
            received = await relay_through(port, transport, (HOST, peer.port), 200)
            assert sorted(received) == [b"packet-%04d" % i for i in range(200)]
            assert len(peer.received) == 200
            # The peer saw the relayed address: the listener's address, a relay port.
            relay_ports = {addr[1] for _, addr in peer.received}
            assert len(relay_ports) == 1 and port not in relay_ports
            assert stunner.allocation_count <= 1
        peer.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_ephemeral_credentials(transport: str) -> None:
    async def scenario() -> None:
        peer = await start_peer(echo=True)
        port = free_port()
        auth = {"type": "ephemeral", "realm": "stunner.l7mp.io", "credentials": {"secret": SECRET}}
        config = make_config(port, [f"{HOST}/32"], auth=auth)
        username = ephemeral_username(int(time.time()) + 3600, "alice")
        async with running_stunner(config):
            received = await relay_through(
                port,
                transport,
                (HOST, peer.port),
                20,
                username,
                ephemeral_password(SECRET, username),
            )
            assert len(received) == 20
            # coturn-style "userid:timestamp" is accepted too (ANCHORS §1.3).
            reversed_name = f"bob:{int(time.time()) + 3600}"
            received = await relay_through(
                port,
                transport,
                (HOST, peer.port),
                5,
                reversed_name,
                ephemeral_password(SECRET, reversed_name),
            )
            assert len(received) == 5
        peer.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("username_of", "password_of"),
    [
        # expired an hour ago, with a correct HMAC password
        (
            lambda: ephemeral_username(int(time.time()) - 3600, "alice"),
            lambda u: ephemeral_password(SECRET, u),
        ),
        # valid expiry, password signed with another secret
        (
            lambda: ephemeral_username(int(time.time()) + 3600, "alice"),
            lambda u: ephemeral_password("not-the-secret", u),
        ),
        # no timestamp at all
        (lambda: "alice", lambda u: ephemeral_password(SECRET, u)),
    ],
    ids=["expired", "wrong-secret", "no-timestamp"],
)
def test_bad_ephemeral_credentials_are_refused(username_of, password_of) -> None:  # type: ignore[no-untyped-def]
    async def scenario() -> None:
        port = free_port()
        auth = {"type": "ephemeral", "realm": "stunner.l7mp.io", "credentials": {"secret": SECRET}}
        async with running_stunner(make_config(port, [f"{HOST}/32"], auth=auth)) as stunner:
            username = username_of()
            with pytest.raises(aioice_stun.TransactionFailed) as failure:
                await create_turn_endpoint(
                    Receiver,
                    server_addr=(HOST, port),
                    username=username,
                    password=password_of(username),
                    transport="udp",
                )
            assert failure.value.response.attributes["ERROR-CODE"][0] == 401
            assert stunner.allocation_count == 0

    asyncio.run(scenario())


def test_wrong_static_password_is_refused() -> None:
    async def scenario() -> None:
        port = free_port()
        async with running_stunner(make_config(port, [f"{HOST}/32"])):
            with pytest.raises(aioice_stun.TransactionFailed) as failure:
                await create_turn_endpoint(
                    Receiver,
                    server_addr=(HOST, port),
                    username=USERNAME,
                    password="wrong",
                    transport="tcp",
                )
            assert failure.value.response.attributes["ERROR-CODE"][0] == 401

    asyncio.run(scenario())


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_peer_outside_routes_gets_403(transport: str) -> None:
    async def scenario() -> None:
        peer = await start_peer(echo=True)
        port = free_port()
        # Only 127.0.0.2 is admitted; the peer listens on 127.0.0.1.
        async with running_stunner(make_config(port, ["127.0.0.2/32"])):
            turn, receiver = await create_turn_endpoint(
                Receiver,
                server_addr=(HOST, port),
                username=USERNAME,
                password=PASSWORD,
                transport=transport,
            )
            turn.sendto(b"must not arrive", (HOST, peer.port))
            deadline = time.monotonic() + 3
            while not receiver.errors and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            turn.close()
            assert receiver.errors, "the ChannelBind should have failed"
            error = receiver.errors[0]
            assert isinstance(error, aioice_stun.TransactionFailed)
            assert error.response.attributes["ERROR-CODE"][0] == 403
            assert peer.received == []
        peer.close()

    asyncio.run(scenario())


def test_peer_port_outside_range_is_never_reached() -> None:
    async def scenario() -> None:
        admitted = await start_peer(echo=True)
        outside = await start_peer(echo=True)
        port = free_port()
        # The IP is admitted, but only one port of it: the ChannelBind to another port is
        # refused with 403 (issue 15; it used to succeed and drop every packet).
        endpoint = f"{HOST}/32:<{admitted.port}-{admitted.port}>"
        async with running_stunner(make_config(port, [endpoint])):
            received = await relay_through(port, "udp", (HOST, outside.port), 10)
            assert received == []
            assert outside.received == []
            received = await relay_through(port, "udp", (HOST, admitted.port), 10)
            assert len(received) == 10
        admitted.close()
        outside.close()

    asyncio.run(scenario())
