"""The dataplane core: a config applied to one process's listeners, auth, routes and log levels.

The primary process (`daemon.Stunner`) and every UDP worker process (`worker_process`) apply
configs through `DataplaneCore.apply`, so a config field is taught here once. They differ only
in which listeners to stop and start and where a new listener's socket comes from, and in what
a listener that cannot start means: the primary refuses the whole config and puts the previous
one back (`Plan.rollback`); a worker, which runs what the primary already applied, logs it and
serves the rest.
"""

from __future__ import annotations

import errno
import logging
import mmap
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from stunner_api.dataplane import StunnerConfig

from ..offload.engine import KernelOffload
from ..surface import logs
from ..surface.logs import LevelControl
from ..transport.listener import Listener
from ..turn.auth import Authenticator, AuthError, NonceManager
from ..turn.counters import ClusterCounters, merge
from ..turn.ledger import Quota, Reservations
from ..turn.limits import Limits
from ..turn.router import DnsResolver, Router
from ..turn.server import ServerContext

log = logging.getLogger("stunner.stunnerd")

Build = Callable[[ServerContext], Listener]  # a new listener on the shared context, unstarted
Release = Callable[[Iterable[Listener]], Awaitable[None]]


class ApplyError(Exception):
    """The config was refused; the previous one keeps running. `retryable`: refused for a port
    or address the node does not have free yet (another process holds it: on the host network,
    the stunnerd a rollout replaces, draining), so the same config may apply later."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


# What a listener meets when its port is not free yet, or its address not yet the node's.
RETRYABLE_ERRNOS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL})


@dataclass(frozen=True)
class Plan:
    stop: Sequence[Listener]  # running listeners to stop
    start: Mapping[str, Build]  # listeners to start, by name
    rollback: bool  # True: all or nothing; False: a listener that cannot start is skipped
    # Called with the listeners that keep running before any is stopped, and again after a
    # rollback: the UDP workers let go of their copies of the stopped sockets first.
    release: Release | None = None


class DataplaneCore:
    """The listeners, auth, quota, routes and log levels of one process."""

    def __init__(
        self,
        nonces: NonceManager,
        users: Quota,
        reservations: Reservations,
        log_levels: LevelControl,
        limits: Limits | None = None,
        relay_ports: mmap.mmap | None = None,
        offload_log_level: int = logging.WARNING,
    ) -> None:
        self.limits = limits or Limits()
        self.router = Router(relay_ports)
        self.nonces = nonces
        self.users = users
        self.reservations = reservations
        # What admin.loglevel sets: -l/-v on the command line win over it (OVERRIDDEN); in
        # stunnerd's own process the whole `stunner` tree, hosted in another's its own scopes.
        self.log_levels = log_levels
        self.context: ServerContext | None = None  # from the first apply on
        # This process's kernel offload (each UDP worker has its own; it tells at DEBUG).
        self.offload = KernelOffload(offload_log_level)
        self.listeners: dict[str, Listener] = {}
        self._resolver = DnsResolver(self.router)

    async def apply(self, config: StunnerConfig, plan: Plan) -> None:
        """Run `config` with the plan's listeners, or raise ApplyError (with `plan.rollback`,
        nothing changed)."""
        try:
            authenticator = Authenticator(
                config.auth.type, config.auth.realm, config.auth.credentials
            )
        except AuthError as exc:
            raise ApplyError(f"auth: {exc}") from None
        try:
            logs.apply_level_spec(config.admin.loglevel, self.log_levels)
        except ValueError as exc:
            raise ApplyError(f"admin.loglevel: {exc}") from None
        context = self.context or ServerContext(
            authenticator,
            self.router,
            self.nonces,
            users=self.users,
            reservations=self.reservations,
            limits=self.limits,
            offload=self.offload,
        )
        previous = (context.authenticator, context.user_quota)
        context.authenticator = authenticator
        context.user_quota = config.admin.user_quota
        context.relay_address_family = config.admin.relay_address_family
        context.revoked_users = frozenset(config.auth.revoked_users)
        context.strict_expiry = config.auth.strict_expiry
        context.allocation_bandwidth_limit = config.auth.allocation_bandwidth_limit

        if plan.release is not None and plan.stop:
            await plan.release([lst for lst in self.listeners.values() if lst not in plan.stop])
        for listener in plan.stop:
            await listener.stop()
        started: list[Listener] = []
        for name, build in plan.start.items():
            try:
                listener = build(context)
                await listener.start()
            except (OSError, ValueError) as exc:
                if not plan.rollback:
                    log.error("listener %s: %s", name, exc)
                    continue
                for done in started:
                    await done.stop()
                context.authenticator, context.user_quota = previous
                await self._restart(plan.stop)
                if plan.release is not None:
                    await plan.release(self.listeners.values())
                retryable = isinstance(exc, OSError) and exc.errno in RETRYABLE_ERRNOS
                raise ApplyError(f"listener {name}: {exc}", retryable=retryable) from None
            started.append(listener)

        for listener in plan.stop:
            self.listeners.pop(listener.name, None)
        for listener in started:
            self.listeners[listener.name] = listener
        configs = {lc.name: lc for lc in config.listeners}
        for name, listener in self.listeners.items():
            listener.config = configs[name]  # routes, public address: in place
        own = [(lc.address, lc.port) for lc in config.listeners]
        own += [(lc.public_address, lc.public_port or lc.port) for lc in config.listeners]
        # Where the sockets bind when the relay address is not this host's (relay address
        # discovery behind NAT): the pod's own address is stunnerd's too.
        own += [(lst.server.bind_ip, lst.config.port) for lst in self.listeners.values()]
        # In place, before the routes: the router's update re-syncs every allocation's routes
        # in the kernel (native_udp), so a route that no longer admits a peer empties them.
        self.offload.configure(config.admin.offload_engine, list(config.admin.offload_interfaces))
        self.router.update({lc.name: lc.routes for lc in config.listeners}, config.clusters, own)
        self.context = context
        for listener in self.listeners.values():
            listener.server.enforce_auth()  # revoked, strict expiry, bandwidth (issue 29)
        self._resolver.follow()

    async def _restart(self, stopped: Iterable[Listener]) -> None:
        """Rollback: bring back the listeners stopped for an apply that failed."""
        for old in stopped:
            listener = old.replica()
            try:
                await listener.start()
            except (OSError, ValueError) as exc:
                log.error("rollback: cannot restart listener %s: %s", listener.name, exc)
                self.listeners.pop(listener.name, None)
                continue
            self.listeners[listener.name] = listener

    def cluster_counters(self) -> dict[str, ClusterCounters]:
        """cluster -> its traffic in this process: Python's count and the native engines'."""
        totals: dict[str, ClusterCounters] = {}
        if self.context is not None:
            merge(totals, self.context.cluster_counters, ClusterCounters)
        for listener in self.listeners.values():
            merge(totals, listener.cluster_counters(), ClusterCounters)
        return totals

    async def close(self) -> None:
        self._resolver.close()
        for listener in self.listeners.values():
            await listener.stop()
        self.listeners.clear()
        self.offload.close()
