"""render(snapshot, settings, now) -> Plan: the whole hierarchy, one pass, no I/O.

For every GatewayClass whose controllerName is ours: its GatewayConfig and Dataplane are judged
and its credentials resolved (any error invalidates the class and every Gateway of it). Then
each Gateway of the class is judged by the rule table; a problem of one listener keeps only that
listener out (its status says why), any other error keeps the Gateway out. UDPRoutes attach to
the rendered listeners that allow them; each attached route becomes one cluster.

The Gateways and routes render in parts (`Part`: a Gateway with the routes naming it, joined
through shared routes), each on a snapshot that records what it read (`tracked.Tracked`), and
their findings and statuses are put in the order one pass over the sorted snapshot makes. A
`Renderer` keeps each part's result and, on the next snapshot, renders again only the parts
whose members, reads or class changed: cluster mode renders with one; `render()` is a fresh
one, so both take the same path.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from stunner_api.annotations import DISABLE_MANAGED_DATAPLANE_ROW, TARGETPORT_ROW, Limits
from stunner_api.dataplane import ConfigError, StunnerConfig, validate_config
from stunner_api.rules import Problem, Severity
from stunner_api.vocabulary import (
    DEFAULT_DATAPLANE,
    GATEWAY_API_GROUP,
    LISTENER_PROTOCOLS,
    LISTENER_TRANSPORT,
    NODE_ADDRESS_PLACEHOLDER,
    RELAY_ADDRESS_DISCOVERY,
    TLS_PROTOCOLS,
    ListenerProtocol,
    group_of,
)
from stunner_api.vocabulary import ConditionReason as Reason

from ..store import Kind, Object, Snapshot, labels_of, matches_selector, name_of, namespace_of
from . import addresses, config, manifests
from . import conditions as cond
from .judge import judge, under
from .plan import Finding, Plan, RenderSettings, StatusUpdate
from .tracked import ReadKey, Tracked, hold, same, same_kinds

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # every Namespace has it (Kubernetes 1.22+)


def _spec(obj: Object | None) -> Mapping[str, Any]:
    value = (obj or {}).get("spec")
    return value if isinstance(value, Mapping) else {}


def gateway_parent_refs(route: Object) -> list[Mapping[str, Any]]:
    """A route's parentRefs that name a Gateway (the group and kind default to them); others
    are not parents this controller answers for."""
    return [
        ref
        for ref in _spec(route).get("parentRefs") or []
        if isinstance(ref, Mapping)
        and (ref.get("group") or GATEWAY_API_GROUP, ref.get("kind") or "Gateway")
        == (GATEWAY_API_GROUP, "Gateway")
    ]


def _id(obj: Object) -> str:
    return f"{namespace_of(obj)}/{name_of(obj)}"


@dataclass
class ClassContext:
    """A GatewayClass of ours with what its Gateways need, or the error that invalidates it."""

    gateway_class: Object
    gateway_config: Object | None = None
    dataplane: Object | None = None
    auth: dict[str, Any] | None = None
    error: str | None = None


@dataclass
class ListenerPlan:
    """One Gateway listener: its conditions, and what it renders to when it renders."""

    index: int
    spec: Mapping[str, Any]
    name: str
    protocol: ListenerProtocol | None
    port: int | None
    accepted: cond.Condition = cond.LISTENER_ACCEPTED
    conflicted: cond.Condition = cond.NO_CONFLICTS
    resolved: cond.Condition = cond.RESOLVED_REFS
    cert: str = ""
    key: str = ""
    routes: set[str] = field(default_factory=set)
    public: tuple[str, int] | None = None

    @property
    def rendered(self) -> bool:
        return (
            self.accepted.status == "True"
            and self.conflicted.status == "False"
            and self.resolved.status == "True"
        )

    @property
    def transport(self) -> str:
        return LISTENER_TRANSPORT[self.protocol] if self.protocol else "UDP"


@dataclass
class GatewayPlan:
    gateway: Object
    context: ClassContext
    listeners: list[ListenerPlan] = field(default_factory=list)
    error: str | None = None  # the Gateway is not rendered
    error_reason: str = Reason.INVALID


@dataclass
class RouteParent:
    ref: dict[str, Any]
    reason: str
    message: str | None = None
    gateway: GatewayPlan | None = None


def _canonical_protocol(value: Any) -> ListenerProtocol | None:
    return LISTENER_PROTOCOLS.get(str(value).upper())


class _Renderer:
    def __init__(self, snapshot: Snapshot, settings: RenderSettings, now: datetime) -> None:
        self.snapshot = snapshot
        self.settings = settings
        self.controller = settings.controller_name
        # The rules decide what is ours by the same controller name.
        self.rule_settings = replace(settings.rules, controller_name=settings.controller_name)
        self.now = now
        # Each finding and status with the key that orders it in the plan (`_Tagged`).
        self.key: SortKey = (0,)
        self.findings: list[tuple[SortKey, Finding]] = []
        self.statuses: list[tuple[SortKey, StatusUpdate]] = []
        self.configs: dict[str, StunnerConfig] = {}
        self.deployments: dict[str, dict[str, Any]] = {}
        self.services: dict[str, dict[str, Any]] = {}
        self.gateways: dict[tuple[str, str], GatewayPlan] = {}
        self.clusters: dict[str, config.Cluster] = {}
        self.route_parents: list[tuple[Object, list[RouteParent], bool]] = []

    # --- findings and status ----------------------------------------------------------------

    def note(self, obj: Object, path: str, message: str, reason: str) -> None:
        kind = str(obj.get("kind"))
        namespace = "" if kind in ("GatewayClass", "Dataplane") else namespace_of(obj)
        self.findings.append(
            (self.key, Finding(kind, namespace, name_of(obj), path, message, reason))
        )

    def note_problems(self, obj: Object, problems: list[Problem]) -> None:
        for p in problems:
            self.note(obj, p.path, p.message, p.reason)

    def set_status(self, obj: Object, status: dict[str, Any]) -> None:
        kind = str(obj.get("kind"))
        namespace = "" if kind == "GatewayClass" else namespace_of(obj)
        if kind == "GatewayClass":
            key: SortKey = (0, name_of(obj))
        elif kind == "Gateway":
            key = (1, namespace, name_of(obj))
        else:
            key = (2, _route_order(obj), namespace, name_of(obj))
        self.statuses.append(
            (
                key,
                StatusUpdate(
                    str(obj.get("apiVersion")),
                    kind,
                    namespace,
                    name_of(obj),
                    cond.generation_of(obj),
                    status,
                ),
            )
        )

    def conditions(self, obj: Object, wanted: list[cond.Condition]) -> list[dict[str, Any]]:
        return cond.conditions(
            wanted, cond.generation_of(obj), self.now, cond.previous_conditions(obj)
        )

    # --- GatewayClass -----------------------------------------------------------------------

    def judge_errors(self, obj: Object) -> list[Problem]:
        problems = judge(obj, self.snapshot, self.rule_settings)
        self.note_problems(obj, problems)
        return [p for p in problems if p.severity == Severity.ERROR]

    def parameter(self, kind: Kind, namespace: str, name: str, missing: str) -> Object | str:
        """A GatewayConfig or Dataplane of a class, or why the class cannot use it."""
        obj = self.snapshot.get(kind, namespace, name)
        if obj is None:
            return missing
        errors = [  # a GatewayConfig's refused annotations are logged and ignored, as Go does
            p
            for p in self.judge_errors(obj)
            if not under(p.path, "spec.loadBalancerServiceAnnotations")
        ]
        where = f"{namespace}/{name}" if namespace else name
        return f"{obj.get('kind')} {where}: {errors[0]}" if errors else obj

    def resolve_class(self, gateway_class: Object) -> ClassContext:
        ctx = ClassContext(gateway_class)
        errors = self.judge_errors(gateway_class)
        if errors:
            ctx.error = str(errors[0])
            return ctx
        ref = _spec(gateway_class).get("parametersRef") or {}
        namespace, name = str(ref.get("namespace")), str(ref.get("name"))
        found = self.parameter(
            Kind.GATEWAY_CONFIG,
            namespace,
            name,
            f"No GatewayConfig found for name: {namespace}/{name}",
        )
        if isinstance(found, str):
            ctx.error = found
            return ctx
        ctx.gateway_config = found
        dataplane_name = str(_spec(found).get("dataplane") or DEFAULT_DATAPLANE)
        found = self.parameter(
            Kind.DATAPLANE,
            "",
            dataplane_name,
            f"missing Dataplane resource for Gateway: no Dataplane {dataplane_name!r}",
        )
        if isinstance(found, str):
            ctx.error = found
            return ctx
        ctx.dataplane = found
        try:
            ctx.auth = config.auth(ctx.gateway_config, self.snapshot)
        except config.AuthError as exc:
            ctx.error = str(exc)
        return ctx

    # --- Gateway ----------------------------------------------------------------------------

    def plan_gateway(self, gateway: Object, ctx: ClassContext) -> GatewayPlan:
        plan = GatewayPlan(gateway, ctx)
        if ctx.error is not None:
            plan.error, plan.error_reason = ctx.error, Reason.PENDING
            return plan
        problems = judge(gateway, self.snapshot, self.rule_settings)
        self.note_problems(gateway, problems)
        spec_listeners = _spec(gateway).get("listeners")
        listeners = spec_listeners if isinstance(spec_listeners, list) else []
        paths = [f"spec.listeners[{i}]" for i in range(len(listeners))]
        fatal = [
            p
            for p in problems
            if p.severity == Severity.ERROR
            and not any(under(p.path, path) for path in paths)
            and not under(p.path, "metadata.annotations")  # logged and ignored, as Go does
        ]
        if fatal:
            plan.error, plan.error_reason = str(fatal[0]), fatal[0].reason
            return plan
        for i, spec in enumerate(listeners):
            if isinstance(spec, Mapping):
                own = [p for p in problems if under(p.path, paths[i])]
                plan.listeners.append(self.plan_listener(gateway, i, spec, own))
        return plan

    def plan_listener(
        self, gateway: Object, index: int, spec: Mapping[str, Any], problems: list[Problem]
    ) -> ListenerPlan:
        port = spec.get("port")
        plan = ListenerPlan(
            index=index,
            spec=spec,
            name=str(spec.get("name") or ""),
            protocol=_canonical_protocol(spec.get("protocol")),
            port=port if isinstance(port, int) and not isinstance(port, bool) else None,
        )
        for p in problems:
            if p.reason == Reason.PROTOCOL_CONFLICT:
                plan.conflicted = cond.PROTOCOL_CONFLICT
            elif p.reason in (Reason.INVALID_CERTIFICATE_REF, Reason.REF_NOT_PERMITTED):
                plan.resolved = cond.listener_refs_unresolved(
                    p.reason,
                    "at least one certificate reference failed to be successfully resolved",
                )
            elif p.severity != Severity.ERROR:
                continue
            elif p.reason == Reason.UNSUPPORTED_PROTOCOL:
                plan.accepted = cond.listener_not_accepted(p.reason, "unsupported protocol")
            elif p.reason == Reason.PORT_UNAVAILABLE:
                plan.accepted = cond.listener_not_accepted(p.reason, "port unavailable")
            elif plan.accepted.status == "True":
                plan.accepted = cond.listener_not_accepted(p.reason, str(p))
        if plan.protocol is None and plan.accepted.status == "True":
            plan.accepted = cond.listener_not_accepted(
                Reason.UNSUPPORTED_PROTOCOL, "unsupported protocol"
            )
        if plan.port is None and plan.accepted.status == "True":
            plan.accepted = cond.listener_not_accepted(Reason.PORT_UNAVAILABLE, "port unavailable")
        if plan.rendered and plan.protocol in TLS_PROTOCOLS:
            pair, reason, message = config.tls_pair(spec, gateway, self.snapshot)
            if pair is None:
                plan.resolved = cond.listener_refs_unresolved(reason, message)
                self.note(gateway, f"spec.listeners[{index}].tls", message, reason)
            else:
                plan.cert, plan.key = pair
        return plan

    # --- UDPRoute ---------------------------------------------------------------------------

    def _namespace_allowed(self, listener: ListenerPlan, gateway: Object, route: Object) -> bool:
        namespaces = (listener.spec.get("allowedRoutes") or {}).get("namespaces") or {}
        origin = namespaces.get("from", "Same")
        route_ns = namespace_of(route)
        if origin == "All":
            return True
        if origin == "Same":
            return route_ns == namespace_of(gateway)
        if origin == "Selector":
            namespace = self.snapshot.get(Kind.NAMESPACE, "", route_ns)
            labels = dict(labels_of(namespace)) if namespace is not None else {}
            labels.setdefault(NAMESPACE_NAME_LABEL, route_ns)
            return matches_selector(labels, namespaces.get("selector") or {})
        return False

    @staticmethod
    def _kind_allowed(listener: ListenerPlan, route: Object) -> bool:
        kinds = (listener.spec.get("allowedRoutes") or {}).get("kinds") or []
        if not kinds:
            return True
        group = group_of(str(route.get("apiVersion")))
        return any(
            k.get("kind") == "UDPRoute" and (k.get("group") or GATEWAY_API_GROUP) == group
            for k in kinds
            if isinstance(k, Mapping)
        )

    def attach_route(self, route: Object, masked: bool) -> None:
        route_ns = namespace_of(route)
        cluster_name = _id(route)
        problems = judge(route, self.snapshot, self.rule_settings)
        self.note_problems(route, problems)
        fatal = [
            p for p in problems if p.severity == Severity.ERROR and not under(p.path, "spec.rules")
        ]
        parents: list[RouteParent] = []
        for ref in gateway_parent_refs(route):
            gw_ns, gw_name = str(ref.get("namespace") or route_ns), str(ref.get("name") or "")
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
            gateway = self.snapshot.get(Kind.GATEWAY, gw_ns, gw_name)
            plan = self.gateways.get((gw_ns, gw_name))
            if gateway is not None and plan is None:
                continue  # a Gateway of another controller answers for itself
            if plan is None:
                parents.append(RouteParent(parent_ref, Reason.NO_MATCHING_PARENT))
                continue
            if masked:
                parents.append(RouteParent(parent_ref, Reason.PENDING, gateway=plan))
                continue
            if fatal:
                parents.append(RouteParent(parent_ref, fatal[0].reason, str(fatal[0]), plan))
                continue
            if plan.error is not None:
                parents.append(
                    RouteParent(
                        parent_ref,
                        Reason.PENDING,
                        f"parent {where} is not accepted: {plan.error}",
                        plan,
                    )
                )
                continue
            section = ref.get("sectionName")
            candidates = [lst for lst in plan.listeners if section is None or lst.name == section]
            if not candidates:
                parents.append(
                    RouteParent(
                        parent_ref,
                        Reason.NO_MATCHING_PARENT,
                        f"parent {where} has no listener named {section!r}",
                        plan,
                    )
                )
                continue
            port = ref.get("port")
            accepting = [
                lst
                for lst in candidates
                if lst.rendered
                and (port is None or port == lst.port)
                and self._kind_allowed(lst, route)
                and self._namespace_allowed(lst, plan.gateway, route)
            ]
            for lst in accepting:
                lst.routes.add(cluster_name)
            verdict = Reason.ACCEPTED if accepting else Reason.NOT_ALLOWED_BY_LISTENERS
            parents.append(RouteParent(parent_ref, verdict, gateway=plan))
        self.route_parents.append((route, parents, masked))
        if parents and not masked:  # backends resolved for status even where not attached
            self.clusters[cluster_name] = config.cluster(route, self.snapshot, self.settings)
            for reason, message in self.clusters[cluster_name].problems:
                self.note(route, "spec.rules[0].backendRefs", message, reason)

    def route_status(self, route: Object, parents: list[RouteParent], masked: bool) -> None:
        cluster = None if masked else self.clusters.get(_id(route))
        resolved = cond.route_resolved(cluster.problems if cluster else [])
        ours = []
        for parent in parents:
            where = f"{parent.ref['namespace']}/{parent.ref['name']}"
            accepted = cond.route_accepted(where, parent.reason, parent.message)
            previous = [
                c
                for entry in (route.get("status") or {}).get("parents") or []
                if entry.get("parentRef") == parent.ref
                and entry.get("controllerName") == self.controller
                for c in entry.get("conditions") or []
            ]
            ours.append(
                {
                    "parentRef": parent.ref,
                    "controllerName": self.controller,
                    "conditions": cond.conditions(
                        [accepted, resolved], cond.generation_of(route), self.now, previous
                    ),
                }
            )
        others = [
            copy.deepcopy(dict(entry))
            for entry in (route.get("status") or {}).get("parents") or []
            if isinstance(entry, Mapping) and entry.get("controllerName") != self.controller
        ]
        if ours or others:
            self.set_status(route, {"parents": [*others, *ours]})

    # --- public addresses (ANCHORS §2.6) ----------------------------------------------------

    def gateway_service(self, gateway: Object) -> Object | None:
        """The live Service exposing a Gateway (addresses.gateway_service)."""
        services = self.snapshot.services_of_gateway(namespace_of(gateway), _id(gateway))
        return addresses.gateway_service(gateway, services)

    def public_address(self, gateway: Object, listener: ListenerPlan) -> tuple[str, int] | None:
        found = addresses.public_address(
            gateway,
            self.gateway_service(gateway),
            self.snapshot.all(Kind.NODE),
            listener.port or 0,
            listener.transport,
        )
        if found.no_port:
            self.note(
                gateway,
                f"spec.listeners[{listener.index}]",
                found.missing,
                Reason.ADDRESS_NOT_ASSIGNED,
            )
        return (found.address, found.port) if found else None

    def relay_fallback(self, gateway: Object, programmed: cond.Condition) -> cond.Condition:
        """Relay address discovery where some Nodes have no public address: a finding, and the
        Programmed condition says so (the listeners still work, at a private address there)."""
        note = addresses.relay_fallback_note(self.snapshot.all(Kind.NODE))
        if note is None:
            return programmed
        self.note(
            gateway,
            f'metadata.annotations["{RELAY_ADDRESS_DISCOVERY}"]',
            note,
            Reason.ADDRESS_NOT_ASSIGNED,
        )
        return replace(programmed, message=f"{programmed.message}; {note}")

    # --- one Gateway ------------------------------------------------------------------------

    def render_gateway(self, plan: GatewayPlan) -> None:
        gateway, ctx = plan.gateway, plan.context
        gw_id = _id(gateway)
        accepted = cond.gateway_accepted(self.controller, plan.error, plan.error_reason)
        status: dict[str, Any] = {}
        if plan.error is not None:
            if plan.error_reason == Reason.PENDING:  # its class's error (its own are noted)
                self.note(gateway, "", plan.error, plan.error_reason)
            programmed = cond.gateway_programmed(self.controller, plan.error, False)
            status["conditions"] = self.conditions(gateway, [accepted, programmed])
            status["listeners"] = self.pending_listeners(gateway)
            self.set_status(gateway, status)
            return
        assert ctx.gateway_config is not None and ctx.dataplane is not None and ctx.auth is not None
        limits = Limits(self.rule_settings.node_port_range)
        targetports = manifests.annotation(TARGETPORT_ROW, gateway, ctx.gateway_config, limits)
        listeners: list[dict[str, Any]] = []
        address_found = True
        first_address: str | None = None
        relay_address = manifests.relay_address(gateway, ctx.gateway_config, limits)
        for lst in plan.listeners:
            if not lst.rendered:
                continue
            lst.public = self.public_address(gateway, lst)
            entry: dict[str, Any] = {
                "name": f"{gw_id}/{lst.name}",
                "protocol": str(lst.protocol),
                "address": relay_address,
                "port": targetports.get(lst.name, lst.port),
                "routes": sorted(lst.routes),
            }
            if lst.public is None:
                address_found = False
            else:
                entry["public_address"], entry["public_port"] = lst.public
                first_address = first_address or lst.public[0]
            if lst.cert:
                entry["cert"], entry["key"] = lst.cert, lst.key
            listeners.append(entry)
        routes = sorted({r for lst in plan.listeners for r in lst.routes})
        data = {
            "version": "v1",
            "admin": config.admin(gw_id, ctx.gateway_config, ctx.dataplane),
            "auth": ctx.auth,
            "listeners": listeners,
            "clusters": [self.clusters[r].to_dict() for r in routes],
        }
        error: str | None = None
        try:
            self.configs[gw_id] = validate_config(data)
        except ConfigError as exc:
            error = f"rendered dataplane config is invalid: {exc}"
            self.note(gateway, "", error, Reason.INVALID)
        if error is None:
            ports = [
                manifests.ServicePort(lst.name, lst.port or 0, lst.transport)
                for lst in plan.listeners
                if lst.rendered
            ]
            service = manifests.service(gateway, ctx.gateway_config, ports, limits)
            if service is not None:
                self.services[gw_id] = service
            unmanaged = DISABLE_MANAGED_DATAPLANE_ROW
            if not manifests.annotation(unmanaged, gateway, ctx.gateway_config, limits):
                self.deployments[gw_id] = manifests.deployment(
                    gateway, ctx.dataplane, self.settings
                )
        programmed = cond.gateway_programmed(self.controller, error, address_found)
        if relay_address == NODE_ADDRESS_PLACEHOLDER and error is None:
            programmed = self.relay_fallback(gateway, programmed)
        status["conditions"] = self.conditions(gateway, [accepted, programmed])
        if first_address is not None:
            kind = "IPAddress" if config.is_ip(first_address) else "Hostname"
            status["addresses"] = [{"type": kind, "value": first_address}]
        status["listeners"] = [self.listener_status(gateway, lst) for lst in plan.listeners]
        self.set_status(gateway, status)

    def pending_listeners(self, gateway: Object) -> list[dict[str, Any]]:
        """The listeners of a Gateway that was not rendered (its class or its own error): each
        still Accepted Unknown Pending, Go's initial listener status (no stale Accepted True
        left from an earlier render)."""
        spec_listeners = _spec(gateway).get("listeners")
        names = [
            str(spec.get("name") or "")
            for spec in (spec_listeners if isinstance(spec_listeners, list) else [])
            if isinstance(spec, Mapping)
        ]
        return [self.listener_entry(gateway, name, 0, [cond.LISTENER_PENDING]) for name in names]

    def listener_entry(
        self, gateway: Object, name: str, attached: int, wanted: list[cond.Condition]
    ) -> dict[str, Any]:
        previous = [
            c
            for entry in (gateway.get("status") or {}).get("listeners") or []
            if isinstance(entry, Mapping) and entry.get("name") == name
            for c in entry.get("conditions") or []
        ]
        return {
            "name": name,
            "supportedKinds": [dict(k) for k in cond.SUPPORTED_KINDS],
            "attachedRoutes": attached,
            "conditions": cond.conditions(wanted, cond.generation_of(gateway), self.now, previous),
        }

    def listener_status(self, gateway: Object, lst: ListenerPlan) -> dict[str, Any]:
        wanted = [lst.accepted, lst.conflicted, lst.resolved]
        return self.listener_entry(gateway, lst.name, len(lst.routes), wanted)

    # --- the stages ------------------------------------------------------------------------
    # Findings are keyed (0) the snapshot's, (1, class) a GatewayClass's, (2, ns, name) a
    # Gateway's judged, (3, route order, ns, name) a route's, (4, ns, name) a Gateway's
    # rendered; statuses (0, class), (1, ns, name) Gateways, (2, route order, ns, name) routes:
    # the order one pass over the sorted snapshot makes them in, whatever part rendered them.

    def run_classes(self) -> dict[str, ClassContext]:
        """The snapshot's own findings, and every GatewayClass of ours with its status."""
        self.key = (0,)
        for ignored in self.snapshot.ignored:
            self.findings.append(
                (
                    self.key,
                    Finding(
                        ignored.kind,
                        ignored.namespace,
                        ignored.name,
                        "",
                        ignored.reason,
                        Reason.INVALID,
                    ),
                )
            )
        classes: dict[str, ClassContext] = {}
        for gateway_class in self.snapshot.all(Kind.GATEWAY_CLASS):
            if _spec(gateway_class).get("controllerName") != self.controller:
                continue
            self.key = (1, name_of(gateway_class))
            ctx = self.resolve_class(gateway_class)
            classes[name_of(gateway_class)] = ctx
            accepted = cond.gateway_class_accepted(self.controller, ctx.error)
            if ctx.error is not None:
                self.note(gateway_class, "", ctx.error, Reason.INVALID_PARAMETERS)
            self.set_status(
                gateway_class, {"conditions": self.conditions(gateway_class, [accepted])}
            )
        return classes

    def run_part(self, part: Part, classes: Mapping[str, ClassContext]) -> None:
        """One part of the cluster: its Gateways (of `classes`) and every route naming one of
        them (`Part`)."""
        for gateway in part.gateways:
            self.key = (2, namespace_of(gateway), name_of(gateway))
            ctx = classes[str(_spec(gateway).get("gatewayClassName"))]
            self.gateways[namespace_of(gateway), name_of(gateway)] = self.plan_gateway(gateway, ctx)
        stunner_ids = {_id(r) for r in part.stunner_routes}
        for route in part.stunner_routes:
            self.key = (3, 0, namespace_of(route), name_of(route))
            self.attach_route(route, masked=False)
        for route in part.api_routes:
            self.key = (3, 1, namespace_of(route), name_of(route))
            self.attach_route(route, masked=_id(route) in stunner_ids)
        for key, plan in self.gateways.items():
            self.key = (4, *key)
            self.render_gateway(plan)
        for route, parents, masked in self.route_parents:
            self.route_status(route, parents, masked)


