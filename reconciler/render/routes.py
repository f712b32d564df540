"""The routes stage: a UDPRoute or TCPRoute attached to the listeners of its parent Gateways that
allow it.

Each parentRef naming a Gateway of ours gets a verdict (Accepted, NotAllowedByListeners,
NoMatchingParent, or Pending: masked by a STUNner UDPRoute of the same name, or its Gateway not
accepted); an attached route becomes one cluster (clusters.py) in its Gateway's config, a
TCPRoute a cluster of protocol TCP on TURN-TCP and TURN-TLS listeners only (a TURN-UDP or
TURN-DTLS listener carries no TCP allocations: NotAllowedByListeners, saying so). The
route's status (its parents of ours, beside those of other controllers) is written here.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stunner_api.rules import Problem, Severity
from stunner_api.rules.tcproute import tcp_allocations_refused
from stunner_api.vocabulary import GATEWAY_API_GROUP, GATEWAY_API_TCP_ROUTE, group_of
from stunner_api.vocabulary import ConditionReason as Reason

from ..store import Kind, Object, labels_of, matches_selector, namespace_of
from . import conditions as cond
from .clusters import TCP_CLUSTER_PREFIX, Cluster, cluster
from .context import (
    Context,
    GatewayKey,
    GatewayPlan,
    ListenerPlan,
    Staged,
    finding,
    findings_of,
    id_of,
    spec_of,
    status_update,
)
from .judge import judge, under
from .plan import StatusUpdate

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # every Namespace has it (Kubernetes 1.22+)


def gateway_parent_refs(route: Object) -> list[Mapping[str, Any]]:
    """A route's parentRefs that name a Gateway (the group and kind default to them); others
    are not parents this controller answers for."""
    return [
        ref
        for ref in spec_of(route).get("parentRefs") or []
        if isinstance(ref, Mapping)
        and (ref.get("group") or GATEWAY_API_GROUP, ref.get("kind") or "Gateway")
        == (GATEWAY_API_GROUP, "Gateway")
    ]


def route_order(api_version: str, kind: str) -> int:
    """STUNner's UDPRoutes render before Gateway API's (one of the same name masks the other),
    and TCPRoutes last (0, 1, 2)."""
    if kind == GATEWAY_API_TCP_ROUTE.kind:
        return 2
    return 1 if group_of(api_version) == GATEWAY_API_GROUP else 0


def route_order_of(route: Object) -> int:
    return route_order(str(route.get("apiVersion")), str(route.get("kind")))


def is_tcp_route(route: Object) -> bool:
    return route.get("kind") == GATEWAY_API_TCP_ROUTE.kind


def route_id(route: Object) -> str:
    """A route's id, the name of its cluster: "<namespace>/<name>" (a STUNner and a Gateway API
    UDPRoute of one name share it: one masks the other), "tcp:<namespace>/<name>" for a TCPRoute
    (its own cluster beside a UDPRoute of its name)."""
    return f"{TCP_CLUSTER_PREFIX}{id_of(route)}" if is_tcp_route(route) else id_of(route)


@dataclass(frozen=True)
class RouteParent:
    """The verdict on one parentRef of a route, for its status."""

    ref: dict[str, Any]
    reason: str
    message: str | None = None


@dataclass(frozen=True)
class Attached:
    """What the routes stage found of a route: its cluster (when it has a parent of ours and is
    not masked; backends are resolved for its status even where it attaches nowhere) and the
    listeners it attaches to."""

    cluster: Cluster | None
    listeners: tuple[tuple[GatewayKey, int], ...]  # (Gateway, listener index)


def _namespace_allowed(
    ctx: Context, listener: ListenerPlan, gateway: Object, route: Object
) -> bool:
    namespaces = (listener.spec.get("allowedRoutes") or {}).get("namespaces") or {}
    origin = namespaces.get("from", "Same")
    route_ns = namespace_of(route)
    allowed = origin == "All" or (origin == "Same" and route_ns == namespace_of(gateway))
    if origin == "Selector":
        namespace = ctx.snapshot.get(Kind.NAMESPACE, "", route_ns)
        labels = dict(labels_of(namespace)) if namespace is not None else {}
        labels.setdefault(NAMESPACE_NAME_LABEL, route_ns)
        allowed = matches_selector(labels, namespaces.get("selector") or {})
    return allowed


def _kind_allowed(listener: ListenerPlan, route: Object) -> bool:
    kinds = (listener.spec.get("allowedRoutes") or {}).get("kinds") or []
    return not kinds or any(
        k.get("kind") == route.get("kind")
        and (k.get("group") or GATEWAY_API_GROUP) == group_of(str(route.get("apiVersion")))
        for k in kinds
        if isinstance(k, Mapping)
    )


def _named(plan: GatewayPlan, section: Any) -> tuple[ListenerPlan, ...]:
    """The listeners a parentRef's sectionName names: all of them when it names none."""
    listeners = plan.listeners
    return listeners if section is None else tuple(x for x in listeners if x.name == section)


