"""The fake API server serves our kinds and Gateway API's as a real kube-apiserver does once the
CRDs are installed (what the envtest layer, tests/envtest/, showed the fake lacked).

We test these aspects:
- Every version each CRD serves (charts/stunner/crds, Gateway API v1.6.1 standard and
  experimental) is served by the fake with the CRD's kind, scope and status subresource, and
  the fake serves no other version of those kinds.
- Every served version reads and writes the same objects: one created at v1 is got, listed,
  watched and patched at v1alpha1 (apiVersion converted, same uid), and a write that changes
  nothing at another version bumps no resourceVersion.
- GatewayConfig, Dataplane and StaticService have a /status subresource: a PUT of the object
  keeps the stored status.
- A label or annotation value that is not a string (YAML's unquoted ``true``) is refused with
  400 BadRequest, as the API server's decoder refuses it, and nothing is stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.support import objects
from tests.support.fakeapi import GATEWAY_TYPES, FakeApiServer
from tests.support.shared import ROOT, crd_served_versions, gateway_api_crds

OUR_CRDS = sorted((ROOT / "charts" / "stunner" / "crds").glob("*.yaml"))
STUNNER = "stunner.l7mp.io"


def fake_versions(group: str) -> set[tuple[str, str, str, str, bool, bool]]:
    return {
        (rt.group, rt.version, rt.plural, rt.kind, rt.namespaced, rt.status_subresource)
        for rt in GATEWAY_TYPES
        if rt.group == group
    }


def test_the_fake_serves_our_crds_as_they_declare() -> None:
    assert fake_versions(STUNNER) == crd_served_versions(OUR_CRDS)


def test_the_fake_serves_the_gateway_api_crds_as_they_declare() -> None:
    experimental = gateway_api_crds("experimental")
    served = crd_served_versions(experimental)
    assert fake_versions("gateway.networking.k8s.io") == served
    # The standard channel serves a subset: UDPRoute at v1 only.
    standard = crd_served_versions(gateway_api_crds("standard"))
    assert standard < served
    assert {v[:3] for v in served - standard} == {
        ("gateway.networking.k8s.io", "v1alpha2", "udproutes")
    }


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def custom(fake: FakeApiServer) -> Iterator[client.CustomObjectsApi]:
    api_client = fake.api_client()
    try:
        yield client.CustomObjectsApi(api_client)
    finally:
        api_client.close()


def gatewayconfig(version: str = "v1", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{STUNNER}/{version}",
        "kind": "GatewayConfig",
        "metadata": {"name": "config", "namespace": "stunner"},
        "spec": {"realm": "stunner.l7mp.io", **spec},
    }


ARGS = (STUNNER, "stunner", "gatewayconfigs")


def test_every_served_version_reads_and_writes_the_same_objects(
    custom: client.CustomObjectsApi,
) -> None:
    created = custom.create_namespaced_custom_object(STUNNER, "v1", *ARGS[1:], gatewayconfig())
    old = custom.get_namespaced_custom_object(STUNNER, "v1alpha1", *ARGS[1:], "config")
    assert old["apiVersion"] == f"{STUNNER}/v1alpha1"
    assert old["metadata"]["uid"] == created["metadata"]["uid"]
    assert old["spec"] == created["spec"]
    listed = custom.list_namespaced_custom_object(STUNNER, "v1alpha1", *ARGS[1:])
    assert [i["metadata"]["uid"] for i in listed["items"]] == [created["metadata"]["uid"]]
    assert all(i["apiVersion"] == f"{STUNNER}/v1alpha1" for i in listed["items"])

    same = custom.replace_namespaced_custom_object(STUNNER, "v1alpha1", *ARGS[1:], "config", old)
    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]

    patched = custom.patch_namespaced_custom_object(
        STUNNER, "v1alpha1", *ARGS[1:], "config", {"spec": {"logLevel": "all:DEBUG"}}
    )
    assert patched["apiVersion"] == f"{STUNNER}/v1alpha1"
    now = custom.get_namespaced_custom_object(STUNNER, "v1", *ARGS[1:], "config")
    assert now["apiVersion"] == f"{STUNNER}/v1"
    assert now["spec"]["logLevel"] == "all:DEBUG"
    assert now["metadata"]["generation"] == 2

    stream = watch.Watch().stream(
        custom.list_namespaced_custom_object,
        STUNNER,
        "v1alpha1",
        *ARGS[1:],
        resource_version=created["metadata"]["resourceVersion"],
        timeout_seconds=1,
    )
    events = [(e["type"], e["object"]["apiVersion"]) for e in stream]
    assert events == [("MODIFIED", f"{STUNNER}/v1alpha1")]

    custom.delete_namespaced_custom_object(STUNNER, "v1alpha1", *ARGS[1:], "config")
    with pytest.raises(ApiException) as gone:
        custom.get_namespaced_custom_object(STUNNER, "v1", *ARGS[1:], "config")
    assert gone.value.status == 404


@pytest.mark.parametrize(
    ("plural", "obj"),
    [
        ("gatewayconfigs", gatewayconfig()),
        (
            "staticservices",
            {
                "apiVersion": f"{STUNNER}/v1",
                "kind": "StaticService",
                "metadata": {"name": "config", "namespace": "stunner"},
                "spec": {"prefixes": ["192.0.2.0/24"]},
            },
        ),
    ],
)
def test_stunner_kinds_have_a_status_subresource(
    custom: client.CustomObjectsApi, plural: str, obj: dict[str, Any]
) -> None:
    custom.create_namespaced_custom_object(STUNNER, "v1", "stunner", plural, obj)
    status = custom.patch_namespaced_custom_object_status(
        STUNNER, "v1", "stunner", plural, "config", {"status": {"observedGeneration": 1}}
    )
    assert status["status"] == {"observedGeneration": 1}
    replaced = custom.replace_namespaced_custom_object(
        STUNNER, "v1", "stunner", plural, "config", {**obj, "status": {"bogus": True}}
    )
    assert replaced["status"] == {"observedGeneration": 1}


def test_a_dataplane_has_a_status_subresource(custom: client.CustomObjectsApi) -> None:
    dataplane = {
        "apiVersion": f"{STUNNER}/v1",
        "kind": "Dataplane",
        "metadata": {"name": "default"},
        "spec": {"image": "l7mp/stunnerd:latest"},
        "status": {"ignored": True},
    }
    created = custom.create_cluster_custom_object(STUNNER, "v1", "dataplanes", dataplane)
    assert "status" not in created
    status = custom.patch_cluster_custom_object_status(
        STUNNER, "v1", "dataplanes", "default", {"status": {"ready": True}}
    )
    assert status["status"] == {"ready": True}


@pytest.mark.parametrize("field", ["annotations", "labels"])
def test_metadata_values_must_be_strings(custom: client.CustomObjectsApi, field: str) -> None:
    obj = gatewayconfig()
    obj["metadata"][field] = {"stunner.l7mp.io/enable-mixed-protocol-lb": True}
    with pytest.raises(ApiException) as refused:
        custom.create_namespaced_custom_object(STUNNER, "v1", *ARGS[1:], obj)
    assert refused.value.status == 400
    assert f"ObjectMeta.metadata.{field} of type string" in refused.value.body
    listed = custom.list_namespaced_custom_object(STUNNER, "v1", *ARGS[1:])
    assert listed["items"] == []

    obj["metadata"][field] = {"stunner.l7mp.io/enable-mixed-protocol-lb": "true"}
    created = custom.create_namespaced_custom_object(STUNNER, "v1", *ARGS[1:], obj)
    created["metadata"][field]["other"] = 1
    with pytest.raises(ApiException) as refused_update:
        custom.replace_namespaced_custom_object(STUNNER, "v1", *ARGS[1:], "config", created)
    assert refused_update.value.status == 400


@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
def test_the_crd_schema_refuses_what_a_real_api_server_refuses(
    custom: client.CustomObjectsApi, version: str
) -> None:
    """A negative Dataplane replicas, which kube-apiserver 1.36 refused by our CRD's minimum: 0
    (tests/envtest/test_admission.py) and this fake stored: 422 Invalid naming the field, in
    the API server's words, on create and on update; nothing stored or changed."""
    words = "spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0"  # noqa: E501
    dataplane = {
        "apiVersion": f"{STUNNER}/{version}",
        "kind": "Dataplane",
        "metadata": {"name": "default"},
        "spec": {"image": "l7mp/stunnerd:latest", "replicas": -1},
    }
    with pytest.raises(ApiException) as refused:
        custom.create_cluster_custom_object(STUNNER, version, "dataplanes", dataplane)
    assert refused.value.status == 422 and '"reason": "Invalid"' in refused.value.body
    assert f'Dataplane.stunner.l7mp.io \\"default\\" is invalid: {words}' in refused.value.body
    assert custom.list_cluster_custom_object(STUNNER, version, "dataplanes")["items"] == []

    dataplane["spec"]["replicas"] = 1
    created = custom.create_cluster_custom_object(STUNNER, version, "dataplanes", dataplane)
    with pytest.raises(ApiException) as refused_update:
        custom.patch_cluster_custom_object(
            STUNNER, version, "dataplanes", "default", {"spec": {"replicas": -1}}
        )
    assert refused_update.value.status == 422 and words in refused_update.value.body
    kept = custom.get_cluster_custom_object(STUNNER, version, "dataplanes", "default")
    assert kept == created


