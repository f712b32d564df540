"""The Service of a Gateway (ANCHORS §2.4, managed mode), and what it shares with the Deployment
(deployment.py): metadata, labels, owner references, copies of input values, annotations.

Both are named after the Gateway, live in its namespace and are owned by it (when its uid is
known: objects read from files have none). The Service rendered here is the operator's intent;
keeping the fields others set on the live Service (nodePorts, loadBalancerClass, user labels) is
the applier's job.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from stunner_api.annotations import (
    DISABLE_HEALTH_CHECK_EXPOSE_ROW,
    DISABLE_SESSION_AFFINITY_ROW,
    EXTERNAL_TRAFFIC_POLICY_ROW,
    MIXED_PROTOCOL_LB_ROW,
    NODEPORT_ROW,
    SERVICE_TYPE_ROW,
    TARGETPORT_ROW,
    Annotation,
    Limits,
    text_of,
)
from stunner_api.vocabulary import (
    APP_LABEL,
    APP_VALUE,
    GATEWAY,
    OWNED_BY_LABEL,
    OWNED_BY_VALUE,
    RELATED_GATEWAY_NAME,
    RELATED_GATEWAY_NAMESPACE,
)

from ..store import Object, meta, name_of, namespace_of
from .context import Context, GatewayPlan, Staged

HEALTH_CHECK_PORT_NAME = "gateway-health-check"
HEALTH_PORT_ANNOTATION = re.compile(r"^service\.beta\.kubernetes\.io/.*health.*port$")
HEALTH_PROTOCOL_ANNOTATION = re.compile(r"^service\.beta\.kubernetes\.io/.*health.*protocol$")


T = TypeVar("T")

_SCALARS = (str, int, float, bool, type(None))


def _copy(value: Any) -> Any:
    """A deep copy of a JSON value: its dicts and lists are rebuilt and its scalars shared, much
    faster than copy.deepcopy; anything else (not from JSON or YAML) goes to copy.deepcopy."""
    if type(value) is dict:
        return {k: _copy(v) for k, v in value.items()}
    if type(value) is list:
        return [_copy(v) for v in value]
    if isinstance(value, _SCALARS):
        return value
    return copy.deepcopy(value)


def _map(value: Any) -> dict[str, Any]:
    """A deep copy of a mapping taken from an input object (a manifest never shares state with
    the snapshot), {} for anything else."""
    return {k: _copy(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


_EMPTY: Mapping[str, Any] = {}


def _view(value: Any) -> Mapping[str, Any]:
    """A mapping taken from an input object, only to be read (no copy), {} for anything else.
    What goes into a manifest from it is copied there (`_map`) or is a scalar."""
    return value if isinstance(value, Mapping) else _EMPTY


def annotation(row: Annotation[T], gateway: Object, gateway_config: Object, limits: Limits) -> T:
    """A STUNner annotation's value for a Gateway, read by its row of the annotation table from
    the Gateway and its GatewayConfig's loadBalancerServiceAnnotations."""
    return row.value(
        _view(meta(gateway).get("annotations")),
        _view(_view(gateway_config.get("spec")).get("loadBalancerServiceAnnotations")),
        limits,
    )


