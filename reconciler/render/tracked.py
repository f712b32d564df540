"""A snapshot that remembers what was read of it, so that a render of one part of the cluster
can later be shown to still hold: everything it read is the same in the newer snapshot.

Every read render makes goes through `get`, `all`, `endpoint_slices`, `services_of_gateway` and
`reference_grants` (the rule table's lookups `secret`, `gateway_class`, `gateway` and `permits`
are built on them). A read is recorded with what it answered; `Reads.hold(snapshot)` asks the
same questions of a newer snapshot and compares the answers object by object: the very same
object (the cache replaces an object's dict when it changes, never edits it), or one equal to
it but for the bookkeeping metadata (`resourceVersion`, `managedFields`: a relist hands out new
dicts of unchanged objects). A GatewayClass or Gateway read is compared without its `status`:
the rules read a Gateway's class and a route's parent Gateways for their spec, render a
Gateway for its existence (a part's own members, whose status render does read, are compared
by the part, `core._members_hold`), and every Gateway (`all`, the host-network port clash rule)
for its spec;
the Nodes are compared by their names and addresses only (render reads nothing else of them,
and their status changes with every heartbeat).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..store import Kind, Object, Snapshot, name_of, node_facts

# (method, arguments) -> what it answered: an object or None (get), or a tuple of objects.
ReadKey = tuple[str, tuple[Any, ...]]
_BOOKKEEPING = frozenset({"resourceVersion", "managedFields"})


def _content(obj: Object, status: bool) -> dict[str, Any]:
    out = {k: v for k, v in obj.items() if k != "metadata" and (status or k != "status")}
    metadata = obj.get("metadata")
    if isinstance(metadata, Mapping):
        out["metadata"] = {k: v for k, v in metadata.items() if k not in _BOOKKEEPING}
    return out


def same(new: Object | None, old: Object | None, *, status: bool = True) -> bool:
    """Whether `new` is `old` for render: the same object, or equal but for bookkeeping (and
    `status`, when `status` is false)."""
    if new is old:
        return True
    if new is None or old is None:
        return False
    return _content(new, status) == _content(old, status)


def same_all(new: tuple[Object, ...], old: tuple[Object, ...]) -> bool:
    return len(new) == len(old) and all(same(a, b) for a, b in zip(new, old, strict=True))


@dataclass(frozen=True)
class Tracked(Snapshot):
    """`snapshot`'s objects, every read of them recorded in `reads`."""

    reads: dict[ReadKey, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, snapshot: Snapshot) -> Tracked:
        return cls(
            objects=snapshot.objects,
            slices_by_service=snapshot.slices_by_service,
            services_by_gateway=snapshot.services_by_gateway,
            ignored=snapshot.ignored,
        )

    def get(self, kind: Kind, namespace: str, name: str) -> Object | None:
        found = super().get(kind, namespace, name)
        self.reads["get", (kind, namespace, name)] = found
        return found

    def all(self, kind: Kind) -> list[Object]:
        found = super().all(kind)
        self.reads["all", (kind,)] = tuple(found)
        return found

    def endpoint_slices(self, namespace: str, service: str) -> tuple[Object, ...]:
        found = super().endpoint_slices(namespace, service)
        self.reads["endpoint_slices", (namespace, service)] = found
        return found

    def services_of_gateway(self, namespace: str, gateway_id: str) -> tuple[Object, ...]:
        found = super().services_of_gateway(namespace, gateway_id)
        self.reads["services_of_gateway", (namespace, gateway_id)] = found
        return found

    def reference_grants(self, namespace: str) -> list[dict[str, Any]]:
        found = _grants(self, namespace)
        self.reads["reference_grants", (namespace,)] = found
        return [dict(obj) for obj in found]


def _grants(snapshot: Snapshot, namespace: str) -> tuple[Object, ...]:
    return tuple(
        obj
        for (ns, _), obj in sorted(snapshot.objects.get(Kind.REFERENCE_GRANT, {}).items())
        if ns == namespace
    )


def same_kinds(old: Snapshot, new: Snapshot, kinds: Iterable[Kind]) -> bool:
    """Whether `new` holds the very objects `old` does of every kind in `kinds`."""
    for kind in kinds:
        before, after = old.objects.get(kind, {}), new.objects.get(kind, {})
        if len(before) != len(after):
            return False
        for key, obj in after.items():
            if before.get(key) is not obj:
                return False
    return True


def _node_facts(nodes: Any) -> list[Any]:
    """What render reads of the Nodes: their names and `node_facts` (not their heartbeats)."""
    return [
        (name_of(node), node_facts(node)) if isinstance(node, Mapping) else None for node in nodes
    ]


def hold(reads: Mapping[ReadKey, Any], snapshot: Snapshot) -> bool:
    """Whether every recorded read answers the same of `snapshot` (see the module's
    docstring)."""
    for (method, args), old in reads.items():
        if method == "get":
            kind, namespace, name = args
            status = kind not in (Kind.GATEWAY_CLASS, Kind.GATEWAY)
            if not same(Snapshot.get(snapshot, kind, namespace, name), old, status=status):
                return False
        elif method == "all" and args[0] == Kind.NODE:
            if _node_facts(Snapshot.all(snapshot, Kind.NODE)) != _node_facts(old):
                return False
        elif method == "all" and args[0] == Kind.GATEWAY:  # the rules read their specs
            new = Snapshot.all(snapshot, Kind.GATEWAY)
            if len(new) != len(old) or not all(
                same(a, b, status=False) for a, b in zip(new, old, strict=True)
            ):
                return False
        elif method == "all":
            if not same_all(tuple(Snapshot.all(snapshot, args[0])), old):
                return False
        elif method == "endpoint_slices":
            if not same_all(Snapshot.endpoint_slices(snapshot, *args), old):
                return False
        elif method == "services_of_gateway":
            if not same_all(Snapshot.services_of_gateway(snapshot, *args), old):
                return False
        elif method == "reference_grants":
            if not same_all(_grants(snapshot, args[0]), old):
                return False
        else:  # pragma: no cover  (every method above records one of these)
            return False
    return True
