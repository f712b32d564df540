"""The classes stage: a GatewayClass of ours resolved to what its Gateways need.

Its GatewayConfig and Dataplane are judged by the rule table and its credentials resolved; the
first error invalidates the class and, later, every Gateway of it (their status says Pending
with the class's error). The class's own status (`Accepted`) is written here.
"""

from __future__ import annotations

from stunner_api.rules import Severity
from stunner_api.vocabulary import DEFAULT_DATAPLANE
from stunner_api.vocabulary import ConditionReason as Reason

from ..store import Kind, Object, Snapshot
from . import conditions as cond
from . import credentials
from .context import (
    ClassContext,
    Context,
    Staged,
    conditions_of,
    finding,
    findings_of,
    spec_of,
    status_update,
)
from .credentials import AuthError
from .judge import judge, under
from .plan import Finding


def ours(ctx: Context) -> list[Object]:
    """The snapshot's GatewayClasses whose controllerName is ours, sorted."""
    return [
        gateway_class
        for gateway_class in ctx.snapshot.all(Kind.GATEWAY_CLASS)
        if spec_of(gateway_class).get("controllerName") == ctx.controller
    ]


def snapshot_findings(snapshot: Snapshot) -> tuple[Finding, ...]:
    """The objects the snapshot was not given (a file's unreadable object), as findings."""
    return tuple(
        Finding(ignored.kind, ignored.namespace, ignored.name, "", ignored.reason, Reason.INVALID)
        for ignored in snapshot.ignored
    )


def _judged(ctx: Context, obj: Object) -> tuple[tuple[Finding, ...], str | None]:
    """Every problem the rule table finds in obj, as findings, and its first error (a
    GatewayConfig's refused annotations are found and otherwise ignored, as Go does)."""
    problems = judge(obj, ctx.snapshot, ctx.rule_settings)
    errors = [
        p
        for p in problems
        if p.severity == Severity.ERROR and not under(p.path, "spec.loadBalancerServiceAnnotations")
    ]
    return findings_of(obj, problems), str(errors[0]) if errors else None


def _parameter(
    ctx: Context, kind: Kind, namespace: str, name: str, missing: str
) -> tuple[Object | None, str | None, tuple[Finding, ...]]:
    """A GatewayConfig or Dataplane of a class, or why the class cannot use it; with the
    findings of judging it."""
    obj = ctx.snapshot.get(kind, namespace, name)
    found, error = _judged(ctx, obj) if obj is not None else ((), missing)
    if obj is not None and error is not None:
        where = f"{namespace}/{name}" if namespace else name
        error = f"{obj.get('kind')} {where}: {error}"
    return (obj if error is None else None), error, found


def resolve(ctx: Context, gateway_class: Object) -> Staged[ClassContext]:
    """The stage: a GatewayClass of ours, its parameters and credentials, and its status."""
    found, error = _judged(ctx, gateway_class)
    gateway_config = dataplane = None
    auth = None
    if error is None:
        ref = spec_of(gateway_class).get("parametersRef") or {}
        namespace, name = str(ref.get("namespace")), str(ref.get("name"))
        missing = f"No GatewayConfig found for name: {namespace}/{name}"
        gateway_config, error, judged = _parameter(
            ctx, Kind.GATEWAY_CONFIG, namespace, name, missing
        )
        found += judged
    if gateway_config is not None:
        dataplane_name = str(spec_of(gateway_config).get("dataplane") or DEFAULT_DATAPLANE)
        missing = f"missing Dataplane resource for Gateway: no Dataplane {dataplane_name!r}"
        dataplane, error, judged = _parameter(ctx, Kind.DATAPLANE, "", dataplane_name, missing)
        found += judged
    if gateway_config is not None and dataplane is not None:
        try:
            auth = credentials.auth(gateway_config, ctx.snapshot)
        except AuthError as exc:
            error = str(exc)
    if error is not None:
        found += (finding(gateway_class, "", error, Reason.INVALID_PARAMETERS),)
    accepted = cond.gateway_class_accepted(ctx.controller, error)
    status = status_update(
        gateway_class, {"conditions": conditions_of(ctx, gateway_class, [accepted])}
    )
    resolved = ClassContext(gateway_class, gateway_config, dataplane, auth, error)
    return Staged(resolved, found, (status,))
