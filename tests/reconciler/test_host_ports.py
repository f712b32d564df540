"""Several host-network Gateways on one node (issue 23): each Gateway's stunnerd gets its own
health-check and metrics ports (the stunner.l7mp.io/health-check-port and metrics-port
annotations), rendered into its config and its pod alike.

We test, through the real render pipeline: the config's admin endpoints and the pod's probes and
metrics-port agree, Gateway by Gateway; a host-network pod declares only the ports its stunnerd
binds (each declared port of such a pod is a hostPort the scheduler reserves); a Gateway whose
annotated port another host-network Gateway holds is kept out, the finding at the annotation
(one whose health check and metrics share a port is rendered, with a finding: stunnerd runs
without its metrics server).
And, with real sockets, that two stunnerd processes run side by side with the configs rendered
for two such Gateways, each answering /ready (and its metrics) on its own ports.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reconciler.render import Plan, RenderSettings, render
from reconciler.store import Snapshot
from stunner_api.vocabulary import HEALTH_CHECK_PORT, METRICS_PORT_ANNOTATION
from tests.reconciler.clusterkit import Obj, dataplane, gateway, gateway_class, gateway_config
from tests.reconciler.clusterkit import listener as lst
from tests.support.ports import free_port
from tests.support.turnclient import binding_answered

NOW = datetime(2026, 1, 1, tzinfo=UTC)
NODE_LOCAL = {"dataplaneResource": "DaemonSet", "hostNetwork": True}


def plan_of(*objects: Obj, **dataplane_spec: Any) -> Plan:
    world = [gateway_class(), gateway_config(), dataplane(**dataplane_spec), *objects]
    return render(Snapshot.from_objects(copy.deepcopy(world)), RenderSettings(), NOW)


def annotated(
    *listeners: Obj,
    name: str,
    namespace: str = "stunner",
    health: int | None = None,
    metrics: int | None = None,
    created: str = "2026-01-01T00:00:00Z",
) -> Obj:
    annotations = {
        key: str(port)
        for key, port in ((HEALTH_CHECK_PORT, health), (METRICS_PORT_ANNOTATION, metrics))
        if port is not None
    }
    gw = gateway(*listeners, name=name, uid=f"uid-{name}", annotations=annotations)
    gw["metadata"] |= {"namespace": namespace, "creationTimestamp": created}
    return gw


def container(plan: Plan, gateway_id: str) -> dict[str, Any]:
    pod = plan.deployments[gateway_id]["spec"]["template"]["spec"]
    found: dict[str, Any] = pod["containers"][0]
    return found


def pod_ports(plan: Plan, gateway_id: str) -> tuple[int | None, int | None]:
    """(the port the probes ask, the declared metrics-port), each None when absent, after
    checking that the config puts stunnerd's endpoints at exactly those ports."""
    c, admin = container(plan, gateway_id), plan.configs[gateway_id].admin
    health = c["readinessProbe"]["httpGet"]["port"] if "readinessProbe" in c else None
    if health is not None:
        assert c["livenessProbe"]["httpGet"]["port"] == health
    assert admin.healthcheck_endpoint == ("" if health is None else f"http://:{health}")
    declared = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    metrics = declared.get("metrics-port")
    if admin.metrics_endpoint:
        assert admin.metrics_endpoint == f"http://:{metrics}/metrics"
    return health, metrics


def test_two_host_network_gateways_render_their_own_daemon_ports() -> None:
    """One Gateway moves its stunnerd to 9086/9080, the other keeps 8086/8080: both render
    (no PortUnavailable), each config's endpoints where its pod's probes and port point."""
    first = annotated(lst("udp", 3478), name="udp", health=9086, metrics=9080)
    second = annotated(lst("tcp", 443, "TURN-TCP"), name="tenant", namespace="media")
    plan = plan_of(first, second, enableMetricsEndpoint=True, **NODE_LOCAL)
    assert not [f for f in plan.findings if f.reason == "PortUnavailable"], plan.findings
    assert pod_ports(plan, "stunner/udp") == (9086, 9080)
    assert pod_ports(plan, "media/tenant") == (8086, 8080)
    assert [lc.port for lc in plan.configs["media/tenant"].listeners] == [443]


def test_a_host_network_pod_declares_only_the_ports_its_stunnerd_binds() -> None:
    """Metrics off: a host-network pod declares no metrics-port (it would be a hostPort the
    scheduler reserves for nothing); a pod in its own network keeps Go's metrics-port 8080 (the
    metrics-port annotation moves only an endpoint that is on).
    The health check off: no probes, no endpoint, whatever the annotation says."""
    gw = annotated(name="gw", health=9086, metrics=9080)
    assert pod_ports(plan_of(gw, **NODE_LOCAL), "stunner/gw") == (9086, None)
    assert pod_ports(plan_of(gw), "stunner/gw") == (9086, 8080)
    assert pod_ports(plan_of(gw, enableMetricsEndpoint=True), "stunner/gw") == (9086, 9080)
    assert pod_ports(plan_of(annotated(name="gw")), "stunner/gw") == (8086, 8080)
    off = plan_of(gw, disableHealthCheck=True, **NODE_LOCAL)
    assert pod_ports(off, "stunner/gw") == (None, None)
    assert "ports" not in container(off, "stunner/gw")


