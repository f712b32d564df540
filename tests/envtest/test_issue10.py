"""Issue 10's faults, tried again behind a real kube-apiserver with real RBAC.

We test these aspects:
- Fault 1: user alice, who may not read Secrets in namespace stunner (real RBAC: her ``kubectl
  get secret`` is Forbidden), cannot use the webhook as an oracle: a GatewayConfig of hers
  referring to an existing Secret there gets the very same answer as one referring to a
  missing Secret, a warning that the reference cannot be checked, and nothing of the Secret
  (its ``type`` value) appears in kubectl's output or the webhook's log. A user who may read it
  (a real SubjectAccessReview answers) and a ReferenceGrant each get the check, still without
  the Secret's content.
- Fault 2: a Gateway API UDPRoute v1 with a ConfigMap backend is refused and not stored.
- Fault 4: another controller's Gateway (STUNner would refuse its listener and annotation) is
  created, updated and deleted untouched; when the webhook may not read GatewayClasses (its
  ClusterRole without them: a real 403), a Gateway is admitted with a warning.
- Fault 5: the mutating hook's defaults land in the stored objects (GatewayConfig, Dataplane,
  STUNner UDPRoute), the CRD schemas keeping every field it writes.
- Fault 3: the webhook discovered the service network from the ServiceCIDR objects of the API
  (Kubernetes 1.33+) and refuses a StaticService inside it.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.envtest.cluster import webhook_rbac
from tests.envtest.conftest import (
    CLASS,
    PARENT,
    STUNNER_NAMESPACE,
    TENANT,
    TENANT_USER,
    Cluster,
    meta,
)
from tests.envtest.controlplane import SERVICE_CLUSTER_IP_RANGE

pytestmark = pytest.mark.envtest

DENIED = "denied the request"
# The auth type an attacker would learn from a refusal that echoes the Secret.
SECRET_TYPE_VALUE = "leaky-type-c0ffee"
CANNOT_BE_CHECKED = "the reference cannot be checked here"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def output(result: Any) -> str:
    return str(result.stdout) + str(result.stderr)


def dry_run(cluster: Cluster, obj: dict[str, Any], user: str | None = None) -> Any:
    args = ("apply", "--dry-run=server", "-f", "-")
    if user is not None:
        return cluster.kubectl_as(user, *args, stdin=yaml.safe_dump(obj))
    return cluster.plane.kubectl(*args, stdin=yaml.safe_dump(obj))


def get(cluster: Cluster, resource: str, name: str, namespace: str | None = None) -> Any:
    args = ["get", resource, name, "-o", "json"]
    if namespace:
        args += ["-n", namespace]
    result = cluster.plane.kubectl(*args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# --- fault 1: no Secret oracle -----------------------------------------------------------------


@pytest.fixture(scope="module")
def victim(cluster: Cluster) -> Cluster:
    cluster.plane.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": meta("victim"),
            "data": {"type": b64(SECRET_TYPE_VALUE), "username": b64("u"), "password": b64("p")},
        }
    )
    return cluster


def tenant_config(secret: str) -> dict[str, Any]:
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "GatewayConfig",
        "metadata": {"name": "probe", "namespace": TENANT},
        "spec": {"authRef": {"name": secret, "namespace": STUNNER_NAMESPACE}},
    }


def test_alice_may_not_read_secrets_in_namespace_stunner(victim: Cluster) -> None:
    result = victim.kubectl_as(TENANT_USER, "get", "secret", "victim", "-n", STUNNER_NAMESPACE)
    assert result.returncode != 0 and "Forbidden" in result.stderr, output(result)
    mine = victim.kubectl_as(TENANT_USER, "get", "gatewayconfigs", "-n", TENANT)
    assert mine.returncode == 0, mine.stderr


def test_no_secret_oracle_for_a_user_without_rights(victim: Cluster) -> None:
    existing = dry_run(victim, tenant_config("victim"), TENANT_USER)
    missing = dry_run(victim, tenant_config("ghost"), TENANT_USER)
    assert existing.returncode == 0, output(existing)
    assert missing.returncode == 0, output(missing)
    assert CANNOT_BE_CHECKED in existing.stderr
    assert existing.stderr.replace("victim", "NAME") == missing.stderr.replace("ghost", "NAME")
    assert SECRET_TYPE_VALUE not in output(existing)
    assert SECRET_TYPE_VALUE not in victim.webhook.log()


def test_a_user_who_may_read_the_secret_gets_it_checked_without_its_content(
    victim: Cluster,
) -> None:
    result = dry_run(victim, tenant_config("victim"))  # admin: system:masters may read it
    assert result.returncode != 0, output(result)
    assert DENIED in result.stderr and "spec.authRef" in result.stderr, result.stderr
    assert "the 'type' key must be" in result.stderr
    assert SECRET_TYPE_VALUE not in output(result)
    assert SECRET_TYPE_VALUE not in victim.webhook.log()


@pytest.fixture
def reference_grant(victim: Cluster) -> Iterator[Cluster]:
    grant = {
        "apiVersion": "gateway.networking.k8s.io/v1beta1",
        "kind": "ReferenceGrant",
        "metadata": meta("tenant-configs-to-victim"),
        "spec": {
            "from": [{"group": "stunner.l7mp.io", "kind": "GatewayConfig", "namespace": TENANT}],
            "to": [{"group": "", "kind": "Secret", "name": "victim"}],
        },
    }
    victim.plane.apply(grant)
    try:
        yield victim
    finally:
        victim.plane.kubectl(
            "delete", "referencegrant", "tenant-configs-to-victim", "-n", STUNNER_NAMESPACE
        )


def test_a_reference_grant_lets_the_reference_be_checked(reference_grant: Cluster) -> None:
    result = dry_run(reference_grant, tenant_config("victim"), TENANT_USER)
    assert result.returncode != 0, output(result)
    assert DENIED in result.stderr and "spec.authRef" in result.stderr, result.stderr
    assert SECRET_TYPE_VALUE not in output(result)


# --- fault 2: Gateway API UDPRoute v1 ------------------------------------------------------------


def test_gateway_api_udproute_v1_with_a_configmap_backend_is_refused(ours: Cluster) -> None:
    # under `ours`' Gateway: the webhook judges a Gateway API UDPRoute only through a parent
    # that exists and is STUNner's (the spec examples' udp-gateway exists only after their test)
    cluster = ours
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "UDPRoute",
        "metadata": meta("configmap-backend"),
        "spec": {
            "parentRefs": [{"name": PARENT}],
            "rules": [{"backendRefs": [{"group": "", "kind": "ConfigMap", "name": "cm"}]}],
        },
    }
    result = cluster.plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(route))
    assert result.returncode != 0, output(result)
    assert DENIED in result.stderr and "spec.rules[0].backendRefs[0]" in result.stderr
    stored = cluster.plane.kubectl(
        "get", "udproutes.gateway.networking.k8s.io", "configmap-backend", "-n", STUNNER_NAMESPACE
    )
    assert stored.returncode != 0 and "NotFound" in stored.stderr


# --- fault 4: blast radius ---------------------------------------------------------------------


def test_another_controllers_gateway_is_never_blocked(cluster: Cluster) -> None:
    other_class = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GatewayClass",
        "metadata": {"name": "envtest-other"},
        "spec": {"controllerName": "example.com/other-controller"},
    }
    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": meta("other-gateway", annotations={"stunner.l7mp.io/typo": "x"}),
        "spec": {
            "gatewayClassName": "envtest-other",
            "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}],
        },
    }
    cluster.plane.apply(other_class)
    created = cluster.plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(gateway))
    assert created.returncode == 0, output(created)
    assert "Warning" not in created.stderr, created.stderr
    stored = get(cluster, "gateways.gateway.networking.k8s.io", "other-gateway", STUNNER_NAMESPACE)
    assert stored["metadata"]["annotations"]["stunner.l7mp.io/typo"] == "x"
    gateway["spec"]["listeners"][0]["port"] = 8080
    updated = cluster.plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(gateway))
    assert updated.returncode == 0 and "Warning" not in updated.stderr, output(updated)
    deleted = cluster.plane.kubectl(
        "delete", "gateways.gateway.networking.k8s.io", "other-gateway", "-n", STUNNER_NAMESPACE
    )
    assert deleted.returncode == 0, output(deleted)


def _role_without_gateway_classes() -> dict[str, Any]:
    role = webhook_rbac()[0]
    rules = [r for r in role["rules"] if "gatewayclasses" not in r.get("resources", [])]
    assert len(rules) < len(role["rules"])
    return {**role, "rules": rules}


def _until(what: str, check: Any, within: float = 20) -> Any:
    deadline = time.monotonic() + within
    while True:
        result = check()
        if result is not None:
            return result
        assert time.monotonic() < deadline, f"{what} within {within} s"
        time.sleep(0.5)


def test_a_gateway_whose_class_cannot_be_read_is_admitted_with_a_warning(ours: Cluster) -> None:
    cluster = ours
    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": meta("unreadable-class", annotations={"stunner.l7mp.io/typo": "x"}),
        "spec": {
            "gatewayClassName": CLASS,
            "listeners": [{"name": "udp", "port": 3478, "protocol": "TURN-UDP"}],
        },
    }
    refused = dry_run(cluster, gateway)
    assert refused.returncode != 0 and DENIED in refused.stderr, output(refused)
    cluster.plane.apply(_role_without_gateway_classes())
    try:

        def admitted() -> Any:
            result = dry_run(cluster, gateway)
            return result if result.returncode == 0 else None

        result = _until("the webhook admits once RBAC forbids GatewayClasses", admitted)
        assert "could not read GatewayClass" in result.stderr, result.stderr
        assert "403" in result.stderr, result.stderr
    finally:
        cluster.plane.apply(*webhook_rbac())

    def refused_again() -> Any:
        result = dry_run(cluster, gateway)
        return result if result.returncode != 0 else None

    _until("the webhook judges again once RBAC allows GatewayClasses", refused_again)


# --- fault 5: defaults ---------------------------------------------------------------------------


def test_the_mutating_defaults_land_in_the_stored_objects(cluster: Cluster) -> None:
    cluster.plane.apply(
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "GatewayConfig",
            "metadata": meta("defaults-config"),
            "spec": {"userName": "u", "password": "p"},
        },
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "Dataplane",
            "metadata": {"name": "defaults-dataplane"},
            "spec": {"image": "l7mp/stunnerd:latest"},
        },
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "UDPRoute",
            "metadata": meta("defaults-route"),
            "spec": {
                "parentRefs": [{"name": "udp-gateway"}],
                "rules": [{"backendRefs": [{"name": "media-server"}]}],
            },
        },
    )
    config = get(cluster, "gatewayconfigs", "defaults-config", STUNNER_NAMESPACE)["spec"]
    assert config["logLevel"] == "all:INFO"
    assert config["authType"] == "static"
    assert config["realm"] == "stunner.l7mp.io"
    assert config["dataplane"] == "default"
    dataplane = get(cluster, "dataplanes", "defaults-dataplane")["spec"]
    assert dataplane["imagePullPolicy"] == "Always"
    assert dataplane["replicas"] == 1
    assert dataplane["terminationGracePeriodSeconds"] == 3600
    assert dataplane["dataplaneResource"] == "Deployment"
    assert dataplane["hostNetwork"] is False
    assert dataplane["disableHealthCheck"] is False
    assert dataplane["enableMetricsEndpoint"] is False
    route = get(cluster, "udproutes.stunner.l7mp.io", "defaults-route", STUNNER_NAMESPACE)["spec"]
    assert route["parentRefs"][0]["namespace"] == STUNNER_NAMESPACE
    backend = route["rules"][0]["backendRefs"][0]
    assert (backend["group"], backend["kind"], backend["namespace"]) == (
        "",
        "Service",
        STUNNER_NAMESPACE,
    )


# --- fault 3: the cluster's networks ------------------------------------------------------------


def test_the_webhook_guards_the_service_network_the_api_offers(cluster: Cluster) -> None:
    raw = cluster.plane.kubectl("get", "--raw", "/apis/networking.k8s.io/v1")
    served = [r["name"] for r in json.loads(raw.stdout)["resources"]] if raw.returncode == 0 else []
    if "servicecidrs" not in served:
        pytest.skip("this kube-apiserver serves no networking.k8s.io/v1 ServiceCIDR (before 1.33)")
    log = cluster.webhook.log()
    assert f"guarding service CIDRs {SERVICE_CLUSTER_IP_RANGE} (from ServiceCIDR objects)" in log
    assert "no pod CIDRs" in log  # no Node has spec.podCIDRs here
    inside = {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "StaticService",
        "metadata": meta("inside-the-service-network"),
        "spec": {"prefixes": ["10.0.0.16/28"]},
    }
    result = dry_run(cluster, inside)
    assert result.returncode != 0, output(result)
    assert DENIED in result.stderr and "spec.prefixes[0]" in result.stderr
    assert f"overlaps the service network {SERVICE_CLUSTER_IP_RANGE}" in result.stderr
