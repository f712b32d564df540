"""render(snapshot, settings, now) -> Plan: the render stages run in order, no I/O.

The stages (context.py) are pure functions, one per output: for every GatewayClass whose
controllerName is ours, the classes stage judges its GatewayConfig and Dataplane and resolves
its credentials (any error invalidates the class and every Gateway of it). Then each Gateway of
the class is planned by the listeners stage (a problem of one listener keeps only that listener
out, any other error keeps the Gateway out); routes attach to the rendered listeners that
allow them (the routes stage; each attached route becomes one cluster); and each rendered
Gateway gets its public addresses, its dataplane config, its Service, ServiceAccount and
Deployment, and last its status. This module only runs them and puts their results in order.

The Gateways and routes render in parts (parts.py: a Gateway with the routes naming it, joined
through shared routes), each on a snapshot that records what it read (`tracked.Tracked`), and
their findings and statuses are put in the order one pass over the sorted snapshot makes. A
`Renderer` keeps each part's result and, on the next snapshot, renders again only the parts
whose members, reads or class changed: cluster mode renders with one; `render()` is a fresh
one, so both take the same path.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from stunner_api.dataplane import StunnerConfig

from ..store import Kind, Object, Snapshot, name_of, namespace_of
from . import addresses, classes, config, deployment, gateways, listeners, manifests, nodes, routes
from .account import service_account_of
from .clusters import Cluster
from .context import (
    Attachments,
    ClassContext,
    Context,
    GatewayKey,
    GatewayPlan,
    Staged,
    id_of,
    spec_of,
)
from .inputs import dataplane_account
from .parts import PART_KINDS, Part, parts
from .plan import Finding, Plan, RenderSettings, StatusUpdate
from .tracked import ReadKey, Tracked, hold, same, same_kinds

T = TypeVar("T")
SortKey = tuple[Any, ...]


def _status_key(update: StatusUpdate) -> SortKey:
    """Statuses are keyed (0, class) GatewayClasses, (1, ns, name) Gateways, (2, route order,
    ns, name) routes."""
    if update.kind == "GatewayClass":
        key: SortKey = (0, update.name)
    elif update.kind == "Gateway":
        key = (1, update.namespace, update.name)
    else:
        order = routes.route_order(update.api_version, update.kind)
        key = (2, order, update.namespace, update.name)
    return key


@dataclass
class _Run:
    """What the stages gave so far. Findings are keyed (0) the snapshot's, (1, class) a
    GatewayClass's, (2, ns, name) a Gateway's judged, (3, route order, ns, name) a route's,
    (4, ns, name) a Gateway's rendered; statuses by `_status_key`: the order one pass over the
    sorted snapshot makes them in, whatever part rendered them."""

    findings: list[tuple[SortKey, Finding]] = field(default_factory=list)
    statuses: list[tuple[SortKey, StatusUpdate]] = field(default_factory=list)
    configs: dict[str, StunnerConfig] = field(default_factory=dict)
    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)
    services: dict[str, dict[str, Any]] = field(default_factory=dict)
    service_accounts: dict[str, dict[str, Any]] = field(default_factory=dict)
    dataplane_accounts: dict[str, str] = field(default_factory=dict)

    def take(self, key: SortKey, staged: Staged[T]) -> T:
        """A stage's findings (keyed `key`) and statuses; its value."""
        if staged.findings:  # most stages find nothing: no list is built for them
            self.findings += [(key, f) for f in staged.findings]
        if staged.statuses:
            self.statuses += [(_status_key(u), u) for u in staged.statuses]
        return staged.value


def _run_classes(ctx: Context) -> tuple[dict[str, ClassContext], _Run]:
    """The snapshot's own findings, and the classes stage for each GatewayClass of ours."""
    run = _Run()
    run.findings += [((0,), f) for f in classes.snapshot_findings(ctx.snapshot)]
    resolved = {
        name_of(gc): run.take((1, name_of(gc)), classes.resolve(ctx, gc))
        for gc in classes.ours(ctx)
    }
    return resolved, run


def _run_gateway(
    ctx: Context,
    run: _Run,
    plan: GatewayPlan,
    attachments: Attachments,
    backends: Mapping[str, Cluster],
) -> None:
    """The stages of one planned Gateway: addresses, config, Service, ServiceAccount,
    Deployment, status."""
    tag, gw_id = (4, *plan.key), id_of(plan.gateway)
    if plan.error is not None:
        run.take(tag, gateways.gateway_status(ctx, plan))
    else:
        publics = run.take(tag, addresses.listener_addresses(ctx, plan))
        rendered = run.take(tag, config.dataplane_config(ctx, plan, publics, attachments, backends))
        if not isinstance(rendered, str):
            run.configs[gw_id] = rendered
            service = run.take(tag, manifests.service_of(ctx, plan))
            if service is not None:
                run.services[gw_id] = service
            run.dataplane_accounts[gw_id] = dataplane_account(plan.gateway, plan.context.dataplane)
            service_account = run.take(tag, service_account_of(ctx, plan))
            if service_account is not None:
                run.service_accounts[gw_id] = service_account
            manifest = run.take(tag, deployment.deployment_of(ctx, plan))
            if manifest is not None:
                run.deployments[gw_id] = manifest
        counts = [len(attachments.get((plan.key, lst.index), ())) for lst in plan.listeners]
        run.take(tag, gateways.gateway_status(ctx, plan, publics, counts, rendered))


