"""Layer 4 of ../shared/TESTING.md: STUNner behind a real kube-apiserver.

With ``KUBEBUILDER_ASSETS`` naming a folder holding ``kube-apiserver`` and ``etcd`` (optionally
``kube-controller-manager``), the session's control plane is started once (``control_plane``,
tests/conftest.py; tests/envtest/README.md says how to build the assets); without it every test
that needs it is skipped, reported in one summary line (the few that check the layer's inputs,
the CRD files and the spec, still run).

The session's cluster: our CRDs and the Gateway API v1.6.1 CRDs (the standard channel, or the
experimental one with ``ENVTEST_GATEWAY_API_CHANNEL=experimental``) established; the webhook
under real gunicorn over TLS as user ``stunner-webhook`` with the README's ClusterRole,
registered by URL with a caBundle for every kind and version it judges; namespace ``tenant``
where user ``alice`` may do anything with STUNner and Gateway API objects and nothing with
Secrets (she has no rights in namespace ``stunner``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stunner_api.vocabulary import DEFAULT_CONTROLLER_NAME
from tests.envtest.cluster import WEBHOOK_USER, registrations, webhook_rbac
from tests.envtest.controlplane import (
    ASSETS_VARIABLE,
    CHANNEL_VARIABLE,
    NO_ASSETS,
    ControlPlane,
    binary_versions,
)
from tests.webhook.serving import Webhook


def pytest_report_header() -> list[str]:
    """The exact versions in the header of a run of this layer (``pytest tests/envtest``)."""
    assets = os.environ.get(ASSETS_VARIABLE)
    if not assets:
        return []
    versions = binary_versions(Path(assets))
    return [f"envtest {name}: {version}" for name, version in versions.items()]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Without assets, every skip of this layer is reported at one place: one summary line."""
    report = yield
    if report.skipped and isinstance(report.longrepr, tuple) and NO_ASSETS in report.longrepr[2]:
        report.longrepr = (__file__, None, report.longrepr[2])
    return report


TENANT = "tenant"
TENANT_USER = "alice"
STUNNER_NAMESPACE = "stunner"
CLASS = "envtest-stunner"  # a GatewayClass of STUNner's controller
CONFIG = "envtest-config"  # its GatewayConfig, in namespace stunner
PARENT = "envtest-gateway"  # a Gateway of that class: Gateway API UDPRoutes under it are judged


@dataclass
class Cluster:
    """The session's control plane with the webhook registered."""

    plane: ControlPlane
    webhook: Webhook
    registrations: list[dict[str, Any]]
    channel: str

    def kubectl_as(self, user: str, *args: str, stdin: str | None = None) -> Any:
        """kubectl as admin impersonating `user` (``--as``): the review's userInfo is theirs."""
        return self.plane.kubectl(f"--as={user}", *args, stdin=stdin)


def _namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def _tenant_rbac() -> list[dict[str, Any]]:
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "gateway-editor", "namespace": TENANT},
        "rules": [
            {
                "apiGroups": ["stunner.l7mp.io", "gateway.networking.k8s.io"],
                "resources": ["*"],
                "verbs": ["*"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "gateway-editor", "namespace": TENANT},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "gateway-editor",
        },
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TENANT_USER}
        ],
    }
    return [role, binding]


def _wait_for_registration(plane: ControlPlane, within: float = 30) -> None:
    """Until the API server calls the webhook (its configuration informer lags a little)."""
    probe = (
        "apiVersion: stunner.l7mp.io/v1\nkind: GatewayConfig\n"
        f"metadata: {{name: registration-probe, namespace: {STUNNER_NAMESPACE}}}\n"
        "spec: {logLevel: 'all:LOUD', userName: u, password: p}\n"
    )
    deadline = time.monotonic() + within
    while True:
        result = plane.kubectl("apply", "--dry-run=server", "-f", "-", stdin=probe)
        if "denied the request" in result.stderr:
            return
        assert time.monotonic() < deadline, f"the webhook is not called: {result}"
        time.sleep(0.5)


@pytest.fixture(scope="session")
def cluster(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """The control plane (tests/conftest.py: CRDs installed) with the webhook registered."""
    channel = os.environ.get(CHANNEL_VARIABLE, "standard")
    plane = control_plane
    plane.apply(*(_namespace(n) for n in (STUNNER_NAMESPACE, TENANT)))
    plane.apply(*webhook_rbac(), *_tenant_rbac())
    directory = tmp_path_factory.mktemp("webhook")
    kubeconfig = plane.kubeconfig(WEBHOOK_USER, ())
    webhook = Webhook(directory, kubeconfig)
    with webhook:
        configs = registrations(f"https://127.0.0.1:{webhook.port}", webhook.ca.read_bytes())
        plane.apply(*configs)
        _wait_for_registration(plane)
        yield Cluster(plane, webhook, configs, channel)


def meta(name: str, namespaced: bool = True, **extra: Any) -> dict[str, Any]:
    return {"name": name, **({"namespace": STUNNER_NAMESPACE} if namespaced else {}), **extra}


@pytest.fixture(scope="session")
def ours(cluster: Cluster) -> Cluster:
    """A GatewayConfig and a GatewayClass of STUNner's controller, for Gateways to be ours, and
    a Gateway of that class, for Gateway API UDPRoutes to be ours (the webhook judges one only
    through a parent Gateway that exists and is STUNner's)."""
    cluster.plane.apply(
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "GatewayConfig",
            "metadata": meta(CONFIG),
            "spec": {"userName": "user", "password": "pass"},
        },
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": meta(CLASS, namespaced=False),
            "spec": {
                "controllerName": DEFAULT_CONTROLLER_NAME,
                "parametersRef": {
                    "group": "stunner.l7mp.io",
                    "kind": "GatewayConfig",
                    "name": CONFIG,
                    "namespace": STUNNER_NAMESPACE,
                },
            },
        },
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": meta(PARENT),
            "spec": {
                "gatewayClassName": CLASS,
                "listeners": [{"name": "udp", "port": 3478, "protocol": "TURN-UDP"}],
            },
        },
    )
    return cluster
