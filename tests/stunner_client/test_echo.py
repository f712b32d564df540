"""stunner_client.echo: the UDP echo peer the demos, selftest and the tests route to, on real
sockets over loopback."""

from __future__ import annotations

import asyncio
import socket

import asyncio_dgram
import pytest

from stunner_client.echo import EchoPeer


def test_every_datagram_goes_back_to_its_sender() -> None:
    async def main() -> None:
        peer = await EchoPeer.bind("127.0.0.1")
        assert peer.address == ("127.0.0.1", peer.port) and peer.port > 0
        clients = [await asyncio_dgram.connect(peer.address) for _ in range(2)]
        try:
            for i, client in enumerate(clients):
                await client.send(b"packet-%d" % i)
            for i, client in enumerate(clients):
                data, source = await asyncio.wait_for(client.recv(), 5)
                assert (data, source) == (b"packet-%d" % i, peer.address)
        finally:
            for client in clients:
                client.close()
            await peer.aclose()

    asyncio.run(main())


def test_closed_it_frees_its_port() -> None:
    async def main() -> int:
        peer = await EchoPeer.bind("127.0.0.1")
        await peer.aclose()
        return peer.port

    port = asyncio.run(main())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", port))  # would raise EADDRINUSE had it stayed bound


def test_a_busy_port_is_a_clear_error() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        with pytest.raises(OSError, match="in use"):
            asyncio.run(EchoPeer.bind("127.0.0.1", squatter.getsockname()[1]))