def _run_part(ctx: Context, part: Part, of_classes: Mapping[str, ClassContext]) -> _Run:
    """The stages of one part of the cluster: its Gateways (of `of_classes`) and every route
    naming one of them (`Part`)."""
    run = _Run()
    plans: dict[GatewayKey, GatewayPlan] = {}
    for gateway in part.gateways:
        key = namespace_of(gateway), name_of(gateway)
        of_class = of_classes[str(spec_of(gateway).get("gatewayClassName"))]
        plans[key] = run.take((2, *key), listeners.plan_gateway(ctx, gateway, of_class))
    stunner_ids = {id_of(r) for r in part.stunner_routes}
    attached: dict[tuple[GatewayKey, int], set[str]] = {}
    backends: dict[str, Cluster] = {}
    none: set[str] = set()
    masks = ((0, none, part.stunner_routes), (1, stunner_ids, part.api_routes))
    for order, masking, group in (*masks, (2, none, part.tcp_routes)):
        for route in group:
            route_id = routes.route_id(route)
            tag = (3, order, namespace_of(route), name_of(route))
            found = run.take(tag, routes.attach(ctx, route, plans, route_id in masking))
            if found.cluster is not None:
                backends[route_id] = found.cluster
            for where in found.listeners:
                attached.setdefault(where, set()).add(route_id)
    attachments = {where: tuple(sorted(ids)) for where, ids in attached.items()}
    for plan in plans.values():
        _run_gateway(ctx, run, plan, attachments, backends)
    return run


def render(snapshot: Snapshot, settings: RenderSettings, now: datetime) -> Plan:
    """The plan of a snapshot: configs, manifests and status of every Gateway of ours."""
    return Renderer(settings).render(snapshot, now)


@dataclass
class _Rendered:
    """What one part rendered, and what it read to render it."""

    members: tuple[Object, ...]  # the part's Gateways and routes as rendered
    # (apiVersion, kind, namespace, name) -> the status planned for a member
    planned: Mapping[tuple[str, str, str, str], Mapping[str, Any]]
    reads: Mapping[ReadKey, Any]
    classes: Mapping[str, ClassContext]
    configs: list[tuple[GatewayKey, str, StunnerConfig]]
    deployments: list[tuple[GatewayKey, str, dict[str, Any]]]
    services: list[tuple[GatewayKey, str, dict[str, Any]]]
    service_accounts: list[tuple[GatewayKey, str, dict[str, Any]]]
    dataplane_accounts: list[tuple[GatewayKey, str, str]]
    findings: list[tuple[SortKey, Finding]]
    statuses: list[tuple[SortKey, StatusUpdate]]


def _untimed(value: Any) -> Any:
    """A status without the transition times of its conditions (at any depth: the Gateway's
    own and its listeners', a route's parents')."""
    if isinstance(value, Mapping):
        return {k: _untimed(v) for k, v in value.items() if k != "lastTransitionTime"}
    if isinstance(value, list):
        return [_untimed(item) for item in value]
    return value


def _members_hold(members: tuple[Object, ...], done: _Rendered) -> bool:
    """Whether a part's Gateways and routes are the ones it was rendered from: the same, or
    changed in nothing but a status that is the very status the part planned for them (the
    echo of our own status write). Render reads a member's status only for the transition
    times of its conditions, which it keeps from a condition of the same status: from the
    status it planned, it plans that status again.

    The status planned but for its transition times holds too: the echo of an earlier
    render's write, which a render running meanwhile did not see (it planned the same
    conditions, stamped with its own time). Apply keeps the stored time of a condition whose
    status is unchanged (`apply._keep_times`): the part as kept writes nothing, as the part
    rendered again (from the stored times) would."""
    if len(members) != len(done.members):
        return False
    for new, old in zip(members, done.members, strict=True):
        if same(new, old):
            continue
        if not same(new, old, status=False):
            return False
        key = (str(new.get("apiVersion")), str(new.get("kind")), namespace_of(new), name_of(new))
        planned = done.planned.get(key)
        if planned is None:
            return False
        status = new.get("status")
        if status != planned and _untimed(status) != _untimed(planned):
            return False
    return True


def _same_class(new: ClassContext | None, old: ClassContext) -> bool:
    """Whether a class renders its Gateways as before: the same GatewayConfig and Dataplane,
    credentials and error (its own object's status is not read for them)."""
    return (
        new is not None
        and same(new.gateway_config, old.gateway_config)
        and same(new.dataplane, old.dataplane)
        and new.auth == old.auth
        and new.error == old.error
    )


