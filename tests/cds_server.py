"""A small config discovery service (CDS) server for tests, speaking the operator's protocol.

- `GET /api/v1/configs/{namespace}/{name}`: the current config as JSON, or 404
  `{"code":404,"message":"..."}`.
- The same with `?watch=true` and a WebSocket upgrade: a stream of text frames, each a full
  config: the current one (if any) on connect, then every update. A deleted config is pushed as
  the zero config, as the operator does when a Gateway is deleted.
- Pings are answered (the websockets library does that); the server does not ping itself.

Use it as `async with run_cds_server() as cds:` (port 0: any free port; `cds.address` is
`http://127.0.0.1:<port>`), then `cds.set_config("ns/name", config)`, `cds.delete("ns/name")`,
`await cds.disconnect_all()`. `cds.requests` records every request path (with its query) and
`cds.origins` the Origin header of every WebSocket client.
"""

from __future__ import annotations

import contextlib
import json
import re
import urllib.parse
from collections.abc import AsyncIterator
from http import HTTPStatus

from websockets.asyncio.server import ServerConnection, broadcast, serve
from websockets.http11 import Request, Response

from stunner_api.dataplane import StunnerConfig, zero_config

CONFIG_PATH = re.compile(r"/api/v1/configs/([^/?]+)/([^/?]+)")


class CdsServer:
    """Configs by id (`namespace/name`) and the WebSocket clients watching each id."""

    def __init__(self) -> None:
        self.configs: dict[str, str] = {}
        self.watchers: dict[str, set[ServerConnection]] = {}
        self.requests: list[str] = []
        self.origins: list[str | None] = []
        self.host = "127.0.0.1"
        self.port = 0

    @property
    def address(self) -> str:
        return f"http://{self.host}:{self.port}"

    def set_config(self, id: str, config: StunnerConfig | str) -> None:
        """Store the config of `id` and push it to every watcher of `id`."""
        text = config if isinstance(config, str) else config.to_json()
        self.configs[id] = text
        broadcast(self.watchers.get(id, set()), text)

    def delete(self, id: str) -> None:
        """Forget `id` and push the zero config to its watchers."""
        self.configs.pop(id, None)
        broadcast(self.watchers.get(id, set()), zero_config(id).to_json())

    async def disconnect_all(self) -> None:
        """Close every WebSocket connection (the clients should reconnect)."""
        for connections in list(self.watchers.values()):
            for connection in list(connections):
                await connection.close(1001, "going away")

    @property
    def watcher_count(self) -> int:
        return sum(len(connections) for connections in self.watchers.values())

    def _error(self, connection: ServerConnection, status: HTTPStatus, message: str) -> Response:
        return self._json(connection, status, json.dumps({"code": status, "message": message}))

    @staticmethod
    def _json(connection: ServerConnection, status: HTTPStatus, body: str) -> Response:
        response = connection.respond(status, body)
        del response.headers["Content-Type"]
        response.headers["Content-Type"] = "application/json"
        return response

    def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        self.requests.append(request.path)
        url = urllib.parse.urlsplit(request.path)
        match = CONFIG_PATH.fullmatch(url.path)
        if match is None:
            return self._error(connection, HTTPStatus.NOT_FOUND, f"no such endpoint: {url.path}")
        id = "/".join(urllib.parse.unquote(part) for part in match.groups())
        if urllib.parse.parse_qs(url.query).get("watch") == ["true"]:
            if request.headers.get("Upgrade", "").lower() != "websocket":
                return self._error(connection, HTTPStatus.BAD_REQUEST, "watch needs a WebSocket")
            return None  # go on with the WebSocket handshake
        config = self.configs.get(id)
        if config is None:
            return self._error(connection, HTTPStatus.NOT_FOUND, f"config {id} not found")
        return self._json(connection, HTTPStatus.OK, config)

    async def handler(self, connection: ServerConnection) -> None:
        assert connection.request is not None
        self.origins.append(connection.request.headers.get("Origin"))
        match = CONFIG_PATH.match(connection.request.path)
        assert match is not None
        id = "/".join(urllib.parse.unquote(part) for part in match.groups())
        watchers = self.watchers.setdefault(id, set())
        watchers.add(connection)
        try:
            # Synchronous from the check to the send: no update can slip in between.
            if id in self.configs:
                broadcast([connection], self.configs[id])
            await connection.wait_closed()
        finally:
            watchers.discard(connection)


@contextlib.asynccontextmanager
async def run_cds_server(host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[CdsServer]:
    """A running `CdsServer` on `host:port`; closed (with its connections) on exit."""
    cds = CdsServer()
    async with serve(
        cds.handler,
        host,
        port,
        process_request=cds.process_request,
        ping_interval=None,
        compression=None,
        close_timeout=1,
    ) as server:
        cds.host = host
        cds.port = next(iter(server.sockets)).getsockname()[1]
        yield cds
