"""The admin HTTP endpoints of stunnerd: health checks, `/status`, Prometheus metrics.

A deliberately small HTTP/1.1 server on asyncio streams (GET only, one response per
connection): these endpoints are polled by kubelet and Prometheus, nothing else.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from stunner_api.dataplane import redacted

if TYPE_CHECKING:
    from .daemon import Stunner

log = logging.getLogger("stunner.admin")

Response = tuple[int, str, bytes]  # status, content type, body
Route = Callable[[], Response]
RoutesFor = Callable[[str], dict[str, Route]]  # the endpoint URL's path -> {path: handler}

REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
REQUEST_TIMEOUT = 5.0
_START_TIME = time.time()


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


class HttpServer:
    """Serves the routes `routes_for` gives for the endpoint's path; start/stop are idempotent."""

    def __init__(self, name: str, routes_for: RoutesFor) -> None:
        self.name = name
        self.routes_for = routes_for
        self.routes: dict[str, Route] = {}
        self.url = ""
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None and self._server.sockets
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self, url: str, default_port: int) -> None:
        endpoint = parse_endpoint(url, default_port)
        self.routes = self.routes_for(endpoint.path)
        self._server = await asyncio.start_server(
            self._serve, host=endpoint.host or None, port=endpoint.port, reuse_address=True
        )
        self.url = url
        log.info("%s server listening on %s", self.name, url)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self.url = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), REQUEST_TIMEOUT)
            while (await asyncio.wait_for(reader.readline(), REQUEST_TIMEOUT)) not in (
                b"\r\n",
                b"\n",
                b"",
            ):
                pass  # headers: nothing we need
            status, content_type, body = self._route(request_line.decode("latin-1"))
            reason = REASONS.get(status, "")
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()

    def _route(self, request_line: str) -> Response:
        parts = request_line.split()
        if len(parts) < 2:
            return 405, "text/plain", b"bad request\n"
        method, target = parts[0], urlsplit(parts[1]).path
        handler = self.routes.get(target)
        if handler is None:
            return 404, "text/plain", b"not found\n"
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"method not allowed\n"
        try:
            return handler()
        except Exception:  # a bug in a handler must not kill the server
            log.exception("%s server: error serving %s", self.name, target)
            return 503, "text/plain", b"internal error\n"


def _json(status: int, value: Any) -> Response:
    return status, "application/json", json.dumps(value).encode()


# --- health (ANCHORS §1.5) ----------------------------------------------------------------


def health_routes(stunner: Stunner) -> dict[str, Route]:
    def live() -> Response:
        return _json(200, {})

    def ready() -> Response:
        if stunner.ready:
            return _json(200, {"status": 200, "message": "READY"})
        return _json(503, {"status": 503, "message": "stunnerd not ready"})

    return {"/live": live, "/ready": ready, "/status": lambda: _json(200, status_of(stunner))}


def status_of(stunner: Stunner) -> dict[str, Any]:
    """Go STUNner's StunnerStatus, except that credentials and keys are redacted."""
    status: dict[str, Any] = {}
    if stunner.config is not None:
        status = redacted(stunner.config).to_dict()
        stats = stunner.listener_stats()
        for listener in status.get("listeners", []):
            s = stats.get(listener["name"])
            if s is not None:
                listener["stats"] = {
                    "rx": {"pkts": s.rx_packets, "bytes": s.rx_bytes},
                    "tx": {"pkts": s.tx_packets, "bytes": s.tx_bytes},
                }
    status["allocationCount"] = stunner.allocation_count
    status["status"] = stunner.status
    return status


# --- metrics (ANCHORS §1.6) ----------------------------------------------------------------


def metrics_routes(stunner: Stunner, path: str) -> dict[str, Route]:
    def metrics() -> Response:
        return 200, "text/plain; version=0.0.4; charset=utf-8", render_metrics(stunner).encode()

    return {path: metrics}


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_metrics(stunner: Stunner) -> str:
    """Prometheus text exposition with Go STUNner's metric names and labels."""
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{labels} {value:g}" for labels, value in samples)

    stats = sorted(stunner.listener_stats().items())
    active = stunner.listener_allocations()
    family(
        "stunner_allocations_active",
        "gauge",
        "Number of active allocations.",
        [("", stunner.allocation_count)],
    )
    family(
        "stunner_listener_connections",
        "gauge",
        "Number of active downstream connections.",
        [(f'{{name="{_label(n)}"}}', active.get(n, 0)) for n, _ in stats],
    )
    family(
        "stunner_listener_connections_total",
        "counter",
        "Number of downstream connections (allocations) since start.",
        [(f'{{name="{_label(n)}"}}', s.allocations_total) for n, s in stats],
    )
    for metric, attr, help_text in (
        ("stunner_listener_packets_total", "packets", "Number of packets on the listener."),
        ("stunner_listener_bytes_total", "bytes", "Number of bytes on the listener."),
    ):
        samples = []
        for name, listener_stats in stats:
            for direction in ("rx", "tx"):
                value = getattr(listener_stats, f"{direction}_{attr}")
                samples.append((f'{{direction="{direction}",name="{_label(name)}"}}', value))
        family(metric, "counter", help_text, samples)
    counters = sorted(stunner.cluster_counters().items())
    for metric, offset, help_text in (
        ("stunner_cluster_packets_total", 0, "Number of packets to and from the cluster."),
        ("stunner_cluster_bytes_total", 1, "Number of bytes to and from the cluster."),
    ):
        samples = []
        for name, values in counters:
            for direction, index in (("tx", offset), ("rx", offset + 2)):
                samples.append(
                    (f'{{direction="{direction}",name="{_label(name)}"}}', values[index])
                )
        family(metric, "counter", help_text, samples)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    worker_cpu, worker_rss = stunner.worker_usage()  # --udp-thread-num: the whole stunnerd
    family(
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time in seconds.",
        [("", usage.ru_utime + usage.ru_stime + worker_cpu)],
    )
    family(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        [("", rss_bytes() + worker_rss)],
    )
    family(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since the epoch.",
        [("", _START_TIME)],
    )
    return "\n".join(lines) + "\n"


def rss_bytes() -> int:
    try:
        with open(f"/proc/{os.getpid()}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
