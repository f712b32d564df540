"""``helm install``, ``upgrade`` and ``uninstall`` of charts/stunner with helm 3 and helm 4
against a real kube-apiserver (issue 13's layer-4 item).

Each helm major gets a control plane of its own, started bare (no CRDs: the chart installs
them, ours from crds/ and Gateway API's from templates), and a release in a fresh namespace.

We test these aspects:
- Every object the chart renders is accepted by the real API server and stored: the CRDs (all
  Established), the RBAC, the webhook configurations, the Deployments, Services, the webhook's
  TLS Secret and the default Dataplane. ``helm get manifest`` is the list checked.
- The installed registration is live: with the webhook's pods not running (no kubelet here, so
  no pod ever starts), a GatewayConfig, a StaticService or a Dataplane of a user's is refused
  fail-closed by the API server calling the webhook (``webhook.failurePolicy: Fail``), while a
  Gateway is admitted (the Gateway API kinds' entry is ``Ignore``): the rules reach the kinds
  they name, through the chart's Service.
- The spec's examples (GATEWAY-REFERENCE.md; not its default Dataplane, the release's own) then
  go through that registration: STUNner's kinds refused the same way, Gateway API's admitted.
- The release's own default Dataplane is not judged by its webhook, so ``helm upgrade`` (which
  patches it) and ``helm uninstall`` (which deletes it) never depend on the webhook's pods
  being up; the upgrade changes the Dataplane, keeps the webhook's CA, and ``helm uninstall``
  removes what the release made (our CRDs stay, as Helm keeps crds/).

What stays unproven here: no pod runs (no kubelet, no scheduler), so neither the reconciler,
the webhook nor stunnerd is seen running in-cluster, and ``helm test`` cannot run.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.cluster import run_cluster
from reconciler.kube.lease import LEADER_ELECTION_ID
from stunner_api.vocabulary import STUNNER_GROUP, group_of
from tests.charts.conftest import CHART, HELMS, helm_binary
from tests.envtest.cluster import apply_order, namespaces_of, spec_examples, with_string_metadata
from tests.envtest.controlplane import ASSETS_VARIABLE, NO_ASSETS, ControlPlane
from tests.reconciler import clusterkit as k

pytestmark = pytest.mark.envtest

RELEASE = "stunner"
LEASE_NAME = LEADER_ELECTION_ID
FAIL_CLOSED = "no endpoints available for service"


@pytest.fixture(params=sorted(HELMS))
def helm_plane(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Path, ControlPlane, str]]:
    """(helm binary, a bare control plane, the release namespace) for one helm major."""
    if not os.environ.get(ASSETS_VARIABLE):
        pytest.skip(NO_ASSETS)
    helm = helm_binary(str(request.param))
    with ControlPlane(Path(os.environ[ASSETS_VARIABLE]), tmp_path) as plane:
        yield helm, plane, f"stunner-{request.param}"


def run(helm: Path, plane: ControlPlane, *args: str) -> str:
    env = {
        **os.environ,
        "KUBECONFIG": str(plane.admin_kubeconfig),
        "HELM_CACHE_HOME": str(plane.directory / "helm-cache"),
        "HELM_CONFIG_HOME": str(plane.directory / "helm-config"),
        "HELM_DATA_HOME": str(plane.directory / "helm-data"),
    }
    done = subprocess.run(
        [str(helm), *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def release_objects(helm: Path, plane: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    manifest = run(helm, plane, "get", "manifest", RELEASE, "-n", namespace)
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


def stored(plane: ControlPlane, obj: dict[str, Any], namespace: str) -> Any:
    """The object as the API server has it (None when it is not there)."""
    group = obj["apiVersion"].rpartition("/")[0]
    resource = f"{obj['kind']}.{group}" if group else obj["kind"]
    meta = obj["metadata"]
    where = ("-n", meta.get("namespace", namespace))
    result = plane.kubectl("get", resource, meta["name"], *where, "-o", "json")
    if result.returncode != 0:
        assert "NotFound" in result.stderr, result.stderr
        return None
    return json.loads(result.stdout)


# No pod runs here: the post-install hook's Job (it waits for the webhook's pods) would never end.
NO_POD = ("--set", "webhook.readyCheck.enabled=false")


def named(api_version: str, kind: str, name: str) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}}


def test_helm_install_upgrade_uninstall_on_a_real_api_server(
    helm_plane: tuple[Path, ControlPlane, str],
) -> None:
    helm, plane, namespace = helm_plane
    run(helm, plane, "install", RELEASE, str(CHART), "-n", namespace, "--create-namespace", *NO_POD)

    # Every object the chart rendered is stored.
    objects = release_objects(helm, plane, namespace)
    kinds = {obj["kind"] for obj in objects}
    assert {
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ServiceAccount",
        "Secret",
        "Service",
        "Deployment",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
        "Dataplane",
    } <= kinds, kinds
    missing = [
        f"{o['kind']}/{o['metadata']['name']}" for o in objects if not stored(plane, o, namespace)
    ]
    assert not missing, missing
    established = plane.kubectl(
        "wait", "--for=condition=Established", "crd", "--all", "--timeout=30s", timeout=60
    )
    assert established.returncode == 0, established.stderr
    crds = json.loads(plane.kubectl("get", "crd", "-o", "json").stdout)["items"]
    groups = {crd["spec"]["group"] for crd in crds}
    assert groups == {"stunner.l7mp.io", "gateway.networking.k8s.io"}, groups
    assert len(crds) == 8, [c["metadata"]["name"] for c in crds]
    deployment = stored(plane, named("apps/v1", "Deployment", "stunner-reconciler"), namespace)
    assert not deployment["status"].get("availableReplicas")  # no kubelet: no pod runs
    ca_before = secret_ca(plane, namespace)

    # The registration is live: our kinds go to the (absent) webhook pods, fail-closed.
    tenant = f"{namespace}-tenant"
    plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": tenant}})
    for obj in users_objects(tenant):
        result = plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(obj))
        if obj["apiVersion"].startswith("gateway.networking.k8s.io/"):
            assert result.returncode == 0, result.stderr  # failurePolicy Ignore
        else:
            assert result.returncode != 0, f"{obj['kind']} admitted: {result.stdout}"
            assert FAIL_CLOSED in result.stderr and "stunner-webhook" in result.stderr

    # The spec's examples go through the installed registration too: STUNner's kinds refused
    # by the absent webhook, Gateway API's admitted. Not the spec's default Dataplane: the
    # release owns it (values), and after a kubectl apply of it helm 4's server-side apply
    # conflicts with kubectl's fields on upgrade (helm upgrade --force-conflicts takes them).
    examples = [
        e
        for e in spec_examples()
        if e.source.startswith("GATEWAY-REFERENCE.md")
        and (e.obj["kind"], e.obj["metadata"]["name"]) != ("Dataplane", "default")
    ]
    spaces = namespaces_of([e.obj for e in examples]) - {"default"}
    plane.apply(
        *({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in spaces)
    )
    for example in sorted(examples, key=apply_order):
        result = plane.kubectl(
            "apply", "-f", "-", stdin=yaml.safe_dump(with_string_metadata(example.obj))
        )
        if "no matches for kind" in result.stderr:
            continue  # the v1alpha2 UDPRoute: the chart's standard channel does not serve it
        if group_of(example.obj["apiVersion"]) == STUNNER_GROUP:
            assert result.returncode != 0, f"{example.id} admitted: {result.stdout}"
            assert FAIL_CLOSED in result.stderr, result.stderr
        else:
            assert result.returncode == 0, f"{example.id}: {result.stderr}"

    # An upgrade that changes the default Dataplane: no webhook needed, the CA kept.
    upgrade = ("upgrade", RELEASE, str(CHART), "-n", namespace, *NO_POD)
    run(helm, plane, *upgrade, "--set", "dataplane.spec.replicas=2")
    dataplane = stored(plane, named("stunner.l7mp.io/v1", "Dataplane", "default"), namespace)
    assert dataplane["spec"]["replicas"] == 2
    assert secret_ca(plane, namespace) == ca_before
    assert "REVISION: 2" in run(helm, plane, "status", RELEASE, "-n", namespace)

    run(helm, plane, "uninstall", RELEASE, "-n", namespace)
    left = [
        f"{o['kind']}/{o['metadata']['name']}"
        for o in objects
        if o["kind"] != "CustomResourceDefinition" and stored(plane, o, namespace)
    ]
    assert not left, left


def secret_ca(plane: ControlPlane, namespace: str) -> str:
    result = plane.kubectl("get", "secret", "stunner-webhook-tls", "-n", namespace, "-o", "json")
    assert result.returncode == 0, result.stderr
    return str(json.loads(result.stdout)["data"]["ca.crt"])


def users_objects(namespace: str) -> list[dict[str, Any]]:
    """A user's objects of kinds the chart's webhook judges, one per entry of its registration."""
    return [
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "GatewayConfig",
            "metadata": {"name": "config", "namespace": namespace},
            "spec": {"userName": "user", "password": "pass"},
        },
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "StaticService",
            "metadata": {"name": "peer", "namespace": namespace},
            "spec": {"prefixes": ["192.0.2.1/32"]},
        },
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "Dataplane",
            "metadata": {"name": f"{namespace}-dataplane"},
            "spec": {"image": "l7mp/stunnerd:latest"},
        },
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": namespace},
            "spec": {
                "gatewayClassName": "stunner",
                "listeners": [{"name": "udp", "port": 3478, "protocol": "TURN-UDP"}],
            },
        },
    ]


def test_the_reconciler_runs_with_the_charts_rbac(tmp_path: Path) -> None:
    """The reconciler as the chart's ServiceAccount (a token the real API server issued,
    authorized by the chart's ClusterRole and Role through the real RBAC authorizer): it lists
    and watches every kind, takes the Lease in the release namespace, creates the Gateway's
    Deployment and Service and writes status, and no request is refused. (The webhook is
    installed with failurePolicy Ignore: its pods never run here.)"""
    if not os.environ.get(ASSETS_VARIABLE):
        pytest.skip(NO_ASSETS)
    helm = helm_binary("helm4")
    namespace = "stunner-system"
    with ControlPlane(Path(os.environ[ASSETS_VARIABLE]), tmp_path) as plane:
        run(helm, plane, "install", RELEASE, str(CHART), "-n", namespace, "--create-namespace",
            "--set", "webhook.failurePolicy=Ignore", *NO_POD)  # fmt: skip
        plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": k.NS}})
        plane.apply(
            k.gateway_class(),
            k.gateway_config(),
            k.static_service(prefixes=("192.0.2.1/32",)),
            k.gateway(),
            k.route(),
        )
        token = plane.kubectl("create", "token", "stunner-reconciler", "-n", namespace)
        assert token.returncode == 0, token.stderr
        kubeconfig = plane.token_kubeconfig("stunner-reconciler", token.stdout.strip())
        settings = k.on_a_real_cluster(kubeconfig, namespace, "stunner-reconciler-0")

        def get(kind: str, name: str, ns: str = k.NS) -> Any:
            return stored(plane, {"apiVersion": "v1", "kind": kind, "metadata": {"name": name}}, ns)

        async def main() -> None:
            async with run_cluster(settings) as running:
                await k.eventually(lambda: get("deployment.apps", "gw"), timeout=30)
                await k.eventually(lambda: get("service", "gw"), timeout=30)

                def accepted() -> bool:
                    status = get("gateway.gateway.networking.k8s.io", "gw").get("status", {})
                    return any(
                        c["type"] == "Accepted" and c["status"] == "True"
                        for c in status.get("conditions", [])
                    )

                await k.eventually(accepted, timeout=30, what="the Gateway's status")
                lease = get("lease.coordination.k8s.io", LEASE_NAME, namespace)
                assert lease["spec"]["holderIdentity"] == "stunner-reconciler-0"
                refused = {
                    (sample.labels["verb"], sample.labels["kind"], sample.labels["result"])
                    for metric in running.mode.metrics.api_writes.collect()
                    for sample in metric.samples
                    if sample.name.endswith("_total") and sample.labels["result"] != "ok"
                }
                assert not refused, refused
                restarts = [
                    sample.labels
                    for metric in running.mode.metrics.watch_restarts.collect()
                    for sample in metric.samples
                    if sample.name.endswith("_total") and sample.value
                ]
                assert not restarts, restarts

        asyncio.run(main())
