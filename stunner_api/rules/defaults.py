"""The mutating hook's defaults: an RFC 6902 patch of "add" ops that writes every default the
spec (docs/GATEWAY.md) documents and the object leaves out. Never changes a value the user set.

Dataplane defaults are Go's (ANCHORS §2.2), where the spec's table is known to be wrong (a
30-second grace period, health checks off by default): the hook must not change behaviour.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from stunner_api.rules.base import as_dict, as_list
from stunner_api.vocabulary import (
    CORE_GROUP,
    DEFAULT_AUTH_TYPE,
    DEFAULT_DATAPLANE,
    DEFAULT_DATAPLANE_REPLICAS,
    DEFAULT_DATAPLANE_RESOURCE,
    DEFAULT_LOG_LEVEL,
    DEFAULT_REALM,
    DEFAULT_ROUTE_NAMESPACES_FROM,
    DEFAULT_TERMINATION_GRACE_PERIOD,
    DEFAULT_TLS_MODE,
    GATEWAY,
    GATEWAY_API_GROUP,
    GATEWAY_CONFIG,
    SERVICE,
    STUNNER_GROUP,
)


def json_pointer(tokens: Iterable[str | int]) -> str:
    """An RFC 6901 JSON pointer ('~' -> '~0', '/' -> '~1')."""
    return "".join("/" + str(t).replace("~", "~0").replace("/", "~1") for t in tokens)


@dataclass
class Patcher:
    """Collects "add" ops on a working copy, so later defaults see the parents created."""

    doc: dict[str, Any]
    ops: list[dict[str, Any]] = field(default_factory=list)

    def default(self, tokens: list[str | int], value: Any) -> None:
        """Add value at tokens unless something is there; create missing parent objects."""
        node: Any = self.doc
        for i, token in enumerate(tokens):
            last = i == len(tokens) - 1
            if isinstance(node, list) and isinstance(token, int) and token < len(node):
                if last:
                    return
                node = node[token]
                continue
            if not isinstance(node, dict):
                return  # malformed (validation reports it): never replace what the user wrote
            if token in node:
                if last:
                    return
                node = node[token]
                continue
            nested: Any = copy.deepcopy(value)
            for parent in reversed(tokens[i + 1 :]):
                nested = {parent: nested}
            node[token] = nested
            op = {
                "op": "add",
                "path": json_pointer(tokens[: i + 1]),
                "value": copy.deepcopy(nested),
            }
            self.ops.append(op)
            return


def _gatewayclass(p: Patcher) -> None:
    # The spec: parametersRef's group and kind "are default and can be omitted"; the Gateway
    # API CRD requires both, so the hook writes them before the API server's schema check.
    if isinstance(as_dict(p.doc.get("spec")).get("parametersRef"), dict):
        p.default(["spec", "parametersRef", "group"], STUNNER_GROUP)
        p.default(["spec", "parametersRef", "kind"], GATEWAY_CONFIG.kind)


def _gatewayconfig(p: Patcher) -> None:
    spec = as_dict(p.doc.get("spec"))
    p.default(["spec", "realm"], DEFAULT_REALM)
    # The auth type of an authRef comes from the Secret; in STUN-only mode there is none (a
    # defaulted one would only draw gatewayconfig_stun_mode's "ignored" warning).
    if spec.get("authRef") is None and spec.get("stunMode") is not True:
        p.default(["spec", "authType"], DEFAULT_AUTH_TYPE.value)
    p.default(["spec", "dataplane"], DEFAULT_DATAPLANE)
    p.default(["spec", "logLevel"], DEFAULT_LOG_LEVEL)


def _gateway(p: Patcher) -> None:
    for i, listener in enumerate(as_list(as_dict(p.doc.get("spec")).get("listeners"))):
        if not isinstance(listener, dict):
            continue
        base: list[str | int] = ["spec", "listeners", i]
        if isinstance(listener.get("tls"), dict):
            p.default([*base, "tls", "mode"], DEFAULT_TLS_MODE)
        p.default([*base, "allowedRoutes", "namespaces", "from"], DEFAULT_ROUTE_NAMESPACES_FROM)


def _route(p: Patcher) -> None:
    spec = as_dict(p.doc.get("spec"))
    namespace = as_dict(p.doc.get("metadata")).get("namespace")
    for i, ref in enumerate(as_list(spec.get("parentRefs"))):
        if isinstance(ref, dict):
            base: list[str | int] = ["spec", "parentRefs", i]
            p.default([*base, "group"], GATEWAY_API_GROUP)
            p.default([*base, "kind"], GATEWAY.kind)
            if namespace:
                p.default([*base, "namespace"], namespace)
    for i, rule in enumerate(as_list(spec.get("rules"))):
        for j, ref in enumerate(as_list(as_dict(rule).get("backendRefs"))):
            if isinstance(ref, dict):
                base = ["spec", "rules", i, "backendRefs", j]
                p.default([*base, "group"], CORE_GROUP)
                p.default([*base, "kind"], SERVICE.kind)
                if namespace:
                    p.default([*base, "namespace"], namespace)


def pull_policy(image: str) -> str:
    """Kubernetes' default imagePullPolicy: Always for a `latest` or missing tag, else
    IfNotPresent (an image by digest included)."""
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.partition(":")[2]
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def _dataplane(p: Patcher) -> None:
    spec = as_dict(p.doc.get("spec"))
    image = spec.get("image")
    if isinstance(image, str) and image.strip():
        p.default(["spec", "imagePullPolicy"], pull_policy(image.strip()))
    p.default(["spec", "dataplaneResource"], DEFAULT_DATAPLANE_RESOURCE)
    p.default(["spec", "replicas"], DEFAULT_DATAPLANE_REPLICAS)
    p.default(["spec", "terminationGracePeriodSeconds"], DEFAULT_TERMINATION_GRACE_PERIOD)
    p.default(["spec", "hostNetwork"], False)
    p.default(["spec", "disableHealthCheck"], False)
    p.default(["spec", "enableMetricsEndpoint"], False)
    p.default(["spec", "env"], [])
    p.default(["spec", "envFrom"], [])


DEFAULTS: dict[str, Callable[[Patcher], None]] = {
    "GatewayClass": _gatewayclass,
    "GatewayConfig": _gatewayconfig,
    "Gateway": _gateway,
    "UDPRoute": _route,
    "TCPRoute": _route,  # the same fields as a UDPRoute
    "Dataplane": _dataplane,
}


def patch_for(kind: str, obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The "add" ops of kind's defaults on obj (no check whose object it is)."""
    filler = DEFAULTS.get(kind)
    if filler is None:
        return []
    patcher = Patcher(copy.deepcopy(obj))
    filler(patcher)
    return patcher.ops
