"""Kubernetes Events about what the reconciler did, for `kubectl describe gateway` and
`kubectl get events`: the pure part (which events a write's outcome is worth) and the recorder.

API: `events.k8s.io/v1`, the Events API client-go's current recorder writes (core `v1` Events
are its older form; the API server stores both as one kind and `kubectl` shows either). Its
fields say who reported (`reportingController`: our controller name, `reportingInstance`: this
replica), what it did (`action`) and to which object (`regarding`, and `related` for the
Deployment or Service concerned).

Recorded, by the leader only and only for writes that happened:
- a Gateway becoming valid (Normal `Valid`) or invalid (Warning `Invalid`, with the reason its
  status gives): a status write whose `Accepted`/`Programmed` verdict differs from the stored one
  (a first status counts);
- a Gateway's Deployment, Service or ServiceAccount created (Normal `Created`) or deleted
  (Normal `Deleted`);
- a write refused `FAILED_WRITE_EVENT_AFTER` times in a row (Warning `WriteFailed`): once per
  streak, with the HTTP status and reason only (never the server's message, which may quote the
  object; the log has it).

A steady state writes none: every event follows a write, and an unchanged cluster gets none;
so events are as rate-limited as the writes (which follow renders, at most one per throttle
window). An event the same as the last one recorded about the same object (reason and note)
within `DEDUPE_WINDOW` seconds is dropped: a write that keeps being needed (someone keeps
deleting a Deployment) tells it once; a change back and forth is told each time.

Recording is best effort: a failure is logged, never retried; an API server that does not serve
Events or forbids them (404, 403) turns recording off for the life of the process, with one
warning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from stunner_api.vocabulary import ConditionReason, ConditionType

from .apply import Verb, Write

log = logging.getLogger("stunner.events")

EVENTS_API_VERSION = "events.k8s.io/v1"
FAILED_WRITE_EVENT_AFTER = 3  # consecutive refusals of one write before a WriteFailed event
DEDUPE_WINDOW = 600.0  # seconds an identical event is not recorded again
NOTE_LIMIT = 1024  # the API server's limit on `note`
CLUSTER_SCOPED_NAMESPACE = "default"  # where events about cluster-scoped objects go
MANAGED_KINDS = ("Deployment", "DaemonSet", "Service", "ServiceAccount")

NORMAL, WARNING = "Normal", "Warning"


@dataclass(frozen=True)
class Reference:
    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""

    def to_dict(self) -> dict[str, str]:
        out = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            out["namespace"] = self.namespace
        if self.uid:
            out["uid"] = self.uid
        return out


@dataclass(frozen=True)
class EventSpec:
    """One event to record."""

    type: str  # NORMAL or WARNING
    reason: str
    action: str
    note: str
    regarding: Reference
    related: Reference | None = None


# --- what a write's outcome is worth (pure) ----------------------------------------------------


def validity(status: Mapping[str, Any] | None) -> tuple[bool, str] | None:
    """A Gateway status's verdict: (valid, why), None when it has no Accepted condition. Valid:
    Accepted True and not Programmed False Invalid (a rendered config that does not validate)."""
    found = (status or {}).get("conditions")
    conditions = {
        c.get("type"): c for c in (found if isinstance(found, list) else []) if isinstance(c, dict)
    }
    accepted = conditions.get(ConditionType.ACCEPTED)
    if accepted is None:
        return None
    if accepted.get("status") != "True":
        return False, f"{accepted.get('reason')}: {accepted.get('message')}"
    programmed = conditions.get(ConditionType.PROGRAMMED) or {}
    if programmed.get("reason") == ConditionReason.INVALID:
        return False, f"{programmed.get('reason')}: {programmed.get('message')}"
    return True, str(accepted.get("message") or "accepted")


def _owner(obj: Mapping[str, Any] | None, namespace: str) -> Reference | None:
    """The Gateway that owns a Deployment or Service (its controller owner reference)."""
    metadata = (obj or {}).get("metadata") or {}
    for ref in metadata.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("kind") == "Gateway":
            return Reference(
                str(ref.get("apiVersion")),
                "Gateway",
                namespace,
                str(ref.get("name")),
                str(ref.get("uid") or ""),
            )
    return None


def _self(write: Write, previous: Mapping[str, Any] | None) -> Reference:
    uid = str(((previous or {}).get("metadata") or {}).get("uid") or "")
    return Reference(write.api_version, write.kind, write.namespace, write.name, uid)


def regarding(write: Write, previous: Mapping[str, Any] | None) -> Reference:
    """Whom an event about `write` is about: the Gateway for its Deployment or Service (the
    object itself when it names no owner), else the object written."""
    if write.kind in MANAGED_KINDS:
        owner = _owner(write.body, write.namespace) or _owner(previous, write.namespace)
        if owner is not None:
            return owner
    return _self(write, previous)


def for_success(write: Write, previous: Mapping[str, Any] | None) -> list[EventSpec]:
    """The events a write that went through is worth (see the module's docstring)."""
    if write.kind in MANAGED_KINDS and write.verb in (Verb.CREATE, Verb.DELETE):
        where = f"{write.namespace}/{write.name}"
        if write.verb == Verb.CREATE:
            reason, action, note = "Created", "Create", f"created {write.kind} {where}"
        else:
            reason, action, note = "Deleted", "Delete", f"deleted {write.kind} {where}"
        return [
            EventSpec(
                NORMAL, reason, action, note, regarding(write, previous), _self(write, previous)
            )
        ]
    if write.kind == "Gateway" and write.verb == Verb.STATUS:
        new = validity(write.body)
        old = validity((previous or {}).get("status"))
        if new is None or (old is not None and old[0] == new[0]):
            return []
        valid, why = new
        return [
            EventSpec(
                NORMAL if valid else WARNING,
                "Valid" if valid else "Invalid",
                "Render",
                f"Gateway is valid: {why}" if valid else f"Gateway is invalid: {why}",
                _self(write, previous),
            )
        ]
    return []


def for_failure(
    write: Write, previous: Mapping[str, Any] | None, failures: int, error: str
) -> list[EventSpec]:
    """A WriteFailed event on the FAILED_WRITE_EVENT_AFTER-th refusal in a row, else none.
    `error` is kube.api.describe's "CODE Reason: message"; only "CODE Reason" is kept."""
    if failures != FAILED_WRITE_EVENT_AFTER:
        return []
    cause = error.partition(":")[0]
    note = (
        f"{write} failed {failures} times ({cause}); retrying with back-off, the reconciler's "
        "log has the details"
    )
    action = str(write.verb).capitalize()
    return [EventSpec(WARNING, "WriteFailed", action, note, regarding(write, previous))]


def _micro_time(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_body(spec: EventSpec, controller: str, instance: str, now: datetime) -> dict[str, Any]:
    """The events.k8s.io/v1 Event for `spec`."""
    ref = spec.regarding
    body: dict[str, Any] = {
        "apiVersion": EVENTS_API_VERSION,
        "kind": "Event",
        "metadata": {
            "name": f"{ref.name}.{time.time_ns():x}",
            "namespace": ref.namespace or CLUSTER_SCOPED_NAMESPACE,
        },
        "eventTime": _micro_time(now),
        "reportingController": controller,
        "reportingInstance": instance[:128],
        "action": spec.action,
        "reason": spec.reason,
        "type": spec.type,
        "note": spec.note[:NOTE_LIMIT],
        "regarding": ref.to_dict(),
    }
    if spec.related is not None:
        body["related"] = spec.related.to_dict()
    return body


# --- the recorder ------------------------------------------------------------------------------


def _not_allowed(code: int, why: str) -> bool:
    """Whether a refusal says Events cannot be written at all: the API server does not serve
    them (404 for the resource, not a missing namespace) or our RBAC forbids them (403, but not
    a namespace being terminated)."""
    if code == 404:
        return "requested resource" in why
    return code == 403 and "terminat" not in why


class Poster(Protocol):
    """What the recorder needs of kube.api.Api: create an Event (raises on a refusal)."""

    def create_event(self, body: Mapping[str, Any]) -> None: ...


Refusal = Callable[[BaseException], tuple[int, str]]  # an exception -> (HTTP status, one line)


class Recorder:
    """Records EventSpecs (blocking: run it in a thread); a repeat of the last event about an
    object within DEDUPE_WINDOW is dropped."""

    def __init__(
        self,
        api: Poster,
        controller: str,
        instance: str,
        refusal: Refusal,
        *,
        window: float = DEDUPE_WINDOW,
        clock: Callable[[], float] = time.monotonic,
        on_write: Callable[[str], None] = lambda result: None,
    ) -> None:
        self.api = api
        self.controller = controller
        self.instance = instance
        self.refusal = refusal
        self.window = window
        self.clock = clock
        self.on_write = on_write  # told "ok" or the HTTP status of every Event written
        self.enabled = True
        self.recorded = 0
        self.dropped = 0  # duplicates within the window
        self._last: dict[tuple[str, ...], tuple[str, str, float]] = {}

    def _fresh(self, spec: EventSpec) -> bool:
        """Not the same as the last event recorded about the same object (and the same related
        object) within the window."""
        now = self.clock()
        if len(self._last) > 4096:
            self._last = {k: v for k, v in self._last.items() if now - v[2] < self.window}
        ref = spec.regarding
        related = spec.related.kind if spec.related is not None else ""
        key = (ref.kind, ref.namespace, ref.name, ref.uid, related)
        last = self._last.get(key)
        self._last[key] = (spec.reason, spec.note, now)
        return not (
            last is not None
            and last[:2] == (spec.reason, spec.note)
            and now - last[2] < self.window
        )

    def record(self, specs: Sequence[EventSpec]) -> None:
        for spec in specs:
            if not self.enabled:
                return
            if not self._fresh(spec):
                self.dropped += 1
                continue
            body = event_body(spec, self.controller, self.instance, datetime.now(UTC))
            try:
                self.api.create_event(body)
            except Exception as exc:
                code, why = self.refusal(exc)
                self.on_write(str(code))
                if _not_allowed(code, why):
                    self.enabled = False
                    log.warning("no Events recorded from now on: %s (%s)", EVENTS_API_VERSION, why)
                else:
                    log.info("event %s not recorded: %s", spec.reason, why)
                continue
            self.on_write("ok")
            self.recorded += 1
