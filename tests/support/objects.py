"""Kubernetes objects as the API server holds them, for tests: Secrets and GatewayClasses."""

from __future__ import annotations

import base64
from typing import Any

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
