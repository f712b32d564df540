"""The reconciler's cache: a snapshot of every object the operator reads, indexed.

`Snapshot.from_objects(objects)` takes raw Kubernetes JSON dicts (from watches, from YAML files)
and indexes them by kind, namespace and name. It answers the rule table's `Lookup` from what it
holds, so render judges objects with exactly the rules the webhook uses: a Secret the snapshot
holds is one the reconciler may read (it watches them with its own rights); a reference across
namespaces is still permitted only by a ReferenceGrant (`Snapshot.permits`).

Objects are kept as the dicts given (never copied or changed): a snapshot is a value for one
render. An object of a kind the operator does not read is not kept; `ignored` names it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from stunner_api.vocabulary import (
    CORE_GROUP,
    GATEWAY_API_GROUP,
    RELATED_GATEWAY_NAME,
    STUNNER_GROUP,
    group_of,
)

Object = Mapping[str, Any]

SERVICE_NAME_LABEL = "kubernetes.io/service-name"  # EndpointSlice -> its Service


class Kind(StrEnum):
    """The kinds the operator reads (every served version of each is one kind here)."""

    GATEWAY_CLASS = "GatewayClass"
    GATEWAY_CONFIG = "GatewayConfig"
    DATAPLANE = "Dataplane"
    GATEWAY = "Gateway"
    STUNNER_UDP_ROUTE = "UDPRoute (stunner.l7mp.io)"
    GATEWAY_API_UDP_ROUTE = "UDPRoute (gateway.networking.k8s.io)"
    STATIC_SERVICE = "StaticService"
    SERVICE = "Service"
    ENDPOINT_SLICE = "EndpointSlice"
    SECRET = "Secret"
    NAMESPACE = "Namespace"
    NODE = "Node"
    REFERENCE_GRANT = "ReferenceGrant"


# (API group, kind) -> Kind.
KINDS: Mapping[tuple[str, str], Kind] = {
    (GATEWAY_API_GROUP, "GatewayClass"): Kind.GATEWAY_CLASS,
    (STUNNER_GROUP, "GatewayConfig"): Kind.GATEWAY_CONFIG,
    (STUNNER_GROUP, "Dataplane"): Kind.DATAPLANE,
    (GATEWAY_API_GROUP, "Gateway"): Kind.GATEWAY,
    (STUNNER_GROUP, "UDPRoute"): Kind.STUNNER_UDP_ROUTE,
    (GATEWAY_API_GROUP, "UDPRoute"): Kind.GATEWAY_API_UDP_ROUTE,
    (STUNNER_GROUP, "StaticService"): Kind.STATIC_SERVICE,
    (CORE_GROUP, "Service"): Kind.SERVICE,
    ("discovery.k8s.io", "EndpointSlice"): Kind.ENDPOINT_SLICE,
    (CORE_GROUP, "Secret"): Kind.SECRET,
    (CORE_GROUP, "Namespace"): Kind.NAMESPACE,
    (CORE_GROUP, "Node"): Kind.NODE,
    (GATEWAY_API_GROUP, "ReferenceGrant"): Kind.REFERENCE_GRANT,
}
CLUSTER_SCOPED = frozenset({Kind.GATEWAY_CLASS, Kind.DATAPLANE, Kind.NAMESPACE, Kind.NODE})


def kind_of(obj: Object) -> Kind | None:
    """The Kind of a raw object, None if the operator does not read it."""
    return KINDS.get((group_of(str(obj.get("apiVersion", ""))), str(obj.get("kind", ""))))


def meta(obj: Object) -> Mapping[str, Any]:
    value = obj.get("metadata")
    if type(value) is dict:  # the common case, without the slower abstract isinstance
        return value
    return value if isinstance(value, Mapping) else {}


def name_of(obj: Object) -> str:
    return str(meta(obj).get("name") or "")


def namespace_of(obj: Object) -> str:
    """The namespace, "default" when a namespaced object leaves it out (as kubectl applies)."""
    return str(meta(obj).get("namespace") or "default")


def labels_of(obj: Object) -> Mapping[str, str]:
    value = meta(obj).get("labels")
    return value if isinstance(value, Mapping) else {}


def matches_selector(labels: Mapping[str, str], selector: Mapping[str, Any]) -> bool:
    """A Kubernetes LabelSelector (matchLabels and matchExpressions) against labels."""
    match_labels = selector.get("matchLabels") or {}
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, operator = expr.get("key"), expr.get("operator")
        values = expr.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False  # an unknown operator selects nothing, as the API server refuses it
    return True


@dataclass(frozen=True)
class Ignored:
    """An object the snapshot did not keep, and why (for the log)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    reason: str


