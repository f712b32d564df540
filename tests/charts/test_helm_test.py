"""The chart's `helm test` end to end on loopback: the test hooks helm renders (the echo Service,
the UDPRoute, the ReferenceGrant), with the quick start's example and the chart's Dataplane, go
through the reconciler's own render; a real stunnerd runs that config from the real CDS; the test
pod's own command and arguments (as the kubelet expands them) then echo through every listener.
What stays unproven here: the pod's public address path through a real LoadBalancer, and the
EndpointSlice, which the API server's controller makes (written here as it would)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.cds.server import cds_app
from reconciler.cds.store import ConfigStore
from stunner_api.dataplane import StunnerConfig, validate_config
from stunner_cli import offline
from tests.charts.conftest import NAMESPACE, ROOT, of_kind, render
from tests.support import ports
from tests.support.background import Background

GATEWAY = "stunner/udp-gateway"  # the quick start's, test.gateways' default
POD_IP = "127.0.0.1"  # where the kubelet would put the test pod


def hooks(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        m
        for m in manifests
        if m.get("metadata", {}).get("annotations", {}).get("helm.sh/hook") == "test"
    ]


def cluster_objects(
    manifests: list[dict[str, Any]], echo_port: int, grant: bool = True
) -> list[offline.Located]:
    """The example, the chart's Dataplane and test hooks, and what the API server adds: the
    echo Service's ClusterIP and the EndpointSlice of the test pod."""
    test_hooks = [h for h in hooks(manifests) if h["kind"] != "Pod"]
    (service,) = [
        s for s in of_kind(manifests, "Service") if s["metadata"]["name"].endswith("-echo")
    ]
    service["spec"]["clusterIP"] = "10.96.0.10"
    endpoints = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service['metadata']['name']}-abcde",
            "namespace": NAMESPACE,
            "labels": {"kubernetes.io/service-name": service["metadata"]["name"]},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [POD_IP], "conditions": {"ready": True}}],
        "ports": [{"name": "echo", "port": echo_port, "protocol": "UDP"}],
    }
    chart = of_kind(manifests, "Dataplane") + [endpoints, service] + test_hooks
    if not grant:
        chart = [o for o in chart if o["kind"] != "ReferenceGrant"]
    located = [offline.Located(ROOT / "charts", 1, "", o) for o in chart]
    return offline.load(ROOT / "examples" / "cluster") + located


def on_loopback(config: StunnerConfig) -> StunnerConfig:
    """The rendered config with its listeners on free loopback ports, reached there (the
    LoadBalancer's public address), and no health server on the fixed port."""
    data = config.to_dict()
    data["admin"]["healthcheck_endpoint"] = ""
    for listener in data["listeners"]:
        port = ports.free_port()
        listener |= {"address": "127.0.0.1", "port": port, "public_address": "127.0.0.1"}
        listener["public_port"] = port
    return validate_config(data)


@pytest.fixture
def echo_port() -> int:
    return ports.free_port()


@pytest.fixture
def manifests(helm: Path, echo_port: int) -> list[dict[str, Any]]:
    return render(helm, f"test.echoPort={echo_port}")


