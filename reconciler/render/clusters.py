"""The cluster of a UDPRoute (ANCHORS §2.3) or a TCPRoute: what the routes stage gives a route
it attaches.

The EndpointSlice addresses of Service backends (every one, ready or not: the list is a
permission, and a starting or terminating pod still carries calls, of both families) plus
every ClusterIP (`spec.clusterIPs`, both of a dual-stack Service); never an ExternalName
Service (a DNS alias out of the cluster: a problem, as Go v2.0.2 drops it),
StaticService prefixes, the `:<port-endPort>` suffix; STRICT_DNS cluster DNS names when
endpoint discovery is off.

Unlike Go STUNner, a backend in another namespace needs a ReferenceGrant there, and a cluster
whose backends are all TCP Service ports is a TCP cluster (Go always renders UDP). A Gateway API
TCPRoute's cluster is always of protocol TCP (the peers of RFC 6062 TCP allocations), named
"tcp:<namespace>/<name>", and its backends' port and endPort apply as a STUNner UDPRoute's do
(the port is the one TCP peers are reached on; a Gateway API UDPRoute's is ignored).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stunner_api.endpoints import is_ip
from stunner_api.vocabulary import BACKEND_KINDS, GATEWAY_API_TCP_ROUTE, STUNNER_GROUP, group_of
from stunner_api.vocabulary import ConditionReason as Reason

from ..store import Kind, Object, Snapshot, name_of, namespace_of
from .plan import RenderSettings

TCP_CLUSTER_PREFIX = "tcp:"  # a TCPRoute's cluster: "tcp:<namespace>/<name>"


def _spec(obj: Object | None) -> Mapping[str, Any]:
    value = (obj or {}).get("spec")
    return value if isinstance(value, Mapping) else {}


@dataclass
class Cluster:
    """One route's cluster and what went wrong resolving its backends."""

    name: str
    type: str = "STATIC"
    protocol: str = "UDP"
    endpoints: list[str] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (reason, message)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "protocol": self.protocol,
            "endpoints": sorted(set(self.endpoints)),
        }


def _port_suffix(ref: Mapping[str, Any], ports_apply: bool) -> str:
    port, end_port = ref.get("port"), ref.get("endPort")
    if not ports_apply or not isinstance(port, int):
        return ""
    end = end_port if isinstance(end_port, int) else port
    return f":<{port}-{end}>"


def _service_addresses(service: Object, snapshot: Snapshot, settings: RenderSettings) -> list[str]:
    namespace, name = namespace_of(service), name_of(service)
    out: list[str] = []
    for endpoint_slice in snapshot.endpoint_slices(namespace, name):
        if endpoint_slice.get("addressType") not in ("IPv4", "IPv6", None):
            continue  # FQDN slices carry names, not addresses
        for endpoint in endpoint_slice.get("endpoints") or []:
            out += [a for a in endpoint.get("addresses") or [] if is_ip(str(a))]
    if settings.relay_to_cluster_ip:
        spec = _spec(service)
        cluster_ips = spec.get("clusterIPs") or [spec.get("clusterIP")]
        out += [str(ip) for ip in cluster_ips if ip and ip != "None" and is_ip(str(ip))]
    return out


def _service_transports(service: Object, ref: Mapping[str, Any]) -> set[str]:
    """The protocols of the Service ports a backendRef's port range selects."""
    port, end_port = ref.get("port"), ref.get("endPort")
    if not isinstance(port, int):
        return {"UDP"}  # every port: the route is about media, which is UDP
    end = end_port if isinstance(end_port, int) else port
    selected = [
        str(p.get("protocol") or "TCP")
        for p in _spec(service).get("ports") or []
        if isinstance(p, Mapping) and isinstance(p.get("port"), int) and port <= p["port"] <= end
    ]
    return set(selected) or {"UDP"}


def cluster(
    route: Object, snapshot: Snapshot, settings: RenderSettings, cluster_name: str
) -> Cluster:
    """The cluster `cluster_name` of a route: its first rule's backends (the other rules are not
    used)."""
    route_namespace, route_group = namespace_of(route), group_of(str(route.get("apiVersion")))
    route_kind = str(route.get("kind"))
    tcp_route = route_kind == GATEWAY_API_TCP_ROUTE.kind
    result = Cluster(name=cluster_name)
    rules_ = [r for r in _spec(route).get("rules") or [] if isinstance(r, Mapping)]
    refs = (
        [r for r in (rules_[0].get("backendRefs") or []) if isinstance(r, Mapping)]
        if rules_
        else []
    )
    # The Gateway API UDPRoute's port is required by its schema and ignored (GATEWAY.md).
    ports_apply = route_group == STUNNER_GROUP or tcp_route
    resolved: list[tuple[str, list[str]]] = []  # (cluster type, endpoints) per backend
    transports: set[str] = set()
    for ref in refs:
        group, kind = str(ref.get("group") or ""), str(ref.get("kind") or "Service")
        namespace, name = str(ref.get("namespace") or route_namespace), str(ref.get("name") or "")
        where = f"{kind} {namespace}/{name}"
        if (group, kind) not in BACKEND_KINDS:
            result.problems.append(
                (Reason.INVALID_KIND, f"backend group {group!r} kind {kind!r} is not supported")
            )
            continue
        if not snapshot.permits(
            (route_group, route_kind, route_namespace), (group, kind, namespace, name)
        ):
            result.problems.append(
                (
                    Reason.REF_NOT_PERMITTED,
                    f"backend {where} is in another namespace and no ReferenceGrant there "
                    f"permits {route_kind}s of {route_namespace}",
                )
            )
            continue
        suffix = _port_suffix(ref, ports_apply)
        if kind == "StaticService":
            static = snapshot.get(Kind.STATIC_SERVICE, namespace, name)
            if static is None:
                result.problems.append((Reason.BACKEND_NOT_FOUND, f"backend {where} not found"))
                continue
            transports.add("UDP")
            prefixes = [str(p) for p in _spec(static).get("prefixes") or []]
            resolved.append(("STATIC", [f"{p}{suffix}" for p in prefixes]))
            continue
        service = snapshot.get(Kind.SERVICE, namespace, name)
        if service is None:
            result.problems.append((Reason.BACKEND_NOT_FOUND, f"backend {where} not found"))
            continue
        if _spec(service).get("type") == "ExternalName":
            # A DNS alias out of the cluster (Go v2.0.2 drops it): its name would resolve,
            # without endpoint discovery, to whatever host it names outside the policy.
            result.problems.append(
                (
                    Reason.INVALID_KIND,
                    f"backend {where} is an ExternalName Service (an alias of "
                    f"{_spec(service).get('externalName') or 'another name'}): not relayed to",
                )
            )
            continue
        transports |= _service_transports(service, ref) if ports_apply else {"UDP"}
        if settings.endpoint_discovery:
            addresses = _service_addresses(service, snapshot, settings)
            resolved.append(("STATIC", [f"{a}{suffix}" for a in addresses]))
        else:
            resolved.append(("STRICT_DNS", [f"{name}.{namespace}.svc.{settings.cluster_domain}"]))
    if resolved:
        result.type = resolved[0][0]
        result.endpoints = [e for t, endpoints in resolved if t == result.type for e in endpoints]
        if any(t != result.type for t, _ in resolved):
            result.problems.append(
                (
                    Reason.BACKEND_NOT_FOUND,
                    "inconsistent cluster type for backends: StaticServices (STATIC) and "
                    "Services without endpoint discovery (STRICT_DNS) cannot share a route",
                )
            )
    result.protocol = "TCP" if tcp_route or transports == {"TCP"} else "UDP"
    return result
