"""The real CDS server (`reconciler.cds.server`) on a free port, with what the client tests look at.

`async with run_cds_server() as cds:` serves a fresh `ConfigStore` on 127.0.0.1 (port 0: any
free port; `cds.address` is `http://127.0.0.1:<port>`). `cds.set_config("ns/name", config)` (a
`StunnerConfig`, or JSON text served as is, so that client tests can send a config the client must
refuse), `cds.delete("ns/name")` (its watchers get the zero config), `await cds.disconnect_all()`
(the clients should reconnect). `cds.requests` records every request path with its query, and
`cds.origins` the Origin header of every WebSocket client. `access` (a middleware such as
`reconciler.cds.access.Access.middleware`) decides who reads what, as in cluster mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.typedefs import Middleware

from reconciler.cds.server import HANDLERS_KEY, cds_app, serve
from reconciler.cds.store import ConfigStore
from stunner_api.dataplane import StunnerConfig


@dataclass
class CdsServer:
    store: ConfigStore
    app: web.Application
    address: str = ""
    requests: list[str] = field(default_factory=list)
    origins: list[str | None] = field(default_factory=list)

    def set_config(self, id: str, config: StunnerConfig | str) -> None:
        if isinstance(config, str):
            self.store.set_json(id, config)
        else:
            self.store.set(id, config)

    def delete(self, id: str) -> None:
        self.store.delete(id)

    async def disconnect_all(self) -> None:
        await self.app[HANDLERS_KEY].close_all()

    @property
    def watcher_count(self) -> int:
        return len(self.store.watchers)


@contextlib.asynccontextmanager
async def run_cds_server(
    host: str = "127.0.0.1", port: int = 0, access: Middleware | None = None
) -> AsyncIterator[CdsServer]:
    """A running CDS server on `host:port`; closed (with its connections) on exit."""
    store = ConfigStore()
    cds = CdsServer(store, cds_app(store, access=access))

    @web.middleware
    async def record(request: web.Request, handler: web.RequestHandler) -> web.StreamResponse:
        cds.requests.append(request.path_qs)
        if request.headers.get("Upgrade", "").lower() == "websocket":
            cds.origins.append(request.headers.get("Origin"))
        return await handler(request)

    cds.app.middlewares.append(record)
    async with serve(cds.app, host, port) as served:
        cds.address = served.address
        yield cds
