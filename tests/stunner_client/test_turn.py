"""stunner_client.turn, aioice's TURN client against a real in-process stunnerd on loopback: each
call deletes the allocations it made before it returns (a stunnerd told to stop would otherwise
drain them for their lifetime: `stunnerd.demo` took 10 s to stop)."""

from __future__ import annotations

import asyncio

from stunner_client.echo import EchoPeer
from stunner_client.turn import allocate, refused, relay
from tests.support.turnclient import (
    HOST,
    PASSWORD,
    USERNAME,
    free_port,
    make_config,
    running_stunner,
)

CREDENTIALS = (USERNAME, PASSWORD)


def test_every_call_deletes_its_allocation_before_it_returns() -> None:
    async def main() -> None:
        port = free_port()
        echo = await EchoPeer.bind(HOST)
        async with running_stunner(make_config(port, [f"{HOST}/32"])) as stunner:
            server = (HOST, port)

            def allocations() -> int:
                return sum(
                    len(listener.server.allocations) for listener in stunner.listeners.values()
                )

            for transport in ("udp", "tcp"):
                result = await relay(transport, server, (HOST, echo.port), 3, CREDENTIALS)
                assert result["received"] == 3, result
                assert allocations() == 0, f"relay over {transport} left its allocation"
            assert "403" in await refused(server, ("127.0.0.2", echo.port), CREDENTIALS)
            assert allocations() == 0, "refused left its allocation"
            await allocate("udp", server, CREDENTIALS, timeout=5)
            assert allocations() == 0, "allocate left its allocation"
        await echo.aclose()

    asyncio.run(main())
