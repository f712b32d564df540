"""The pure parts of cluster mode: the diff (`reconciler.apply`) and the event filter
(`reconciler.relevance`)."""

from __future__ import annotations

from typing import Any

import pytest

from reconciler.apply import (
    MAX_CONDITIONS,
    Verb,
    contains,
    desired_object,
    manifest_writes,
    merge_conditions,
    needs_update,
    overlay,
    status_writes,
)
from reconciler.relevance import References
from reconciler.render import StatusUpdate
from reconciler.store import Snapshot
from tests.reconciler import clusterkit as k

OURS = {
    "stunner.l7mp.io/owned-by": "stunner",
    "stunner.l7mp.io/related-gateway-name": "gw",
    "stunner.l7mp.io/related-gateway-namespace": "stunner",
}


@pytest.mark.parametrize(
    ("have", "want", "expected"),
    [
        ({"a": 1, "b": 2}, {"a": 1}, True),  # extra fields (others', defaults) are fine
        ({"a": 1}, {"a": 2}, False),
        ({}, {"a": None}, True),  # the API server stores no zero value (Go's omitempty)
        ({}, {"hostNetwork": False, "annotations": {}, "args": []}, True),
        ({}, {"replicas": 1}, False),
        ({"a": 1}, {"a": None}, False),
        ([{"name": "x", "p": 1, "q": 2}], [{"name": "x", "p": 1}], True),
        ([{"name": "y", "p": 1}], [{"name": "x", "p": 1}], False),
        ([{"name": "x"}, {"name": "y"}], [{"name": "y"}, {"name": "x"}], False),  # order counts
        ([1, 2], [1, 2, 3], False),
        ([{"name": "A", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "x"}}}],
         [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}], True),
    ],
)  # fmt: skip
def test_contains(have: Any, want: Any, expected: bool) -> None:
    assert contains(have, want) is expected


def test_overlay_keeps_others_fields_and_matches_named_items() -> None:
    have = {
        "metadata": {"labels": {"team": "media", "app": "old"}},
        "spec": {
            "loadBalancerClass": "example.com/lb",
            "ports": [
                {"name": "udp", "port": 3478, "nodePort": 30001},
                {"name": "gone", "port": 1},
            ],
        },
    }
    want = {
        "metadata": {"labels": {"app": "stunner"}},
        "spec": {"ports": [{"name": "tcp", "port": 3479}, {"name": "udp", "port": 3478}]},
    }
    assert overlay(have, want) == {
        "metadata": {"labels": {"team": "media", "app": "stunner"}},
        "spec": {
            "loadBalancerClass": "example.com/lb",
            "ports": [
                {"name": "tcp", "port": 3479},
                {"name": "udp", "port": 3478, "nodePort": 30001},
            ],
        },
    }


def test_an_env_var_changing_from_value_to_value_from_is_replaced_not_merged() -> None:
    have = {"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}
    want = {"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "x"}}},
                    {"name": "B", "value": "3"}]}  # fmt: skip
    assert overlay(have, want) == want


def _service(spec: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "gw",
            "namespace": "stunner",
            "labels": dict(OURS),
            "annotations": annotations or {},
            "resourceVersion": "7",
        },
        "spec": spec,
    }


def test_a_service_loses_what_render_no_longer_sets_but_not_the_api_servers_defaults() -> None:
    want = _service({"type": "LoadBalancer", "ports": []}, {"stunner.l7mp.io/x": "1"})
    defaults = _service(
        {"type": "LoadBalancer", "ports": [], "externalTrafficPolicy": "Cluster",
         "sessionAffinity": "None", "clusterIP": "10.0.0.1"},
        {"stunner.l7mp.io/x": "1", "example.com/y": "2"},
    )  # fmt: skip
    assert not needs_update(defaults, want)
    stale = _service(
        {"type": "LoadBalancer", "ports": [], "externalTrafficPolicy": "Local",
         "loadBalancerIP": "1.2.3.4"},
        {"stunner.l7mp.io/x": "1", "stunner.l7mp.io/old": "1", "example.com/y": "2"},
    )  # fmt: skip
    assert needs_update(stale, want)
    body = desired_object(stale, want)
    assert "externalTrafficPolicy" not in body["spec"] and "loadBalancerIP" not in body["spec"]
    assert body["metadata"]["annotations"] == {"stunner.l7mp.io/x": "1", "example.com/y": "2"}
    assert body["metadata"]["resourceVersion"] == "7"  # the update is conditional


def test_deletions_only_for_our_gateways_without_a_plan() -> None:
    def deployment(name: str, **labels: str) -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": "stunner", "uid": f"u-{name}",
                         "labels": OURS | {"stunner.l7mp.io/related-gateway-name": name} | labels},
        }  # fmt: skip

    existing = [
        deployment("invalid"),  # ours, no plan: deleted
        deployment("planned"),  # ours, planned: kept
        deployment("foreign"),  # a Gateway of another controller: kept
        deployment("mine", **{"stunner.l7mp.io/owned-by": "someone-else"}),
    ]
    planned = existing[1]
    writes = manifest_writes(
        ("apps/v1", "Deployment"),
        {"stunner/planned": planned},
        existing,
        lambda api_version, kind, ns, name: planned if name == "planned" else None,
        {"stunner/invalid", "stunner/planned", "stunner/mine"},
    )
    assert [(w.verb, w.name, w.uid) for w in writes] == [(Verb.DELETE, "invalid", "u-invalid")]


