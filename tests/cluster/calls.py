"""Live calls through a Gateway for the fault phases (tests/cluster/test_faults_cluster.py).

A call is a TURN allocation (UDP or TURN-TCP) with a channel bound to the echo pod, sending a
stream of timestamped, numbered ChannelData packets at a fixed rate (50 a second by default, a
voice call's packet rate) and recording each echo's arrival. What it records is what a user
hears: how many packets never came back, the longest silence, whether it broke (its TCP
connection closed, or no echo at all for `BROKEN_AFTER` seconds before its end), and which
stunnerd pod relayed it (the XOR-RELAYED-ADDRESS is the pod's address). Every allocation is
deleted (Refresh with lifetime 0) when its call ends: stunnerd drains live allocations on
SIGTERM, so one left behind would hold a pod for its lifetime.

`first_working_call` measures the other side of a fault: from a moment on, how long until a new
call is admitted and echoes.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from dataclasses import dataclass, field

from stunner_api.stun import Class
from tests.support.turnclient import RawClient, RawTcpClient, error_code

CHANNEL = 0x4000
HEADER = struct.Struct("!Id")  # sequence number, send time (monotonic)
PAYLOAD_SIZE = 160  # a 20 ms G.711 frame
BROKEN_AFTER = 3.0  # seconds without an echo before the call's end: the call broke


@dataclass
class CallResult:
    transport: str
    relayed: str = ""  # the stunnerd pod's address (XOR-RELAYED-ADDRESS)
    sent: int = 0
    echoed: int = 0
    longest_gap: float = 0.0  # seconds: the longest time without an echo while sending
    gap_at: float = 0.0  # seconds into the call when that longest gap began
    closed: bool = False  # TURN-TCP: the server's side closed the connection
    error: str = ""  # the call could not start (Allocate, CreatePermission, ChannelBind)
    arrivals: list[float] = field(default_factory=list, repr=False)

    @property
    def lost(self) -> int:
        return self.sent - self.echoed

    @property
    def kept(self) -> bool:
        """The call lasted: it started, its connection stayed, and echoes kept coming to the end."""
        return not self.error and not self.closed and self.longest_gap < BROKEN_AFTER


async def _connect(
    transport: str, server: tuple[str, int], credentials: tuple[str, str]
) -> RawClient:
    user, password = credentials
    if transport == "tcp":
        return await RawTcpClient.connect(server, username=user, password=password)
    # from any local address (RawClient.connect binds the server's own: loopback tests)
    _, client = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: RawClient(server, username=user, password=password), local_addr=("0.0.0.0", 0)
    )
    return client


async def _open(
    client: RawClient, peer: tuple[str, int], result: CallResult, within: float
) -> bool:
    """Allocate, permit the peer and bind the channel; False (the error said) if any fails."""
    try:
        allocated = await client.allocate()
    except TimeoutError:
        result.error = "Allocate: no answer"
        return False
    if allocated.message_class != Class.SUCCESS:
        result.error = f"Allocate: {error_code(allocated)}"
        return False
    result.relayed = str(allocated.attributes["XOR-RELAYED-ADDRESS"][0])
    deadline = time.monotonic() + within
    while True:  # the route reaches a fresh pod a moment after it is Ready
        bound = await client.channel_bind(CHANNEL, peer)
        if bound.message_class == Class.SUCCESS:
            return True
        if time.monotonic() >= deadline:
            result.error = f"ChannelBind: {error_code(bound)}"
            return False
        await asyncio.sleep(0.2)


async def _receive(client: RawClient, result: CallResult) -> None:
    seen: set[int] = set()
    while True:
        _, data = await client.channel_data.get()
        if len(data) < HEADER.size:
            continue
        sequence, _ = HEADER.unpack_from(data)
        if sequence not in seen:
            seen.add(sequence)
            result.echoed += 1
            result.arrivals.append(time.monotonic())


async def call(
    transport: str,
    server: tuple[str, int],
    peer: tuple[str, int],
    credentials: tuple[str, str],
    seconds: float,
    rate: float = 50.0,
) -> CallResult:
    """One call of `seconds` at `rate` packets a second; its allocation deleted at its end."""
    result = CallResult(transport)
    try:
        client = await _connect(transport, server, credentials)
    except OSError as exc:
        result.error = f"connect: {exc}"
        return result
    opened = False
    try:
        opened = await _open(client, peer, result, within=10)
        if not opened:
            return result
        receiving = asyncio.get_running_loop().create_task(_receive(client, result))
        started = time.monotonic()
        padding = bytes(PAYLOAD_SIZE - HEADER.size)
        while (now := time.monotonic()) < started + seconds:
            if isinstance(client, RawTcpClient) and client.closed.done():
                result.closed = True
                break
            client.send_channel_data(CHANNEL, HEADER.pack(result.sent, now) + padding)
            result.sent += 1
            await asyncio.sleep(max(0.0, started + result.sent / rate - time.monotonic()))
        ended = time.monotonic()
        await asyncio.sleep(0.5)  # the last echoes' way back
        receiving.cancel()
        marks = [started, *(t for t in result.arrivals if t <= ended), ended]
        gap, begun = max((b - a, a) for a, b in zip(marks, marks[1:], strict=False))
        result.longest_gap, result.gap_at = gap, begun - started
    except (OSError, ConnectionError) as exc:
        result.closed = True
        result.error = result.error or f"{type(exc).__name__}: {exc}"
    finally:
        if opened:
            with contextlib.suppress(Exception):
                await client.refresh(0)
        client.close()
        if isinstance(client, RawTcpClient) and client.writer is not None:
            # a connection to a pod that went away keeps its unsent bytes and its socket past
            # the event loop (a ResourceWarning in a later test): dropped, not flushed
            client.writer.transport.abort()
    return result


async def first_working_call(
    transport: str,
    server: tuple[str, int],
    peer: tuple[str, int],
    credentials: tuple[str, str],
    within: float,
    every: float = 0.5,
) -> tuple[float, CallResult]:
    """From now, short calls (1 s) until one is admitted and echoes every packet but a few:
    (seconds until it started, that call). Raises AssertionError after `within` seconds."""
    started = time.monotonic()
    last = CallResult(transport)
    while time.monotonic() - started < within:
        attempt = time.monotonic()
        last = await call(transport, server, peer, credentials, seconds=1.0)
        if not last.error and not last.closed and last.echoed >= last.sent - 2 and last.sent:
            return attempt - started, last
        await asyncio.sleep(every)
    raise AssertionError(f"no {transport} call worked within {within:.0f} s (last: {last})")


def summary(results: list[CallResult]) -> str:
    """`kept k/n, lost L of S packets, longest gap G s` of a set of calls."""
    kept = sum(r.kept for r in results)
    sent = sum(r.sent for r in results)
    lost = sum(r.lost for r in results)
    gap = max((r.longest_gap for r in results), default=0.0)
    return f"kept {kept}/{len(results)}, lost {lost} of {sent} packets, longest gap {gap:.2f} s"
