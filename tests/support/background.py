"""An asyncio loop in a thread, serving aiohttp applications (a CDS, a pod's /status) and
UDP echo peers for tests whose subject runs in another process (helm, the CLI)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from aiohttp import web

from reconciler.cds.server import serve
from stunner_client.echo import EchoPeer


class Background:
    """An asyncio loop in a thread serving aiohttp apps (the CDS, a pod's /status)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._stops: list[asyncio.Event] = []
        self._closers: list[Callable[[], None]] = []

    def serve(self, app: web.Application) -> tuple[str, int]:
        ready: asyncio.Future[tuple[str, int]] = self.loop.create_future()
        stop = asyncio.Event()
        self._stops.append(stop)

        async def run() -> None:
            async with serve(app) as served:
                ready.set_result((served.host, served.port))
                await stop.wait()

        asyncio.run_coroutine_threadsafe(run(), self.loop)
        return asyncio.run_coroutine_threadsafe(
            asyncio.wait_for(asyncio.shield(ready), 10), self.loop
        ).result()

    def close(self) -> None:
        for stop in self._stops:
            self.loop.call_soon_threadsafe(stop.set)
        for close in self._closers:
            self.loop.call_soon_threadsafe(close)
        time.sleep(0.2)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    def echo(self) -> tuple[str, int]:
        """A UDP echo peer (stunner_client.echo) on 127.0.0.1, any free port: its address."""

        async def bind() -> tuple[str, int]:
            peer = await EchoPeer.bind("127.0.0.1")
            self._closers.append(peer.close)
            return peer.address

        return asyncio.run_coroutine_threadsafe(bind(), self.loop).result(10)
