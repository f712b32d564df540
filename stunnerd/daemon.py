"""The running dataplane: turns a validated StunnerConfig into listeners, auth and routes.

`Stunner.apply(config)` plans, then applies, and on failure puts the previous configuration
back: a config that cannot be applied (a port already in use, say) is refused whole.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from stunner_api.dataplane import (
    DEFAULT_HEALTHCHECK_PORT,
    DEFAULT_METRICS_PORT,
    ListenerConfig,
    StunnerConfig,
    is_zero_config,
)

from . import logs
from .admin import HttpServer, health_routes, metrics_routes
from .auth import Authenticator, AuthError, NonceManager
from .counters import ClusterCounters, ListenerCounters, merge
from .ledger import Reservations, UserAllocations
from .listener import Listener
from .router import DnsResolver, Router
from .turn import ServerContext
from .workers import WorkerCounters, WorkerPool

log = logging.getLogger("stunner.stunnerd")


class ApplyError(Exception):
    """The config was refused; the previous one keeps running."""


def restart_needed(old: ListenerConfig, new: ListenerConfig, realm_changed: bool) -> bool:
    """Only identity fields restart a listener; routes and public address change in place."""
    identity = ("protocol", "address", "port", "cert", "key")
    return realm_changed or any(getattr(old, f) != getattr(new, f) for f in identity)


class Stunner:
    def __init__(
        self,
        nonces: NonceManager | None = None,
        log_override: str | None = None,
        force_ready: bool = False,
        workers: WorkerPool | None = None,
    ) -> None:
        self.config: StunnerConfig | None = None
        self.force_ready = force_ready  # --force-ready-status: stay ready while draining
        self.terminating = False
        self._configured = False  # a real (non-zero) config has been applied
        # Fixed paths, as Go STUNner's; the metrics path comes from metrics_endpoint.
        self.health = HttpServer("health-check", lambda _path: health_routes(self))
        self.metrics = HttpServer("metrics", lambda path: metrics_routes(self, path))
        self.listeners: dict[str, Listener] = {}
        self.router = Router()
        self.nonces = nonces or NonceManager()
        self.users = workers.users if workers is not None else UserAllocations()
        self.reservations = workers.reservations if workers is not None else Reservations()
        self.context: ServerContext | None = None
        self.workers = workers  # --udp-thread-num: they serve the other sockets of UDP listeners
        self._udp_sockets = 1 + (workers.size if workers is not None else 0)
        self.log_override = log_override  # -l/-v on the command line win over admin.loglevel
        self._resolver = DnsResolver(self.router)

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
            stats.add(listener.server.stats)
            for report in reports:
                entry = report.listeners.get(name)
                if entry is not None and entry[0] == listener.generation:
                    stats.add(entry[1])
        return totals

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
        totals: dict[str, ClusterCounters] = {}
        if self.context is not None:
            merge(totals, self.context.cluster_counters, ClusterCounters)
        for report in self._worker_reports():
            merge(totals, report.clusters, ClusterCounters)
        return totals

    def worker_usage(self) -> tuple[float, int]:
        """CPU seconds and resident bytes of the UDP workers (the dead ones' CPU included)."""
        reports = self._worker_reports()
        return sum(r.cpu_seconds for r in reports), sum(r.rss_bytes for r in reports)

    async def apply(self, config: StunnerConfig) -> None:
        """Reconcile the running dataplane to `config`, or raise ApplyError and change nothing."""
        if config == self.config:
            return
        old = self.config
        try:
            authenticator = Authenticator(
                config.auth.type, config.auth.realm, config.auth.credentials
            )
        except AuthError as exc:
            raise ApplyError(f"auth: {exc}") from None
        if self.log_override is None:
            try:
                logs.apply_level_spec(config.admin.loglevel)
            except ValueError as exc:
                raise ApplyError(f"admin.loglevel: {exc}") from None

        realm_changed = old is not None and old.auth.realm != config.auth.realm
        wanted = {lc.name: lc for lc in config.listeners}
        to_stop = [
            lst
            for name, lst in self.listeners.items()
            if name not in wanted or restart_needed(lst.config, wanted[name], realm_changed)
        ]
        stopped_names = {lst.name for lst in to_stop}
        to_start = [
            lc for name, lc in wanted.items() if name not in self.listeners or name in stopped_names
        ]

        context = self.context or ServerContext(
            authenticator,
            self.router,
            self.nonces,
            users=self.users,
            reservations=self.reservations,
        )
        previous = (context.authenticator, context.user_quota)
        context.authenticator = authenticator
        context.user_quota = config.admin.user_quota

        if self.workers is not None and to_stop:
            # The workers let go of their copies first, so that the ports are really free.
            remaining = [lst for lst in self.listeners.values() if lst not in to_stop]
            await self.workers.sync(old, remaining)
        await self._stop(to_stop)
        started: list[Listener] = []
        try:
            for listener_config in to_start:
                listener = Listener(listener_config, context, self._udp_sockets)
                await listener.start()
                started.append(listener)
        except (OSError, ValueError) as exc:
            await self._stop(started)
            context.authenticator, context.user_quota = previous
            await self._restart(context, (lst.config for lst in to_stop))
            if self.workers is not None:
                await self.workers.sync(old, self.listeners.values())
            raise ApplyError(f"listener {listener_config.name}: {exc}") from None

        for listener in to_stop:
            self.listeners.pop(listener.name, None)
        for listener in started:
            self.listeners[listener.name] = listener
        for name, listener in self.listeners.items():
            listener.config = wanted[name]  # routes, public address: in place
        self.router.update({lc.name: lc.routes for lc in config.listeners}, config.clusters)
        self.context = context
        self.config = config
        self._configured = self._configured or not is_zero_config(config)
        self._resolver.follow()
        if self.workers is not None:
            await self.workers.sync(config, self.listeners.values())
        await self._reconcile_admin_servers(config)
        log.info("applied config: %s", config)

    async def _reconcile_admin_servers(self, config: StunnerConfig) -> None:
        """Restart the health or metrics server only when its endpoint changed. A server that
        cannot start is logged, not fatal: the TURN service matters more (as in Go STUNner)."""
        wanted = [
            (self.health, config.admin.healthcheck_endpoint, DEFAULT_HEALTHCHECK_PORT),
            (self.metrics, config.admin.metrics_endpoint, DEFAULT_METRICS_PORT),
        ]
        for server, url, default_port in wanted:
            if server.url == url:
                continue
            await server.stop()
            if not url:
                continue
            try:
                await server.start(url, default_port)
            except (OSError, ValueError) as exc:
                log.error("cannot start the %s server on %s: %s", server.name, url, exc)

    async def _stop(self, listeners: Iterable[Listener]) -> None:
        for listener in listeners:
            await listener.stop()

    async def _restart(self, context: ServerContext, configs: Iterable[ListenerConfig]) -> None:
        """Rollback: bring back the listeners stopped for an apply that failed."""
        for listener_config in configs:
            listener = Listener(listener_config, context, self._udp_sockets)
            try:
                await listener.start()
            except (OSError, ValueError) as exc:
                log.error("rollback: cannot restart listener %s: %s", listener.name, exc)
                self.listeners.pop(listener.name, None)
                continue
            self.listeners[listener.name] = listener

    async def close(self) -> None:
        self._resolver.close()
        if self.workers is not None:
            await self.workers.close()
        await self._stop(self.listeners.values())
        self.listeners.clear()
        self.reservations.close()
        await self.health.stop()
        await self.metrics.stop()
