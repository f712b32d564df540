"""The cluster cut into parts that render apart: a Gateway with the routes naming it, joined
through shared routes (`Part`). The incremental render (`core.Renderer`) keeps each part's
result while what it rendered from and read still holds.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from ..store import ROUTE_KINDS, Kind, Object, Snapshot, name_of, namespace_of
from .context import GatewayKey, spec_of
from .routes import gateway_parent_refs, route_id, route_order_of

# What a cut into parts reads of the snapshot.
PART_KINDS = (Kind.GATEWAY, *ROUTE_KINDS)


@dataclass(frozen=True)
class Part:
    """Gateways and routes that render together: every route with the Gateways it names, every
    Gateway with the routes naming it, and a STUNner UDPRoute with the Gateway API one of its
    name (which it masks; a TCPRoute masks and is masked by none). Nothing outside a part
    changes what the part renders but what it reads of the snapshot, so a part whose reads
    still hold renders as it did (`Renderer`)."""

    gateways: tuple[Object, ...]  # sorted by (namespace, name), each of a class of ours
    stunner_routes: tuple[Object, ...]  # sorted
    api_routes: tuple[Object, ...]  # sorted
    tcp_routes: tuple[Object, ...] = ()  # sorted

    @property
    def members(self) -> tuple[Object, ...]:
        return (*self.gateways, *self.stunner_routes, *self.api_routes, *self.tcp_routes)

    @property
    def key(self) -> tuple[frozenset[GatewayKey], frozenset[tuple[int, str, str]]]:
        routes = (*self.stunner_routes, *self.api_routes, *self.tcp_routes)
        return (
            frozenset((namespace_of(g), name_of(g)) for g in self.gateways),
            frozenset((route_order_of(r), namespace_of(r), name_of(r)) for r in routes),
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
        g for g in snapshot.all(Kind.GATEWAY) if spec_of(g).get("gatewayClassName") in classes
    ]
    for gateway in gateways:
        find(("gateway", namespace_of(gateway), name_of(gateway)))
    routes = [route for kind in ROUTE_KINDS for route in snapshot.all(kind)]
    for route in routes:
        # The two UDPRoute kinds of one name are one node (masking); a TCPRoute's id is its own.
        node = ("route", route_id(route))
        find(node)
        for ref in gateway_parent_refs(route):
            gw_ns = str(ref.get("namespace") or namespace_of(route))
            union(node, ("gateway", gw_ns, str(ref.get("name") or "")))
    members: dict[Any, tuple[list[Object], list[Object], list[Object], list[Object]]] = {}
    for gateway in gateways:
        root = find(("gateway", namespace_of(gateway), name_of(gateway)))
        members.setdefault(root, ([], [], [], []))[0].append(gateway)
    for route in routes:
        root = find(("route", route_id(route)))
        members.setdefault(root, ([], [], [], []))[1 + route_order_of(route)].append(route)
    return [Part(tuple(g), tuple(s), tuple(a), tuple(t)) for g, s, a, t in members.values()]