def test_a_status_write_is_checked_against_the_status_schema(
    custom: client.CustomObjectsApi,
) -> None:
    """Gateway API's condition schema requires reason, message and lastTransitionTime: a /status
    write without them is refused; a full condition is stored."""
    gateway = objects.gateway("gw", "stunner")
    args = ("gateway.networking.k8s.io", "v1", "stunner", "gateways")
    custom.create_namespaced_custom_object(*args, gateway)
    partial = {"type": "Accepted", "status": "True"}
    with pytest.raises(ApiException) as refused:
        custom.patch_namespaced_custom_object_status(
            *args, "gw", {"status": {"conditions": [partial]}}
        )
    assert refused.value.status == 422
    assert "status.conditions[0].reason: Required value" in refused.value.body
    full = partial | {
        "reason": "Accepted",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }  # noqa: E501
    stored = custom.patch_namespaced_custom_object_status(
        *args, "gw", {"status": {"conditions": [full]}}
    )
    assert stored["status"]["conditions"] == [full]


def test_a_seeded_object_is_not_checked_and_an_update_ratchets(
    fake: FakeApiServer, custom: client.CustomObjectsApi
) -> None:
    """seed() is an object already stored (as under an older, laxer CRD): kept as it is, so a
    test can show the reconciler surviving it. An update keeping what was already wrong is let
    through (validation ratcheting, Kubernetes 1.33+); one making it worse is refused."""
    gateway = objects.gateway("badport", "stunner")
    gateway["spec"]["listeners"][0]["port"] = 0
    fake.seed(gateway)
    args = ("gateway.networking.k8s.io", "v1", "stunner", "gateways")
    stored = custom.get_namespaced_custom_object(*args, "badport")
    assert stored["spec"]["listeners"][0]["port"] == 0
    labelled = custom.patch_namespaced_custom_object(
        *args, "badport", {"metadata": {"labels": {"a": "b"}}}
    )
    assert labelled["metadata"]["labels"] == {"a": "b"}
    worse = [{"op": "replace", "path": "/spec/listeners/0/port", "value": -1}]
    with pytest.raises(ApiException) as refused:
        custom.patch_namespaced_custom_object(
            *args, "badport", worse, _content_type="application/json-patch+json"
        )
    assert refused.value.status == 422 and "spec.listeners[0].port" in refused.value.body