class Renderer:
    """`render` with a memory: each part of the cluster (`Part`) whose reads of the snapshot
    still hold, and whose GatewayClass resolves as before, keeps what it rendered last time;
    the others render again. The plan is the one a render of the whole snapshot makes (the
    tests check it against one after random edits), but for the time stamped on a condition
    that flipped: that is the time of the render that rendered the part (and it stays when the
    member's stored status differs in its transition times only, see `_members_hold`).

    The GatewayClasses (their GatewayConfig, Dataplane and credentials: a handful of objects)
    render every time; a change of one renders its Gateways again. Not thread-safe: one render
    at a time."""

    def __init__(self, settings: RenderSettings) -> None:
        self.settings = settings
        self._parts: dict[Any, _Rendered] = {}
        # The last cut into parts, and what it was cut from: reused while no Gateway or route
        # changed and the classes of ours are the same.
        self._cut: tuple[Snapshot, frozenset[str], list[tuple[Part, Any]]] | None = None
        self.rendered_parts = 0  # of the last render: parts rendered again
        self.kept_parts = 0  # and kept

    def forget(self) -> None:
        """Render everything again next time."""
        self._parts = {}
        self._cut = None

    def _parts_of(self, snapshot: Snapshot, ours: Collection[str]) -> list[tuple[Part, Any]]:
        names = frozenset(ours)
        if self._cut is not None:
            before, before_names, cut = self._cut
            if before_names == names and same_kinds(before, snapshot, PART_KINDS):
                return cut
        cut = [(part, part.key) for part in parts(snapshot, names)]
        self._cut = (snapshot, names, cut)
        return cut

    def render(self, snapshot: Snapshot, now: datetime) -> Plan:
        ctx = Context.of(snapshot, self.settings, now)
        of_classes, top = _run_classes(ctx)
        kept: dict[Any, _Rendered] = {}
        self.rendered_parts = self.kept_parts = 0
        for part, key in self._parts_of(snapshot, of_classes):
            done = self._parts.get(key)
            if (
                done is None
                or not _members_hold(part.members, done)
                or not all(_same_class(of_classes.get(n), c) for n, c in done.classes.items())
                or not hold(done.reads, snapshot)
            ):
                done = self._render_part(part, ctx, of_classes)
                self.rendered_parts += 1
            else:
                self.kept_parts += 1
            kept[key] = done
        self._parts = kept
        done_parts = list(kept.values())

        def ordered(items: list[tuple[Any, Any]]) -> list[Any]:
            items.sort(key=lambda item: item[0])
            return [item[1] for item in items]

        def by_gateway(field_name: str) -> dict[str, Any]:
            items = [entry for d in done_parts for entry in getattr(d, field_name)]
            items.sort(key=lambda item: item[0])
            return {gw_id: value for _, gw_id, value in items}

        configs = by_gateway("configs")
        statuses = tuple(ordered([*top.statuses, *(s for d in done_parts for s in d.statuses)]))
        return Plan(
            configs=configs,
            deployments=by_gateway("deployments"),
            services=by_gateway("services"),
            service_accounts=by_gateway("service_accounts"),
            dataplane_accounts=by_gateway("dataplane_accounts"),
            statuses=statuses,
            findings=tuple(ordered([*top.findings, *(f for d in done_parts for f in d.findings)]))
            + nodes.node_findings(snapshot.all(Kind.NODE)),
            node_addresses=nodes.node_relay_addresses(snapshot.all(Kind.NODE)),
            node_local=nodes.gateway_node_addresses(configs, statuses),
        )

    def _render_part(
        self, part: Part, ctx: Context, of_classes: Mapping[str, ClassContext]
    ) -> _Rendered:
        tracked = Tracked.of(ctx.snapshot)
        run = _run_part(
            Context(tracked, ctx.settings, ctx.now, ctx.rule_settings), part, of_classes
        )

        def keyed(values: Mapping[str, Any]) -> list[tuple[GatewayKey, str, Any]]:
            return [(_key_of(gw_id), gw_id, value) for gw_id, value in values.items()]

        used = {str(spec_of(g).get("gatewayClassName")) for g in part.gateways}
        planned = {
            (update.api_version, update.kind, update.namespace, update.name): update.status
            for _, update in run.statuses
        }
        return _Rendered(
            members=part.members,
            planned=planned,
            reads=tracked.reads,
            classes={name: of_classes[name] for name in used},
            configs=keyed(run.configs),
            deployments=keyed(run.deployments),
            services=keyed(run.services),
            service_accounts=keyed(run.service_accounts),
            dataplane_accounts=keyed(run.dataplane_accounts),
            findings=run.findings,
            statuses=run.statuses,
        )


def _key_of(gw_id: str) -> GatewayKey:
    namespace, _, name = gw_id.partition("/")
    return namespace, name
