"""Real helm 3 and helm 4 (installed by hack/helm.sh into .tools/) and the chart they render."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.fakeapi import CORE_TYPES, GATEWAY_TYPES, FakeApiServer, ResourceType

ROOT = Path(__file__).resolve().parent.parent.parent
CHART = ROOT / "charts" / "stunner"
HELMS = {"helm3": ROOT / ".tools" / "helm3" / "helm", "helm4": ROOT / ".tools" / "helm4" / "helm"}
NAMESPACE = "stunner-system"


def helm_binary(name: str) -> Path:
    path = HELMS[name]
    if not path.is_file():
        pytest.fail(f"{path} is missing: run bash hack/helm.sh (hack/test.sh does)")
    return path


@pytest.fixture(params=sorted(HELMS), scope="session")
def helm(request: pytest.FixtureRequest) -> Path:
    return helm_binary(str(request.param))


def run_helm(helm: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(helm), *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def refused(helm: Path, *sets: str, skip_schema: bool = False) -> str:
    """What `helm template` says on stderr when it refuses these `--set` values (with
    skip_schema, what the templates themselves refuse)."""
    args = [str(helm), "template", "stunner", str(CHART)]
    if skip_schema:
        args.append("--skip-schema-validation")
    for value in sets:
        args += ["--set", value]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0, f"helm template accepted {sets}"
    return done.stderr


def render(helm: Path, *sets: str, show_tests: bool = True) -> list[dict[str, Any]]:
    """The manifests `helm template` renders with `--set` values (None documents dropped)."""
    args = ["template", "stunner", str(CHART), "--namespace", NAMESPACE, "--include-crds"]
    for value in sets:
        args += ["--set", value]
    out = run_helm(helm, *args)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def of_kind(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m.get("kind") == kind]


@pytest.fixture(scope="session")
def default_manifests() -> Iterator[list[dict[str, Any]]]:
    yield render(helm_binary("helm4"))


# What helm 4 maps every rendered kind to before it renders against a cluster.
CHART_TYPES = (
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount"),
    ResourceType("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy"),
    ResourceType(
        "rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False
    ),
    ResourceType(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        namespaced=False,
    ),
    ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    ResourceType(
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        namespaced=False,
    ),
    ResourceType(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        namespaced=False,
    ),
    ResourceType(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        namespaced=False,
    ),
)


def chart_api() -> FakeApiServer:
    """A fake API server that serves every kind the chart renders (helm install against it)."""
    return FakeApiServer(CORE_TYPES + GATEWAY_TYPES + CHART_TYPES)
