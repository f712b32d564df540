"""The admin HTTP endpoints of stunnerd: health checks, `/status`, Prometheus metrics.

Served by aiohttp (GET and HEAD only) with the connection discipline every server of ours has
(`stunner_http.server`), with bounds a kubelet probe or a Prometheus scrape never reaches: a
request line or header field of at most 8 KiB, at most 64 header fields, no body,
HEADER_DEADLINE seconds for a connection to deliver a complete request (a client trickling one
header line every few seconds is closed at the deadline), MAX_CONNECTIONS connections at once
(stunner_http's default per source IP, 16, from one address).
Oversized requests get 400 without a traceback in the log.

The handlers read a narrow view of the dataplane (`AdminView`), never the daemon itself.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from stunner_api.dataplane import StunnerConfig, redacted

from ..turn.counters import ListenerCounters
from ..turn.router import PEER_POLICY
from .metrics import CONTENT_TYPE, MetricsView, render_metrics

if TYPE_CHECKING:
    from aiohttp import web

    from stunner_http.server import ConnectionStats, GuardedSite, ServerLimits

# aiohttp (~10 MiB of RSS) is imported when a server starts: a stunnerd with no admin endpoint
# (health check and metrics both off) never loads it (bench/rss_bench.py).

log = logging.getLogger("stunner.admin")

Response = tuple[int, str, bytes]  # status, content type, body
Route = Callable[[], Response]
RoutesFor = Callable[[str], dict[str, Route]]  # the endpoint URL's path -> {path: handler}

HEADER_DEADLINE = 5.0  # seconds for a connection to deliver a complete request
MAX_CONNECTIONS = 64  # concurrent connections: probes and a scrape need a few
MAX_BODY = 1024  # GET and HEAD only: no body is expected


def _admin_limits() -> ServerLimits:
    from stunner_http.server import ServerLimits  # loaded with the server

    return ServerLimits(request_deadline=HEADER_DEADLINE, max_connections=MAX_CONNECTIONS)


class AdminView(MetricsView, Protocol):
    """What /ready, /status and /metrics read of the running dataplane."""

    @property
    def ready(self) -> bool: ...

    @property
    def status(self) -> str: ...

    @property
    def config(self) -> StunnerConfig | None: ...


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    path: str


def parse_endpoint(url: str, default_port: int) -> Endpoint:
    """`http://:8086` -> all interfaces, port 8086; the path defaults to `/`."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"invalid endpoint {url!r}: the scheme must be http")
    return Endpoint(parts.hostname or "", parts.port or default_port, parts.path or "/")


def parse_address(text: str) -> tuple[str, int]:
    """`HOST:PORT` (`[v6]:PORT`; an empty host is every interface) for --health-address."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"invalid address {text!r}: expected HOST:PORT")
    return host.removeprefix("[").removesuffix("]"), int(port)


def relocate(url: str, address: str) -> str:
    """`url` served at `address` (HOST:PORT) instead: its scheme and path stay."""
    host, port = parse_address(address)
    path = urlsplit(url).path
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"http://{netloc}{path}"


class HttpServer:
    """Serves the routes `routes_for` gives for the endpoint's path; start/stop are idempotent."""

    def __init__(self, name: str, routes_for: RoutesFor) -> None:
        self.name = name
        self.routes_for = routes_for
        self.routes: dict[str, Route] = {}
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._site: GuardedSite | None = None

    @property
    def stats(self) -> ConnectionStats | None:
        return None if self._site is None else self._site.stats

    @property
    def bound_port(self) -> int | None:
        """The port it listens on, None while it is not started."""
        return self.port if self._runner is not None and self._runner.addresses else None

    @property
    def port(self) -> int:
        assert self._runner is not None and self._runner.addresses
        port: int = self._runner.addresses[0][1]
        return port

    async def start(self, url: str, default_port: int) -> None:
        from aiohttp import web

        from stunner_http.server import start

        endpoint = parse_endpoint(url, default_port)
        self.routes = self.routes_for(endpoint.path)
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{path:.*}", self._serve)
        self._runner, self._site = await start(
            app, endpoint.host, endpoint.port, self.name, _admin_limits()
        )
        self.url = url
        log.info("%s server listening on %s", self.name, url)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = self._site = None
        self.url = ""

    async def _serve(self, request: web.Request) -> web.Response:
        from aiohttp import web  # loaded by start

        status, content_type, body = self._route(request.method, request.path)
        return web.Response(status=status, body=body, headers={"Content-Type": content_type})

    def _route(self, method: str, path: str) -> Response:
        handler = self.routes.get(path)
        if handler is None:
            return 404, "text/plain", b"not found\n"
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"method not allowed\n"
        try:
            return handler()
        except Exception:  # a bug in a handler must not kill the server
            log.exception("%s server: error serving %s", self.name, path)
            return 503, "text/plain", b"internal error\n"


def _json(status: int, value: Any) -> Response:
    return status, "application/json", json.dumps(value).encode()


# --- health (ANCHORS §1.5) ----------------------------------------------------------------


def health_routes(view: AdminView) -> dict[str, Route]:
    def live() -> Response:
        return _json(200, {})

    def ready() -> Response:
        if view.ready:
            return _json(200, {"status": 200, "message": "READY"})
        return _json(503, {"status": 503, "message": "stunnerd not ready"})

    return {"/live": live, "/ready": ready, "/status": lambda: _json(200, status_of(view))}


def status_of(view: AdminView) -> dict[str, Any]:
    """Go STUNner's StunnerStatus, except that credentials and keys are redacted."""
    status: dict[str, Any] = {}
    if view.config is not None:
        status = redacted(view.config).to_dict()
        stats: Mapping[str, ListenerCounters] = view.listener_stats()
        offload = view.listener_offload()
        for listener in status.get("listeners", []):
            s = stats.get(listener["name"])
            if s is not None:
                listener["stats"] = {
                    "rx": {"pkts": s.rx_packets, "bytes": s.rx_bytes},
                    "tx": {"pkts": s.tx_packets, "bytes": s.tx_bytes},
                }
            state = offload.get(listener["name"])
            if state is not None:
                listener["offload"] = {k: v for k, v in state.items() if k != "code"}
            if state is not None and s is not None and state["on"]:
                listener["offload"]["stats"] = {  # of the listener's stats, the kernel's share
                    "rx": {"pkts": s.offloaded_rx_packets, "bytes": s.offloaded_rx_bytes},
                    "tx": {"pkts": s.offloaded_tx_packets, "bytes": s.offloaded_tx_bytes},
                }
    status["allocationCount"] = view.allocation_count
    status["status"] = view.status
    status["peerPolicy"] = PEER_POLICY  # what no route can open (router.py)
    return status


# --- metrics (ANCHORS §1.6) ----------------------------------------------------------------


def metrics_routes(view: MetricsView, path: str) -> dict[str, Route]:
    def metrics() -> Response:
        return 200, CONTENT_TYPE, render_metrics(view).encode()

    return {path: metrics}


__all__ = [
    "AdminView",
    "HttpServer",
    "health_routes",
    "metrics_routes",
    "parse_address",
    "relocate",
    "render_metrics",
]
