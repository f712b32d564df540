"""The chart's GatewayConfig with a LoadBalancer preset on a real kube-apiserver
(README, "LoadBalancer presets"): `helm install` stores them although the webhook's pods never
start here (its registration is fail-closed for STUNner's kinds), the GatewayConfig carries the
preset's annotations as the CRD stores them, a user's GatewayConfig is still sent to the
(absent) webhook and refused, and upgrade and uninstall need no webhook either."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.charts.conftest import CHART
from tests.envtest.controlplane import ControlPlane
from tests.envtest.test_helm import (
    FAIL_CLOSED,
    NO_POD,
    RELEASE,
    helm_plane,
    named,
    release_objects,
    run,
    stored,
)

pytestmark = pytest.mark.envtest
__all__ = ["helm_plane"]  # the fixture, imported for this module's tests


def test_the_charts_gateway_config_installs_without_the_webhook(
    helm_plane: tuple[Path, ControlPlane, str],
) -> None:
    helm, plane, namespace = helm_plane
    # NO_POD: the webhook-ready hook's Job would wait for a pod that never runs here
    values = ("--set", "gatewayConfig.create=true", "--set", "loadBalancer.preset=oci", *NO_POD)
    run(helm, plane, "install", RELEASE, str(CHART), "-n", namespace, "--create-namespace",
        *values)  # fmt: skip

    config = stored(plane, named("stunner.l7mp.io/v1", "GatewayConfig", "stunner-gatewayconfig"),
                    namespace)  # fmt: skip
    assert config is not None
    assert config["spec"]["loadBalancerServiceAnnotations"] == {
        "oci.oraclecloud.com/load-balancer-type": "nlb",
        "stunner.l7mp.io/disable-session-affinity": "true",
    }
    # A user's GatewayConfig goes to the webhook, which is not up: refused, fail-closed.
    users = {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "GatewayConfig",
        "metadata": {"name": "mine", "namespace": namespace},
        "spec": {"realm": "example.com", "authType": "static", "userName": "u", "password": "p"},
    }
    result = plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(users))
    assert result.returncode != 0, result.stdout
    assert FAIL_CLOSED in result.stderr, result.stderr

    # Upgrade to another preset, then uninstall: neither waits for the webhook.
    run(helm, plane, "upgrade", RELEASE, str(CHART), "-n", namespace,
        "--set", "gatewayConfig.create=true", "--set", "loadBalancer.preset=gcp",
        *NO_POD)  # fmt: skip
    config = stored(plane, named("stunner.l7mp.io/v1", "GatewayConfig", "stunner-gatewayconfig"),
                    namespace)  # fmt: skip
    assert config["spec"]["loadBalancerServiceAnnotations"] == {
        "cloud.google.com/l4-rbs": "enabled"
    }
    objects = release_objects(helm, plane, namespace)
    run(helm, plane, "uninstall", RELEASE, "-n", namespace)
    left = [
        f"{o['kind']}/{o['metadata']['name']}"
        for o in objects
        if o["kind"] == "GatewayConfig" and stored(plane, o, namespace)
    ]
    assert not left, left
