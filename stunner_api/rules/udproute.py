"""Rules of a UDPRoute: STUNner's own (stunner.l7mp.io/v1) and the Gateway API one (every
served version: v1 since Gateway API v1.6, and v1alpha2)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from stunner_api.rules.base import (
    Problem,
    Request,
    as_list,
    error,
    indexed,
    is_int,
    schema_problems,
    warning,
)
from stunner_api.vocabulary import (
    BACKEND_KINDS,
    GATEWAY,
    GATEWAY_API_GROUP,
    SERVICE,
    STUNNER_UDP_ROUTE,
    ConditionReason,
    api_version,
)


def udproute_schema(req: Request) -> list[Problem]:
    """Field types and required fields."""
    return schema_problems(req, ConditionReason.UNSUPPORTED_VALUE)


def udproute_parent_refs(req: Request) -> list[Problem]:
    """parentRefs name at least one Gateway."""
    refs = as_list(req.spec.get("parentRefs"))
    reason = ConditionReason.NO_MATCHING_PARENT
    if not refs:
        return [
            error("spec.parentRefs", "required: name the Gateway(s) to attach the route to", reason)
        ]
    problems = []
    for path, ref in indexed(refs, "spec.parentRefs"):
        group, kind = ref.get("group", GATEWAY_API_GROUP), ref.get("kind", GATEWAY.kind)
        if (group, kind) != (GATEWAY_API_GROUP, GATEWAY.kind):
            problems.append(
                error(
                    path,
                    f"must reference a Gateway (group {GATEWAY_API_GROUP}, kind Gateway, or "
                    f"omitted), got group {group!r} kind {kind!r}",
                    reason,
                )
            )
    return problems


def _backend_refs(req: Request) -> Iterator[tuple[str, dict[str, Any]]]:
    for rule_path, rule in indexed(as_list(req.spec.get("rules")), "spec.rules"):
        yield from indexed(as_list(rule.get("backendRefs")), f"{rule_path}.backendRefs")


def udproute_backend_kinds(req: Request) -> list[Problem]:
    """backendRefs are Services (group "") or StaticServices (group stunner.l7mp.io)."""
    problems = []
    if len(as_list(req.spec.get("rules"))) > 1:
        problems.append(
            warning(
                "spec.rules",
                "only the first rule is used; merge the backendRefs into it",
                ConditionReason.UNSUPPORTED_VALUE,
            )
        )
    for path, ref in _backend_refs(req):
        group, kind = ref.get("group", ""), ref.get("kind", SERVICE.kind)
        if (group, kind) not in BACKEND_KINDS:
            problems.append(
                error(
                    path,
                    f"group {group!r} kind {kind!r} is not a backend STUNner knows: use kind "
                    'Service (group "") or kind StaticService (group stunner.l7mp.io)',
                    ConditionReason.INVALID_KIND,
                )
            )
    return problems


def port_range_problems(req: Request) -> Iterator[tuple[str, dict[str, Any], list[Problem]]]:
    """Each backendRef with its path and the problems of its port and endPort: 1..65535,
    endPort needs port and is not below it (a UDPRoute's and a TCPRoute's)."""
    reason = ConditionReason.UNSUPPORTED_VALUE
    for path, ref in _backend_refs(req):
        problems = []
        port, end_port = ref.get("port"), ref.get("endPort")
        for key, value in (("port", port), ("endPort", end_port)):
            if is_int(value) and not 1 <= value <= 65535:
                problems.append(
                    error(f"{path}.{key}", f"must be between 1 and 65535, got {value}", reason)
                )
        if end_port is not None and port is None:
            problems.append(
                error(f"{path}.endPort", "needs port: set port to the start of the range", reason)
            )
        elif is_int(port) and is_int(end_port) and end_port < port:
            problems.append(
                error(f"{path}.endPort", f"must not be below port {port}, got {end_port}", reason)
            )
        yield path, ref, problems


def udproute_backend_ports(req: Request) -> list[Problem]:
    """port and endPort are 1..65535; endPort needs port and is not below it. A Gateway API
    UDPRoute (any version) requires a port for a Service backend."""
    problems = []
    reason = ConditionReason.UNSUPPORTED_VALUE
    gateway_api = req.group == GATEWAY_API_GROUP
    stunner_v1 = api_version(STUNNER_UDP_ROUTE.group, STUNNER_UDP_ROUTE.preferred_version)
    for path, ref, found in port_range_problems(req):
        problems += found
        if (
            gateway_api
            and ref.get("port") is None
            and ref.get("kind", SERVICE.kind) == (SERVICE.kind)
        ):
            problems.append(
                error(
                    f"{path}.port",
                    f"required by {req.obj.get('apiVersion')} for a Service (any port: STUNner "
                    f"ignores it), or use apiVersion {stunner_v1}",
                    reason,
                )
            )
    return problems


RULES = [udproute_schema, udproute_parent_refs, udproute_backend_kinds, udproute_backend_ports]