@dataclass(frozen=True)
class Snapshot:
    """Every object the operator reads, by Kind and (namespace, name); cluster-scoped objects
    have namespace ""."""

    objects: Mapping[Kind, Mapping[tuple[str, str], Object]]
    slices_by_service: Mapping[tuple[str, str], tuple[Object, ...]] = field(default_factory=dict)
    services_by_gateway: Mapping[tuple[str, str], tuple[Object, ...]] = field(default_factory=dict)
    ignored: tuple[Ignored, ...] = ()

    @classmethod
    def from_objects(cls, objects: Iterable[Object]) -> Snapshot:
        """Index raw objects; a later object with the same kind, namespace and name wins."""
        table: dict[Kind, dict[tuple[str, str], Object]] = {kind: {} for kind in Kind}
        ignored: list[Ignored] = []
        for obj in objects:
            kind = kind_of(obj) if isinstance(obj, Mapping) else None
            if kind is None or not name_of(obj):
                api_version = str(obj.get("apiVersion", "")) if isinstance(obj, Mapping) else ""
                what = str(obj.get("kind", "")) if isinstance(obj, Mapping) else type(obj).__name__
                reason = "no metadata.name" if kind is not None else "not a kind the operator reads"
                ignored.append(
                    Ignored(
                        api_version,
                        what,
                        namespace_of(obj) if isinstance(obj, Mapping) else "",
                        name_of(obj) if isinstance(obj, Mapping) else "",
                        reason,
                    )
                )
                continue
            namespace = "" if kind in CLUSTER_SCOPED else namespace_of(obj)
            table[kind][namespace, name_of(obj)] = obj
        slices: dict[tuple[str, str], list[Object]] = defaultdict(list)
        for (namespace, _), endpoint_slice in sorted(table[Kind.ENDPOINT_SLICE].items()):
            service_name = labels_of(endpoint_slice).get(SERVICE_NAME_LABEL)
            if service_name:
                slices[namespace, service_name].append(endpoint_slice)
        gateway_services: dict[tuple[str, str], list[Object]] = defaultdict(list)
        for (namespace, _), service in sorted(table[Kind.SERVICE].items()):
            annotations = meta(service).get("annotations")
            if isinstance(annotations, Mapping) and annotations.get(RELATED_GATEWAY_NAME):
                gateway_services[namespace, str(annotations[RELATED_GATEWAY_NAME])].append(service)
        return cls(
            objects=table,
            slices_by_service={key: tuple(value) for key, value in slices.items()},
            services_by_gateway={k: tuple(v) for k, v in gateway_services.items()},
            ignored=tuple(ignored),
        )

    # --- reads ----------------------------------------------------------------------------

    def get(self, kind: Kind, namespace: str, name: str) -> Object | None:
        """One object; namespace is ignored for cluster-scoped kinds."""
        return self.objects.get(kind, {}).get(("" if kind in CLUSTER_SCOPED else namespace, name))

    def all(self, kind: Kind) -> list[Object]:
        """Every object of a kind, sorted by namespace and name."""
        items = self.objects.get(kind, {})
        return [items[key] for key in sorted(items)]

    def endpoint_slices(self, namespace: str, service: str) -> tuple[Object, ...]:
        """The EndpointSlices of a Service (by their kubernetes.io/service-name label)."""
        return self.slices_by_service.get((namespace, service), ())

    def services_of_gateway(self, namespace: str, gateway_id: str) -> tuple[Object, ...]:
        """The Services of a namespace annotated related-gateway-name=<gateway ns>/<name>."""
        return self.services_by_gateway.get((namespace, gateway_id), ())

    # --- the rule table's Lookup ----------------------------------------------------------

    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.get(Kind.SECRET, namespace, name)
        return dict(obj) if obj is not None else None

    def gateway_class(self, name: str) -> dict[str, Any] | None:
        obj = self.get(Kind.GATEWAY_CLASS, "", name)
        return dict(obj) if obj is not None else None

    def gateway(self, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.get(Kind.GATEWAY, namespace, name)
        return dict(obj) if obj is not None else None

    def reference_grants(self, namespace: str) -> list[dict[str, Any]]:
        return [
            dict(obj)
            for (ns, _), obj in sorted(self.objects.get(Kind.REFERENCE_GRANT, {}).items())
            if ns == namespace
        ]

    def may_read_secret(self, namespace: str, name: str) -> bool:
        """Whether a requester may read a Secret that no ReferenceGrant opens: the reconciler's
        own rights are no reason to read across namespaces, so never."""
        return False

    def permits(
        self,
        source: tuple[str, str, str],
        target: tuple[str, str, str, str],
    ) -> bool:
        """Whether an object (group, kind, namespace) may reference (group, kind, namespace,
        name): always within a namespace; across namespaces only when a ReferenceGrant in the
        target's namespace lists the source in `from` and the target in `to`."""
        from_group, from_kind, from_namespace = source
        to_group, to_kind, to_namespace, to_name = target
        if from_namespace == to_namespace:
            return True
        for grant in self.reference_grants(to_namespace):
            spec = grant.get("spec") or {}
            sources = spec.get("from") or []
            targets = spec.get("to") or []
            if not any(
                (s.get("group") or "") == from_group
                and s.get("kind") == from_kind
                and s.get("namespace") == from_namespace
                for s in sources
                if isinstance(s, Mapping)
            ):
                continue
            if any(
                (t.get("group") or "") == to_group
                and t.get("kind") == to_kind
                and (not t.get("name") or t.get("name") == to_name)
                for t in targets
                if isinstance(t, Mapping)
            ):
                return True
        return False
