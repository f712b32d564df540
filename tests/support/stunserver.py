"""A scripted STUN server on loopback, for relay address discovery's tests.

It answers each Binding request with the XOR-MAPPED-ADDRESS its script says (`say`: each
request takes the next answer, the last one repeats; None is silence), from its own socket, or
from another one (`forge_from`: an answer with the right transaction id from another source,
which a connected client socket never sees). `requests_reach(n)` waits for the n-th request.
"""

from __future__ import annotations

import asyncio
from typing import cast

from stunner_api.stun import Class, Message, Method, StunError, parse_message

STEP = 20.0  # seconds a test waits for a condition before it fails


class FakeStunServer(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.script: list[str | None] = ["203.0.113.7"]
        self.requests = 0
        self.answered: list[str] = []  # what it answered, in order
        self.transport: asyncio.DatagramTransport | None = None
        self.forger: asyncio.DatagramTransport | None = None  # answers go from here instead
        self._arrived = asyncio.Event()

    @classmethod
    async def start(cls, host: str = "127.0.0.1") -> FakeStunServer:
        _, server = await asyncio.get_running_loop().create_datagram_endpoint(
            cls, local_addr=(host, 0)
        )
        return server

    async def forge_from(self, host: str, port: int = 0) -> None:
        """Answer from (host, port) from now on, not from the server's own socket."""
        self.forger, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            asyncio.DatagramProtocol, local_addr=(host, port)
        )

    def say(self, *answers: str | None) -> None:
        """The next requests' answers, in order; the last one repeats."""
        self.script = list(answers)

    @property
    def sockname(self) -> tuple[str, int]:
        assert self.transport is not None
        name = self.transport.get_extra_info("sockname")
        return str(name[0]), int(name[1])

    @property
    def address(self) -> str:
        """host:port ([host]:port for IPv6), as STUNNER_RELAY_STUN_SERVER names it."""
        host, port = self.sockname
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            request = parse_message(data)
        except StunError:
            return
        self.requests += 1
        self._arrived.set()
        answer = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        sender = self.forger or self.transport
        if answer is None or sender is None:
            return
        response = Message(Method.BINDING, Class.SUCCESS, request.transaction_id)
        response.attributes["XOR-MAPPED-ADDRESS"] = (answer, addr[1])
        self.answered.append(answer)
        sender.sendto(response.encode(), addr)

    async def requests_reach(self, count: int) -> None:
        """Wait until `count` requests have come (within STEP seconds)."""
        async with asyncio.timeout(STEP):
            while self.requests < count:
                self._arrived.clear()
                await self._arrived.wait()

    def close(self) -> None:
        for transport in (self.transport, self.forger):
            if transport is not None:
                transport.close()
