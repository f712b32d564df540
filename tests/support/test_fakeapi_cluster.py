"""What the fake API server grew for cluster mode, through the official client unchanged:
watch bookmarks, garbage collection by owner references, delete preconditions, Service defaults,
Leases, refusals, and a restart on the same port with the same state."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.support.fakeapi import FakeApiServer


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def core(fake: FakeApiServer) -> Iterator[client.CoreV1Api]:
    api_client = fake.api_client()
    try:
        yield client.CoreV1Api(api_client)
    finally:
        api_client.close()


def _service(name: str, type_: str = "LoadBalancer", **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default"} | meta,
        "spec": {"type": type_, "ports": [{"name": "udp", "port": 3478, "protocol": "UDP"}]},
    }


def test_a_quiet_watch_gets_bookmarks_with_the_current_resource_version(
    fake: FakeApiServer, core: client.CoreV1Api
) -> None:
    fake.bookmark_interval = 0.1
    core.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    current = str(fake.resource_version)
    events = list(
        watch.Watch().stream(
            core.list_namespaced_config_map,
            "default",
            resource_version=current,
            allow_watch_bookmarks=True,
            timeout_seconds=1,
        )
    )
    assert events and {e["type"] for e in events} == {"BOOKMARK"}
    assert events[0]["raw_object"]["metadata"]["resourceVersion"] == current
    # Without asking for them: none.
    assert not list(
        watch.Watch().stream(
            core.list_namespaced_config_map, "default", resource_version=current, timeout_seconds=1
        )
    )


def test_deleting_an_owner_collects_its_dependents_transitively(
    fake: FakeApiServer, core: client.CoreV1Api
) -> None:
    owner = core.create_namespaced_config_map("default", {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    child = fake.seed(_service("child", ownerReferences=[ref]))
    grandchild_ref = ref | {"kind": "Service", "name": "child", "uid": child["metadata"]["uid"]}
    fake.seed(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "grandchild", "namespace": "default",
                         "ownerReferences": [grandchild_ref]},
        }
    )  # fmt: skip
    fake.seed({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unrelated"}})
    core.delete_namespaced_config_map("owner", "default")
    names = {cm.metadata.name for cm in core.list_namespaced_config_map("default").items}
    assert names == {"unrelated"}
    assert not core.list_namespaced_service("default").items


def test_a_delete_precondition_on_the_uid(fake: FakeApiServer, core: client.CoreV1Api) -> None:
    fake.seed(_service("svc"))
    with pytest.raises(ApiException) as error:
        core.delete_namespaced_service(
            "svc", "default", body=client.V1DeleteOptions(preconditions={"uid": "not-it"})
        )
    assert error.value.status == 409
    uid = core.read_namespaced_service("svc", "default").metadata.uid
    core.delete_namespaced_service(
        "svc", "default", body=client.V1DeleteOptions(preconditions={"uid": uid})
    )


def test_services_get_the_api_servers_defaults_and_keep_allocations(
    fake: FakeApiServer, core: client.CoreV1Api
) -> None:
    created = core.create_namespaced_service("default", _service("lb"))
    assert created.spec.cluster_ip and created.spec.session_affinity == "None"
    assert created.spec.external_traffic_policy == "Cluster"
    node_port = created.spec.ports[0].node_port
    assert node_port
    body = _service("lb")
    body["metadata"]["resourceVersion"] = created.metadata.resource_version
    updated = core.replace_namespaced_service("lb", "default", body)
    assert updated.spec.ports[0].node_port == node_port
    assert updated.spec.cluster_ip == created.spec.cluster_ip
    plain = core.create_namespaced_service("default", _service("plain", "ClusterIP"))
    assert plain.spec.external_traffic_policy is None and plain.spec.ports[0].node_port is None


def test_leases_through_the_coordination_api(fake: FakeApiServer) -> None:
    api_client = fake.api_client()
    try:
        leases = client.CoordinationV1Api(api_client)
        lease = leases.create_namespaced_lease(
            "kube-system",
            client.V1Lease(
                metadata=client.V1ObjectMeta(name="lock"),
                spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15),
            ),
        )
        lease.spec.holder_identity = "b"
        leases.replace_namespaced_lease("lock", "kube-system", lease)
        with pytest.raises(ApiException) as error:  # stale resourceVersion
            leases.replace_namespaced_lease("lock", "kube-system", lease)
        assert error.value.status == 409
        assert leases.read_namespaced_lease("lock", "kube-system").spec.holder_identity == "b"
    finally:
        api_client.close()


def test_refusals_and_a_restart_on_the_same_port(
    fake: FakeApiServer, core: client.CoreV1Api
) -> None:
    fake.refuse("POST", "services", 422)
    with pytest.raises(ApiException) as error:
        core.create_namespaced_service("default", _service("svc"))
    assert error.value.status == 422
    fake.refuse("POST", "services", None)
    core.create_namespaced_service("default", _service("svc"))
    url = fake.url
    fake.stop()
    with pytest.raises(Exception):  # noqa: B017 - any connection error
        core.read_namespaced_service("svc", "default", _request_timeout=2)
    fake.start()
    assert fake.url == url
    assert core.read_namespaced_service("svc", "default").metadata.name == "svc"
    assert ("POST", "/api/v1/namespaces/default/services") in fake.writes()


def test_an_object_created_with_a_gone_owner_is_collected(
    fake: FakeApiServer, core: client.CoreV1Api
) -> None:
    gone = {"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "no-such-uid"}
    fake.seed(_service("dangling", ownerReferences=[gone]))
    assert not core.list_namespaced_service("default").items
    fake.garbage_collection = False
    fake.seed(_service("kept", ownerReferences=[gone]))
    assert [s.metadata.name for s in core.list_namespaced_service("default").items] == ["kept"]