@pytest.fixture
def dataplane(
    manifests: list[dict[str, Any]], echo_port: int, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    """stunnerd following the reconciler's render of the chart's test objects on the real CDS
    (its log in `log`, for a failure's message)."""
    config = on_loopback(offline.plan(cluster_objects(manifests, echo_port)).configs[GATEWAY])
    background = Background()
    store = ConfigStore()
    store.set(GATEWAY, config)
    host, port = background.serve(cds_app(store))
    cds = f"http://{host}:{port}"
    log = tmp_path / "stunnerd.log"
    with log.open("w") as stderr:
        stunnerd = subprocess.Popen(
            [sys.executable, "-m", "stunnerd", "-w", "-u", "1", "-c", cds, "-i", GATEWAY],
            stderr=stderr,
        )
    try:
        yield {"cds": cds, "config": config, "log": log}
    finally:
        stunnerd.terminate()
        stunnerd.wait(10)
        background.close()


def test_the_default_helm_test_echoes_through_the_route_its_hooks_create(
    manifests: list[dict[str, Any]], dataplane: dict[str, Any]
) -> None:
    (pod,) = of_kind(hooks(manifests), "Pod")
    (container,) = pod["spec"]["containers"]
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in (
        container["env"]
    )
    args = [a.replace("$(POD_IP)", POD_IP) for a in container["args"]]  # the kubelet's expansion
    args = [f"--cds-url={dataplane['cds']}" if a.startswith("--cds-url=") else a for a in args]
    assert f"--gateway={GATEWAY}" in args and any(a.startswith("--echo=") for a in args)
    command = [sys.executable, "-m", "stunner_cli"]  # the image's `stunner`
    assert container["command"] == ["stunner"]
    started = time.monotonic()
    done = subprocess.run(command + args, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr + dataplane["log"].read_text()
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("ok ") for line in lines), lines
    assert all("echoed 5/5" in line for line in lines)
    assert time.monotonic() - started < 30


def test_the_hooks_route_only_with_their_reference_grant(
    manifests: list[dict[str, Any]], echo_port: int
) -> None:
    def echo_endpoints(grant: bool) -> list[str]:
        plan = offline.plan(cluster_objects(manifests, echo_port, grant))
        config = plan.configs[GATEWAY]
        (listener, *_) = config.listeners
        routes = [c for c in config.clusters if c.name in listener.routes]
        return [e for c in routes for e in c.endpoints if str(echo_port) in e]

    assert f"{POD_IP}:<{echo_port}-{echo_port}>" in echo_endpoints(grant=True)
    assert echo_endpoints(grant=False) == []


def test_the_hooks_exist_before_the_pod_and_go_when_it_passes(
    manifests: list[dict[str, Any]],
) -> None:
    test_hooks = hooks(manifests)
    assert sorted(h["kind"] for h in test_hooks) == ["Pod", "ReferenceGrant", "UDPRoute"]
    for hook in test_hooks:
        annotations = hook["metadata"]["annotations"]
        policy = annotations["helm.sh/hook-delete-policy"].split(",")
        weight = int(annotations.get("helm.sh/hook-weight", "0"))
        assert weight == (0 if hook["kind"] == "Pod" else -1), hook["kind"]
        # the pod stays for `helm test --logs` until the next run; the others go when it passes
        want = ["before-hook-creation"] + ([] if hook["kind"] == "Pod" else ["hook-succeeded"])
        assert policy == want, hook["kind"]


def test_helm_test_logs_finds_a_pod_for_every_test_hook(manifests: list[dict[str, Any]]) -> None:
    """helm 3.18 and 4.2.3 `helm test --logs` read, after the hooks' delete policies ran, the
    logs of a Pod in the release namespace named like each test hook, and fail on a hook whose
    name no Pod has (helm/helm#6968, #9098). Found on a real cluster (tests/cluster): the
    echo Service, UDPRoute and ReferenceGrant were named stunner-test-echo and the pod was
    deleted when it passed, so `helm test --logs` failed after a passing test."""
    test_hooks = hooks(manifests)
    (pod,) = of_kind(test_hooks, "Pod")
    assert pod["metadata"]["namespace"] == NAMESPACE
    assert "hook-succeeded" not in pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    assert {h["metadata"]["name"] for h in test_hooks} == {pod["metadata"]["name"]}


def test_no_gateways_to_echo_through_means_allocation_only(helm: Path) -> None:
    test_hooks = hooks(render(helm, "test.gateways=null"))
    assert [h["kind"] for h in test_hooks] == ["Pod"]
    (container,) = test_hooks[0]["spec"]["containers"]
    assert not any(a.startswith(("--echo", "--gateway")) for a in container["args"])
