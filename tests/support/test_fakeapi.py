"""The fake API server against the official kubernetes client, unchanged.

We test these aspects:
- CRUD through CoreV1Api and CustomObjectsApi, with Status objects on 404 and 409.
- resourceVersion: monotonically increasing, 409 Conflict on a stale update.
- Label and field selectors on list.
- generation bumps on spec changes only; the /status subresource changes only status.
- Patches: merge, JSON patch, strategic merge (treated as merge).
- kubernetes.watch.Watch().stream: ADDED/MODIFIED/DELETED, resume from a resourceVersion,
  timeoutSeconds ends the stream, 410 Gone after compaction.
- Finalizers defer deletion; fault injection answers with the chosen error.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.support.fakeapi import FakeApiServer, label_selector_matches

GW = ("gateway.networking.k8s.io", "v1")


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def api(fake: FakeApiServer) -> Iterator[client.ApiClient]:
    api_client = fake.api_client()
    try:
        yield api_client
    finally:
        api_client.close()


def secret(name: str, labels: dict[str, str] | None = None, **data: str) -> client.V1Secret:
    return client.V1Secret(
        metadata=client.V1ObjectMeta(name=name, labels=labels), string_data=data or None
    )


def gateway(name: str, cls: str = "stunner") -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": name},
        "spec": {
            "gatewayClassName": cls,
            "listeners": [{"name": "udp", "port": 3478, "protocol": "UDP"}],
        },
    }


def condition(type_: str) -> dict[str, Any]:
    """A condition with every field Gateway API's status schema requires."""
    return {
        "type": type_,
        "status": "True",
        "reason": type_,
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


def test_core_crud_and_errors(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    created = core.create_namespaced_secret("default", secret("s1", user="u"))
    assert created.metadata.uid and created.metadata.creation_timestamp
    assert created.metadata.namespace == "default"
    rv1 = int(created.metadata.resource_version)

    got = core.read_namespaced_secret("s1", "default")
    assert got.string_data == {"user": "u"}

    with pytest.raises(ApiException) as err:
        core.create_namespaced_secret("default", secret("s1"))
    assert err.value.status == 409
    assert json.loads(err.value.body)["reason"] == "AlreadyExists"

    with pytest.raises(ApiException) as err:
        core.read_namespaced_secret("nope", "default")
    assert err.value.status == 404
    status = json.loads(err.value.body)
    assert status["kind"] == "Status" and status["reason"] == "NotFound"
    assert status["message"] == 'secrets "nope" not found'

    got.metadata.labels = {"a": "b"}
    updated = core.replace_namespaced_secret("s1", "default", got)
    assert int(updated.metadata.resource_version) > rv1

    got.metadata.labels = {"a": "stale"}  # still carries rv1
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_secret("s1", "default", got)
    assert err.value.status == 409
    assert json.loads(err.value.body)["reason"] == "Conflict"

    core.delete_namespaced_secret("s1", "default")
    with pytest.raises(ApiException) as err:
        core.read_namespaced_secret("s1", "default")
    assert err.value.status == 404


def test_namespaces_are_cluster_scoped(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="stunner")))
    core.create_namespaced_config_map(
        "stunner", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cm"), data={"k": "v"})
    )
    assert [n.metadata.name for n in core.list_namespace().items] == ["stunner"]
    assert core.read_namespaced_config_map("cm", "stunner").data == {"k": "v"}
    assert core.list_namespaced_config_map("default").items == []
    assert len(core.list_config_map_for_all_namespaces().items) == 1


