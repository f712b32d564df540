"""A Gateway listener's public address (ANCHORS §2.6), and why there is none.

One decision for three readers: render puts it in the dataplane config (`public_address`,
`public_port`) and the Gateway's status (`status.addresses`, `Programmed`); `stunner ice` and
`stunner status` read the config the CDS serves and, when a listener has none, run this same
function over the live objects to say what is missing.

The order is Go's: the Gateway's `spec.addresses[0]`; a LoadBalancer Service's ingress (the
entry naming the listener's port first); then, for a Service with node ports (NodePort, or a
LoadBalancer whose ingress has not come), a Node's address and the listener's nodePort. Go takes
a Node's ExternalIP, else its ExternalDNS, and stops there; we add the InternalIP as the last
resort: on bare-metal, kubeadm and kind clusters Nodes carry only an InternalIP, it is the
address the NodePort answers on, and without it `ice` handed out `0.0.0.0`. A LoadBalancer
ingress, once it arrives, replaces the node address (a public address changes in place).

The addresses stage (`listener_addresses`) asks it for each rendered listener of a Gateway.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from stunner_api.vocabulary import SERVICE_TYPE
from stunner_api.vocabulary import ConditionReason as Reason

from ..store import Kind, Object, meta, name_of, namespace_of
from .context import Context, GatewayPlan, Public, Staged, finding
from .nodes import node_local_addresses
from .plan import Finding

# Preferred first: Go's two, then ours (see the module's note).
NODE_ADDRESS_TYPES = ("ExternalIP", "ExternalDNS", "InternalIP")
# An ExternalName Service exposes nothing (an alias, no address, no ports): never the
# Gateway's (Go v2.0.2 "drop the ExternalName service type").
SERVICE_TYPE_RANK = {"LoadBalancer": 0, "NodePort": 1, "ClusterIP": 2}
NO_PORT_HINT = "enable mixed-protocol-LB support to expose listeners of both transports"


@dataclass(frozen=True)
class PublicAddress:
    """A listener's public address and port, where it came from; or, with `address` empty,
    what is missing (`missing`, a phrase to follow "has no public address yet: ")."""

    address: str = ""
    port: int = 0
    source: str = ""
    missing: str = ""
    no_port: bool = False  # the Service has no port for the listener (a finding in render)
    # Every other address the port answers on (a dual-stack LoadBalancer's ingress IPs of the
    # other family, Go v2.0.2 "collect every load-balancer IP of a port"): the Gateway's
    # status lists them after `address`.
    also: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.address)


def spec_of(obj: Object | None) -> Mapping[str, Any]:
    value = (obj or {}).get("spec")
    return value if isinstance(value, Mapping) else {}


def _id(obj: Object) -> str:
    return f"{namespace_of(obj)}/{name_of(obj)}"


def gateway_service(gateway: Object, services: Iterable[Object]) -> Object | None:
    """The Service exposing a Gateway among `services` (those of its namespace annotated with
    it): owned by it when its uid is known, a LoadBalancer before a NodePort before a
    ClusterIP one; an ExternalName one never."""
    uid = meta(gateway).get("uid")
    candidates = [
        svc
        for svc in services
        if _service_type(svc) in SERVICE_TYPE_RANK
        and (
            not uid
            or any(o.get("uid") == uid for o in meta(svc).get("ownerReferences") or [])
            or (name_of(svc) == name_of(gateway) and not meta(svc).get("ownerReferences"))
        )
    ]
    candidates.sort(key=lambda svc: SERVICE_TYPE_RANK[_service_type(svc)])
    return candidates[0] if candidates else None


def _service_type(service: Object) -> str:
    return str(spec_of(service).get("type") or "ClusterIP")


def node_address(nodes: Iterable[Object]) -> tuple[str, str] | None:
    """The first Node address by type preference (NODE_ADDRESS_TYPES), nodes in the order
    given: (address, "Node NAME's TYPE")."""
    listed = list(nodes)
    for kind in NODE_ADDRESS_TYPES:
        for node in listed:
            for address in (node.get("status") or {}).get("addresses") or []:
                if (
                    isinstance(address, Mapping)
                    and address.get("type") == kind
                    and address.get("address")
                ):
                    return str(address["address"]), f"Node {name_of(node)}'s {kind}"
    return None


def public_address(
    gateway: Object,
    service: Object | None,
    nodes: Iterable[Object],
    port: int,
    transport: str,
) -> PublicAddress:
    """The public address of a Gateway listener on `port`/`transport` (see the module)."""
    addresses = spec_of(gateway).get("addresses") or []
    if addresses and isinstance(addresses[0], Mapping) and addresses[0].get("value"):
        return PublicAddress(str(addresses[0]["value"]), port, "the Gateway's spec.addresses")
    if service is None:
        return PublicAddress(missing="no Service exposes it yet")
    svc, type_ = _id(service), _service_type(service)
    service_port = next(
        (
            p
            for p in spec_of(service).get("ports") or []
            if isinstance(p, Mapping)
            and p.get("port") == port
            and (p.get("protocol") or "TCP") == transport
        ),
        None,
    )
    if service_port is None:
        return PublicAddress(
            missing=f"no {transport} port {port} on Service {svc}: {NO_PORT_HINT}",
            no_port=True,
        )
    if type_ == "LoadBalancer":
        ingress = [
            i
            for i in ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
            if isinstance(i, Mapping)
        ]
        chosen = next(
            (i for i in ingress if _names_port(i, port, transport)),
            ingress[0] if ingress else None,
        )
        if chosen is not None and (chosen.get("ip") or chosen.get("hostname")):
            address = str(chosen.get("ip") or chosen.get("hostname"))
            # Every ingress entry of the port (those naming it, else every one: an ingress
            # without ports serves them all), each address once, in the order given.
            same = [i for i in ingress if i is chosen or _names_port(i, port, transport)]
            if not _names_port(chosen, port, transport):
                same = [i for i in ingress if not i.get("ports")] or [chosen]
            also = [str(i.get("ip") or i.get("hostname") or "") for i in same]
            others = tuple(dict.fromkeys(a for a in also if a and a != address))
            return PublicAddress(address, port, "LoadBalancer ingress", also=others)
    node_port = service_port.get("nodePort")
    if isinstance(node_port, int) and node_port > 0:
        found = node_address(nodes)
        if found is not None:
            return PublicAddress(found[0], node_port, f"{found[1]} and nodePort {node_port}")
        lb = "no LoadBalancer ingress, " if type_ == "LoadBalancer" else ""
        return PublicAddress(
            missing=f"its Service {svc} ({type_}) has no public address yet ({lb}nodePort "
            f"{node_port} but no Node with an address: {'/'.join(NODE_ADDRESS_TYPES)})"
        )
    if type_ == "LoadBalancer":
        return PublicAddress(
            missing=f"its Service {svc} (LoadBalancer) has no public address yet (no "
            "LoadBalancer ingress, no node port): is there a load-balancer controller?"
        )
    return PublicAddress(
        missing=f"its Service {svc} is of type {type_}, which has no public address: set the "
        f"Gateway's {SERVICE_TYPE} annotation to LoadBalancer or NodePort, or give the Gateway "
        "spec.addresses"
    )


def _names_port(ingress: Mapping[str, Any], port: int, transport: str) -> bool:
    return any(
        isinstance(s, Mapping)
        and s.get("port") == port
        and (s.get("protocol") or "TCP") == transport
        for s in ingress.get("ports") or []
    )


def listener_addresses(ctx: Context, plan: GatewayPlan) -> Staged[tuple[Public | None, ...]]:
    """The stage: the public (address, port) of each listener of a rendered Gateway, in the
    order of `plan.listeners` (None for one not rendered or without an address); a finding for
    each listener its Service has no port for."""
    gateway = plan.gateway
    rendered = any(lst.rendered for lst in plan.listeners)
    services = (
        ctx.snapshot.services_of_gateway(namespace_of(gateway), _id(gateway)) if rendered else ()
    )
    service = gateway_service(gateway, services)
    nodes = ctx.snapshot.all(Kind.NODE) if rendered else []
    node_local, host_ports = node_local_addresses(ctx, plan) if rendered else ([], {})
    publics: list[Public | None] = []
    found: list[Finding] = []
    for lst in plan.listeners:
        if lst.rendered and node_local:  # the first node's; status and ICE list every node
            publics.append(Public(node_local[0], host_ports.get(lst.name, lst.port or 0)))
            continue
        address = (
            public_address(gateway, service, nodes, lst.port or 0, lst.transport)
            if lst.rendered
            else PublicAddress()
        )
        publics.append(Public(address.address, address.port, address.also) if address else None)
        if address.no_port:
            path = f"spec.listeners[{lst.index}]"
            found.append(finding(gateway, path, address.missing, Reason.ADDRESS_NOT_ASSIGNED))
    return Staged(tuple(publics), tuple(found))


__all__ = [
    "NODE_ADDRESS_TYPES",
    "PublicAddress",
    "gateway_service",
    "listener_addresses",
    "node_address",
    "public_address",
]
