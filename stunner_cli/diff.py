"""`helm stunner diff -f PATH [NS/GW]`: what applying manifests would change in the running
dataplanes, and what it costs.

The configs running now come from the CDS. The configs after come from the reconciler's own
render over the cluster's objects as they are (listed through the API, the kinds cluster mode
watches) with the manifests' objects put in their place. Each listener is compared with the
restart rule stunnerd applies (stunner_api.restart); a restart drops the listener's allocations,
counted from the Gateway's stunnerd pods' /status.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from reconciler.render import RenderSettings, render
from reconciler.store import CLUSTER_SCOPED, Snapshot, kind_of
from stunner_api.cds import split_id
from stunner_api.dataplane import StunnerConfig
from stunner_api.restart import ListenerChange, listener_changes
from stunner_cli.cluster import Target, cds_configs, dataplane_status
from stunner_cli.kube import Kube
from stunner_cli.offline import Located

Key = tuple[str, str, str, str]  # group, kind, namespace, name
DROPS = (ListenerChange.RESTARTED, ListenerChange.REMOVED)  # the changes that drop allocations


def _key(obj: Mapping[str, Any]) -> Key:
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    meta = obj.get("metadata") or {}
    return group, str(obj.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name"))


def proposed(
    live: list[dict[str, Any]], files: list[Located], settings: RenderSettings
) -> Mapping[str, StunnerConfig]:
    """The configs the reconciler would render once the files' objects are applied."""
    objects = {_key(o): o for o in live}
    for located in files:
        if kind_of(located.obj) not in CLUSTER_SCOPED:  # the kinds table's scope column
            located.obj.setdefault("metadata", {}).setdefault("namespace", "default")
        objects[_key(located.obj)] = located.obj
    snapshot = Snapshot.from_objects(objects.values())
    return render(snapshot, settings, datetime.datetime.now(datetime.UTC)).configs


def report(kube: Kube, target: Target, files: list[Located]) -> list[str]:
    running = {c.admin.name: c for c in cds_configs(kube, Target(target.namespace))}
    after = proposed(kube.rendered_objects(), files, RenderSettings())
    lines: list[str] = []
    for id in sorted(running.keys() | after.keys()):
        namespace, name = split_id(id)
        if target.gateway_namespace and namespace != target.gateway_namespace:
            continue
        if target.gateway and name != target.gateway:
            continue
        changes = listener_changes(running.get(id), after.get(id))
        if all(c == ListenerChange.UNCHANGED for c in changes.values()):
            lines.append(f"{id}: unchanged")
            continue
        lines.append(f"{id}:" + ("" if id in after else " deleted (its stunnerd pods drain)"))
        dropping = [
            n for n, c in changes.items() if c in (ListenerChange.RESTARTED, ListenerChange.REMOVED)
        ]
        for listener, change in changes.items():
            lines.append(f"  {listener}: {change}")
        if dropping:
            pods = dataplane_status(kube, Target(target.namespace, namespace, name))
            allocations = sum(int(p["status"].get("allocationCount", 0)) for p in pods)
            lines.append(
                f"  cost: {len(dropping)} listener(s) restarted or removed; up to {allocations} "
                f"live allocations dropped on {len(pods)} stunnerd pod(s) (/status counts "
                "allocations per pod, not per listener)"
            )
    return lines or ["no Gateways"]