def test_label_and_field_selectors(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_secret("default", secret("a", {"app": "stunner", "tier": "x"}))
    core.create_namespaced_secret("default", secret("b", {"app": "stunner", "tier": "y"}))
    core.create_namespaced_secret("default", secret("c", {"app": "other"}))

    def names(**kw: str) -> list[str]:
        listed = core.list_namespaced_secret("default", **kw)
        assert int(listed.metadata.resource_version) >= 3
        return [s.metadata.name for s in listed.items]

    assert names(label_selector="app=stunner") == ["a", "b"]
    assert names(label_selector="app=stunner,tier!=x") == ["b"]
    assert names(label_selector="tier in (x,z)") == ["a"]
    assert names(label_selector="tier notin (x)") == ["b", "c"]
    assert names(label_selector="tier") == ["a", "b"]
    assert names(label_selector="!tier") == ["c"]
    assert names(field_selector="metadata.name=c") == ["c"]
    with pytest.raises(ApiException) as err:
        core.list_namespaced_secret("default", label_selector="a in b")
    assert err.value.status == 400


def test_label_selector_parser() -> None:
    assert label_selector_matches("", {})
    assert label_selector_matches("a==b , c in (d, e)", {"a": "b", "c": "e"})
    assert not label_selector_matches("a notin (b)", {"a": "b"})


def test_custom_objects_generation_and_status(api: client.ApiClient) -> None:
    co = client.CustomObjectsApi(api)
    created = co.create_namespaced_custom_object(*GW, "default", "gateways", gateway("gw"))
    assert created["metadata"]["generation"] == 1

    # Metadata-only change: no generation bump.
    patched = co.patch_namespaced_custom_object(
        *GW, "default", "gateways", "gw", {"metadata": {"labels": {"x": "y"}}}
    )
    assert patched["metadata"]["generation"] == 1
    assert patched["metadata"]["labels"] == {"x": "y"}

    # Status through the main endpoint is ignored.
    patched["status"] = {"conditions": [condition("Accepted")]}
    replaced = co.replace_namespaced_custom_object(*GW, "default", "gateways", "gw", patched)
    assert "status" not in replaced and replaced["metadata"]["generation"] == 1

    # The status subresource changes only status, and not the generation.
    st = co.patch_namespaced_custom_object_status(
        *GW,
        "default",
        "gateways",
        "gw",
        {"status": {"conditions": [condition("Programmed")]}, "spec": {"gatewayClassName": "zz"}},
    )
    assert st["status"] == {"conditions": [condition("Programmed")]}
    assert st["spec"]["gatewayClassName"] == "stunner"
    assert st["metadata"]["generation"] == 1

    # A spec change bumps the generation and keeps the status.
    spec = co.patch_namespaced_custom_object(
        *GW,
        "default",
        "gateways",
        "gw",
        [{"op": "replace", "path": "/spec/gatewayClassName", "value": "other"}],
        _content_type="application/json-patch+json",
    )
    assert spec["metadata"]["generation"] == 2
    assert spec["status"] == st["status"]
    assert int(spec["metadata"]["resourceVersion"]) > int(st["metadata"]["resourceVersion"])

    # Stale status update -> 409.
    st["status"] = {}
    with pytest.raises(ApiException) as err:
        co.replace_namespaced_custom_object_status(*GW, "default", "gateways", "gw", st)
    assert err.value.status == 409


def test_cluster_scoped_custom_object(api: client.ApiClient) -> None:
    co = client.CustomObjectsApi(api)
    body = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GatewayClass",
        "metadata": {"name": "stunner"},
        "spec": {"controllerName": "stunner.l7mp.io/gateway-operator"},
    }
    co.create_cluster_custom_object(*GW, "gatewayclasses", body)
    got = co.get_cluster_custom_object(*GW, "gatewayclasses", "stunner")
    assert got["spec"]["controllerName"] == "stunner.l7mp.io/gateway-operator"
    assert "namespace" not in got["metadata"]
    with pytest.raises(ApiException) as err:
        co.get_cluster_custom_object(*GW, "gatewayclasses", "missing")
    assert err.value.status == 404
    co.delete_cluster_custom_object(*GW, "gatewayclasses", "stunner")
    assert co.list_cluster_custom_object(*GW, "gatewayclasses")["items"] == []


def test_strategic_merge_patch_on_core(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cm"), data={"a": "1"})
    )
    # The client sends a dict body as strategic-merge-patch+json.
    out = core.patch_namespaced_config_map("cm", "default", {"data": {"b": "2", "a": None}})
    assert out.data == {"b": "2"}