SortKey = tuple[Any, ...]
# What a cut into parts reads of the snapshot.
PART_KINDS = (Kind.GATEWAY, Kind.STUNNER_UDP_ROUTE, Kind.GATEWAY_API_UDP_ROUTE)
GatewayKey = tuple[str, str]  # (namespace, name)


def _route_order(route: Object) -> int:
    """STUNner's UDPRoutes render before Gateway API's (one of the same name masks the other)."""
    return 1 if group_of(str(route.get("apiVersion"))) == GATEWAY_API_GROUP else 0


@dataclass(frozen=True)
class Part:
    """Gateways and routes that render together: every route with the Gateways it names, every
    Gateway with the routes naming it, and a STUNner UDPRoute with the Gateway API one of its
    name (which it masks). Nothing outside a part changes what the part renders but what it
    reads of the snapshot, so a part whose reads still hold renders as it did (`Renderer`)."""

    gateways: tuple[Object, ...]  # sorted by (namespace, name), each of a class of ours
    stunner_routes: tuple[Object, ...]  # sorted
    api_routes: tuple[Object, ...]  # sorted

    @property
    def members(self) -> tuple[Object, ...]:
        return (*self.gateways, *self.stunner_routes, *self.api_routes)

    @property
    def key(self) -> tuple[frozenset[GatewayKey], frozenset[tuple[int, str, str]]]:
        routes = (*self.stunner_routes, *self.api_routes)
        return (
            frozenset((namespace_of(g), name_of(g)) for g in self.gateways),
            frozenset((_route_order(r), namespace_of(r), name_of(r)) for r in routes),
        )


