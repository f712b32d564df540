"""Which watch events are worth a render (pure; the cluster mode's event filter).

Render is level-based and reads the whole snapshot (and itself renders again only the parts of
the cluster whose reads changed), so an event only decides *whether* to render soon. Only
objects of our GatewayClasses matter:
- a GatewayClass whose controllerName is ours (before or after the change);
- a Gateway of one of our classes, a route (UDPRoute, TCPRoute) with such a Gateway as a
  parent, a GatewayConfig, Dataplane, StaticService or ReferenceGrant: when something other
  than `status` changed (our own status writes come back as events and must not render again);
- a Secret, Service or EndpointSlice only when something rendered refers to it (`References`,
  recomputed after every render): a listener's certificate, a GatewayConfig's authRef, a route's
  backend Service and its EndpointSlices, a Gateway's own Service (its load-balancer address);
- a Namespace when its labels change (allowedRoutes selectors), a Node when what render reads of
  it changes: its addresses, its relay-address annotation (relay address discovery) or its
  taints (which Nodes a node-local DaemonSet runs on); its heartbeats are ignored;
- a Deployment, DaemonSet or ServiceAccount we own (someone edited or deleted it: write it back;
  render reads none of them, so cluster mode only diffs the last plan against it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stunner_api.vocabulary import OWNED_BY_LABEL, OWNED_BY_VALUE, RELATED_GATEWAY_NAME

from .store import (
    ROUTE_KINDS,
    SERVICE_NAME_LABEL,
    Kind,
    Object,
    Snapshot,
    kind_of,
    labels_of,
    meta,
    name_of,
    namespace_of,
    node_facts,
)

Key = tuple[str, str]  # (namespace, name)


def _spec(obj: Object | None) -> Mapping[str, Any]:
    value = (obj or {}).get("spec")
    return value if isinstance(value, Mapping) else {}


def _refs(items: Any) -> list[Mapping[str, Any]]:
    return [i for i in items if isinstance(i, Mapping)] if isinstance(items, list) else []


@dataclass(frozen=True)
class References:
    """What the current objects of ours refer to."""

    controller: str
    classes: frozenset[str] = frozenset()
    gateways: frozenset[Key] = frozenset()
    secrets: frozenset[Key] = frozenset()
    services: frozenset[Key] = frozenset()

    @classmethod
    def of(cls, snapshot: Snapshot, controller: str) -> References:
        classes = frozenset(
            name_of(c)
            for c in snapshot.all(Kind.GATEWAY_CLASS)
            if _spec(c).get("controllerName") == controller
        )
        gateways = [
            g for g in snapshot.all(Kind.GATEWAY) if _spec(g).get("gatewayClassName") in classes
        ]
        gateway_keys = frozenset((namespace_of(g), name_of(g)) for g in gateways)
        secrets: set[Key] = set()
        for gateway in gateways:
            for listener in _refs(_spec(gateway).get("listeners")):
                tls = listener.get("tls") if isinstance(listener.get("tls"), Mapping) else {}
                for ref in _refs((tls or {}).get("certificateRefs")):
                    ns = str(ref.get("namespace") or namespace_of(gateway))
                    secrets.add((ns, str(ref.get("name") or "")))
        for gateway_config in snapshot.all(Kind.GATEWAY_CONFIG):
            auth_ref = _spec(gateway_config).get("authRef")
            if isinstance(auth_ref, Mapping):
                ns = str(auth_ref.get("namespace") or namespace_of(gateway_config))
                secrets.add((ns, str(auth_ref.get("name") or "")))
        services: set[Key] = set()
        for kind in ROUTE_KINDS:
            for route in snapshot.all(kind):
                if not _parents_ours(route, gateway_keys):
                    continue
                for rule in _refs(_spec(route).get("rules")):
                    for ref in _refs(rule.get("backendRefs")):
                        if (ref.get("group") or "") == "" and (ref.get("kind") or "Service") == (
                            "Service"
                        ):
                            ns = str(ref.get("namespace") or namespace_of(route))
                            services.add((ns, str(ref.get("name") or "")))
        return cls(controller, classes, gateway_keys, frozenset(secrets), frozenset(services))

    # --- the filter ---------------------------------------------------------------------------

    def wants(self, new: Object | None, old: Object | None) -> bool:
        """Whether a change from `old` to `new` (None: absent) may change the plan."""
        obj = new if new is not None else old
        if obj is None:
            return False
        if _labels(obj).get(OWNED_BY_LABEL) == OWNED_BY_VALUE and obj.get("kind") in (
            "Deployment",
            "DaemonSet",
            "ServiceAccount",
        ):
            return _changed(new, old, status=False)
        kind = kind_of(obj)
        if kind is None:
            return False
        if kind == Kind.GATEWAY_CLASS:
            ours = any(_spec(o).get("controllerName") == self.controller for o in (new, old) if o)
            return ours and _changed(new, old, status=False)
        if kind == Kind.GATEWAY:
            ours = any(_spec(o).get("gatewayClassName") in self.classes for o in (new, old) if o)
            return ours and _changed(new, old, status=False)
        if kind in ROUTE_KINDS:
            ours = any(_parents_ours(o, self.gateways) for o in (new, old) if o)
            return ours and _changed(new, old, status=False)
        if kind in (Kind.GATEWAY_CONFIG, Kind.DATAPLANE, Kind.STATIC_SERVICE):
            return bool(self.classes) and _changed(new, old, status=False)
        if kind == Kind.REFERENCE_GRANT:
            return bool(self.classes) and _changed(new, old, status=False)
        key = (namespace_of(obj), name_of(obj))
        if kind == Kind.SECRET:
            return key in self.secrets and _changed(new, old, status=True)
        if kind == Kind.SERVICE:
            related = any(RELATED_GATEWAY_NAME in _annotations(o) for o in (new, old) if o)
            return (key in self.services or related) and _changed(new, old, status=True)
        if kind == Kind.ENDPOINT_SLICE:
            service = (namespace_of(obj), _labels(obj).get(SERVICE_NAME_LABEL, ""))
            return service in self.services and _changed(new, old, status=True)
        if kind == Kind.NAMESPACE:
            return new is None or old is None or _labels(new) != _labels(old)
        if kind == Kind.NODE:
            return new is None or old is None or node_facts(new) != node_facts(old)
        return False


def _parents_ours(route: Object, gateways: frozenset[Key]) -> bool:
    for ref in _refs(_spec(route).get("parentRefs")):
        if (ref.get("kind") or "Gateway") != "Gateway":
            continue
        if (str(ref.get("namespace") or namespace_of(route)), str(ref.get("name"))) in gateways:
            return True
    return False


def _labels(obj: Object) -> Mapping[str, str]:
    return labels_of(obj)


def _annotations(obj: Object) -> Mapping[str, Any]:
    value = meta(obj).get("annotations")
    return value if isinstance(value, Mapping) else {}


def _changed(new: Object | None, old: Object | None, *, status: bool) -> bool:
    """Whether anything render reads changed: everything but the bookkeeping metadata, and
    `status` only when `status` is true."""
    if new is None or old is None:
        return True
    return _content(new, status) != _content(old, status)


_IGNORED_METADATA = frozenset({"resourceVersion", "managedFields", "generation"})


def _content(obj: Object, status: bool) -> dict[str, Any]:
    out = {k: v for k, v in obj.items() if k != "metadata" and (status or k != "status")}
    out["metadata"] = {k: v for k, v in meta(obj).items() if k not in _IGNORED_METADATA}
    return out
