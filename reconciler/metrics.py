"""The reconciler's Prometheus metrics, and its health endpoints (`/healthz`, `/readyz`).

Metrics (each process has its own registry, so several reconcilers in one test process do not
share counters):
- `stunner_reconciler_renders_total`, `stunner_reconciler_render_duration_seconds`;
- `stunner_reconciler_render_parts_total` (parts of the cluster, a Gateway with its routes,
  rendered again) and `stunner_reconciler_render_parts_kept_total` (kept from the last render);
- `stunner_reconciler_api_writes_total{verb,kind,result}` (result: "ok" or the HTTP status,
  "0" for no answer);
- `stunner_reconciler_watch_restarts_total{kind,reason}` (reason: "expired" for a 410 Gone
  relist, "error" for a failed list or watch);
- `stunner_reconciler_cds_clients` (open CDS watches), `stunner_reconciler_leader` (1 while this
  replica holds the Lease), `stunner_reconciler_cache_fresh`;
- per server (`server`: "cds"), its connection discipline (stunner_http):
  `stunner_reconciler_http_connections` (open), `stunner_reconciler_http_refused_total` (past
  a cap), `stunner_reconciler_http_evicted_total` (without a valid token, closed to make room
  for a new connection), `stunner_reconciler_http_accept_errors_total` (EMFILE and the like), and
  `stunner_reconciler_websocket_closed_total{reason}` (reason: "flooding", 1008, or
  "unmasked", 1002).

Both are served from their own thread (`ServedInThread`), never from the reconciler's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence

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
            prefix + "http_refused", "Connections closed at once: past a cap", labels=["server"]
        )
        evicted = CounterMetricFamily(
            prefix + "http_evicted",
            "Connections without a valid token closed to make room for a new one",
            labels=["server"],
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
            evicted.add_metric([name], stats.evicted)
            errors.add_metric([name], stats.accept_errors)
            if guard is not None:
                closed.add_metric([name, "flooding"], guard.flooding)
                closed.add_metric([name, "unmasked"], guard.unmasked)
        yield from (open_, refused, evicted, errors, closed)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.renders = Counter(
            "stunner_reconciler_renders",
            "Renders (each of the parts of the cluster that changed)",
            registry=self.registry,
        )
        self.render_duration = Histogram(
            "stunner_reconciler_render_duration_seconds",
            "Time one render took",
            registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.parts_rendered = Counter(
            "stunner_reconciler_render_parts",
            "Parts of the cluster (a Gateway with its routes) rendered again",
            registry=self.registry,
        )
        self.parts_kept = Counter(
            "stunner_reconciler_render_parts_kept",
            "Parts of the cluster kept as the last render left them (nothing they read changed)",
            registry=self.registry,
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


def health_app(
    ready: Callable[[], tuple[bool, str]],
    alive: Callable[[], tuple[bool, str]] | None = None,
) -> web.Application:
    """`/healthz`: 200 while the process serves (and `alive()`, when given, says so: served
    from its own thread, the probe asks whether the main loop still turns), else 503 with the
    reason; `/readyz`: 200 while `ready()` says so, else 503 with its reason."""

    async def healthz(request: web.Request) -> web.Response:
        if alive is not None:
            ok, why = alive()
            if not ok:
                return web.Response(status=503, text=why + "\n")
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        ok, why = ready()
        return web.Response(status=200 if ok else 503, text=why + "\n")

    app = web.Application()
    app[NAME_KEY] = "health"  # served with an admin endpoint's limits (stunner_http.server)
    app.router.add_get("/healthz", healthz, allow_head=False)
    app.router.add_get("/readyz", readyz, allow_head=False)
    return app


class ServedInThread:
    """aiohttp apps served from their own thread and event loop, so that what the reconciler's
    loop does (a render, a burst of watch events) never delays them: the kubelet's probes and
    Prometheus' scrapes are answered while the main loop is busy. Their handlers only read
    (`ready()` takes the cache's lock; the metrics' gauges read counters), so they need nothing
    of the main loop.

        with ServedInThread([(health_app(ready), ("127.0.0.1", 8081))]) as addresses: ...

    An address of None serves nothing (its slot in `addresses` is None); one that cannot be
    bound raises from `__enter__`, as serving on the main loop would."""

    def __init__(self, apps: Sequence[tuple[web.Application, tuple[str, int] | None]]) -> None:
        self.apps = list(apps)
        self.addresses: list[str | None] = []
        self.thread = threading.Thread(target=self._run, name="reconciler-probes", daemon=True)
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001  (handed to the starting thread)
            self._error = exc
        finally:
            self._started.set()

    async def _serve(self) -> None:
        from .cds.server import serve

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with contextlib.AsyncExitStack() as stack:
            for app, address in self.apps:
                if address is None:
                    self.addresses.append(None)
                    continue
                served = await stack.enter_async_context(serve(app, address[0], address[1]))
                self.addresses.append(served.address)
            self._started.set()
            await self._stop.wait()

    def __enter__(self) -> list[str | None]:
        self.thread.start()
        self._started.wait()
        if self._error is not None:
            self.thread.join()
            raise self._error
        return self.addresses

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None and self.thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(10.0)