def owner_references(gateway: Object) -> list[dict[str, Any]]:
    uid = meta(gateway).get("uid")
    if not uid:
        return []
    return [
        {
            "apiVersion": str(gateway.get("apiVersion") or GATEWAY.api_versions[0]),
            "kind": "Gateway",
            "name": name_of(gateway),
            "uid": str(uid),
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def _metadata(
    gateway: Object, labels: dict[str, str], annotations: dict[str, str]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": name_of(gateway),
        "namespace": namespace_of(gateway),
        "labels": labels,
        "annotations": annotations,
    }
    owners = owner_references(gateway)
    if owners:
        out["ownerReferences"] = owners
    return out


def related_labels(gateway: Object) -> dict[str, str]:
    return {
        RELATED_GATEWAY_NAME: name_of(gateway),
        RELATED_GATEWAY_NAMESPACE: namespace_of(gateway),
    }


def _gateway_id(gateway: Object) -> str:
    return f"{namespace_of(gateway)}/{name_of(gateway)}"


# --- the stage --------------------------------------------------------------------------------


def service_of(ctx: Context, plan: GatewayPlan) -> Staged[dict[str, Any] | None]:
    """The stage: the Service of a Gateway whose config rendered (`service`)."""
    assert plan.context.gateway_config is not None
    ports = [
        ServicePort(lst.name, lst.port or 0, lst.transport)
        for lst in plan.listeners
        if lst.rendered
    ]
    limits = Limits(ctx.rule_settings.node_port_range)
    return Staged(service(plan.gateway, plan.context.gateway_config, ports, limits))


# --- Service ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServicePort:
    """A rendered listener as the Service exposes it."""

    name: str
    port: int
    transport: str  # "UDP" | "TCP"


def service_annotations(gateway: Object, gateway_config: Object) -> dict[str, str]:
    """GatewayConfig loadBalancerServiceAnnotations, overridden by the Gateway's annotations."""
    merged = {
        k: text_of(v)
        for k, v in _view(
            _view(gateway_config.get("spec")).get("loadBalancerServiceAnnotations")
        ).items()
    }
    merged |= {k: text_of(v) for k, v in _view(meta(gateway).get("annotations")).items()}
    return merged


def service(
    gateway: Object, gateway_config: Object, ports: Sequence[ServicePort], limits: Limits
) -> dict[str, Any] | None:
    """The Service exposing a Gateway's rendered listeners, None when there is none. A refused
    annotation value counts as absent (the rule table's finding says why, once)."""
    if not ports:
        return None
    annotations = service_annotations(gateway, gateway_config)

    def value(row: Annotation[T]) -> T:
        return annotation(row, gateway, gateway_config, limits)

    service_type = value(SERVICE_TYPE_ROW)
    nodeports, targetports = value(NODEPORT_ROW), value(TARGETPORT_ROW)
    mixed = value(MIXED_PROTOCOL_LB_ROW)
    first = ports[0].transport
    service_ports: list[dict[str, Any]] = []
    for p in ports:
        if p.transport != first and not mixed:
            continue
        entry: dict[str, Any] = {"name": p.name, "protocol": p.transport, "port": p.port}
        if p.name in targetports:
            entry["targetPort"] = targetports[p.name]
        if p.name in nodeports and service_type in ("NodePort", "LoadBalancer"):
            entry["nodePort"] = nodeports[p.name]
        service_ports.append(entry)
    if service_type == "LoadBalancer" and not value(DISABLE_HEALTH_CHECK_EXPOSE_ROW):
        health = _health_check_port(annotations)
        if health is not None:
            service_ports.append(
                {"name": HEALTH_CHECK_PORT_NAME, "protocol": "TCP", "port": health}
            )
    spec: dict[str, Any] = {
        "type": service_type,
        "selector": {APP_LABEL: APP_VALUE} | related_labels(gateway),
        "ports": service_ports,
        "sessionAffinity": "None" if value(DISABLE_SESSION_AFFINITY_ROW) else "ClientIP",
    }
    policy = value(EXTERNAL_TRAFFIC_POLICY_ROW)
    if policy == "Local" and service_type in ("NodePort", "LoadBalancer"):
        spec["externalTrafficPolicy"] = "Local"
    addresses = _view(gateway.get("spec")).get("addresses") or []
    if addresses and isinstance(addresses[0], Mapping):
        if addresses[0].get("type", "IPAddress") == "IPAddress" and addresses[0].get("value"):
            spec["loadBalancerIP"] = str(addresses[0]["value"])
    labels = {OWNED_BY_LABEL: OWNED_BY_VALUE} | related_labels(gateway)
    annotations[RELATED_GATEWAY_NAME] = _gateway_id(gateway)
    manifest = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(gateway, labels, annotations),
        "spec": spec,
    }
    return manifest


def _health_check_port(annotations: Mapping[str, str]) -> int | None:
    """The health-check port the load balancer annotations name (port and TCP/HTTP protocol)."""
    port = next((v for k, v in annotations.items() if HEALTH_PORT_ANNOTATION.match(k)), None)
    protocol = next(
        (v for k, v in annotations.items() if HEALTH_PROTOCOL_ANNOTATION.match(k)), None
    )
    if port is None or protocol is None or protocol.upper() not in ("TCP", "HTTP"):
        return None
    try:
        value = int(port)
    except ValueError:
        return None
    return value if 1 <= value <= 65535 else None