def parts(snapshot: Snapshot, classes: Collection[str]) -> list[Part]:
    """The snapshot's Gateways of `classes` and its routes, in parts (see `Part`), in the order
    of their first member."""
    parent: dict[Any, Any] = {}

    def find(node: Any) -> Any:
        root = node
        while parent.setdefault(root, root) != root:
            root = parent[root]
        while parent[node] != root:
            parent[node], node = root, parent[node]
        return root

    def union(a: Any, b: Any) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[rb] = ra

    gateways = [
        g for g in snapshot.all(Kind.GATEWAY) if _spec(g).get("gatewayClassName") in classes
    ]
    for gateway in gateways:
        find(("gateway", namespace_of(gateway), name_of(gateway)))
    routes = [
        *snapshot.all(Kind.STUNNER_UDP_ROUTE),
        *snapshot.all(Kind.GATEWAY_API_UDP_ROUTE),
    ]
    for route in routes:
        node = ("route", _id(route))  # the two kinds of one name are one node: masking
        find(node)
        for ref in gateway_parent_refs(route):
            gw_ns = str(ref.get("namespace") or namespace_of(route))
            union(node, ("gateway", gw_ns, str(ref.get("name") or "")))
    members: dict[Any, tuple[list[Object], list[Object], list[Object]]] = {}
    for gateway in gateways:
        root = find(("gateway", namespace_of(gateway), name_of(gateway)))
        members.setdefault(root, ([], [], []))[0].append(gateway)
    for route in routes:
        root = find(("route", _id(route)))
        members.setdefault(root, ([], [], []))[1 + _route_order(route)].append(route)
    return [Part(tuple(g), tuple(s), tuple(a)) for g, s, a in members.values()]


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
    findings: list[tuple[SortKey, Finding]]
    statuses: list[tuple[SortKey, StatusUpdate]]


