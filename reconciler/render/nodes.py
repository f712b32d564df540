"""Relay address discovery's Node addresses (a node-local dataplane: a stunnerd on every node,
handing out its node's public address), for three readers: the CDS patches each stunnerd's
config with its Node's (`node_relay_addresses`, in the Plan), the Gateway's status and the
config's public address list where clients connect (`node_public_addresses`, the Nodes the
DaemonSet runs on by their taints and its node affinity), and status says which Nodes fall back
to a private address (`relay_fallback_note`) or carry a bad annotation (`node_findings`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from stunner_api.annotations import (
    RELAY_ADDRESS_DISCOVERY_ROW,
    TARGETPORT_ROW,
    Limits,
    Refused,
    relay_address,
)
from stunner_api.dataplane import StunnerConfig
from stunner_api.vocabulary import NODE_ADDRESS_PLACEHOLDER, NODE_RELAY_ADDRESS
from stunner_api.vocabulary import ConditionReason as Reason

from ..store import Kind, Object, meta, name_of, requirement_met
from .context import Context, GatewayPlan, finding
from .inputs import annotation
from .plan import Finding, StatusUpdate


def spec_of(obj: Object | None) -> Mapping[str, Any]:
    value = (obj or {}).get("spec")
    return value if isinstance(value, Mapping) else {}


# Go's node patcher: a Node's ExternalIP, else its ExternalDNS (resolved by the CDS); then ours,
# the address the operator names in the Node's NODE_RELAY_ADDRESS annotation (an IP or a DNS
# name); no InternalIP: a node without any of these hands out what the Gateway's STUN server
# reports (stunnerd asks it), else its stunnerd pod's own address, and says so.
RELAY_ADDRESS_TYPES = ("ExternalIP", "ExternalDNS")
RELAY_ADDRESS_PATH = f'metadata.annotations["{NODE_RELAY_ADDRESS}"]'


def _named_relay_address(node: Object) -> str | Refused | None:
    """A Node's NODE_RELAY_ADDRESS annotation, parsed; None when it has none."""
    annotations = meta(node).get("annotations")
    if not isinstance(annotations, Mapping) or NODE_RELAY_ADDRESS not in annotations:
        return None
    return relay_address(str(annotations[NODE_RELAY_ADDRESS]))


def node_relay_addresses(nodes: Iterable[Object]) -> dict[str, str]:
    """Node name -> its public address for relay address discovery (RELAY_ADDRESS_TYPES, the
    first of the preferred type, else a valid NODE_RELAY_ADDRESS annotation), for the Nodes
    that have one."""
    found: dict[str, str] = {}
    for node in nodes:
        listed = [
            a
            for a in (node.get("status") or {}).get("addresses") or []
            if isinstance(a, Mapping) and a.get("address")
        ]
        for kind in RELAY_ADDRESS_TYPES:
            match = next((str(a["address"]) for a in listed if a.get("type") == kind), None)
            if match is not None:
                found[name_of(node)] = match
                break
        else:
            named = _named_relay_address(node)
            if isinstance(named, str):
                found[name_of(node)] = named
    return found


# Taints the pods of a DaemonSet tolerate without asking: the DaemonSet controller adds these
# tolerations to every pod it makes (node conditions, cordoning; network-unavailable for pods
# on the host network, as ours are).
DAEMONSET_TOLERATED = frozenset(
    f"node.kubernetes.io/{name}"
    for name in (
        "not-ready",
        "unreachable",
        "disk-pressure",
        "memory-pressure",
        "pid-pressure",
        "unschedulable",
        "network-unavailable",
    )
)


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' matching: an empty effect matches every effect; `Exists` with no key every
    key; `Equal` (the default) the key and the value."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if toleration.get("operator") == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


@dataclass(frozen=True)
class Placement:
    """Where the DaemonSet of a Dataplane runs pods: the Nodes whose NoSchedule and NoExecute
    taints its pods' tolerations allow, and that its required node affinity (the terms of
    requiredDuringSchedulingIgnoredDuringExecution; None: no such affinity) selects."""

    tolerations: tuple[Mapping[str, Any], ...] = ()
    node_selector_terms: tuple[Mapping[str, Any], ...] | None = None


def placement(dataplane: Object | None) -> Placement:
    """The Placement a Dataplane gives its stunnerd pods."""
    spec = spec_of(dataplane)
    tolerations = tuple(t for t in spec.get("tolerations") or [] if isinstance(t, Mapping))
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = (
        node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        if isinstance(node_affinity, Mapping)
        else None
    )
    if not isinstance(required, Mapping):
        return Placement(tolerations)
    terms = required.get("nodeSelectorTerms") or []
    return Placement(tolerations, tuple(t for t in terms if isinstance(t, Mapping)))


def _selects(term: Mapping[str, Any], node: Object) -> bool:
    """A NodeSelectorTerm: every matchExpressions requirement on the Node's labels and every
    matchFields one (metadata.name) holds; an empty term selects no Node (Kubernetes')."""
    expressions = [e for e in term.get("matchExpressions") or [] if isinstance(e, Mapping)]
    fields = [f for f in term.get("matchFields") or [] if isinstance(f, Mapping)]
    if not expressions and not fields:
        return False
    labels = meta(node).get("labels")
    labels = labels if isinstance(labels, Mapping) else {}
    return all(requirement_met(labels.get(str(e.get("key"))), e) for e in expressions) and all(
        requirement_met(name_of(node) if f.get("key") == "metadata.name" else None, f)
        for f in fields
    )


