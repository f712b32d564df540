"""Status conditions (ANCHORS §2.7): GatewayClass, Gateway and its listeners, UDPRoute parents.

Every condition carries the object's generation as `observedGeneration`. `lastTransitionTime`
is the render's clock, unless the object already has a condition of that type with the same
status: then its time is kept, so a render that changes nothing writes nothing new.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from stunner_api.vocabulary import GATEWAY_API_UDP_ROUTE, STUNNER_UDP_ROUTE, ConditionType
from stunner_api.vocabulary import ConditionReason as Reason

from ..store import Object, meta

SUPPORTED_KINDS = tuple(
    {"group": info.group, "kind": info.kind} for info in (GATEWAY_API_UDP_ROUTE, STUNNER_UDP_ROUTE)
)


@dataclass(frozen=True)
class Condition:
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str


def generation_of(obj: Object) -> int:
    value = meta(obj).get("generation")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@functools.lru_cache(maxsize=8)  # one render stamps every condition with the same `now`
def timestamp(now: datetime) -> str:
    """A Kubernetes metav1.Time: RFC 3339 in UTC, whole seconds."""
    if now.tzinfo is not None:
        now = now.astimezone(UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def conditions(
    wanted: Sequence[Condition],
    generation: int,
    now: datetime,
    previous: Sequence[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """The JSON conditions, keeping the transition time of those whose status did not change."""
    before = {c.get("type"): c for c in previous if isinstance(c, Mapping)}
    out = []
    for c in wanted:
        old = before.get(c.type)
        keep = old is not None and old.get("status") == c.status and old.get("lastTransitionTime")
        out.append(
            {
                "type": str(c.type),  # plain str: the status is JSON, not our enums
                "status": str(c.status),
                "reason": str(c.reason),
                "message": str(c.message),
                "observedGeneration": generation,
                "lastTransitionTime": old["lastTransitionTime"] if keep and old else timestamp(now),
            }
        )
    return out


def previous_conditions(obj: Object) -> list[Mapping[str, Any]]:
    status = obj.get("status")
    found = status.get("conditions") if isinstance(status, Mapping) else None
    return list(found) if isinstance(found, list) else []


# --- GatewayClass -----------------------------------------------------------------------------


def gateway_class_accepted(controller: str, error: str | None) -> Condition:
    if error is None:
        return Condition(
            ConditionType.ACCEPTED,
            "True",
            Reason.ACCEPTED,
            f'GatewayClass is now managed by controller "{controller}"',
        )
    return Condition(
        ConditionType.ACCEPTED,
        "False",
        Reason.INVALID_PARAMETERS,
        f'controller "{controller}" failed to process GatewayClass: {error}',
    )


# --- Gateway ----------------------------------------------------------------------------------


def gateway_accepted(controller: str, error: str | None, reason: str = Reason.PENDING) -> Condition:
    if error is None:
        return Condition(
            ConditionType.ACCEPTED,
            "True",
            Reason.ACCEPTED,
            f"gateway accepted by controller {controller}",
        )
    return Condition(ConditionType.ACCEPTED, "False", reason, error)


def gateway_programmed(controller: str, error: str | None, address_found: bool) -> Condition:
    if error is not None:
        return Condition(
            ConditionType.PROGRAMMED,
            "False",
            Reason.INVALID,
            f"error processing gateway by controller {controller}: {error}",
        )
    if not address_found:
        return Condition(
            ConditionType.PROGRAMMED,
            "False",
            Reason.ADDRESS_NOT_ASSIGNED,
            "no public address found for at least one listener",
        )
    return Condition(
        ConditionType.PROGRAMMED,
        "True",
        Reason.PROGRAMMED,
        "dataplane configuration successfully rendered",
    )


LISTENER_ACCEPTED = Condition(ConditionType.ACCEPTED, "True", Reason.ACCEPTED, "listener accepted")
LISTENER_PENDING = Condition(ConditionType.ACCEPTED, "Unknown", Reason.PENDING, "pending")
NO_CONFLICTS = Condition(
    ConditionType.CONFLICTED, "False", Reason.NO_CONFLICTS, "listener protocol-port available"
)
PROTOCOL_CONFLICT = Condition(
    ConditionType.CONFLICTED,
    "True",
    Reason.PROTOCOL_CONFLICT,
    "multiple listeners specified with the same Listener port and protocol",
)
RESOLVED_REFS = Condition(
    ConditionType.RESOLVED_REFS,
    "True",
    Reason.RESOLVED_REFS,
    "listener object references sucessfully resolved",  # sic, as Go writes it
)


def listener_not_accepted(reason: str, message: str) -> Condition:
    return Condition(ConditionType.ACCEPTED, "False", reason, message)


def listener_refs_unresolved(reason: str, message: str) -> Condition:
    return Condition(ConditionType.RESOLVED_REFS, "False", reason, message)


# --- UDPRoute and TCPRoute -------------------------------------------------------------------


def route_accepted(gateway: str, reason: str, message: str | None = None) -> Condition:
    messages: dict[str, str] = {
        Reason.ACCEPTED: f"parent {gateway} accepted the route",
        Reason.NOT_ALLOWED_BY_LISTENERS: f"parent {gateway} rejects the route",
        Reason.NO_MATCHING_PARENT: f"parent {gateway} does not exist",
        Reason.PENDING: "GwAPI.v1 UDPRoute masked by a STUNnerV1 UDPRoute",
    }
    status = "True" if reason == Reason.ACCEPTED else "False"
    return Condition(
        ConditionType.ACCEPTED, status, reason, message or messages.get(reason, reason)
    )


def route_resolved(problems: Sequence[tuple[str, str]]) -> Condition:
    if not problems:
        return Condition(
            ConditionType.RESOLVED_REFS,
            "True",
            Reason.RESOLVED_REFS,
            "all backend references successfully resolved",
        )
    reason = problems[0][0]
    detail = "; ".join(message for _, message in problems)
    return Condition(
        ConditionType.RESOLVED_REFS,
        "False",
        reason,
        f"at least one backend reference failed to be successfully resolved: {detail}",
    )