def _members_hold(members: tuple[Object, ...], done: _Rendered) -> bool:
    """Whether a part's Gateways and routes are the ones it was rendered from: the same, or
    changed in nothing but a status that is the very status the part planned for them (the
    echo of our own status write). Render reads a member's status only for the transition
    times of its conditions, which it keeps from a condition of the same status: from the
    status it planned, it plans that status again."""
    if len(members) != len(done.members):
        return False
    for new, old in zip(members, done.members, strict=True):
        if same(new, old):
            continue
        if not same(new, old, status=False):
            return False
        key = (str(new.get("apiVersion")), str(new.get("kind")), namespace_of(new), name_of(new))
        if key not in done.planned or new.get("status") != done.planned[key]:
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
    that flipped: that is the time of the render that rendered the part.

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

    def _parts_of(self, snapshot: Snapshot, classes: Collection[str]) -> list[tuple[Part, Any]]:
        names = frozenset(classes)
        if self._cut is not None:
            before, before_names, cut = self._cut
            if before_names == names and same_kinds(before, snapshot, PART_KINDS):
                return cut
        cut = [(part, part.key) for part in parts(snapshot, names)]
        self._cut = (snapshot, names, cut)
        return cut

    def render(self, snapshot: Snapshot, now: datetime) -> Plan:
        top = _Renderer(snapshot, self.settings, now)
        classes = top.run_classes()
        kept: dict[Any, _Rendered] = {}
        self.rendered_parts = self.kept_parts = 0
        for part, key in self._parts_of(snapshot, classes):
            done = self._parts.get(key)
            if (
                done is None
                or not _members_hold(part.members, done)
                or not all(_same_class(classes.get(n), c) for n, c in done.classes.items())
                or not hold(done.reads, snapshot)
            ):
                done = self._render_part(part, snapshot, classes, now)
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

        return Plan(
            configs=by_gateway("configs"),
            deployments=by_gateway("deployments"),
            services=by_gateway("services"),
            statuses=tuple(ordered([*top.statuses, *(s for d in done_parts for s in d.statuses)])),
            findings=tuple(ordered([*top.findings, *(f for d in done_parts for f in d.findings)])),
            node_addresses=addresses.node_relay_addresses(snapshot.all(Kind.NODE)),
        )

    def _render_part(
        self, part: Part, snapshot: Snapshot, classes: Mapping[str, ClassContext], now: datetime
    ) -> _Rendered:
        tracked = Tracked.of(snapshot)
        renderer = _Renderer(tracked, self.settings, now)
        renderer.run_part(part, classes)

        def keyed(values: Mapping[str, Any]) -> list[tuple[GatewayKey, str, Any]]:
            return [(_key_of(gw_id), gw_id, value) for gw_id, value in values.items()]

        used = {str(_spec(g).get("gatewayClassName")) for g in part.gateways}
        planned = {
            (update.api_version, update.kind, update.namespace, update.name): update.status
            for _, update in renderer.statuses
        }
        return _Rendered(
            members=part.members,
            planned=planned,
            reads=tracked.reads,
            classes={name: classes[name] for name in used},
            configs=keyed(renderer.configs),
            deployments=keyed(renderer.deployments),
            services=keyed(renderer.services),
            findings=renderer.findings,
            statuses=renderer.statuses,
        )


def _key_of(gw_id: str) -> GatewayKey:
    namespace, _, name = gw_id.partition("/")
    return namespace, name
