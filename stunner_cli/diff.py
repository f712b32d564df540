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

import kubernetes.client

from reconciler.kube.api import Api
from reconciler.render import RenderSettings, render
from reconciler.store import WATCHED, Snapshot
from stunner_api.cds import split_id
from stunner_api.dataplane import StunnerConfig
from stunner_api.restart import ListenerChange, listener_changes
from stunner_cli.cluster import ClusterError, Target, cds_configs, dataplane_status
from stunner_cli.offline import Located

Key = tuple[str, str, str, str]  # group, kind, namespace, name
DROPS = (ListenerChange.RESTARTED, ListenerChange.REMOVED)  # the changes that drop allocations


def _key(obj: Mapping[str, Any]) -> Key:
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    meta = obj.get("metadata") or {}
    return group, str(obj.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name"))


def live_objects(client: kubernetes.client.ApiClient) -> list[dict[str, Any]]:
    """Every object of the kinds cluster mode watches, as the API serves them now."""
    api = Api(client)
    out: list[dict[str, Any]] = []
    for watched in WATCHED:
        if not watched.rendered:
            continue
        for version in watched.versions:
            try:
                items, _ = api.list(watched, version)
            except kubernetes.client.exceptions.ApiException as e:
                if e.status == 404:
                    continue  # this version (or the CRD) is not served
                raise ClusterError(f"listing {watched.name}: HTTP {e.status} {e.reason}") from None
            except Exception as e:
                raise ClusterError(f"cannot reach the Kubernetes API: {e}") from None
            out.extend(items)
            break
    return out


def proposed(
    live: list[dict[str, Any]], files: list[Located], settings: RenderSettings
) -> Mapping[str, StunnerConfig]:
    """The configs the reconciler would render once the files' objects are applied."""
    objects = {_key(o): o for o in live}
    for located in files:
        namespaced = located.obj.get("metadata", {})
        if located.obj.get("kind") not in ("GatewayClass", "Dataplane", "Namespace", "Node"):
            namespaced.setdefault("namespace", "default")
        objects[_key(located.obj)] = located.obj
    snapshot = Snapshot.from_objects(objects.values())
    return render(snapshot, settings, datetime.datetime.now(datetime.UTC)).configs


def report(client: kubernetes.client.ApiClient, target: Target, files: list[Located]) -> list[str]:
    running = {c.admin.name: c for c in cds_configs(client, Target(target.namespace))}
    after = proposed(live_objects(client), files, RenderSettings())
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
            pods = dataplane_status(client, Target(target.namespace, namespace, name))
            allocations = sum(int(p["status"].get("allocationCount", 0)) for p in pods)
            lines.append(
                f"  cost: {len(dropping)} listener(s) restarted or removed; up to {allocations} "
                f"live allocations dropped on {len(pods)} stunnerd pod(s) (/status counts "
                "allocations per pod, not per listener)"
            )
    return lines or ["no Gateways"]