def test_watch_stream_events_and_resume(fake: FakeApiServer, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_secret("default", secret("pre"))
    start_rv = core.list_namespaced_secret("default").metadata.resource_version

    def mutate() -> None:
        time.sleep(0.1)
        core.create_namespaced_secret("default", secret("w1", {"app": "x"}))
        core.patch_namespaced_secret("w1", "default", {"metadata": {"labels": {"k": "v"}}})
        core.create_namespaced_secret("default", secret("other"))
        core.delete_namespaced_secret("w1", "default")

    thread = threading.Thread(target=mutate)
    thread.start()
    w = watch.Watch()
    seen = []
    for event in w.stream(
        core.list_namespaced_secret,
        "default",
        label_selector="app=x",
        resource_version=start_rv,
        timeout_seconds=5,
    ):
        seen.append((event["type"], event["object"].metadata.name))
        if event["type"] == "DELETED":
            w.stop()
    thread.join()
    assert seen == [("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]

    # Resume from the start: the history replays; no resourceVersion: the current state.
    replay = [
        (e["type"], e["object"].metadata.name)
        for e in watch.Watch().stream(
            core.list_namespaced_secret, "default", resource_version=start_rv, timeout_seconds=1
        )
    ]
    assert replay == [
        ("ADDED", "w1"),
        ("MODIFIED", "w1"),
        ("ADDED", "other"),
        ("DELETED", "w1"),
    ]
    started = time.monotonic()
    current = [
        e["object"].metadata.name
        for e in watch.Watch().stream(core.list_namespaced_secret, "default", timeout_seconds=1)
    ]
    assert current == ["other", "pre"]
    assert 0.8 < time.monotonic() - started < 3  # timeoutSeconds ends the stream


def test_watch_custom_objects_and_gone(fake: FakeApiServer, api: client.ApiClient) -> None:
    co = client.CustomObjectsApi(api)
    co.create_namespaced_custom_object(*GW, "default", "gateways", gateway("g1"))
    old_rv = co.list_namespaced_custom_object(*GW, "default", "gateways")["metadata"][
        "resourceVersion"
    ]
    co.create_namespaced_custom_object(*GW, "default", "gateways", gateway("g2"))
    events = list(
        watch.Watch().stream(
            co.list_namespaced_custom_object,
            *GW,
            "default",
            "gateways",
            resource_version=old_rv,
            timeout_seconds=1,
        )
    )
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "g2")]

    fake.compact()
    with pytest.raises(ApiException) as err:
        list(
            watch.Watch().stream(
                co.list_namespaced_custom_object,
                *GW,
                "default",
                "gateways",
                resource_version=old_rv,
                timeout_seconds=1,
            )
        )
    assert err.value.status == 410


def test_finalizers_defer_deletion(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    body = secret("f")
    body.metadata.finalizers = ["stunner.l7mp.io/cleanup"]
    core.create_namespaced_secret("default", body)
    core.delete_namespaced_secret("f", "default")
    pending = core.read_namespaced_secret("f", "default")
    assert pending.metadata.deletion_timestamp is not None
    core.patch_namespaced_secret("f", "default", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as err:
        core.read_namespaced_secret("f", "default")
    assert err.value.status == 404


def test_dry_run_stores_nothing(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_secret("default", secret("d"), dry_run="All")
    assert core.list_namespaced_secret("default").items == []


def test_fault_injection(fake: FakeApiServer, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    fake.fail_status = 503
    with pytest.raises(ApiException) as err:
        core.list_namespaced_secret("default")
    assert err.value.status == 503
    fake.fail_status = None
    fake.delay = 5
    started = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017 - urllib3 raises its own timeout types
        core.list_namespaced_secret("default", _request_timeout=0.3)
    assert time.monotonic() - started < 2
    fake.delay = 0


def test_discovery(fake: FakeApiServer, api: client.ApiClient) -> None:
    assert "v1" in client.CoreApi(api).get_api_versions().versions
    groups = {g.name for g in client.ApisApi(api).get_api_versions().groups}
    assert {"gateway.networking.k8s.io", "stunner.l7mp.io", "apps"} <= groups
    resources = client.CoreV1Api(api).get_api_resources().resources
    assert {"secrets", "services", "namespaces"} <= {r.name for r in resources}


def test_the_listen_backlog_takes_a_burst_of_connections(fake: FakeApiServer) -> None:
    """Connections opened while the accepting thread waits for the GIL queue in the backlog
    (the kernel's own count, read back with `ss`): with socketserver's 5, a reconciler pair's
    burst of watches overflowed it, and a dropped handshake cost a client TCP's 1 s
    retransmission (a Lease renewal past its deadline) or a reset."""
    port = fake.url.rsplit(":", 1)[1]
    listening = subprocess.run(
        ["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert listening[0] == "LISTEN", listening
    assert int(listening[2]) >= 128, listening  # Send-Q of a listener: its backlog
