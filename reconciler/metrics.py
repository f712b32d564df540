"""The reconciler's Prometheus metrics, and its health endpoints (`/healthz`, `/readyz`).

Metrics (each process has its own registry, so several reconcilers in one test process do not
share counters):
- `stunner_reconciler_renders_total`, `stunner_reconciler_render_duration_seconds`;
- `stunner_reconciler_api_writes_total{verb,kind,result}` (result: "ok" or the HTTP status,
  "0" for no answer);
- `stunner_reconciler_watch_restarts_total{kind,reason}` (reason: "expired" for a 410 Gone
  relist, "error" for a failed list or watch);
- `stunner_reconciler_cds_clients` (open CDS watches), `stunner_reconciler_leader` (1 while this
  replica holds the Lease), `stunner_reconciler_cache_fresh`.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from stunner_http.server import NAME_KEY


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
