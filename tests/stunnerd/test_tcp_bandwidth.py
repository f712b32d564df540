"""Issue 29's bandwidth cap on RFC 6062 TCP allocations, over real sockets: a data connection is
a byte stream, so the cap paces it (the relay stops reading the sender while the bucket is
empty; TCP's flow control holds the sender) instead of dropping. One allocation sends as fast
as TCP lets it through a TCP echo backend; what comes back is measured in consecutive windows
(after the bucket's initial burst): none above the cap by more than 5 %, one within 5 % of it
(a window in which a busy machine starved the event loop falls short). Another allocation on
the same stunnerd, sending half the cap at the same time, gets back what it sends, at its own
rate, within 5 % in that window."""

from __future__ import annotations

import asyncio
from typing import Any

from stunner_api.stun import Class
from stunnerd.process.daemon import Stunner
from stunnerd.turn.limits import Limits
from tests.stunnerd.test_tcp_allocations import (
    config,
    connect,
    connection_bind,
    echo_backend,
    run,
    tcp_allocation,
)
from tests.support.turnclient import free_port

LIMIT = 800_000  # the cap, bits per second each way: 100,000 B/s
RATE = LIMIT / 8
WARM_UP = 0.5  # seconds left out: the bucket's initial burst (0.2 s of the cap)
WINDOW = 3.0  # seconds measured
WINDOWS = 3  # consecutive windows, at most, for one within 5 %
CHUNK = 5_000  # bytes the uncapped-rate sender writes at a time


class Received:
    """What a data connection reads back, with when (the loop's clock)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.arrivals: list[tuple[float, int]] = []
        self.task = asyncio.ensure_future(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        loop = asyncio.get_running_loop()
        while data := await reader.read(65536):
            self.arrivals.append((loop.time(), len(data)))

    def rate(self, start: float, end: float) -> float:
        return sum(n for t, n in self.arrivals if start <= t < end) / (end - start)


async def data_connection(port: int, backend: int) -> tuple[Any, Any, Any]:
    control = await tcp_allocation(port)
    response = await connect(control, ("127.0.0.1", backend))
    assert response.message_class == Class.SUCCESS, response.attributes
    reader, writer, bound = await connection_bind(
        control, port, response.attributes["CONNECTION-ID"]
    )
    assert bound.message_class == Class.SUCCESS, bound.attributes
    return control, reader, writer


async def flood(writer: asyncio.StreamWriter) -> None:
    """As fast as TCP's flow control lets it."""
    chunk = bytes(65536)
    while True:
        writer.write(chunk)
        await writer.drain()


async def steady(writer: asyncio.StreamWriter, per_second: float) -> None:
    """`per_second` bytes a second, CHUNK at a time, on the loop's clock (no drift)."""
    loop = asyncio.get_running_loop()
    start, sent = loop.time(), 0
    while True:
        writer.write(bytes(CHUNK))
        sent += CHUNK
        await writer.drain()
        await asyncio.sleep(max(0.0, start + sent / per_second - loop.time()))


def test_a_capped_tcp_allocation_is_paced_at_its_cap_and_another_is_unaffected(
    relay_path: str,
) -> None:
    async def main() -> None:
        port = free_port()
        stunner = Stunner(limits=Limits())
        plain = config(port)
        auth = plain.auth.model_copy(update={"allocation_bandwidth_limit": LIMIT})
        capped = plain.model_copy(update={"auth": auth})
        await stunner.apply(capped)
        tasks: list[asyncio.Future[None]] = []
        try:
            async with echo_backend() as (backend, _):
                fast = await data_connection(port, backend)
                slow = await data_connection(port, backend)
                fast_back, slow_back = Received(fast[1]), Received(slow[1])
                tasks += [fast_back.task, slow_back.task]
                tasks.append(asyncio.ensure_future(flood(fast[2])))
                tasks.append(asyncio.ensure_future(steady(slow[2], RATE / 2)))
                loop = asyncio.get_running_loop()
                since = loop.time() + WARM_UP
                rates: list[tuple[float, float]] = []
                while len(rates) < WINDOWS:
                    await asyncio.sleep(since + WINDOW - loop.time())
                    end = since + WINDOW
                    got = (fast_back.rate(since, end), slow_back.rate(since, end))
                    rates.append(got)
                    since += WINDOW
                    assert got[0] <= 1.05 * RATE, (rates, RATE)
                    if got[0] >= 0.95 * RATE and abs(got[1] - RATE / 2) <= 0.05 * RATE / 2:
                        break
                else:
                    raise AssertionError(f"no window within 5 %: {rates}, cap {RATE} B/s")
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                for control, _, writer in (fast, slow):
                    writer.close()
                    control.close()
        finally:
            for task in tasks:
                task.cancel()
            await stunner.close()

    run(main)
