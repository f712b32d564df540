"""The rule table, as render asks it: every Problem of an object, each with its reason.

Render judges with exactly the rules the webhook uses (`stunner_api.rules`), answering their
lookups from the snapshot. What render does with a Problem depends on where it points: a
problem of one listener keeps that listener out, a problem of one backend that backend, and any
other error keeps the whole object out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stunner_api import rules

from ..store import Snapshot
from .words import Reason, Severity


@dataclass(frozen=True)
class Problem:
    """One finding of one rule (the shape of stunner_api.rules.Problem)."""

    path: str
    message: str
    severity: Severity
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


# The reason each rule reports (the rule table's Problems will carry it themselves).
_RULE_REASONS: Mapping[str, str] = {
    "gatewayclass_parameters_ref": Reason.INVALID_PARAMETERS,
    "gatewayconfig_realm": Reason.INVALID_PARAMETERS,
    "gatewayconfig_auth_type": Reason.INVALID_PARAMETERS,
    "gatewayconfig_inline_auth": Reason.INVALID_PARAMETERS,
    "gatewayconfig_auth_ref": Reason.INVALID_PARAMETERS,
    "gatewayconfig_log_level": Reason.INVALID_PARAMETERS,
    "gatewayconfig_annotations": Reason.INVALID_PARAMETERS,
    "gateway_listener_names": Reason.INVALID,
    "gateway_listener_protocols": Reason.UNSUPPORTED_PROTOCOL,
    "gateway_listener_ports": Reason.PORT_UNAVAILABLE,
    "gateway_mixed_protocols": Reason.INVALID,
    "gateway_listener_tls": Reason.INVALID_CERTIFICATE_REF,
    "gateway_addresses": Reason.UNSUPPORTED_ADDRESS,
    "gateway_allowed_routes": Reason.INVALID,
    "gateway_annotations": Reason.INVALID,
    "udproute_parent_refs": Reason.NO_MATCHING_PARENT,
    "udproute_backend_kinds": Reason.INVALID_KIND,
    "udproute_backend_ports": Reason.INVALID,
    "staticservice_prefixes": Reason.INVALID,
    "dataplane_image": Reason.INVALID_PARAMETERS,
    "dataplane_counts": Reason.INVALID_PARAMETERS,
}
_WARNING = re.compile(r"^(?P<path>[^\s:]+): (?P<message>.*)$", re.DOTALL)


def _reason(rule_name: str, kind: str, message: str) -> str:
    if rule_name == "gateway_listener_ports" and "already used" in message:
        return Reason.PROTOCOL_CONFLICT
    if rule_name == "conforms_to_schema":
        return (
            Reason.INVALID_PARAMETERS if kind in ("GatewayConfig", "Dataplane") else Reason.INVALID
        )
    return _RULE_REASONS.get(rule_name, Reason.INVALID)


def judge(obj: Mapping[str, Any], snapshot: Snapshot, settings: rules.Settings) -> list[Problem]:
    """Every Problem the rule table finds in obj (as created: no old object)."""
    data = dict(obj)
    if not rules.is_ours(data, snapshot, settings):
        return []
    kind = str(data.get("kind"))
    request = rules.Request(
        obj=data, old=None, operation="CREATE", lookup=snapshot, settings=settings
    )
    problems: list[Problem] = []
    for rule in rules.RULES.get(kind, []):
        if rule in rules.ON_DELETE:
            continue
        errors, warnings = rule(request)
        for error in errors:
            reason = _reason(rule.__name__, kind, error.message)
            problems.append(Problem(error.path, error.message, Severity.ERROR, reason))
        for warning in warnings:
            match = _WARNING.match(warning)
            path, message = (match["path"], match["message"]) if match else ("", warning)
            reason = _reason(rule.__name__, kind, message)
            problems.append(Problem(path, message, Severity.WARNING, reason))
    return problems


def under(path: str, prefix: str) -> bool:
    """Whether a problem's path is prefix or below it (prefix "spec.listeners[1]")."""
    return path == prefix or path.startswith((prefix + ".", prefix + "["))