def runs_pods_of(node: Object, where: Placement) -> bool:
    """Whether a DaemonSet whose pods are placed `where` runs one on `node`: every NoSchedule
    and NoExecute taint of the node is tolerated, and one of the required node affinity's terms
    (if any) selects it."""
    taints = spec_of(node).get("taints") or []
    tolerations = where.tolerations
    tolerated = all(
        taint.get("key") in DAEMONSET_TOLERATED or any(_tolerates(t, taint) for t in tolerations)
        for taint in taints
        if isinstance(taint, Mapping) and taint.get("effect") in ("NoSchedule", "NoExecute")
    )
    terms = where.node_selector_terms
    return tolerated and (terms is None or any(_selects(term, node) for term in terms))


def node_public_addresses(nodes: Iterable[Object], where: Placement | None = None) -> list[str]:
    """The Nodes' public addresses for relay address discovery (`node_relay_addresses`), by
    Node name, each once: where clients reach a Gateway with a stunnerd on every node. With
    `where` (its pods' placement), only the Nodes the DaemonSet runs a pod on."""
    listed = list(nodes)
    if where is not None:
        listed = [node for node in listed if runs_pods_of(node, where)]
    found = node_relay_addresses(listed)
    return list(dict.fromkeys(found[name] for name in sorted(found)))


def node_local_addresses(ctx: Context, plan: GatewayPlan) -> tuple[list[str], Mapping[str, int]]:
    """For a Gateway with relay address discovery, the public addresses of the Nodes its
    stunnerd runs on and the ports it binds there (the targetport annotation's, else the
    listener's): clients reach the node, not a Service. ([], {}) for any other Gateway."""
    gateway_config = plan.context.gateway_config
    if gateway_config is None:
        return [], {}
    limits = Limits(ctx.rule_settings.node_port_range)
    if not annotation(RELAY_ADDRESS_DISCOVERY_ROW, plan.gateway, gateway_config, limits):
        return [], {}
    ports = annotation(TARGETPORT_ROW, plan.gateway, gateway_config, limits)
    where = placement(plan.context.dataplane)
    return node_public_addresses(ctx.snapshot.all(Kind.NODE), where), ports


def node_findings(nodes: Iterable[Object]) -> tuple[Finding, ...]:
    """A finding for each Node whose NODE_RELAY_ADDRESS annotation is not an address (the
    annotation is then ignored)."""
    found = []
    for node in sorted(nodes, key=name_of):
        named = _named_relay_address(node)
        if isinstance(named, Refused):
            found.append(finding(node, RELAY_ADDRESS_PATH, named.reason, Reason.INVALID))
    return tuple(found)


def relay_fallback_note(nodes: Iterable[Object], stun_server: str = "") -> str | None:
    """What relay address discovery says when some Nodes have no public address, None when
    every Node has one. `stun_server`: the Gateway's (RELAY_STUN_SERVER), which stunnerd there
    asks first."""
    listed = list(nodes)
    found = node_relay_addresses(listed)
    missing = sorted(name_of(node) for node in listed if name_of(node) not in found)
    if not missing:
        return None
    shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    stun = f"the address STUN server {stun_server} reports for it, else " if stun_server else ""
    return (
        f"relay address discovery: Node{'s' if len(missing) > 1 else ''} {shown} "
        f"{'have' if len(missing) > 1 else 'has'} no ExternalIP, ExternalDNS or "
        f"{NODE_RELAY_ADDRESS} annotation, so stunnerd there hands clients {stun}its pod's own "
        "address ($STUNNER_ADDR, likely private) as the relay address"
    )


def gateway_node_addresses(
    configs: Mapping[str, StunnerConfig], statuses: Iterable[StatusUpdate]
) -> dict[str, tuple[str, ...]]:
    """Config id -> the node addresses of a Gateway with a stunnerd on every node (its listeners
    at the node placeholder), as its status lists them: what the auth service turns into one
    URI per node."""
    wanted = {
        tuple(id.split("/", 1)): id
        for id, config in configs.items()
        if any(lc.address == NODE_ADDRESS_PLACEHOLDER for lc in config.listeners)
    }
    found: dict[str, tuple[str, ...]] = {id: () for id in wanted.values()}
    for update in statuses:
        id = wanted.get((update.namespace, update.name))
        if update.kind == "Gateway" and id is not None:
            listed = update.status.get("addresses") or []
            found[id] = tuple(str(a.get("value")) for a in listed if isinstance(a, Mapping))
    return found


__all__ = [
    "gateway_node_addresses",
    "DAEMONSET_TOLERATED",
    "RELAY_ADDRESS_TYPES",
    "node_findings",
    "node_local_addresses",
    "node_public_addresses",
    "node_relay_addresses",
    "placement",
    "Placement",
    "relay_fallback_note",
    "runs_pods_of",
]
