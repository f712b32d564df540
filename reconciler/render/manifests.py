"""The Service of a Gateway (ANCHORS §2.4, managed mode), and what it shares with the Deployment
(deployment.py): metadata, labels, owner references, copies of input values, annotations.

Both are named after the Gateway, live in its namespace and are owned by it (when its uid is
known: objects read from files have none). The Service rendered here is the operator's intent;
keeping the fields others set on the live Service (nodePorts, loadBalancerClass, user labels) is
the applier's job.
"""

from __future__ import annotations

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
    OWNED_BY_LABEL,
    OWNED_BY_VALUE,
    RELATED_GATEWAY_NAME,
)

from ..store import Object, meta
from .context import Context, GatewayPlan, Staged, id_of
from .inputs import annotation, gateway_metadata, related_labels, view

T = TypeVar("T")

HEALTH_CHECK_PORT_NAME = "gateway-health-check"
HEALTH_PORT_ANNOTATION = re.compile(r"^service\.beta\.kubernetes\.io/.*health.*port$")
HEALTH_PROTOCOL_ANNOTATION = re.compile(r"^service\.beta\.kubernetes\.io/.*health.*protocol$")


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
        for k, v in view(
            view(gateway_config.get("spec")).get("loadBalancerServiceAnnotations")
        ).items()
    }
    merged |= {k: text_of(v) for k, v in view(meta(gateway).get("annotations")).items()}
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
    addresses = view(gateway.get("spec")).get("addresses") or []
    if addresses and isinstance(addresses[0], Mapping):
        if addresses[0].get("type", "IPAddress") == "IPAddress" and addresses[0].get("value"):
            spec["loadBalancerIP"] = str(addresses[0]["value"])
    labels = {OWNED_BY_LABEL: OWNED_BY_VALUE} | related_labels(gateway)
    annotations[RELATED_GATEWAY_NAME] = id_of(gateway)
    manifest = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": gateway_metadata(gateway, labels, annotations),
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
