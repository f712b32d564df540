"""The reconciler's Prometheus metrics, and its health endpoints (`/healthz`, `/readyz`).

Metrics (each process has its own registry, so several reconcilers in one test process do not
share counters):
- `stunner_reconciler_renders_total`, `stunner_reconciler_render_duration_seconds`;
- `stunner_reconciler_api_writes_total{verb,kind,result}` (result: "ok" or the HTTP status,
  "0" for no answer);
- `stunner_reconciler_watch_restarts_total{kind,reason}` (reason: "expired" for a 410 Gone
  relist, "error" for a failed list or watch);
- `stunner_reconciler_cds_clients` (open CDS watches), `stunner_reconciler_leader` (1 while this
  replica holds the Lease), `stunner_reconciler_cache_fresh`;
- per server (`server`: "cds"), its connection discipline (stunner_http):
  `stunner_reconciler_http_connections` (open), `stunner_reconciler_http_refused_total` (past
  the cap), `stunner_reconciler_http_accept_errors_total` (EMFILE and the like), and
  `stunner_reconciler_websocket_closed_total{reason}` (reason: "flooding", 1008, or
  "unmasked", 1002).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from stunner_http.server import NAME_KEY, ConnectionStats
from stunner_http.websocket import WebSocketGuard


class _Servers(Collector):
    """The counters of our servers, read at scrape time."""

    def __init__(self) -> None:
        self.servers: dict[str, tuple[ConnectionStats, WebSocketGuard | None]] = {}

    def collect(self) -> Iterator[Metric]:
        prefix = "stunner_reconciler_"
        open_ = GaugeMetricFamily(
            prefix + "http_connections", "Open connections", labels=["server"]
        )
        refused = CounterMetricFamily(
            prefix + "http_refused", "Connections closed at once: past the cap", labels=["server"]
        )
        errors = CounterMetricFamily(
            prefix + "http_accept_errors", "Failed accepts (EMFILE...)", labels=["server"]
        )
        closed = CounterMetricFamily(
            prefix + "websocket_closed",
            "WebSocket clients closed by the guard",
            labels=["server", "reason"],
        )
        for name, (stats, guard) in sorted(self.servers.items()):
            open_.add_metric([name], stats.open)
            refused.add_metric([name], stats.refused)
            errors.add_metric([name], stats.accept_errors)
            if guard is not None:
                closed.add_metric([name, "flooding"], guard.flooding)
                closed.add_metric([name, "unmasked"], guard.unmasked)
        yield from (open_, refused, errors, closed)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.renders = Counter(
            "stunner_reconciler_renders", "Renders of the whole snapshot", registry=self.registry
        )
        self.render_duration = Histogram(
            "stunner_reconciler_render_duration_seconds",
            "Time one render took",
            registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.api_writes = Counter(
            "stunner_reconciler_api_writes",
            "Write requests sent to the Kubernetes API",
            ("verb", "kind", "result"),
            registry=self.registry,
        )
        self.watch_restarts = Counter(
            "stunner_reconciler_watch_restarts",
            "List/watch restarts per kind",
            ("kind", "reason"),
            registry=self.registry,
        )
        self.cds_clients = Gauge(
            "stunner_reconciler_cds_clients", "Open CDS watches", registry=self.registry
        )
        self.leader = Gauge(
            "stunner_reconciler_leader",
            "1 while this replica is the leader",
            registry=self.registry,
        )
        self.cache_fresh = Gauge(
            "stunner_reconciler_cache_fresh",
            "1 while the watch cache is fresh",
            registry=self.registry,
        )

        self._servers = _Servers()
        self.registry.register(self._servers)

    def track_server(
        self, name: str, stats: ConnectionStats, guard: WebSocketGuard | None = None
    ) -> None:
        """Export a server's connection counters (and its WebSocket guard's) as `server=name`."""
        self._servers.servers[name] = (stats, guard)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def metrics_app(metrics: Metrics) -> web.Application:
    async def handler(request: web.Request) -> web.Response:
        response = web.Response(body=metrics.exposition())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app = web.Application()
    app[NAME_KEY] = "metrics"  # served with an admin endpoint's limits (stunner_http.server)
    app.router.add_get("/metrics", handler, allow_head=False)
    return app


def health_app(ready: Callable[[], tuple[bool, str]]) -> web.Application:
    """`/healthz`: 200 while the process serves; `/readyz`: 200 while `ready()` says so, else
    503 with its reason."""

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        ok, why = ready()
        return web.Response(status=200 if ok else 503, text=why + "\n")

    app = web.Application()
    app[NAME_KEY] = "health"  # served with an admin endpoint's limits (stunner_http.server)
    app.router.add_get("/healthz", healthz, allow_head=False)
    app.router.add_get("/readyz", readyz, allow_head=False)
    return app
