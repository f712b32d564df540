"""Kubernetes objects as the API server holds them, for tests: Secrets, GatewayClasses,
Gateways and the config discovery Service."""

from __future__ import annotations

import base64
from typing import Any

from stunner_api.vocabulary import CDS_SERVICE_LABEL, CDS_SERVICE_NAME

STUNNER_CONTROLLER = "stunner.l7mp.io/gateway-operator"


def secret(
    name: str, kind: str = "Opaque", namespace: str = "stunner", **data: bytes | str
) -> dict[str, Any]:
    """A Secret of type `kind` holding `data` (base64-encoded, as the API serves it)."""
    raw = {k: v.encode() if isinstance(v, str) else v for k, v in data.items()}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": kind,
        "data": {k: base64.b64encode(v).decode() for k, v in raw.items()},
    }


def gateway_class(name: str, controller: str = STUNNER_CONTROLLER) -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GatewayClass",
        "metadata": {"name": name},
        "spec": {"controllerName": controller},
    }


def gateway(name: str, class_name: str, namespace: str = "stunner") -> dict[str, Any]:
    """A Gateway of `class_name` with one TURN-UDP listener."""
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "gatewayClassName": class_name,
            "listeners": [{"name": "udp", "port": 3478, "protocol": "TURN-UDP"}],
        },
    }


def cds_service(namespace: str) -> dict[str, Any]:
    """The chart's Service in front of the config discovery service, as the CLI finds it."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": CDS_SERVICE_NAME,
            "namespace": namespace,
            "labels": {CDS_SERVICE_LABEL: "true"},
        },
    }
