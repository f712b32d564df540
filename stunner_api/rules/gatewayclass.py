"""Rules of a GatewayClass whose controllerName is ours."""

from __future__ import annotations

from stunner_api.rules.base import Problem, Request, error, schema_problems
from stunner_api.vocabulary import GATEWAY_CONFIG, STUNNER_GROUP, ConditionReason

REASON = ConditionReason.INVALID_PARAMETERS


def gatewayclass_schema(req: Request) -> list[Problem]:
    """Field types and required fields."""
    return schema_problems(req, REASON)


def gatewayclass_parameters_ref(req: Request) -> list[Problem]:
    """parametersRef points at a GatewayConfig by name and namespace."""
    ref = req.spec.get("parametersRef")
    path = "spec.parametersRef"
    if not isinstance(ref, dict):
        return [
            error(
                path,
                "required: point it at a GatewayConfig (group stunner.l7mp.io, kind "
                "GatewayConfig, name and namespace)",
                REASON,
            )
        ]
    problems = []
    if ref.get("group", STUNNER_GROUP) != STUNNER_GROUP:
        problems.append(
            error(
                f"{path}.group", f"must be stunner.l7mp.io or omitted, got {ref['group']!r}", REASON
            )
        )
    if ref.get("kind", GATEWAY_CONFIG.kind) != GATEWAY_CONFIG.kind:
        problems.append(
            error(f"{path}.kind", f"must be GatewayConfig or omitted, got {ref['kind']!r}", REASON)
        )
    if not ref.get("name"):
        problems.append(error(f"{path}.name", "required: the name of the GatewayConfig", REASON))
    if not ref.get("namespace"):
        problems.append(
            error(
                f"{path}.namespace",
                "required: GatewayConfigs are namespaced, set the namespace of the GatewayConfig",
                REASON,
            )
        )
    return problems


RULES = [gatewayclass_schema, gatewayclass_parameters_ref]
