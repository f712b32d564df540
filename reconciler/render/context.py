"""The frozen context the render stages read, and what a stage gives back.

Render is a row of pure stages, one per output (core.py runs them in order):

    classes    GatewayClass -> ClassContext (its GatewayConfig, Dataplane, credentials)
    listeners  Gateway -> GatewayPlan (which listeners render, their conditions, TLS pairs)
    routes     UDPRoute -> where it attaches, its cluster (clusters.py), its status
    addresses  GatewayPlan -> the public address of each listener
    config     GatewayPlan + the above -> the Gateway's StunnerConfig
    manifests  GatewayPlan -> its Service;  deployment: GatewayPlan -> its Deployment
    account    GatewayPlan -> the ServiceAccount its dataplane runs as (rendered unless named)
    gateways   GatewayPlan + the above -> the Gateway's status

Each stage is a function of a `Context` (the snapshot, the settings, the clock) and the frozen
values of the stages before it, returning `Staged`: its value, the findings it made and the
statuses it wrote. Nothing is appended to a shared object, so each stage is tested, read and
timed alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Generic, NamedTuple, TypeVar

from stunner_api import rules
from stunner_api.rules import Problem
from stunner_api.vocabulary import LISTENER_TRANSPORT, ListenerProtocol
from stunner_api.vocabulary import ConditionReason as Reason

from ..store import Object, Snapshot, name_of, namespace_of
from . import conditions as cond
from .plan import Finding, RenderSettings, StatusUpdate

T = TypeVar("T")
GatewayKey = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class Context:
    """What every stage reads: the snapshot (one that records its reads, in a part's render),
    the settings and the render's clock."""

    snapshot: Snapshot
    settings: RenderSettings
    now: datetime
    # The rules decide what is ours by the same controller name.
    rule_settings: rules.Settings = field(default_factory=rules.Settings)

    @classmethod
    def of(cls, snapshot: Snapshot, settings: RenderSettings, now: datetime) -> Context:
        rule_settings = replace(settings.rules, controller_name=settings.controller_name)
        return cls(snapshot, settings, now, rule_settings)

    @property
    def controller(self) -> str:
        return self.settings.controller_name


class Public(NamedTuple):
    """A rendered listener's public address and port, and the other addresses it answers on."""

    address: str
    port: int
    also: tuple[str, ...] = ()


class Staged(NamedTuple, Generic[T]):
    """What one stage gives back: its value, its findings and its statuses, in the order it
    made them. Immutable as a frozen dataclass, and built several times faster (render builds
    about fifteen per Gateway)."""

    value: T
    findings: tuple[Finding, ...] = ()
    statuses: tuple[StatusUpdate, ...] = ()


def spec_of(obj: Object | None) -> Mapping[str, Any]:
    value = (obj or {}).get("spec")
    return value if isinstance(value, Mapping) else {}


def id_of(obj: Object) -> str:
    """ "<namespace>/<name>": a Gateway's config id, a route's cluster name."""
    return f"{namespace_of(obj)}/{name_of(obj)}"


def finding(obj: Object, path: str, message: str, reason: str) -> Finding:
    kind = str(obj.get("kind"))
    namespace = "" if kind in ("GatewayClass", "Dataplane") else namespace_of(obj)
    return Finding(kind, namespace, name_of(obj), path, message, reason)


def findings_of(obj: Object, problems: Sequence[Problem]) -> tuple[Finding, ...]:
    return tuple(finding(obj, p.path, p.message, p.reason) for p in problems)


def status_update(obj: Object, status: dict[str, Any]) -> StatusUpdate:
    kind = str(obj.get("kind"))
    return StatusUpdate(
        str(obj.get("apiVersion")),
        kind,
        "" if kind == "GatewayClass" else namespace_of(obj),
        name_of(obj),
        cond.generation_of(obj),
        status,
    )


def conditions_of(ctx: Context, obj: Object, wanted: list[cond.Condition]) -> list[dict[str, Any]]:
    """An object's JSON conditions, keeping the transition times of its unchanged ones."""
    return cond.conditions(wanted, cond.generation_of(obj), ctx.now, cond.previous_conditions(obj))


# --- the values that flow from stage to stage -------------------------------------------------


@dataclass(frozen=True)
class ClassContext:
    """A GatewayClass of ours with what its Gateways need, or the error that invalidates it."""

    gateway_class: Object
    gateway_config: Object | None = None
    dataplane: Object | None = None
    auth: dict[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ListenerPlan:
    """One Gateway listener: its conditions, and what it renders to when it renders."""

    index: int
    spec: Mapping[str, Any]
    name: str
    protocol: ListenerProtocol | None
    port: int | None
    accepted: cond.Condition = cond.LISTENER_ACCEPTED
    conflicted: cond.Condition = cond.NO_CONFLICTS
    resolved: cond.Condition = cond.RESOLVED_REFS
    cert: str = ""
    key: str = ""
    # Whether it renders: accepted, not conflicted, its references resolved (asked by every
    # later stage, so found once).
    rendered: bool = field(init=False)

    def __post_init__(self) -> None:
        rendered = (
            self.accepted.status == "True"
            and self.conflicted.status == "False"
            and self.resolved.status == "True"
        )
        object.__setattr__(self, "rendered", rendered)

    @property
    def transport(self) -> str:
        return LISTENER_TRANSPORT[self.protocol] if self.protocol else "UDP"


@dataclass(frozen=True)
class GatewayPlan:
    """A Gateway of ours as the listeners stage planned it; `error` when it is not rendered."""

    gateway: Object
    context: ClassContext
    listeners: tuple[ListenerPlan, ...] = ()
    error: str | None = None
    error_reason: str = Reason.INVALID
    key: GatewayKey = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (namespace_of(self.gateway), name_of(self.gateway)))


# (gateway, listener index) -> the clusters (route ids) attached to it, sorted
Attachments = Mapping[tuple[GatewayKey, int], tuple[str, ...]]
