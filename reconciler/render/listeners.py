"""The listeners stage: a Gateway of ours judged, and each of its listeners planned.

A problem of one listener keeps only that listener out (its conditions say why); any other
error keeps the whole Gateway out, as does an error of its class. A TLS listener that renders
gets its certificate and key here (`credentials.tls_pair`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stunner_api.rules import Problem, Severity
from stunner_api.vocabulary import LISTENER_PROTOCOLS, TLS_PROTOCOLS, ListenerProtocol
from stunner_api.vocabulary import ConditionReason as Reason

from ..store import Object
from . import conditions as cond
from .context import (
    ClassContext,
    Context,
    GatewayPlan,
    ListenerPlan,
    Staged,
    finding,
    findings_of,
)
from .credentials import tls_pair
from .inputs import listener_specs
from .judge import judge, under
from .plan import Finding


def _canonical_protocol(value: Any) -> ListenerProtocol | None:
    return LISTENER_PROTOCOLS.get(str(value).upper())


def _conditions(
    problems: list[Problem], protocol: ListenerProtocol | None, port: int | None
) -> tuple[cond.Condition, cond.Condition, cond.Condition]:
    """A listener's Accepted, Conflicted and ResolvedRefs, from the rule table's problems."""
    accepted, conflicted, resolved = cond.LISTENER_ACCEPTED, cond.NO_CONFLICTS, cond.RESOLVED_REFS
    for p in problems:
        if p.reason == Reason.PROTOCOL_CONFLICT:
            conflicted = cond.PROTOCOL_CONFLICT
        elif p.reason in (Reason.INVALID_CERTIFICATE_REF, Reason.REF_NOT_PERMITTED):
            resolved = cond.listener_refs_unresolved(
                p.reason, "at least one certificate reference failed to be successfully resolved"
            )
        elif p.severity != Severity.ERROR:
            continue
        elif p.reason == Reason.UNSUPPORTED_PROTOCOL:
            accepted = cond.listener_not_accepted(p.reason, "unsupported protocol")
        elif p.reason == Reason.PORT_UNAVAILABLE:
            accepted = cond.listener_not_accepted(p.reason, "port unavailable")
        elif accepted.status == "True":
            accepted = cond.listener_not_accepted(p.reason, str(p))
    if protocol is None and accepted.status == "True":
        accepted = cond.listener_not_accepted(Reason.UNSUPPORTED_PROTOCOL, "unsupported protocol")
    if port is None and accepted.status == "True":
        accepted = cond.listener_not_accepted(Reason.PORT_UNAVAILABLE, "port unavailable")
    return accepted, conflicted, resolved


def _listener(
    ctx: Context, gateway: Object, index: int, spec: Mapping[str, Any], problems: list[Problem]
) -> Staged[ListenerPlan]:
    """One listener of a Gateway and its conditions; a TLS one that renders, its TLS pair."""
    port = spec.get("port")
    port = port if isinstance(port, int) and not isinstance(port, bool) else None
    protocol = _canonical_protocol(spec.get("protocol"))
    accepted, conflicted, resolved = _conditions(problems, protocol, port)
    name = str(spec.get("name") or "")
    plan = ListenerPlan(index, spec, name, protocol, port, accepted, conflicted, resolved)
    found: tuple[Finding, ...] = ()
    if plan.rendered and protocol in TLS_PROTOCOLS:
        pair, reason, message = tls_pair(spec, gateway, ctx.snapshot)
        if pair is None:
            resolved = cond.listener_refs_unresolved(reason, message)
            found = (finding(gateway, f"spec.listeners[{index}].tls", message, reason),)
        cert, key = pair or ("", "")
        plan = ListenerPlan(
            index, spec, name, protocol, port, accepted, conflicted, resolved, cert, key
        )
    return Staged(plan, found)


def _judged(ctx: Context, gateway: Object, of_class: ClassContext) -> Staged[GatewayPlan]:
    problems = judge(gateway, ctx.snapshot, ctx.rule_settings)
    found = list(findings_of(gateway, problems))
    specs = listener_specs(gateway)
    paths = [f"spec.listeners[{i}]" for i in range(len(specs))]
    fatal = [
        p
        for p in problems
        if p.severity == Severity.ERROR
        and not any(under(p.path, path) for path in paths)
        # A refused annotation is logged and ignored, as Go does; stunnerd's own port taken
        # (at its health-check-port or metrics-port annotation) keeps the Gateway out.
        and (not under(p.path, "metadata.annotations") or p.reason == Reason.PORT_UNAVAILABLE)
    ]
    if fatal:
        plan = GatewayPlan(gateway, of_class, error=str(fatal[0]), error_reason=fatal[0].reason)
    else:
        listeners = []
        for i, spec in enumerate(specs):
            if isinstance(spec, Mapping):
                own = [p for p in problems if under(p.path, paths[i])]
                planned = _listener(ctx, gateway, i, spec, own)
                listeners.append(planned.value)
                found += planned.findings
        plan = GatewayPlan(gateway, of_class, tuple(listeners))
    return Staged(plan, tuple(found))


def plan_gateway(ctx: Context, gateway: Object, of_class: ClassContext) -> Staged[GatewayPlan]:
    """The stage: a Gateway of ours, judged unless its class is in error, and its listeners."""
    if of_class.error is not None:
        planned = Staged(
            GatewayPlan(gateway, of_class, error=of_class.error, error_reason=Reason.PENDING)
        )
    else:
        planned = _judged(ctx, gateway, of_class)
    return planned
