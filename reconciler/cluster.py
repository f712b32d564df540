"""Cluster mode: the reconciler against a Kubernetes API server.

    watches (kube.informer, one per kind) -> store.Cache --relevant change--> loop.Reconciler
        (Snapshot -> render -> ConfigStore -> CDS, on every replica)
        -> apply.plan_writes(plan, cache) -> kube.writer (the leader only)

Every replica lists and watches, renders and serves CDS, so stunnerd keeps its connection and
its config through a leader change; only the holder of the Lease writes. The first render waits
until every watched kind has been listed once (a render of a half-filled cache would delete what
it has not seen yet).

The leader records Kubernetes Events about what its writes did (`reconciler.events`): a Gateway
becoming valid or invalid, its Deployment or Service created or deleted, a write refused again
and again. They follow writes, so a steady state records none.

A write the API server refuses is logged with the object and retried with back-off (per object:
`write_backoff_initial` doubling to `write_backoff_max`); it never holds up the other writes. A
conflict re-reads the object first (`kube.writer`). When the API server comes back after being
away, the informers relist, the changes found trigger one render, and its writes converge.

SIGTERM (`ClusterMode.shutdown`): the Lease is released and writing stops; the CDS keeps
serving until the process ends, so stunnerd sees no gap it does not have to.

Leader-only CDS (`cds_leader_only`, --cds-leader-only; the chart's with `reconciler.replicas`
above 1): only the leader serves configs and takes usage reports, so the cluster-wide user quotas
(reconciler.cds.usage) are counted in one place. A standby renders as every replica does, but
answers /readyz with 503 (so the CDS Service routes to the leader only) and every CDS request
with 503 and `Retry-After` (a stunnerd that reaches it anyway retries, through the Service);
a leader that stops leading (a lost renewal, SIGTERM) closes its watches (1001), whose stunnerds
reconnect through the Service to the new leader, keeping their running config meanwhile. A
leader that dies leaves the Lease to expire: the standby takes over within a lease duration plus
two retry periods (15 s + 2 x 2 s by default), at once on a release.

The render, apply and leader-election loops and the informers' watch threads are core tasks of
one `Supervisor` (`reconciler.supervise`): one that ends unexpectedly is logged, the Lease is
released (without `--enable-finalizer`'s deletions: the restarted process takes over where this
one stopped) and the command exits 1, for the kubelet to restart it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from stunner_api.cds import DEFAULT_PORT as DEFAULT_CDS_PORT
from stunner_api.vocabulary import (
    CDS_TOKEN_AUDIENCE,
    ENDPOINT_SLICE,
    POD,
    SYSTEM_NAMESPACE,
    WRITTEN_KINDS,
)

from . import events
from .apply import Write, owned_by
from .cds.access import MAX_TTL, Access, Account, AuthMode, ReviewUnavailable, TokenVerifier
from .cds.quota import dataplane_pod
from .cds.server import HANDLERS_KEY, CdsHandlers, cds_app, serve
from .cds.store import ConfigStore
from .health import Health
from .kube.api import Api, ConfigUnavailable, describe, load_client, refusal
from .kube.informer import BACKOFF_INITIAL, BACKOFF_MAX, NOT_SERVED_RETRY, WATCH_TIMEOUT, Informer
from .kube.lease import (
    LEADER_ELECTION_ID,
    LEASE_DURATION,
    RENEW_DEADLINE,
    RETRY_PERIOD,
    LeaseElector,
    default_identity,
)
from .kube.writer import Writer
from .loop import THROTTLE, Reconciler
from .metrics import Metrics, ServedInThread, health_app, metrics_app
from .relevance import References
from .render import Plan, Renderer, RenderSettings
from .render.finalize import finalized
from .render.inputs import account_name
from .render.tracked import same_kinds
from .store import STALE_AFTER, WATCHED, Cache, Kind, Object, Snapshot
from .supervise import Supervisor
from .write_backoff import WriteBackoff
from .write_queue import WriteQueue

log = logging.getLogger("stunner.reconciler")

# What `References.of` reads: while none of these changed, the references stay.
REFERENCING_KINDS = (
    Kind.GATEWAY_CLASS,
    Kind.GATEWAY,
    Kind.GATEWAY_CONFIG,
    Kind.STUNNER_UDP_ROUTE,
    Kind.GATEWAY_API_UDP_ROUTE,
    Kind.GATEWAY_API_TCP_ROUTE,
)
WRITE_BACKOFF_INITIAL = 0.5
WRITE_BACKOFF_MAX = 60.0
FINALIZE_TIMEOUT = 2.0  # seconds --enable-finalizer's writes may take on shutdown (as Go)
DEFAULT_METRICS_PORT = 8080  # Go's --metrics-bind-address
DEFAULT_HEALTH_PORT = 8081  # Go's --health-probe-bind-address
# The cached objects, and the parts of the plan the Renderer keeps (~200 objects a Gateway),
# are long-lived and acyclic: kept out of the cyclic garbage collector's scans (gc.freeze),
# whose full collections otherwise cost more than the render itself with 1,000 Gateways cached
# and paused everything for 300 ms at a time after the first pass (bench/reconciler_bench.py).
# Every GC_REFREEZE seconds they are unfrozen, collected once and frozen again, so cyclic
# garbage cannot pile up among them; in between, every render freezes what it made and what
# was cached since (gc.freeze costs the same however many objects it moves; what refcounting
# frees is freed frozen or not).
GC_REFREEZE = 600.0
LOOP_STALL = 30.0  # seconds without a turn of the event loop after which /healthz fails
# Written and never read by render (our Deployments, DaemonSets, ServiceAccounts): a change of
# one is diffed against the last plan, with no render.
WRITTEN_ONLY = frozenset(k.kind for k in WRITTEN_KINDS if not k.rendered)


class ClusterUnavailable(Exception):
    """No Kubernetes API configured (not in a pod, no KUBECONFIG, no ~/.kube/config)."""


@dataclass(frozen=True)
class ClusterSettings:
    kubeconfig: str | None = None  # None: in-cluster, KUBECONFIG or ~/.kube/config
    host: str = "0.0.0.0"
    cds_port: int = DEFAULT_CDS_PORT
    # (host, port) of the metrics and health endpoints; None: not served.
    metrics_address: tuple[str, int] | None = ("0.0.0.0", DEFAULT_METRICS_PORT)
    health_address: tuple[str, int] | None = ("0.0.0.0", DEFAULT_HEALTH_PORT)
    throttle: float = THROTTLE
    render_settings: RenderSettings = field(default_factory=RenderSettings)
    leader_elect: bool = False
    lease_namespace: str = SYSTEM_NAMESPACE
    lease_name: str = LEADER_ELECTION_ID
    # The Deployment (in lease_namespace) that owns the Lease: deleted with it (empty: none).
    lease_owner: str = ""
    identity: str | None = None
    lease_duration: float = LEASE_DURATION
    renew_deadline: float = RENEW_DEADLINE
    retry_period: float = RETRY_PERIOD
    watch_timeout: int = WATCH_TIMEOUT
    watch_backoff_initial: float = BACKOFF_INITIAL
    watch_backoff_max: float = BACKOFF_MAX
    stale_after: float = STALE_AFTER
    not_served_retry: float = NOT_SERVED_RETRY
    write_backoff_initial: float = WRITE_BACKOFF_INITIAL
    write_backoff_max: float = WRITE_BACKOFF_MAX
    gc_refreeze: float = GC_REFREEZE
    # /healthz fails once the event loop has not turned for this long (a wedged loop: the
    # probes are served from their own thread and would answer regardless).
    loop_stall: float = LOOP_STALL
    # --enable-finalizer: on shutdown, invalidate our statuses and delete our Deployments and
    # Services (render.finalize), within FINALIZE_TIMEOUT, before the Lease is released.
    enable_finalizer: bool = False
    # False (--disable-endpointslice-controller): EndpointSlices are not watched at all.
    watch_endpoint_slices: bool = True
    # --cds-auth: "required", every CDS request shows a ServiceAccount token (cds.access);
    # "off", anyone who reaches the port reads every config (Go's behaviour).
    cds_auth: AuthMode = AuthMode.REQUIRED
    cds_readers: frozenset[Account] = frozenset()  # --cds-readers: may read every config
    # Seconds a token's authentication is trusted, and between two checks of a watching one.
    cds_token_ttl: float = MAX_TTL
    # --cds-leader-only (the chart's with more than one replica): only the leader serves the
    # CDS and is ready; a standby answers 503 with Retry-After (see the module's docstring).
    cds_leader_only: bool = False


class ClusterMode:
    """The running cluster mode (see the module's docstring)."""

    def __init__(self, settings: ClusterSettings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.store = ConfigStore()
        watched = [w for w in WATCHED if settings.watch_endpoint_slices or w.info != ENDPOINT_SLICE]
        self.cache = Cache(watched, stale_after=settings.stale_after)
        try:
            self.api = Api(load_client(settings.kubeconfig))
        except ConfigUnavailable as exc:
            raise ClusterUnavailable(str(exc)) from exc
        self.supervisor = Supervisor()
        self.writer = Writer(self.api, self.cache)
        self.reconciler = Reconciler(
            self._render, self.store, throttle=settings.throttle, in_thread=True
        )
        self.reconciler.published = self._published
        self.renderer = Renderer(settings.render_settings)
        self.references = References(settings.render_settings.controller_name)
        self._referenced: Snapshot | None = None  # the snapshot `references` is of
        self.ours: frozenset[str] = frozenset()
        self.elector: LeaseElector | None = None
        if settings.leader_elect:
            self.elector = LeaseElector(
                self.api,
                settings.lease_namespace,
                settings.lease_name,
                settings.identity,
                lease_duration=settings.lease_duration,
                renew_deadline=settings.renew_deadline,
                retry_period=settings.retry_period,
                owner=settings.lease_owner,
            )
        controller = settings.render_settings.controller_name
        instance = self.elector.identity if self.elector is not None else default_identity()
        self.recorder = events.Recorder(
            self.api,
            controller,
            instance,
            refusal,
            on_write=lambda result: self.metrics.api_writes.labels("create", "Event", result).inc(),
        )
        self.informers = [
            Informer(
                self.api,
                self.cache,
                watched,
                watch_timeout=settings.watch_timeout,
                backoff_initial=settings.watch_backoff_initial,
                backoff_max=settings.watch_backoff_max,
                on_restart=self._watch_restarted,
                not_served_retry=settings.not_served_retry,
                on_exit=self.supervisor.thread_ended,
            )
            for watched in self.cache.watched
        ]
        self.writing = True  # false from shutdown on
        self.cds_handlers: CdsHandlers | None = None  # run_cluster's, once the CDS serves
        self.rendered_once = False
        self.writes = WriteQueue(
            self.writer,
            self.cache,
            self.metrics,
            self.recorder,
            WriteBackoff(settings.write_backoff_initial, settings.write_backoff_max),
            leading=lambda: self.leading,
            ours=lambda: self.ours,
        )
        self.health = Health(
            self.cache.freshness,
            lambda: self.rendered_once,
            self.standing_by,
            loop_stall=settings.loop_stall,
        )
        self._frozen_at: int | None = None  # cache.changes at the last gc.freeze()
        self._loop = asyncio.get_running_loop()
        self.access: Access | None = None
        if settings.cds_auth == AuthMode.REQUIRED:
            self.access = Access(
                TokenVerifier(self._review_token, max_ttl=settings.cds_token_ttl),
                readers=settings.cds_readers,
                account_of=self._account_of,
                registry=self.metrics.registry,
            )
        self.metrics.cds_clients.set_function(lambda: len(self.store.watchers))
        self.metrics.leader.set_function(lambda: 1 if self.leading else 0)
        self.metrics.cache_fresh.set_function(lambda: 1 if self.cache.freshness()[0] else 0)

    # --- state ---------------------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        """Whether this replica may write now."""
        if not self.writing:
            return False
        return self.elector.leading if self.elector is not None else True

    @property
    def idle(self) -> bool:
        """Nothing under way or due now: no render wanted or running, no pass of writes wanted
        or running. (A refused write waiting for its retry is not under way: it may be refused
        for good. A replica that does not lead is idle once it rendered: it writes nothing.)"""
        return self.reconciler.idle and self.writes.idle

    def ready(self) -> tuple[bool, str]:
        """/readyz's answer (`health`)."""
        return self.health.ready()

    @property
    def writes_sent(self) -> int:
        return self.writes.writes_sent

    @property
    def last_writes(self) -> list[Write]:
        """The last pass's writes (those not backing off)."""
        return self.writes.last_writes

    def standing_by(self) -> str | None:
        """Why this replica serves no CDS now (`cds_leader_only` and not the leader); None
        while it serves."""
        if not self.settings.cds_leader_only or self.leading:
            return None
        return "standing by: the CDS is served by the leader only (--cds-leader-only)"

    # --- who reads the configs (cds.access) ---------------------------------------------------

    def _review_token(self, token: str) -> dict[str, Any]:
        """In a thread: the TokenReview of a CDS caller's token."""
        try:
            return self.api.review_token(token, (CDS_TOKEN_AUDIENCE,))
        except Exception as exc:
            raise ReviewUnavailable(describe(exc)) from None

    def _account_of(self, id: str) -> str | None:
        """The ServiceAccount whose pods may read config `id` (the last render's, and for a
        config not rendered the one it would render); None when the rendered account's name is
        held by an account that is not the Gateway's (never taken over: no pod reads it)."""
        plan = self.reconciler.last_plan
        plan = plan if isinstance(plan, Plan) else Plan({}, {}, {}, (), ())
        namespace, _, name = id.partition("/")
        account = plan.dataplane_accounts.get(id) or account_name(name)
        want = plan.service_accounts.get(id)
        if want is None:
            return account  # the Dataplane's own choice, or a config not rendered
        have = self.cache.get("v1", "ServiceAccount", namespace, account)
        return account if have is not None and owned_by(have, want, id) else None

    # --- watching and rendering ----------------------------------------------------------------

    def _watch_restarted(self, kind: str, reason: str) -> None:
        self.metrics.watch_restarts.labels(kind, reason).inc()

    def _on_change(self, new: Object | None, old: Object | None) -> None:
        """From a watch thread: consider the change on the loop."""
        obj = new if new is not None else old
        if obj is not None and obj.get("kind") == POD.kind:
            self._loop.call_soon_threadsafe(self._pod_changed, new, old)
            return
        self._loop.call_soon_threadsafe(self._consider, new, old)

    def _pod_changed(self, new: Object | None, old: Object | None) -> None:
        """A Gateway's dataplane pod seen or gone: who may report usage (cds.usage)."""
        was = dataplane_pod(old) if old is not None else None
        now = dataplane_pod(new) if new is not None else None
        if was is not None and was != now:
            self.store.usage.pod_gone(*was)
        if now is not None:
            self.store.usage.pod_seen(*now)

    def _consider(self, new: Object | None, old: Object | None) -> None:
        if not self.rendered_once or not self.references.wants(new, old):
            return
        if _is_written_only(new if new is not None else old):
            # Render reads no Deployment, DaemonSet or ServiceAccount: one of ours edited or
            # deleted (or our own write's echo) only needs the diff against the last plan, which
            # writes it back.
            self.writes.want()
            return
        self.reconciler.trigger()

    def _render(self, objects: Sequence[Object]) -> Plan:
        """The loop's render step, in a worker thread; it reads the cache as it is now
        (level-based) and renders again only the parts of the cluster that changed since the
        last render (`render.Renderer`)."""
        started = time.perf_counter()
        objects = self.cache.rendered_objects()
        self.reconciler.objects = objects  # what the loop's log counts
        snapshot = Snapshot.from_objects(objects)
        plan = self.renderer.render(snapshot, datetime.now(UTC))
        before = self._referenced
        if before is None or not same_kinds(before, snapshot, REFERENCING_KINDS):
            controller = self.settings.render_settings.controller_name
            self.references = References.of(snapshot, controller)
            self.ours = frozenset(f"{ns}/{name}" for ns, name in self.references.gateways)
            self._referenced = snapshot
        self.metrics.renders.inc()
        self.metrics.render_duration.observe(time.perf_counter() - started)
        self.metrics.parts_rendered.inc(self.renderer.rendered_parts)
        self.metrics.parts_kept.inc(self.renderer.kept_parts)
        log.debug(
            "rendered %d parts again, kept %d, in %.3f s",
            self.renderer.rendered_parts,
            self.renderer.kept_parts,
            time.perf_counter() - started,
        )
        if self._frozen_at is not None:
            gc.freeze()  # what this render made and what was cached since join the frozen
            self._frozen_at = self.cache.changes
        return plan

    def _published(self, plan: object) -> None:
        """On the loop, after a render's configs went out: the writes may follow."""
        self.rendered_once = True
        self.writes.want()

    async def _first_render(self) -> None:
        while not self.cache.synced:
            await asyncio.sleep(0.02)
        log.info("every watched kind listed: first render")
        self.reconciler.trigger()

    async def _freeze_cache(self) -> None:
        """Keep the long-lived objects out of the garbage collector's scans (GC_REFREEZE)."""
        while not self.rendered_once:
            await asyncio.sleep(0.05)
        # The first freeze collects nothing: a full collection of everything cached is a pause
        # of a few hundred milliseconds with 1,000 Gateways, which would land in the first pass
        # (and in the probes answered meanwhile); what cyclic garbage the start-up left is
        # collected GC_REFREEZE later.
        gc.freeze()
        self._frozen_at = self.cache.changes
        while True:
            await asyncio.sleep(self.settings.gc_refreeze)
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self._frozen_at = self.cache.changes

    # --- leadership ----------------------------------------------------------------------------

    async def _follow_leadership(self) -> None:
        assert self.elector is not None
        while True:
            await self.elector.changed.wait()
            self.elector.changed.clear()
            if self.elector.leading:
                self.writes.want()
            elif self.settings.cds_leader_only:
                await self._hand_over_watches()

    async def _hand_over_watches(self) -> None:
        """No longer the leader in leader-only mode: close every CDS watch, so that stunnerd
        reconnects through the Service to the replica that leads (or will)."""
        if self.cds_handlers is None or not self.cds_handlers.sockets:
            return
        log.info(
            "not the leader any more: closing %d CDS watches, for them to reconnect to the leader",
            len(self.cds_handlers.sockets),
        )
        await self.cds_handlers.close_all()

    # --- lifecycle -----------------------------------------------------------------------------

    def start_watching(self) -> None:
        self.cache.on_change = self._on_change
        for informer in self.informers:
            informer.start()

    async def shutdown(self) -> None:
        """Stop writing and release the Lease (SIGTERM); watches and CDS go on meanwhile. With
        `enable_finalizer` the leader first leaves the finalized plan behind, unless a core task
        ended (the process is to be restarted, not uninstalled)."""
        finalize = (
            self.settings.enable_finalizer and self.leading and not self.supervisor.failed.is_set()
        )
        self.supervisor.wind_down()  # the elector's loop and the watches end from here on
        self.writing = False
        plan = self.reconciler.last_plan
        if finalize and isinstance(plan, Plan):
            controller = self.settings.render_settings.controller_name
            final = finalized(plan, controller, datetime.now(UTC))
            sent = await self.writes.send_final(final, time.monotonic() + FINALIZE_TIMEOUT)
            log.info("finalized: %d of our objects deleted or invalidated", sent)
        if self.elector is not None:
            await self.elector.stop(release=True)
        if self.settings.cds_leader_only:
            # after the release, so that the watches reconnect to a replica that may lead now
            await self._hand_over_watches()

    def stop_watching(self) -> None:
        for informer in self.informers:
            informer.stop()


@dataclass
class Running:
    """What a caller (the command, a test) may look at."""

    mode: ClusterMode
    cds_address: str
    health_address: str | None
    metrics_address: str | None

    async def rendered(self, renders: int) -> None:
        reconciler = self.mode.reconciler
        async with reconciler.rendered:
            await reconciler.rendered.wait_for(lambda: reconciler.renders >= renders)


@contextlib.asynccontextmanager
async def run_cluster(settings: ClusterSettings) -> AsyncIterator[Running]:
    """Watch, render, serve CDS and (as the leader) write, until the block ends."""
    mode = ClusterMode(settings)
    # Health, readiness and metrics answer from their own thread, whatever the loop is doing.
    probes = ServedInThread(
        [
            (health_app(mode.health.ready, mode.health.alive), settings.health_address),
            (metrics_app(mode.metrics), settings.metrics_address),
        ]
    )
    health, metrics = await asyncio.to_thread(probes.__enter__)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(asyncio.to_thread, probes.__exit__, None, None, None)
        cds_application = cds_app(
            mode.store,
            access=mode.access.middleware if mode.access else None,
            standby=mode.standing_by,
            retry_after=settings.retry_period,
        )
        mode.cds_handlers = cds_application[HANDLERS_KEY]
        cds = await stack.enter_async_context(
            serve(cds_application, settings.host, settings.cds_port)
        )
        log.info("cluster mode: config discovery service on %s", cds.address)
        mode.metrics.track_server("cds", cds.stats, cds_application[HANDLERS_KEY].guard)
        mode.start_watching()
        supervisor = mode.supervisor
        supervisor.spawn("render loop", mode.reconciler.run())
        supervisor.spawn("first render", mode._first_render(), oneshot=True)
        supervisor.spawn("apply loop", mode.writes.run(lambda: mode.reconciler.last_plan))
        supervisor.spawn("cache freezer", mode._freeze_cache())
        supervisor.spawn("heartbeat", mode.health.beat())
        if mode.elector is not None:
            supervisor.spawn("leader election", mode.elector.run())
            supervisor.spawn("leadership follower", mode._follow_leadership())
        try:
            yield Running(mode, cds.address, health, metrics)
        finally:
            await supervisor.stop()
            mode.writing = False
            mode.stop_watching()
            await asyncio.to_thread(_join_all, mode.informers)
            mode.api.close()
            gc.unfreeze()


def _is_written_only(obj: Object | None) -> bool:
    return obj is not None and obj.get("kind") in WRITTEN_ONLY


def _join_all(informers: Sequence[Informer]) -> None:
    for informer in informers:
        informer.join(2.0)
