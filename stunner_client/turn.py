"""A real TURN client (aioice's) against a running STUNner listener: allocate, relay packets to
a peer and count what comes back, or see a peer refused.

aioice is imported by the calls, not here: it comes with the `demo` and `cli` extras.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any


class Receiver(asyncio.DatagramProtocol):
    """What the relayed endpoint receives, with the time each payload arrived, and its errors."""

    def __init__(self) -> None:
        self.received: dict[bytes, float] = {}
        self.errors: list[Exception] = []

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.received[data] = time.monotonic()

    def error_received(self, exc: Exception) -> None:
        self.errors.append(exc)


async def relay(
    transport: str,
    server: tuple[str, int],
    peer: tuple[str, int],
    count: int,
    credentials: tuple[str, str],
    wait: float = 2.0,
) -> dict[str, Any]:
    """Send `count` packets to the echo peer through TURN over `transport` (udp, tcp); report
    what came back within `wait` seconds."""
    from aioice.turn import create_turn_endpoint

    username, password = credentials
    turn, receiver = await create_turn_endpoint(
        Receiver, server_addr=server, username=username, password=password, transport=transport
    )
    try:
        relayed = turn.get_extra_info("sockname")
        sent: dict[bytes, float] = {}
        for i in range(count):
            payload = f"{transport}-packet-{i:04d}".encode()
            sent[payload] = time.monotonic()
            turn.sendto(payload, peer)
            await asyncio.sleep(0.01)  # a modest 100 packets/s
        deadline = time.monotonic() + wait
        while len(receiver.received) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        rtts = [receiver.received[p] - t for p, t in sent.items() if p in receiver.received]
        return {
            "transport": transport,
            "relayed_address": relayed,
            "sent": count,
            "received": len(rtts),
            "mean_rtt_ms": round(1000 * sum(rtts) / len(rtts), 2) if rtts else None,
        }
    finally:
        turn.close()


async def refused(
    server: tuple[str, int],
    peer: tuple[str, int],
    credentials: tuple[str, str],
    timeout: float = 3.0,
) -> str:
    """Try to reach a peer no route admits: the ChannelBind must fail with 403."""
    from aioice.turn import create_turn_endpoint

    username, password = credentials
    turn, receiver = await create_turn_endpoint(
        Receiver, server_addr=server, username=username, password=password, transport="udp"
    )
    try:
        turn.sendto(b"should not arrive", peer)
        deadline = time.monotonic() + timeout
        while not receiver.errors and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return str(receiver.errors[0]) if receiver.errors else "no error (unexpected)"
    finally:
        turn.close()


async def allocate(
    transport: str, server: tuple[str, int], credentials: tuple[str, str], timeout: float
) -> Any:
    """One allocation over `transport` within `timeout` seconds: its relayed address."""
    from aioice.turn import create_turn_endpoint

    turn, _ = await asyncio.wait_for(
        create_turn_endpoint(
            asyncio.DatagramProtocol,
            server_addr=server,
            username=credentials[0],
            password=credentials[1],
            transport=transport,
        ),
        timeout,
    )
    try:
        return turn.get_extra_info("sockname")
    finally:
        turn.close()


async def open_allocation(
    transport: str, server: tuple[str, int], credentials: tuple[str, str], timeout: float
) -> Any:
    """One allocation over `transport`, held: aioice's TurnTransport, whose `close()` releases
    it (a Refresh with LIFETIME 0). A refusal raises aioice's TransactionFailed (`error_code`)."""
    from aioice.turn import create_turn_endpoint

    turn, _ = await asyncio.wait_for(
        create_turn_endpoint(
            asyncio.DatagramProtocol,
            server_addr=server,
            username=credentials[0],
            password=credentials[1],
            transport=transport,
        ),
        timeout,
    )
    return turn


def error_code(exc: BaseException) -> int | None:
    """The STUN error code of a refused request (aioice's TransactionFailed), else None."""
    response = getattr(exc, "response", None)
    error = response.attributes.get("ERROR-CODE") if response is not None else None
    return int(error[0]) if error else None