def test_render_keeps_out_the_younger_gateway_whose_annotated_port_is_taken() -> None:
    older = annotated(lst("udp", 3478), name="first", health=9086)
    younger = annotated(
        lst("udp", 3479),
        name="second",
        namespace="media",
        health=9086,
        created="2026-01-02T00:00:00Z",
    )
    plan = plan_of(older, younger, **NODE_LOCAL)
    assert "stunner/first" in plan.configs and "media/second" not in plan.configs
    assert "media/second" not in plan.deployments  # its pods could not run beside the older's
    (finding,) = [f for f in plan.findings if f.reason == "PortUnavailable"]
    assert (finding.namespace, finding.name) == ("media", "second")
    assert finding.path == f'metadata.annotations["{HEALTH_CHECK_PORT}"]'
    assert finding.message.startswith(
        "TCP port 9086 (stunnerd: its health check) is already bound on the nodes by Gateway "
        "stunner/first (its health check)"
    )


def test_health_and_metrics_on_one_port_is_a_finding_and_the_gateway_still_renders() -> None:
    gw = annotated(lst("udp", 3478), name="gw", health=9086, metrics=9086)
    plan = plan_of(gw, enableMetricsEndpoint=True, **NODE_LOCAL)
    assert [lc.port for lc in plan.configs["stunner/gw"].listeners] == [3478]
    (finding,) = [f for f in plan.findings if f.name == "gw"]
    assert (finding.path, finding.reason) == (
        f'metadata.annotations["{METRICS_PORT_ANNOTATION}"]',
        "Invalid",
    )
    assert finding.message.startswith("TCP port 9086 is also stunnerd's health check")


def test_a_listener_on_stunnerds_own_port_is_left_out_in_the_pods_network_too() -> None:
    """A TURN-TCP listener on 8086 in a pod of its own network: stunnerd's health check binds
    that port first, so the listener could never bind (and its config would be refused). The
    listener is left out with PortUnavailable; the Gateway's other listener is served."""
    gw = annotated(lst("tcp", 8086, "TURN-TCP"), lst("udp", 3478), name="gw")
    plan = plan_of(gw)
    assert [lc.port for lc in plan.configs["stunner/gw"].listeners] == [3478]
    (finding,) = [f for f in plan.findings if f.reason == "PortUnavailable"]
    assert finding.path == "spec.listeners[0].port"
    assert finding.message.startswith(
        "TCP port 8086 is its health check (stunnerd's own port, in its pods' network)"
    )


# --- two stunnerd processes, side by side -----------------------------------------------------


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=2) as response:
        return int(response.status), bytes(response.read())


def _until_ready(port: int, process: subprocess.Popen[str], log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        try:
            if _get(f"http://127.0.0.1:{port}/ready")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"no /ready on 127.0.0.1:{port}: {log.read_text()}")


def test_two_stunnerds_with_the_rendered_configs_run_side_by_side(tmp_path: Path) -> None:
    """The configs rendered for two host-network Gateways, each with its own health-check and
    metrics ports, run in two stunnerd processes on one host (loopback only: the rendered
    `http://:PORT` is bound at 127.0.0.1, its port kept); each answers /ready and /metrics on
    its own ports, and its TURN listener on its own."""
    ports = [free_port() for _ in range(6)]
    gateways = [
        annotated(lst("udp", ports[0]), name="a", health=ports[1], metrics=ports[2]),
        annotated(lst("udp", ports[3]), name="b", health=ports[4], metrics=ports[5]),
    ]
    plan = plan_of(*gateways, enableMetricsEndpoint=True, **NODE_LOCAL)
    assert not [f for f in plan.findings if f.reason == "PortUnavailable"], plan.findings
    processes: list[tuple[subprocess.Popen[str], Path]] = []
    try:
        for gateway_id in ("stunner/a", "stunner/b"):
            health, metrics = pod_ports(plan, gateway_id)
            config = json.loads(plan.configs[gateway_id].to_json())
            admin = config["admin"]
            for key, port in (("healthcheck_endpoint", health), ("metrics_endpoint", metrics)):
                assert admin[key].startswith(f"http://:{port}")
                admin[key] = admin[key].replace("http://:", "http://127.0.0.1:")
            path = tmp_path / f"{gateway_id.replace('/', '-')}.json"
            path.write_text(json.dumps(config))
            log = tmp_path / f"{path.stem}.log"
            with log.open("w") as stderr:
                process = subprocess.Popen(
                    [sys.executable, "-m", "stunnerd", "-u", "1", "-c", str(path)],
                    stderr=stderr,
                    text=True,
                    env={**os.environ, "STUNNER_ADDR": "127.0.0.1"},
                    cwd=tempfile.gettempdir(),
                )
            processes.append((process, log))
        for (process, log), (turn, health, metrics) in zip(
            processes, [ports[:3], ports[3:]], strict=True
        ):
            _until_ready(health, process, log)
            status, body = _get(f"http://127.0.0.1:{metrics}/metrics")
            assert status == 200 and b"stunner" in body
            assert binding_answered(turn)
        for process, log in processes:
            assert process.poll() is None, log.read_text()
    finally:
        for process, _ in processes:
            process.terminate()
        for process, _ in processes:
            process.wait(10)
