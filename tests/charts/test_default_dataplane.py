"""One source of truth for the default Dataplane: the chart installs exactly the Dataplane
`stunner render` assumes when the files hold none (stunner_api.vocabulary.CHART_DATAPLANE_SPEC,
stunner_cli.offline.default_dataplane)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reconciler.render import RenderSettings
from reconciler.render import render as render_plan
from reconciler.store import Snapshot
from stunner_cli.offline import default_dataplane
from tests.charts.conftest import of_kind, render
from tests.reconciler import clusterkit as k


def test_the_chart_installs_the_dataplane_render_assumes(
    default_manifests: list[dict[str, Any]],
) -> None:
    (installed,) = [d for d in of_kind(default_manifests, "Dataplane")]
    assumed = default_dataplane()
    assert installed["metadata"]["name"] == assumed["metadata"]["name"]
    assert installed["apiVersion"] == assumed["apiVersion"]
    assert installed["spec"] == assumed["spec"]


def test_the_chart_installs_a_node_local_dataplane_that_renders_a_daemonset(helm: Path) -> None:
    """`dataplane.spec.dataplaneResource=DaemonSet` and `hostNetwork=true`: the chart's
    Dataplane carries them and render makes each Gateway's stunnerd a host-network DaemonSet
    (the README's "Node-local dataplanes")."""
    manifests = render(
        helm, "dataplane.spec.dataplaneResource=DaemonSet", "dataplane.spec.hostNetwork=true"
    )
    (installed,) = of_kind(manifests, "Dataplane")
    assert installed["spec"]["dataplaneResource"] == "DaemonSet"
    assert installed["spec"]["hostNetwork"] is True
    world = [k.gateway_class(), k.gateway_config(), installed, k.gateway(uid="u")]
    plan = render_plan(Snapshot.from_objects(world), RenderSettings(), datetime.now(UTC))
    workload = plan.deployments[f"{k.NS}/gw"]
    assert workload["kind"] == "DaemonSet" and "replicas" not in workload["spec"]
    assert workload["spec"]["template"]["spec"]["hostNetwork"] is True


def test_the_charts_dataplane_turns_the_offload_on_with_only_its_capabilities(helm: Path) -> None:
    """`dataplane.spec.offloadEngine=TC`: the chart's Dataplane carries it, render puts it in
    the config and gives stunnerd CAP_BPF and CAP_NET_ADMIN, and nothing else; without it,
    no capability and no security context at all."""
    for engine, expected in (("None", None), ("TC", ["BPF", "NET_ADMIN"])):
        manifests = render(helm, f"dataplane.spec.offloadEngine={engine}")
        (installed,) = of_kind(manifests, "Dataplane")
        assert installed["spec"]["offloadEngine"] == engine
        world = [k.gateway_class(), k.gateway_config(), installed, k.gateway(uid="u")]
        plan = render_plan(Snapshot.from_objects(world), RenderSettings(), datetime.now(UTC))
        assert plan.configs[f"{k.NS}/gw"].admin.offload_engine == engine
        workload = plan.deployments[f"{k.NS}/gw"]
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        context = container.get("securityContext")
        if expected is None:
            assert context is None
            continue
        assert context["capabilities"] == {"add": expected, "drop": ["ALL"]}
        assert context["privileged"] is False and context["allowPrivilegeEscalation"] is False
