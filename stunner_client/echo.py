"""The UDP echo peer: a media-server stand-in that sends every datagram back where it came from.

A route admits it; the TURN client's packets come back through the relay (the demos, `stunner
selftest --echo`, the tests). It runs off the measured packet path, so it uses asyncio-dgram
(`await recv()` / `await send()` over an asyncio datagram endpoint) rather than a protocol class
of our own.
"""

from __future__ import annotations

import asyncio
import contextlib

import asyncio_dgram


class EchoPeer:
    """An echo peer bound to `(host, port)` (port 0: any free one) until `close()`."""

    def __init__(self, stream: asyncio_dgram.DatagramServer) -> None:
        self._stream = stream
        self._task = asyncio.create_task(self._echo())

    @classmethod
    async def bind(cls, host: str, port: int = 0) -> EchoPeer:
        return cls(await asyncio_dgram.bind((host, port)))

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._stream.sockname[:2]
        return str(host), int(port)

    @property
    def port(self) -> int:
        return self.address[1]

    async def _echo(self) -> None:
        while True:
            try:
                data, addr = await self._stream.recv()
                await self._stream.send(data, addr)
            except asyncio_dgram.TransportClosed:
                return
            except OSError:
                continue  # an earlier send failed (error_received): echo the next one

    def close(self) -> None:
        self._stream.close()
        self._task.cancel()

    async def aclose(self) -> None:
        self.close()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
