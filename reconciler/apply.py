"""What to write to the API server to make it hold a render's plan: the pure diff (no I/O).

`plan_writes(plan, current, ours)` compares the plan with the cached objects and returns the
writes that differ, nothing else: a second pass over an unchanged cluster returns no write.

- A Deployment or Service that does not exist is created. One that exists is updated (PUT with
  the cached `resourceVersion`, so a concurrent change is a 409 Conflict, never lost) only when
  the plan's fields are not all already there. The update starts from the cached object and lays
  the plan's fields over it (`overlay`), so what others set is kept: labels, annotations,
  `loadBalancerClass`, `clusterIP`, a port's `nodePort`, defaults the API server filled in
  (Go STUNner's Service churn, its #104 and #205). Lists of named items (ports, containers, env)
  are matched by name; other lists are the plan's.
- The spec fields render decides on a Service (`SERVICE_OWNED_SPEC`) are removed when the plan no
  longer sets them (an `externalTrafficPolicy` whose annotation went away), and so are
  `stunner.l7mp.io/*` annotations the plan no longer carries (as Go does).
- A ServiceAccount is never taken over: one of the planned name that is not the Gateway's
  (`owned_by`: neither labelled as its nor owned by it, a user's own) counts as absent, so its
  create is refused (409 AlreadyExists, retried with back-off) until it is renamed or deleted.
- A Deployment, DaemonSet, Service or ServiceAccount labelled as ours whose Gateway is one of
  ours but has none of its kind in the plan (the Gateway became invalid,
  `disable-managed-dataplane` is set, its Dataplane switched between Deployment and DaemonSet
  or names a ServiceAccount) is deleted. A Gateway that is gone is left to the garbage
  collector (every object carries its owner reference).
- Status goes to the `/status` subresource, only when it differs from the cached status.
  Conditions of types render does not write (another controller's) are kept; at most
  `MAX_CONDITIONS` are written.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from stunner_api.vocabulary import (
    ANNOTATION_PREFIX,
    OWNED_BY_LABEL,
    OWNED_BY_VALUE,
    RELATED_GATEWAY_NAME,
    RELATED_GATEWAY_NAMESPACE,
)

from .render import Plan, StatusUpdate
from .store import Object, labels_of, meta

MAX_CONDITIONS = 8  # Gateway API's limit on conditions (Go keeps at most 8 as well)
# The Service spec fields render decides on, and the value the API server puts in one that is
# left out (a field at its default is not "set by us and no longer wanted").
SERVICE_OWNED_SPEC: Mapping[str, str | None] = {
    "type": "ClusterIP",
    "selector": None,
    "ports": None,
    "sessionAffinity": "None",
    "externalTrafficPolicy": "Cluster",
    "loadBalancerIP": None,
}
DEPLOYMENT = ("apps/v1", "Deployment")
DAEMON_SET = ("apps/v1", "DaemonSet")
# A named item holding one of these (an env var: `value` or `valueFrom`) is the plan's as a
# whole: merged with the stored one it could hold both, which the API server refuses.
ONE_OF = frozenset({"value", "valueFrom"})
SERVICE = ("v1", "Service")
SERVICE_ACCOUNT = ("v1", "ServiceAccount")
NOT_ADOPTED = frozenset({SERVICE_ACCOUNT[1]})  # kinds whose namesakes are never taken over

# (apiVersion, kind, namespace, name) -> the cached object, None if there is none.
Current = Callable[[str, str, str, str], Object | None]
# (kind, namespace, name) -> (resourceVersion, manifest) of a manifest found in place.
Memo = dict[tuple[str, str, str], tuple[Any, Mapping[str, Any]]]


class Verb(StrEnum):
    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"
    STATUS = "status"  # a merge patch of the /status subresource


@dataclass(frozen=True)
class Write:
    """One request to the API server. `body`: the whole object (create, update) or the
    status (status); `uid` of the object deleted (a precondition: never a newer namesake)."""

    verb: Verb
    api_version: str
    kind: str
    namespace: str
    name: str
    body: Mapping[str, Any] | None = None
    uid: str = ""

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.verb} {self.kind} {where}"


# --- comparing and overlaying -------------------------------------------------------------------


def _named(items: Any) -> bool:
    return (
        isinstance(items, list)
        and bool(items)
        and all(isinstance(i, Mapping) and isinstance(i.get("name"), str) for i in items)
    )


def _is_zero(value: Any) -> bool:
    """A value the API server does not store (Go's `omitempty`: false, 0, "", {}, [], null), so
    its absence from the stored object is no difference."""
    return value is None or (not isinstance(value, int | float) and not value) or value is False


def contains(have: Any, want: Any) -> bool:
    """Whether `have` already holds every field of `want` (extra fields in `have` are fine:
    others' fields and the API server's defaults)."""
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(
            contains(have[k], v) if k in have else _is_zero(v) for k, v in want.items()
        )
    if isinstance(want, list):
        if not isinstance(have, list) or len(have) != len(want):
            return False
        if _named(want) and _named(have):
            return [i["name"] for i in have] == [i["name"] for i in want] and all(
                contains(h, w) for h, w in zip(have, want, strict=True)
            )
        return all(contains(h, w) for h, w in zip(have, want, strict=True))
    return bool(have == want)


def overlay(have: Any, want: Any) -> Any:
    """`want` laid over `have`: mappings merge key by key, lists of named items by name (an
    item's other fields are kept, items not wanted go), anything else is `want`."""
    if isinstance(want, Mapping) and isinstance(have, Mapping):
        out = {k: copy.deepcopy(v) for k, v in have.items()}
        for k, v in want.items():
            out[k] = overlay(have.get(k), v)
        return out
    if _named(want) and _named(have):
        by_name = {i["name"]: i for i in have}
        return [
            copy.deepcopy(i) if ONE_OF.intersection(i) else overlay(by_name.get(i["name"]), i)
            for i in want
        ]
    return copy.deepcopy(want)


def _drop_unwanted(obj: dict[str, Any], want: Mapping[str, Any]) -> None:
    """Remove from a Service what render decides on but no longer sets."""
    spec = obj.get("spec")
    want_spec = want.get("spec") or {}
    if isinstance(spec, dict):
        for key, default in SERVICE_OWNED_SPEC.items():
            if key not in want_spec and key in spec and spec[key] != default:
                del spec[key]
    annotations = obj.get("metadata", {}).get("annotations")
    want_annotations = (want.get("metadata") or {}).get("annotations") or {}
    if isinstance(annotations, dict):
        for key in [k for k in annotations if k.startswith(ANNOTATION_PREFIX)]:
            if key not in want_annotations:
                del annotations[key]


def desired_object(have: Object | None, want: Mapping[str, Any]) -> dict[str, Any]:
    """The object to write: `want` over the cached `have` (with its resourceVersion)."""
    if have is None:
        return copy.deepcopy(dict(want))
    out: dict[str, Any] = overlay(have, want)
    out.pop("status", None)
    if want.get("kind") == "Service":
        _drop_unwanted(out, want)
    for key in ("managedFields",):
        out.get("metadata", {}).pop(key, None)
    return out


def needs_update(have: Object, want: Mapping[str, Any]) -> bool:
    """Whether the cached object lacks some of the plan's fields (or holds what render no longer
    wants on a Service)."""
    if not contains(have, want):
        return True
    if want.get("kind") != "Service":
        return False
    spec, want_spec = have.get("spec") or {}, want.get("spec") or {}
    if any(
        key not in want_spec and key in spec and spec[key] != default
        for key, default in SERVICE_OWNED_SPEC.items()
    ):
        return True
    annotations = meta(have).get("annotations") or {}
    wanted = (want.get("metadata") or {}).get("annotations") or {}
    return any(k.startswith(ANNOTATION_PREFIX) and k not in wanted for k in annotations)


# --- status ---------------------------------------------------------------------------------


def merge_conditions(
    previous: Iterable[Mapping[str, Any]], ours: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Ours, then the others' conditions of types we do not write, at most MAX_CONDITIONS."""
    types = {c.get("type") for c in ours}
    others = [dict(c) for c in previous if isinstance(c, Mapping) and c.get("type") not in types]
    return [*ours, *others][:MAX_CONDITIONS]


def _keep_times(ours: Any, cached: Any) -> None:
    """Give our conditions the cached transition time of a condition of the same type and
    status: render kept them against its snapshot; the cache may hold a newer status since (our
    own write of an earlier render), and a flip is only a flip against what is stored."""
    if not isinstance(ours, list) or not isinstance(cached, list):
        return
    before = {c.get("type"): c for c in cached if isinstance(c, Mapping)}
    for condition in ours:
        old = before.get(condition.get("type"))
        if old is not None and old.get("status") == condition.get("status"):
            if old.get("lastTransitionTime"):
                condition["lastTransitionTime"] = old["lastTransitionTime"]


def desired_status(current: Object | None, update: StatusUpdate) -> dict[str, Any]:
    status = copy.deepcopy(dict(update.status))
    old = (current or {}).get("status")
    old = old if isinstance(old, Mapping) else {}
    if "conditions" in status:
        _keep_times(status["conditions"], old.get("conditions"))
        status["conditions"] = merge_conditions(old.get("conditions") or [], status["conditions"])
    old_listeners = {
        entry.get("name"): entry
        for entry in old.get("listeners") or []
        if isinstance(entry, Mapping)
    }
    for entry in status.get("listeners") or []:
        _keep_times(
            entry.get("conditions"), old_listeners.get(entry.get("name"), {}).get("conditions")
        )
    for entry in status.get("parents") or []:
        for old_entry in old.get("parents") or []:
            if isinstance(old_entry, Mapping) and (
                old_entry.get("parentRef"),
                old_entry.get("controllerName"),
            ) == (entry.get("parentRef"), entry.get("controllerName")):
                _keep_times(entry.get("conditions"), old_entry.get("conditions"))
    return status


# --- the plan -------------------------------------------------------------------------------


def _owner_gateway(obj: Object) -> str | None:
    labels = labels_of(obj)
    if labels.get(OWNED_BY_LABEL) != OWNED_BY_VALUE:
        return None
    name, namespace = labels.get(RELATED_GATEWAY_NAME), labels.get(RELATED_GATEWAY_NAMESPACE)
    return f"{namespace}/{name}" if name and namespace else None


def owned_by(have: Object, want: Mapping[str, Any], gw_id: str) -> bool:
    """Whether a live object is Gateway `gw_id`'s own: labelled as its, or owned by the Gateway
    (the uid the planned manifest `want` names)."""
    uids = {r.get("uid") for r in (want.get("metadata") or {}).get("ownerReferences") or []}
    owners = meta(have).get("ownerReferences") or []
    return _owner_gateway(have) == gw_id or any(
        isinstance(r, Mapping) and r.get("uid") in uids for r in owners
    )


def owner_present(want: Mapping[str, Any], current: Current) -> bool:
    """Whether every Gateway a manifest names as its owner is cached, with the uid it names.
    Writes follow the last plan, and a deleted workload (the garbage collector's, once its
    Gateway is gone) is diffed against that plan at once, before the render the Gateway's
    deletion triggered: without this check the plan, rendered while the Gateway still existed,
    wrote the Service and Deployment back, and their new pods came and went (found on the real
    node)."""
    metadata = want.get("metadata") or {}
    for reference in metadata.get("ownerReferences") or []:
        if reference.get("kind") != "Gateway":
            continue
        owner = current(
            str(reference.get("apiVersion")),
            "Gateway",
            str(metadata.get("namespace")),
            str(reference.get("name")),
        )
        if owner is None or meta(owner).get("uid") != reference.get("uid"):
            return False
    return True


def manifest_writes(
    kind: tuple[str, str],
    wanted: Mapping[str, Mapping[str, Any]],
    existing: Iterable[Object],
    current: Current,
    ours: Collection[str],
    memo: Memo | None = None,
) -> list[Write]:
    """Creates and updates for the wanted manifests of one kind, deletions for ours not wanted.
    `memo` remembers the manifests found already in place (by the cached resourceVersion), so
    an unchanged one is passed over with one equality test."""
    api_version, kind_name = kind
    writes: list[Write] = []
    for gw_id in sorted(wanted):
        want = wanted[gw_id]
        namespace, name = want["metadata"]["namespace"], want["metadata"]["name"]
        have = current(api_version, kind_name, namespace, name)
        if have is not None and kind_name in NOT_ADOPTED and not owned_by(have, want, gw_id):
            have = None  # not ours: never updated, and its create says why it is refused
        key = (kind_name, namespace, name)
        version = meta(have or {}).get("resourceVersion")
        if memo is not None and have is not None and memo.get(key) == (version, want):
            continue
        if not owner_present(want, current):
            continue  # its Gateway is gone: the garbage collector deletes what it owned
        if have is None:
            writes.append(
                Write(
                    Verb.CREATE, api_version, kind_name, namespace, name, desired_object(None, want)
                )
            )
        elif needs_update(have, want):
            body = desired_object(have, want)
            writes.append(Write(Verb.UPDATE, api_version, kind_name, namespace, name, body))
        elif memo is not None:
            memo[key] = (version, want)
    for obj in existing:
        owner = _owner_gateway(obj)
        if owner is None or owner not in ours or owner in wanted:
            continue
        if meta(obj).get("deletionTimestamp"):
            continue
        namespace, name = str(meta(obj).get("namespace")), str(meta(obj).get("name"))
        uid = str(meta(obj).get("uid") or "")
        writes.append(Write(Verb.DELETE, api_version, kind_name, namespace, name, uid=uid))
    return writes


def status_writes(
    statuses: Iterable[StatusUpdate], current: Current, memo: Memo | None = None
) -> list[Write]:
    """The status writes the plan needs. `memo` remembers the statuses found in place (by the
    cached resourceVersion), as for the manifests: a status a kept part of the plan still holds
    (the very same object) is passed over with one comparison."""
    writes = []
    for update in statuses:
        have = current(update.api_version, update.kind, update.namespace, update.name)
        if have is None:
            continue  # gone since the snapshot: nothing to report on
        key = (update.kind, update.namespace, update.name)
        version = meta(have).get("resourceVersion")
        if memo is not None and memo.get(key) == (version, update.status):
            continue
        if have.get("status") == update.status:  # the common case, compared without a copy
            if memo is not None:
                memo[key] = (version, update.status)
            continue
        status = desired_status(have, update)
        if have.get("status") == status:
            if memo is not None:
                memo[key] = (version, update.status)
            continue
        writes.append(
            Write(
                Verb.STATUS,
                str(have.get("apiVersion") or update.api_version),
                update.kind,
                update.namespace,
                update.name,
                status,
            )
        )
    return writes


def plan_writes(
    plan: Plan,
    current: Current,
    ours: Collection[str],
    deployments: Iterable[Object] = (),
    services: Iterable[Object] = (),
    memo: Memo | None = None,
    daemonsets: Iterable[Object] = (),
    service_accounts: Iterable[Object] = (),
) -> list[Write]:
    """Every write that makes the cluster hold `plan`, in order: ServiceAccounts (before the pods
    that run as them), Services, the stunnerd workloads (Deployments, DaemonSets), status.
    `ours`: the ids of every Gateway of our GatewayClasses; `deployments`, `daemonsets`,
    `services` and `service_accounts`: the cached ones labelled as ours (candidates for
    deletion). A Gateway's workload in the plan is of one kind: its namesake of
    the other kind is deleted (the Dataplane switched `dataplaneResource`)."""
    workloads = {
        kind: {
            gw_id: manifest
            for gw_id, manifest in plan.deployments.items()
            if manifest.get("kind") == kind[1]
        }
        for kind in (DEPLOYMENT, DAEMON_SET)
    }
    accounts = plan.service_accounts
    return [
        *manifest_writes(SERVICE_ACCOUNT, accounts, service_accounts, current, ours, memo),
        *manifest_writes(SERVICE, plan.services, services, current, ours, memo),
        *manifest_writes(DEPLOYMENT, workloads[DEPLOYMENT], deployments, current, ours, memo),
        *manifest_writes(DAEMON_SET, workloads[DAEMON_SET], daemonsets, current, ours, memo),
        *status_writes(plan.statuses, current, memo),
    ]
