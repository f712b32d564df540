"""The running dataplane: turns a validated StunnerConfig into listeners, auth and routes.

`Stunner.apply(config)` plans, then applies, and on failure puts the previous configuration
back: a config that cannot be applied (a port already in use, say) is refused whole.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

from stunner_api.dataplane import (
    DEFAULT_HEALTHCHECK_PORT,
    DEFAULT_METRICS_PORT,
    ListenerConfig,
    StunnerConfig,
    is_zero_config,
)
from stunner_api.restart import (  # the rule `helm stunner diff` predicts with
    every_listener_restarts,
    restart_needed,
)

from ..surface.admin import HttpServer, health_routes, metrics_routes, relocate
from ..surface.logs import LevelControl
from ..transport.listener import Listener
from ..turn.auth import NonceManager
from ..turn.counters import ClusterCounters, ListenerCounters, merge
from ..turn.ledger import LocalQuota, Reservations
from ..turn.limits import Limits
from ..turn.router import Router
from ..turn.server import ServerContext
from .core import ApplyError as ApplyError
from .core import DataplaneCore, Plan
from .relay_discovery import RelayDiscovery
from .sessions import SessionDesk, WatchLink
from .usage import UsageReporter
from .worker_pool import WorkerCounters, WorkerPool

log = logging.getLogger("stunner.stunnerd")

BUSY_RETRY_FIRST = 0.5  # seconds before a port found busy (a config's, an endpoint's) is tried
BUSY_RETRY_MAX = 5.0  # again, doubling up to this


class Stunner:
    def __init__(
        self,
        nonces: NonceManager | None = None,
        log_levels: LevelControl = LevelControl.HOSTED,
        force_ready: bool = False,
        workers: WorkerPool | None = None,
        udp_engines: int = 1,
        limits: Limits | None = None,
        health_address: str = "",
        metrics_address: str = "",
        relay_discovery: RelayDiscovery | None = None,
    ) -> None:
        self.config: StunnerConfig | None = None  # running: with the discovered relay address
        # STUNNER_RELAY_STUN_SERVER: the relay address of listeners at the pod's own address
        # asked of a STUN server (relay_discovery); `wanted` is the config as given.
        self.relay_discovery = relay_discovery
        self.wanted: StunnerConfig | None = None
        self._applying = asyncio.Lock()
        # --health-address/--metrics-address: where the endpoints listen when the config turns
        # them on (several stunnerds on one host: local mode).
        self.admin_addresses = (health_address, metrics_address)
        self.force_ready = force_ready  # --force-ready-status: stay ready while draining
        self._configured = False  # a real (non-zero) config has been applied
        # Fixed paths, as Go STUNner's; the metrics path comes from metrics_endpoint.
        self.health = HttpServer("health-check", lambda _path: health_routes(self))
        self.metrics = HttpServer("metrics", lambda path: metrics_routes(self, path))
        # An admin server whose port was busy, trying to bind again: name -> (url, the task).
        self._admin_retries: dict[str, tuple[str, asyncio.Task[None]]] = {}
        # --udp-thread-num: on the Python path, worker processes serve the other sockets of
        # each UDP listener; on the native path this process runs an engine per socket (issue
        # 30: one interpreter for the requests, one relay thread per CPU, as coturn runs)
        self.workers = workers
        self._udp_sockets = 1 + workers.size if workers is not None else max(1, udp_engines)
        self.limits = limits or (workers.limits if workers is not None else Limits())
        self.users = (
            workers.users if workers is not None else LocalQuota(self.limits.max_allocations)
        )
        self.reservations = workers.reservations if workers is not None else Reservations()
        # Cluster-wide user quotas: the CDS watch reports through it (stunnerd.process.usage).
        self.usage = UsageReporter(self.users)
        # Sessions (stunnerd.process.sessions): listed and ended on the CDS's say, same watch.
        self.sessions = SessionDesk(lambda: self.listeners)
        self.watch_link = WatchLink(self.usage, self.sessions)
        self.core = DataplaneCore(
            nonces or NonceManager(),
            self.users,
            self.reservations,
            log_levels,
            self.limits,
            workers.relay_ports if workers is not None else None,
        )

    @property
    def terminating(self) -> bool:
        """Draining after SIGTERM: not ready, and new allocations are refused with 508 in
        every process (the ledger answers them all), so the drain is not stretched."""
        return self.users.draining

    @terminating.setter
    def terminating(self, value: bool) -> None:
        self.users.draining = value

    @property
    def listeners(self) -> dict[str, Listener]:
        return self.core.listeners

    @property
    def router(self) -> Router:
        return self.core.router

    @property
    def context(self) -> ServerContext | None:
        return self.core.context

    @property
    def ready(self) -> bool:
        """Ready once a real config is running; not while terminating, unless forced."""
        return self._configured and (not self.terminating or self.force_ready)

    @property
    def status(self) -> str:
        if self.terminating:
            return "TERMINATING"
        return "READY" if self.ready else "NOT-READY"

    @property
    def user_quota_shared(self) -> bool | None:
        return self.usage.shared

    @property
    def allocation_count(self) -> int:
        return sum(self.listener_allocations().values())

    async def current_allocation_count(self) -> int:
        """allocation_count with the UDP workers' counts fetched now, not up to a second old."""
        if self.workers is not None:
            await self.workers.refresh()
        return self.allocation_count

    # --- counters, this process and the UDP workers together -----------------------------

    def _worker_reports(self) -> list[WorkerCounters]:
        return self.workers.reports() if self.workers is not None else []

    def listener_stats(self) -> dict[str, ListenerCounters]:
        totals: dict[str, ListenerCounters] = {}
        reports = self._worker_reports()
        for name, listener in self.listeners.items():
            totals[name] = stats = ListenerCounters()
            stats.add(listener.stats())
            for report in reports:
                entry = report.listeners.get(name)
                if entry is not None and entry[0] == listener.generation:
                    stats.add(entry[1])
        return totals

    def listener_offload(self) -> dict[str, dict[str, Any]]:
        """Per listener, the kernel offload's state in this process (each UDP worker applies
        the same config with the same privileges)."""
        return {name: listener.offload_state() for name, listener in self.listeners.items()}

    def listener_allocations(self) -> dict[str, int]:
        """Active allocations per listener."""
        counts = {name: len(lst.server.allocations) for name, lst in self.listeners.items()}
        for report in self._worker_reports():
            for name, (generation, _, active) in report.listeners.items():
                listener = self.listeners.get(name)
                if listener is not None and listener.generation == generation:
                    counts[name] += active
        return counts

    def cluster_counters(self) -> dict[str, ClusterCounters]:
        """cluster -> its traffic to and from its peers, in every process."""
        totals = self.core.cluster_counters()
        for report in self._worker_reports():
            merge(totals, report.clusters, ClusterCounters)
        return totals

    def worker_usage(self) -> tuple[float, int]:
        """CPU seconds and resident bytes of the UDP workers (the dead ones' CPU included)."""
        reports = self._worker_reports()
        return sum(r.cpu_seconds for r in reports), sum(r.rss_bytes for r in reports)

    async def apply(self, config: StunnerConfig) -> None:
        """Reconcile the running dataplane to `config`, or raise ApplyError and change nothing.
        With relay address discovery, the listeners at the pod's address get the discovered
        relay address, and an answer (the first, or a changed one) applies the config again
        (`_rediscovered`)."""
        async with self._applying:
            patched = config
            if self.relay_discovery is not None:
                patched = self.relay_discovery.patched(config)
            await self._apply(patched, {lc.name: lc.address for lc in config.listeners})
            self.wanted = config
        if self.relay_discovery is not None:
            self.relay_discovery.follow(config, self._rediscovered)

    async def _rediscovered(self) -> None:
        if self.wanted is None or self.terminating:  # draining: no new configuration
            return
        try:
            await self.apply(self.wanted)
        except ApplyError as exc:
            log.error("could not apply the discovered relay address: %s", exc)

    async def _apply(self, config: StunnerConfig, configured: Mapping[str, str]) -> None:
        """Run `config`, whose listeners bind their `configured` addresses (by name: the config
        as given, before relay address discovery's answer replaced the pod's)."""
        rebind = {
            n for n, lst in self.listeners.items() if lst.configured_address != configured.get(n)
        }
        if config == self.config and not rebind:
            return
        old = self.config
        realm_changed = every_listener_restarts(old.auth if old else None, config.auth)
        wanted = {lc.name: lc for lc in config.listeners}
        to_stop = [
            lst
            for name, lst in self.listeners.items()
            if name not in wanted
            or name in rebind
            or restart_needed(lst.config, wanted[name], realm_changed)
        ]
        stopped_names = {lst.name for lst in to_stop}
        to_start = [
            lc for name, lc in wanted.items() if name not in self.listeners or name in stopped_names
        ]
        workers = self.workers

        async def release(remaining: Iterable[Listener]) -> None:
            if workers is not None:
                await workers.sync(old, remaining)

        udp_sockets = self._udp_sockets
        builds = {
            lc.name: partial(_new_listener, lc, udp_sockets, configured.get(lc.name, lc.address))
            for lc in to_start
        }
        await self.core.apply(config, Plan(to_stop, builds, rollback=True, release=release))
        self.config = config
        self._configured = self._configured or not is_zero_config(config)
        self.usage.set_enabled(config.admin.user_quota > 0)
        if workers is not None:
            await workers.sync(config, self.listeners.values())
        await self._reconcile_admin_servers(config)
        self._guard_service_ports()
        log.info("applied config: %s", config)

    async def _reconcile_admin_servers(self, config: StunnerConfig) -> None:
        """Restart the health or metrics server only when its endpoint changed. A server that
        cannot start is logged, not fatal: the TURN service matters more (as in Go STUNner).
        One whose port is busy binds as soon as the port is free (tried every 0.5 s doubling to
        5 s): on the host network the stunnerd a rollout replaces may still hold it, and until
        then the kubelet's probe reaches that other process."""
        wanted = [
            (self.health, config.admin.healthcheck_endpoint, DEFAULT_HEALTHCHECK_PORT),
            (self.metrics, config.admin.metrics_endpoint, DEFAULT_METRICS_PORT),
        ]
        for (server, url, default_port), address in zip(wanted, self.admin_addresses, strict=True):
            if url and address:
                url = relocate(url, address)
            retrying_url, retrying = self._admin_retries.pop(server.name, ("", None))
            if retrying is not None and not retrying.done():
                if retrying_url == url:
                    self._admin_retries[server.name] = (url, retrying)
                    continue
                retrying.cancel()
                await asyncio.wait({retrying})
            if server.url == url:
                continue
            await server.stop()
            if not url:
                continue
            if not await self._start_admin_server(server, url, default_port):
                retry = self._retry_admin_server(server, url, default_port)
                self._admin_retries[server.name] = (url, asyncio.create_task(retry))

    def _guard_service_ports(self) -> None:
        """The router refuses TCP peers at the HTTP servers' ports on stunnerd's addresses."""
        ports = (self.health.bound_port, self.metrics.bound_port)
        self.router.service_ports = frozenset(port for port in ports if port is not None)

    async def _start_admin_server(
        self, server: HttpServer, url: str, default_port: int, retrying: bool = False
    ) -> bool:
        """Start `server` at `url`: False if its port is busy (worth trying again), True once
        started or refused for good (logged, a busy port only when not `retrying`)."""
        try:
            await server.start(url, default_port)
            if retrying:
                log.info("the %s server's port is free now", server.name)
            return True
        except OSError as exc:
            busy = exc.errno == errno.EADDRINUSE
            if not (retrying and busy):  # a busy port is said once
                hint = (
                    " (another process, maybe another stunnerd on this host, holds the port;"
                    " --health-address/--metrics-address move it); retrying while it is busy"
                    if busy
                    else ""
                )
                log.error(
                    "cannot start the %s server on %s: %s%s; the TURN service runs without it",
                    server.name,
                    url,
                    exc.strerror or exc,
                    hint,
                )
            return not busy  # only a busy port is worth trying again
        except ValueError as exc:
            log.error("cannot start the %s server on %s: %s", server.name, url, exc)
            return True

    async def _retry_admin_server(self, server: HttpServer, url: str, default_port: int) -> None:
        delay = BUSY_RETRY_FIRST
        while True:
            await asyncio.sleep(delay)
            if await self._start_admin_server(server, url, default_port, retrying=True):
                self._guard_service_ports()
                return
            delay = min(delay * 2, BUSY_RETRY_MAX)

    async def close(self) -> None:
        if self.relay_discovery is not None:
            self.relay_discovery.close()
        if self.workers is not None:
            await self.workers.close()
        await self.core.close()
        self.reservations.close()
        retries = [task for _url, task in self._admin_retries.values()]
        for task in retries:
            task.cancel()
        await asyncio.gather(*retries, return_exceptions=True)
        await self.health.stop()
        await self.metrics.stop()


def _new_listener(
    config: ListenerConfig, udp_sockets: int, configured_address: str, context: ServerContext
) -> Listener:
    return Listener(config, context, udp_sockets, configured_address=configured_address)
