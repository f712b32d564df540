"""The vocabulary's kinds table is the one list of kinds: render's `Kind` names are exactly its
rendered rows, the cache holds exactly its watched rows, and a Snapshot built from one object of
every watched kind keeps what render reads (cluster-scoped ones without a namespace) and leaves
out the rest."""

from __future__ import annotations

from typing import Any

from reconciler.kube.api import WRITTEN, resource_path
from reconciler.store import CLUSTER_SCOPED, WATCHED, Cache, Kind, Snapshot, kind_of
from stunner_api.vocabulary import (
    DAEMON_SET,
    DATAPLANE_POD_SELECTOR,
    DEPLOYMENT,
    GATEWAY_CLASS,
    KINDS,
    OWNED_BY_LABEL,
    OWNED_BY_VALUE,
    POD,
    RENDERED_KINDS,
    SECRET,
    SERVICE_ACCOUNT,
    WATCHED_KINDS,
    WRITTEN_KINDS,
    KindInfo,
    api_version,
)


def one_of(info: KindInfo, version: str) -> dict[str, Any]:
    metadata = {"name": "x", **({"namespace": "ns"} if info.namespaced else {})}
    return {"apiVersion": api_version(info.group, version), "kind": info.kind, "metadata": metadata}


def test_render_names_exactly_the_rendered_rows() -> None:
    assert {str(kind) for kind in Kind} == {info.name for info in RENDERED_KINDS}
    assert CLUSTER_SCOPED == {Kind(i.name) for i in RENDERED_KINDS if not i.namespaced}


def test_every_row_is_one_kind_and_the_lists_are_its_columns() -> None:
    assert len({(i.group, i.kind) for i in KINDS}) == len(KINDS)
    assert [w.info for w in WATCHED] == [i for i in KINDS if i.watch]
    assert set(WRITTEN.values()) == set(WRITTEN_KINDS)
    assert set(RENDERED_KINDS) <= set(WATCHED_KINDS)  # render reads only what is watched
    assert [w.label_selector for w in WATCHED if w.label_selector] == [
        f"{OWNED_BY_LABEL}={OWNED_BY_VALUE}"  # our Deployments, DaemonSets, accounts, by label
    ] * 3 + [DATAPLANE_POD_SELECTOR]  # the Gateways' dataplane pods (who may report usage)
    assert [w.info for w in WATCHED if not w.rendered] == [
        DEPLOYMENT,
        DAEMON_SET,
        SERVICE_ACCOUNT,
        POD,
    ]


def test_a_snapshot_keeps_every_version_of_the_rendered_kinds_and_ignores_the_rest() -> None:
    objects = [one_of(info, version) for info in WATCHED_KINDS for version in info.watch]
    snapshot = Snapshot.from_objects(objects)
    for info in RENDERED_KINDS:
        kind = Kind(info.name)
        namespace = "ns" if info.namespaced else ""
        assert set(snapshot.objects[kind]) == {(namespace, "x")}, info.name
        for version in info.watch:
            assert kind_of(one_of(info, version)) is kind
    assert [(i.kind, i.reason) for i in snapshot.ignored] == [
        ("Deployment", "not a kind the operator reads"),
        ("DaemonSet", "not a kind the operator reads"),
        ("ServiceAccount", "not a kind the operator reads"),
        ("Pod", "not a kind the operator reads"),
    ]
    assert snapshot.gateway_class("x") is not None and snapshot.secret("ns", "x") is not None


def test_the_cache_holds_the_watched_rows_and_hands_render_the_rendered_ones() -> None:
    cache = Cache()
    for watched in cache.watched:
        cache.replace(watched, [one_of(watched.info, watched.versions[0])], "1")
    assert cache.synced and cache.freshness() == (True, "cache fresh")
    rendered = {(o["apiVersion"], o["kind"]) for o in cache.rendered_objects()}
    assert rendered == {(api_version(i.group, i.watch[0]), i.kind) for i in RENDERED_KINDS}
    assert cache.get("apps/v1", "Deployment", "ns", "x") is not None


def test_rest_paths_follow_the_rows() -> None:
    assert resource_path(GATEWAY_CLASS, "v1", "ns", "c") == (
        "/apis/gateway.networking.k8s.io/v1/gatewayclasses/c"  # cluster-scoped: no namespace
    )
    assert resource_path(SECRET, "v1", "ns") == "/api/v1/namespaces/ns/secrets"