def _parent(
    ctx: Context,
    route: Object,
    ref: Mapping[str, Any],
    gateways: Mapping[GatewayKey, GatewayPlan],
    masked: bool,
    fatal: list[Problem],
) -> tuple[RouteParent | None, list[int]]:
    """The verdict on one parentRef (None: a Gateway of another controller answers for it)
    and the indexes of the listeners the route attaches to there."""
    gw_ns, gw_name = str(ref.get("namespace") or namespace_of(route)), str(ref.get("name") or "")
    parent_ref = {
        "group": GATEWAY_API_GROUP,
        "kind": "Gateway",
        "namespace": gw_ns,
        "name": gw_name,
    }
    for key in ("sectionName", "port"):
        if ref.get(key) is not None:
            parent_ref[key] = ref[key]
    where = f"{gw_ns}/{gw_name}"
    gateway = ctx.snapshot.get(Kind.GATEWAY, gw_ns, gw_name)
    plan = gateways.get((gw_ns, gw_name))
    section = ref.get("sectionName")
    accepting: list[ListenerPlan] = []
    parent: RouteParent | None = None
    if plan is None:
        if gateway is None:
            parent = RouteParent(parent_ref, Reason.NO_MATCHING_PARENT)
    elif masked:
        parent = RouteParent(parent_ref, Reason.PENDING)
    elif fatal:
        parent = RouteParent(parent_ref, fatal[0].reason, str(fatal[0]))
    elif plan.error is not None:
        message = f"parent {where} is not accepted: {plan.error}"
        parent = RouteParent(parent_ref, Reason.PENDING, message)
    elif not _named(plan, section):
        message = f"parent {where} has no listener named {section!r}"
        parent = RouteParent(parent_ref, Reason.NO_MATCHING_PARENT, message)
    else:
        port = ref.get("port")
        candidates = [
            lst
            for lst in _named(plan, section)
            if lst.rendered and (port is None or port == lst.port)
        ]
        # A TCPRoute is for TCP allocations, which run over TURN-TCP and TURN-TLS only.
        refused = {
            lst.index: why
            for lst in candidates
            if is_tcp_route(route) and (why := tcp_allocations_refused(lst.protocol)) is not None
        }
        accepting = [
            lst
            for lst in candidates
            if lst.index not in refused
            and _kind_allowed(lst, route)
            and _namespace_allowed(ctx, lst, plan.gateway, route)
        ]
        if accepting:
            parent = RouteParent(parent_ref, Reason.ACCEPTED)
        elif refused:
            why = "; ".join(
                f"listener {lst.name!r}: {refused[lst.index]}"
                for lst in candidates
                if lst.index in refused
            )
            message = f"parent {where} rejects the route: {why}"
            parent = RouteParent(parent_ref, Reason.NOT_ALLOWED_BY_LISTENERS, message)
        else:
            parent = RouteParent(parent_ref, Reason.NOT_ALLOWED_BY_LISTENERS)
    return parent, [lst.index for lst in accepting]


def _status(
    ctx: Context, route: Object, parents: list[RouteParent], found: Cluster | None
) -> tuple[StatusUpdate, ...]:
    """The route's status: our parents' conditions beside other controllers' parents."""
    resolved = cond.route_resolved(found.problems if found else [])
    before = (route.get("status") or {}).get("parents") or []
    ours = []
    for parent in parents:
        where = f"{parent.ref['namespace']}/{parent.ref['name']}"
        accepted = cond.route_accepted(where, parent.reason, parent.message)
        previous = [
            c
            for entry in before
            if entry.get("parentRef") == parent.ref
            and entry.get("controllerName") == ctx.controller
            for c in entry.get("conditions") or []
        ]
        conditions = cond.conditions(
            [accepted, resolved], cond.generation_of(route), ctx.now, previous
        )
        ours.append(
            {"parentRef": parent.ref, "controllerName": ctx.controller, "conditions": conditions}
        )
    others = [
        copy.deepcopy(dict(entry))
        for entry in before
        if isinstance(entry, Mapping) and entry.get("controllerName") != ctx.controller
    ]
    return (status_update(route, {"parents": [*others, *ours]}),) if ours or others else ()


def attach(
    ctx: Context, route: Object, gateways: Mapping[GatewayKey, GatewayPlan], masked: bool
) -> Staged[Attached]:
    """The stage: a route judged, its verdict from each parent Gateway of `gateways` (a part's
    Gateways of ours), its cluster and its status."""
    problems = judge(route, ctx.snapshot, ctx.rule_settings)
    found = list(findings_of(route, problems))
    fatal = [
        p for p in problems if p.severity == Severity.ERROR and not under(p.path, "spec.rules")
    ]
    parents: list[RouteParent] = []
    listeners: list[tuple[GatewayKey, int]] = []
    for ref in gateway_parent_refs(route):
        parent, indexes = _parent(ctx, route, ref, gateways, masked, fatal)
        if parent is not None:
            parents.append(parent)
            key = (str(parent.ref["namespace"]), str(parent.ref["name"]))
            listeners += [(key, index) for index in indexes]
    backends = None
    if parents and not masked:
        backends = cluster(route, ctx.snapshot, ctx.settings, route_id(route))
        path = "spec.rules[0].backendRefs"
        found += [finding(route, path, message, reason) for reason, message in backends.problems]
    attached = Attached(backends, tuple(listeners))
    return Staged(attached, tuple(found), _status(ctx, route, parents, backends))
