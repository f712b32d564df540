"""`--enable-finalizer`: the plan a reconciler leaves behind when it shuts down (Go STUNner's
"finalize" render, ANCHORS §2.8): every GatewayClass and Gateway of ours invalidated with the
reason, and no Deployment, Service or ServiceAccount (so `apply.plan_writes` deletes ours).
Routes keep their status; configs are not touched (stunnerd keeps serving until its Deployment
goes)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from stunner_api.vocabulary import GATEWAY, GATEWAY_CLASS

from . import conditions as cond
from .plan import Plan, StatusUpdate

SHUTDOWN_ERROR = "Operator unavailable after graceful shutdown"  # Go's words


def _invalidated(update: StatusUpdate, controller: str, now: datetime) -> StatusUpdate:
    if update.kind == GATEWAY_CLASS.kind:
        wanted = [cond.gateway_class_accepted(controller, SHUTDOWN_ERROR)]
    else:
        wanted = [
            cond.gateway_accepted(controller, SHUTDOWN_ERROR),
            cond.gateway_programmed(controller, SHUTDOWN_ERROR, False),
        ]
    status = {"conditions": cond.conditions(wanted, update.generation, now)}
    return replace(update, status=status)


def finalized(plan: Plan, controller: str, now: datetime) -> Plan:
    """`plan` as the reconciler leaves it on shutdown (see the module's docstring)."""
    kinds = (GATEWAY_CLASS.kind, GATEWAY.kind)
    statuses = tuple(
        _invalidated(update, controller, now) for update in plan.statuses if update.kind in kinds
    )
    return replace(plan, deployments={}, services={}, service_accounts={}, statuses=statuses)