def test_a_plan_writes_nothing_back_for_a_gateway_gone_since_it_was_rendered() -> None:
    """The last plan still has the Gateway's Service and Deployment, the cache no longer has the
    Gateway (deleted) nor its workload (the garbage collector's): nothing is created, until a
    Gateway of that name with the uid the manifests name is cached again. Found on the real
    node: the workload's deletion was diffed against the stale plan at once, and the Gateway's
    pods came back for a moment."""
    owner = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "name": "gw",
             "uid": "uid-gw", "controller": True}  # fmt: skip
    want = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "gw", "namespace": "stunner", "labels": OURS,
                     "ownerReferences": [owner]},
        "spec": {"replicas": 2},
    }  # fmt: skip
    cached: dict[tuple[str, str], Any] = {}

    def writes() -> list[tuple[Verb, str]]:
        found = manifest_writes(
            ("apps/v1", "Deployment"),
            {"stunner/gw": want},
            [],
            lambda api_version, kind, ns, name: cached.get((kind, name)),
            {"stunner/gw"},
        )
        return [(w.verb, w.name) for w in found]

    assert writes() == []  # the Gateway is gone
    cached["Gateway", "gw"] = {"metadata": {"name": "gw", "namespace": "stunner", "uid": "other"}}
    assert writes() == []  # another Gateway of that name: the next render's plan names it
    cached["Gateway", "gw"]["metadata"]["uid"] = "uid-gw"
    assert writes() == [(Verb.CREATE, "gw")]


def test_conditions_of_others_are_kept_up_to_the_limit() -> None:
    ours = [{"type": "Accepted"}, {"type": "Programmed"}]
    previous = [{"type": "Accepted", "status": "old"}] + [{"type": f"Other{i}"} for i in range(10)]
    merged = merge_conditions(previous, ours)
    assert len(merged) == MAX_CONDITIONS
    assert merged[:3] == [{"type": "Accepted"}, {"type": "Programmed"}, {"type": "Other0"}]


def _references(*extra: dict[str, Any]) -> References:
    objects = [k.gateway_class(), k.gateway_config(), k.dataplane(), k.gateway(), k.route()]
    return References.of(Snapshot.from_objects([*objects, *extra]), k.CONTROLLER)


def test_the_event_filter() -> None:
    backend = k.route({"name": "media"}, name="r2")
    refs = _references(backend)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s", "namespace": "stunner"},
    }
    assert not refs.wants(secret, None)
    config = k.gateway_config(authRef={"name": "s"})
    assert _references(config).wants(secret, None)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "media", "namespace": "stunner", "resourceVersion": "1"},
    }
    assert refs.wants(service, None)
    assert not refs.wants(
        service | {"metadata": {**service["metadata"], "resourceVersion": "2"}}, service
    )  # nothing but bookkeeping changed
    other = service | {"metadata": {"name": "other", "namespace": "stunner"}}
    assert not refs.wants(other, None)
    gateway = k.gateway()
    with_status = gateway | {"status": {"conditions": [{"type": "Accepted"}]}}
    assert not refs.wants(with_status, gateway)  # our own status write comes back
    assert refs.wants(k.gateway(k.listener(port=1)), gateway)
    foreign = k.gateway(gateway_class="not-ours")
    assert not refs.wants(foreign, None)
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n"},
        "status": {
            "addresses": [{"type": "ExternalIP", "address": "1.2.3.4"}],
            "conditions": [{"type": "Ready", "lastHeartbeatTime": "t1"}],
        },
    }
    heartbeat = node | {"status": {**node["status"], "conditions": [{"lastHeartbeatTime": "t2"}]}}
    assert not refs.wants(heartbeat, node)
    assert refs.wants(node | {"status": {"addresses": []}}, node)
    # what relay address discovery and the node-local URIs read: the annotation, the taints
    named = {**node["metadata"], "annotations": {"stunner.l7mp.io/relay-address": "192.0.2.1"}}
    assert refs.wants(node | {"metadata": named}, node)
    taint = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
    assert refs.wants(node | {"spec": {"taints": [taint]}}, node)
    other = {**node["metadata"], "annotations": {"example.com/note": "x"}}
    assert not refs.wants(node | {"metadata": other}, node)


def test_a_plan_older_than_the_cache_writes_no_status_for_a_time_alone() -> None:
    """A render computed before our own previous status write landed in the cache: the same
    statuses with newer times are not written again; a flip is."""

    def gateway(accepted: str, at: str) -> dict[str, Any]:
        condition = {"type": "Accepted", "status": accepted, "lastTransitionTime": at}
        return k.gateway() | {
            "status": {
                "conditions": [condition],
                "listeners": [{"name": "udp", "conditions": [condition]}],
            }
        }

    cached = gateway("True", "2026-01-01T00:00:01Z")
    same = gateway("True", "2026-01-01T00:00:09Z")
    update = StatusUpdate(k.GW, "Gateway", k.NS, "gw", 1, same["status"])
    assert status_writes([update], lambda *key: cached) == []
    flipped = gateway("False", "2026-01-01T00:00:09Z")
    update = StatusUpdate(k.GW, "Gateway", k.NS, "gw", 1, flipped["status"])
    (write,) = status_writes([update], lambda *key: cached)
    assert write.body is not None
    assert write.body["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:09Z"
