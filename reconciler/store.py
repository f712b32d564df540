"""The reconciler's cache: the objects of every watched kind (`Cache`, filled by the watches of
`reconciler.kube.informer` and the writes' answers) and the snapshot of them render reads.

`Snapshot.from_objects(objects)` takes raw Kubernetes JSON dicts (from watches, from YAML files)
and indexes them by kind, namespace and name. It answers the rule table's `Lookup` from what it
holds, so render judges objects with exactly the rules the webhook uses: a Secret the snapshot
holds is one the reconciler may read (it watches them with its own rights); a reference across
namespaces is still permitted only by a ReferenceGrant (`Snapshot.permits`).

Objects are kept as the dicts given (never copied or changed): a snapshot is a value for one
render. An object of a kind the operator does not read is not kept; `ignored` names it.

The `Cache` is shared by the watch threads and the asyncio loop (a lock, no asyncio): it is
*fresh* while every kind has listed once and no kind has been failing for longer than
`stale_after` seconds (`Cache.freshness`). Every change is offered to `on_change` (cluster mode
decides whether it is worth a render).

The kinds come from the vocabulary's kinds table: `Kind` names its rendered rows for render,
`WATCHED` its watched rows for the informers.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from stunner_api import vocabulary
from stunner_api.vocabulary import (
    OWNED_BY_LABEL,
    OWNED_BY_VALUE,
    RELATED_GATEWAY_NAME,
    RENDERED_KINDS,
    WATCHED_KINDS,
    KindInfo,
    group_of,
)

Object = Mapping[str, Any]

SERVICE_NAME_LABEL = "kubernetes.io/service-name"  # EndpointSlice -> its Service


class Kind(StrEnum):
    """Render's names for the kinds it reads: the rendered rows of the vocabulary's kinds table
    (every served version of each is one kind here). A rendered row without a name here fails
    at import (`KINDS`)."""

    GATEWAY_CLASS = vocabulary.GATEWAY_CLASS.name
    GATEWAY_CONFIG = vocabulary.GATEWAY_CONFIG.name
    DATAPLANE = vocabulary.DATAPLANE.name
    GATEWAY = vocabulary.GATEWAY.name
    STUNNER_UDP_ROUTE = vocabulary.STUNNER_UDP_ROUTE.name
    GATEWAY_API_UDP_ROUTE = vocabulary.GATEWAY_API_UDP_ROUTE.name
    GATEWAY_API_TCP_ROUTE = vocabulary.GATEWAY_API_TCP_ROUTE.name
    STATIC_SERVICE = vocabulary.STATIC_SERVICE.name
    SERVICE = vocabulary.SERVICE.name
    ENDPOINT_SLICE = vocabulary.ENDPOINT_SLICE.name
    SECRET = vocabulary.SECRET.name
    NAMESPACE = vocabulary.NAMESPACE.name
    NODE = vocabulary.NODE.name
    REFERENCE_GRANT = vocabulary.REFERENCE_GRANT.name


# The routes: each names parent Gateways and backends, and becomes a cluster where it attaches.
ROUTE_KINDS = (Kind.STUNNER_UDP_ROUTE, Kind.GATEWAY_API_UDP_ROUTE, Kind.GATEWAY_API_TCP_ROUTE)

# (API group, kind) -> Kind, from the table's rendered rows.
KINDS: Mapping[tuple[str, str], Kind] = {(k.group, k.kind): Kind(k.name) for k in RENDERED_KINDS}
CLUSTER_SCOPED = frozenset(Kind(k.name) for k in RENDERED_KINDS if not k.namespaced)


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


def node_facts(node: Object) -> tuple[Any, Any, Any, Any]:
    """What render reads of a Node, and so what a change must re-render (the event filter and
    the incremental render both ask): its addresses (public address discovery), its relay
    address annotation (relay address discovery), its taints and labels (which Nodes a
    node-local DaemonSet runs on: tolerations, node affinity); not its heartbeats."""
    status = node.get("status")
    addresses = status.get("addresses") if isinstance(status, Mapping) else None
    annotations = meta(node).get("annotations")
    named = (
        annotations.get(vocabulary.NODE_RELAY_ADDRESS) if isinstance(annotations, Mapping) else None
    )
    spec = node.get("spec")
    taints = spec.get("taints") if isinstance(spec, Mapping) else None
    return addresses, named, taints, meta(node).get("labels")


def labels_of(obj: Object) -> Mapping[str, str]:
    value = meta(obj).get("labels")
    return value if isinstance(value, Mapping) else {}


LABEL_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def requirement_met(value: str | None, requirement: Mapping[str, Any]) -> bool:
    """One selector requirement (a LabelSelector's matchExpressions item, a
    NodeSelectorRequirement) against the value of its key, None when the key is absent: In,
    NotIn, Exists, DoesNotExist, and a node selector's Gt/Lt comparing integers. An unknown
    operator selects nothing, as the API server refuses it."""
    operator, values = requirement.get("operator"), requirement.get("values") or []
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def matches_selector(labels: Mapping[str, str], selector: Mapping[str, Any]) -> bool:
    """A Kubernetes LabelSelector (matchLabels and matchExpressions) against labels."""
    match_labels = selector.get("matchLabels") or {}
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    return all(
        expr.get("operator") in LABEL_SELECTOR_OPERATORS
        and requirement_met(labels.get(expr.get("key")), expr)
        for expr in selector.get("matchExpressions") or []
    )


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

    def gateways(self) -> list[dict[str, Any]]:
        return [dict(obj) for obj in self.all(Kind.GATEWAY)]

    def gateway_config(self, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.get(Kind.GATEWAY_CONFIG, namespace, name)
        return dict(obj) if obj is not None else None

    def dataplane(self, name: str) -> dict[str, Any] | None:
        obj = self.get(Kind.DATAPLANE, "", name)
        return dict(obj) if obj is not None else None

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


# --- the cache the watches fill -----------------------------------------------------------------

STALE_AFTER = 60.0  # seconds a kind's watch may be failing before the cache is not fresh


@dataclass(frozen=True)
class Watched:
    """One kind the reconciler lists and watches (a watched row of the kinds table)."""

    info: KindInfo

    @property
    def versions(self) -> tuple[str, ...]:
        """In order of preference: the first the API server serves is watched."""
        return self.info.watch

    @property
    def label_selector(self) -> str:
        return f"{OWNED_BY_LABEL}={OWNED_BY_VALUE}" if self.info.owned_only else self.info.selector

    @property
    def rendered(self) -> bool:
        """Handed to render (the Deployments are only compared with the plan, the Pods tell
        the CDS who may report usage)."""
        return self.info.rendered

    @property
    def name(self) -> str:
        return self.info.name


WATCHED: tuple[Watched, ...] = tuple(Watched(info) for info in WATCHED_KINDS)

Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped kinds
OnChange = Callable[[Object | None, Object | None], None]  # (new, old), from a watch thread


def _key(obj: Object) -> Key:
    return (str(meta(obj).get("namespace") or ""), str(meta(obj).get("name") or ""))


def _rv(obj: Object | None) -> int:
    try:
        return int(meta(obj or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


@dataclass
class KindState:
    objects: dict[Key, Object] = field(default_factory=dict)
    synced: bool = False
    failing_since: float | None = None
    version: str = ""


class Cache:
    """The objects of every watched kind, shared by the watch threads and the asyncio loop."""

    def __init__(
        self,
        watched: Sequence[Watched] = WATCHED,
        stale_after: float = STALE_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.watched = tuple(watched)
        self.stale_after = stale_after
        self.clock = clock
        self._lock = threading.Lock()
        self._kinds: dict[Watched, KindState] = {w: KindState() for w in self.watched}
        self.on_change: OnChange = lambda new, old: None
        self.changes = 0  # objects put, removed or relisted so far

    def _state(self, api_version: str, kind: str) -> KindState | None:
        for watched, state in self._kinds.items():
            if watched.info.kind == kind and watched.info.group == group_of(api_version):
                return state
        return None

    def _state_of(self, watched: Watched | None, obj: Object) -> KindState | None:
        """The state of `watched`, or (None: a write's answer) of the object's own kind."""
        if watched is not None:
            return self._kinds.get(watched)
        return self._state(str(obj.get("apiVersion")), str(obj.get("kind")))

    # --- writes from the watch threads (and from the API server's answers) --------------------

    def replace(self, watched: Watched, items: Sequence[Object], version: str) -> None:
        """A fresh list of one kind: the changes it makes are offered to `on_change`."""
        new = {_key(item): item for item in items}
        with self._lock:
            state = self._kinds[watched]
            old = state.objects
            state.objects, state.synced, state.failing_since = new, True, None
            state.version = version
            self.changes += len(new)
        for key in old.keys() - new.keys():
            self.on_change(None, old[key])
        for key, obj in new.items():
            if _rv(old.get(key)) != _rv(obj):
                self.on_change(obj, old.get(key))

    def put(self, watched: Watched | None, obj: Object) -> None:
        """An object as the API server has it now (older versions than the cached are ignored)."""
        with self._lock:
            state = self._state_of(watched, obj)
            if state is None:
                return
            old = state.objects.get(_key(obj))
            if old is not None and _rv(old) >= _rv(obj):
                return
            state.objects[_key(obj)] = obj
            self.changes += 1
        self.on_change(obj, old)

    def remove(self, watched: Watched | None, obj: Object) -> None:
        with self._lock:
            state = self._state_of(watched, obj)
            if state is None:
                return
            old = state.objects.pop(_key(obj), None)
            self.changes += 1
        if old is not None:
            self.on_change(None, old)

    def healthy(self, watched: Watched) -> None:
        with self._lock:
            self._kinds[watched].failing_since = None

    def failing(self, watched: Watched) -> None:
        with self._lock:
            state = self._kinds[watched]
            if state.failing_since is None:
                state.failing_since = self.clock()

    # --- reads ---------------------------------------------------------------------------------

    def rendered_objects(self) -> list[Object]:
        """Every object render reads (not the Deployments)."""
        with self._lock:
            return [
                obj
                for watched, state in self._kinds.items()
                if watched.rendered
                for obj in state.objects.values()
            ]

    def all_of(self, kind: str) -> list[Object]:
        with self._lock:
            return [
                obj
                for watched, state in self._kinds.items()
                if watched.info.kind == kind
                for obj in state.objects.values()
            ]

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Object | None:
        with self._lock:
            state = self._state(api_version, kind)
            return state.objects.get((namespace, name)) if state is not None else None

    @property
    def synced(self) -> bool:
        with self._lock:
            return all(state.synced for state in self._kinds.values())

    def freshness(self) -> tuple[bool, str]:
        """(fresh, why not): every kind listed once, none failing for more than stale_after."""
        now = self.clock()
        with self._lock:
            unsynced = [w.name for w, s in self._kinds.items() if not s.synced]
            stale = [
                f"{w.name} ({now - s.failing_since:.0f} s)"
                for w, s in self._kinds.items()
                if s.failing_since is not None and now - s.failing_since > self.stale_after
            ]
        if unsynced:
            return False, "not listed yet: " + ", ".join(unsynced)
        if stale:
            return False, "watch failing for longer than the limit: " + ", ".join(stale)
        return True, "cache fresh"
