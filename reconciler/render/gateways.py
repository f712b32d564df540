"""The Gateway status stage, the last one: what the listeners, routes, addresses and config
stages found of a Gateway, as its status (ANCHORS §2.7).

`Accepted` and `Programmed`; the first public address found (`status.addresses`); and per
listener its conditions and the number of routes attached. A Gateway that was not rendered (its
class's error or its own) has its listeners Accepted Unknown Pending, Go's initial listener
status (no stale Accepted True left from an earlier render).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from stunner_api.annotations import RELAY_STUN_SERVER_ROW, Limits
from stunner_api.dataplane import StunnerConfig
from stunner_api.endpoints import is_ip
from stunner_api.vocabulary import NODE_ADDRESS_PLACEHOLDER, RELAY_ADDRESS_DISCOVERY
from stunner_api.vocabulary import ConditionReason as Reason

from ..store import Kind, Object
from . import conditions as cond
from .context import (
    Context,
    GatewayPlan,
    ListenerPlan,
    Public,
    Staged,
    conditions_of,
    finding,
    status_update,
)
from .inputs import annotation, listener_specs
from .nodes import node_public_addresses, placement, relay_fallback_note, runs_pods_of
from .plan import Finding


def _listener_entry(
    ctx: Context, gateway: Object, name: str, attached: int, wanted: list[cond.Condition]
) -> dict[str, Any]:
    previous = [
        c
        for entry in (gateway.get("status") or {}).get("listeners") or []
        if isinstance(entry, Mapping) and entry.get("name") == name
        for c in entry.get("conditions") or []
    ]
    return {
        "name": name,
        "supportedKinds": [dict(k) for k in cond.SUPPORTED_KINDS],
        "attachedRoutes": attached,
        "conditions": cond.conditions(wanted, cond.generation_of(gateway), ctx.now, previous),
    }


def _pending_listeners(ctx: Context, gateway: Object) -> list[dict[str, Any]]:
    names = [
        str(spec.get("name") or "") for spec in listener_specs(gateway) if isinstance(spec, Mapping)
    ]
    return [_listener_entry(ctx, gateway, name, 0, [cond.LISTENER_PENDING]) for name in names]


def _listener_status(
    ctx: Context, gateway: Object, lst: ListenerPlan, attached: int
) -> dict[str, Any]:
    wanted = [lst.accepted, lst.conflicted, lst.resolved]
    return _listener_entry(ctx, gateway, lst.name, attached, wanted)


def _relay_fallback(
    ctx: Context, plan: GatewayPlan, programmed: cond.Condition
) -> tuple[cond.Condition, tuple[Finding, ...]]:
    """Relay address discovery where some Nodes its stunnerd runs on (by their taints) have no
    public address: a finding, and the Programmed condition says so (the listeners still work,
    at a private address there)."""
    gateway, gateway_config = plan.gateway, plan.context.gateway_config
    where = placement(plan.context.dataplane)
    nodes = [node for node in ctx.snapshot.all(Kind.NODE) if runs_pods_of(node, where)]
    limits = Limits(ctx.rule_settings.node_port_range)
    stun_server = (
        annotation(RELAY_STUN_SERVER_ROW, gateway, gateway_config, limits)
        if gateway_config is not None
        else ""
    )
    note = relay_fallback_note(nodes, stun_server)
    if note is None:
        return programmed, ()
    path = f'metadata.annotations["{RELAY_ADDRESS_DISCOVERY}"]'
    return (
        replace(programmed, message=f"{programmed.message}; {note}"),
        (finding(gateway, path, note, Reason.ADDRESS_NOT_ASSIGNED),),
    )


def gateway_status(
    ctx: Context,
    plan: GatewayPlan,
    publics: Sequence[Public | None] = (),
    attached: Sequence[int] = (),
    config: StunnerConfig | str | None = None,
) -> Staged[None]:
    """The stage: a Gateway's status. For a rendered Gateway, `publics` and `attached` are its
    listeners' public addresses and numbers of attached routes (in the order of
    `plan.listeners`) and `config` what the config stage made of it."""
    gateway = plan.gateway
    accepted = cond.gateway_accepted(ctx.controller, plan.error, plan.error_reason)
    found: tuple[Finding, ...] = ()
    status: dict[str, Any] = {}
    if plan.error is not None:
        if plan.error_reason == Reason.PENDING:  # its class's error (its own are found)
            found = (finding(gateway, "", plan.error, plan.error_reason),)
        programmed = cond.gateway_programmed(ctx.controller, plan.error, False)
        status["conditions"] = conditions_of(ctx, gateway, [accepted, programmed])
        status["listeners"] = _pending_listeners(ctx, gateway)
    else:
        rendered = [
            public for lst, public in zip(plan.listeners, publics, strict=True) if lst.rendered
        ]
        error = config if isinstance(config, str) else None
        programmed = cond.gateway_programmed(ctx.controller, error, None not in rendered)
        node_local: list[str] = []
        if isinstance(config, StunnerConfig) and any(
            lc.address == NODE_ADDRESS_PLACEHOLDER for lc in config.listeners
        ):
            programmed, found = _relay_fallback(ctx, plan, programmed)
            where = placement(plan.context.dataplane)
            node_local = node_public_addresses(ctx.snapshot.all(Kind.NODE), where)
        status["conditions"] = conditions_of(ctx, gateway, [accepted, programmed])
        first = next((public for public in rendered if public is not None), None)
        # A stunnerd on every node (relay address discovery): every node's public address;
        # else the first listener's, and every other its port answers on (both families).
        shown = node_local or ([first.address, *first.also] if first is not None else [])
        if shown:
            status["addresses"] = [
                {"type": "IPAddress" if is_ip(a) else "Hostname", "value": a} for a in shown
            ]
        status["listeners"] = [
            _listener_status(ctx, gateway, lst, count)
            for lst, count in zip(plan.listeners, attached, strict=True)
        ]
    return Staged(None, found, (status_update(gateway, status),))
