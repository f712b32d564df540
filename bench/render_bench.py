"""Render time of the reconciler: N Gateways, each with 3 listeners and 2 routes, in one render.

    .venv/bin/python bench/render_bench.py [--gateways 1000] [--repeat 5] [--endpoints 10]

Builds one snapshot: a GatewayClass, its GatewayConfig (auth from a Secret), the default
Dataplane, and per Gateway a TURN-UDP, a TURN-TCP and a TURN-TLS listener (a shared certificate
Secret, so the rule table parses a real certificate per Gateway), two UDPRoutes each to its own
Service with an EndpointSlice of --endpoints pods, and the Gateway's LoadBalancer Service with an
ingress IP. Then renders it --repeat times and prints the wall and CPU seconds per render
(median and best) against the 2 s budget of issue 11, and what one render produced. A benchmark,
not a test: nothing here asserts timing.
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reconciler.render import RenderSettings, render  # noqa: E402
from reconciler.store import Snapshot  # noqa: E402
from stunnerd.transport.certificates import self_signed_certificate  # noqa: E402

BUDGET_SECONDS = 2.0
NAMESPACES = 20


def hierarchy(cert: str, key: str) -> list[dict[str, Any]]:
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    return [
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": "stunner", "generation": 1},
            "spec": {
                "controllerName": "stunner.l7mp.io/gateway-operator",
                "parametersRef": {
                    "group": "stunner.l7mp.io",
                    "kind": "GatewayConfig",
                    "name": "config",
                    "namespace": "stunner",
                },
            },
        },
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "GatewayConfig",
            "metadata": {"name": "config", "namespace": "stunner"},
            "spec": {"realm": "stunner.l7mp.io", "authRef": {"name": "auth"}},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "auth", "namespace": "stunner"},
            "type": "Opaque",
            "data": {"type": b64("static"), "username": b64("user"), "password": b64("pass")},
        },
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "Dataplane",
            "metadata": {"name": "default"},
            "spec": {"image": "l7mp/stunnerd:latest"},
        },
        *[
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "cert", "namespace": f"ns-{n}"},
                "type": "kubernetes.io/tls",
                "data": {"tls.crt": cert, "tls.key": key},
            }
            for n in range(NAMESPACES)
        ],
    ]


def gateway_objects(i: int, endpoints: int) -> list[dict[str, Any]]:
    ns, name = f"ns-{i % NAMESPACES}", f"gw-{i}"
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": name, "namespace": ns, "generation": 1, "uid": f"uid-{i}"},
            "spec": {
                "gatewayClassName": "stunner",
                "listeners": [
                    {"name": "udp", "port": 3478, "protocol": "TURN-UDP"},
                    {"name": "tcp", "port": 3478, "protocol": "TURN-TCP"},
                    {
                        "name": "tls",
                        "port": 443,
                        "protocol": "TURN-TLS",
                        "tls": {"certificateRefs": [{"name": "cert"}]},
                    },
                ],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": name,
                "namespace": ns,
                "annotations": {"stunner.l7mp.io/related-gateway-name": f"{ns}/{name}"},
            },
            "spec": {
                "type": "LoadBalancer",
                "ports": [
                    {"name": "udp", "port": 3478, "protocol": "UDP"},
                    {"name": "tcp", "port": 3478, "protocol": "TCP"},
                    {"name": "tls", "port": 443, "protocol": "TCP"},
                ],
            },
            "status": {"loadBalancer": {"ingress": [{"ip": f"203.0.{i // 250}.{i % 250}"}]}},
        },
    ]
    for r in range(2):
        backend = f"media-{i}-{r}"
        objects += [
            {
                "apiVersion": "stunner.l7mp.io/v1",
                "kind": "UDPRoute",
                "metadata": {"name": f"route-{i}-{r}", "namespace": ns, "generation": 1},
                "spec": {
                    "parentRefs": [{"name": name}],
                    "rules": [
                        {"backendRefs": [{"name": backend, "port": 10000, "endPort": 20000}]}
                    ],
                },
            },
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": backend, "namespace": ns},
                "spec": {
                    "clusterIP": f"10.96.{i // 250}.{i % 250}",
                    "ports": [{"port": 10000, "protocol": "UDP"}],
                },
            },
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{backend}-1",
                    "namespace": ns,
                    "labels": {"kubernetes.io/service-name": backend},
                },
                "addressType": "IPv4",
                "endpoints": [
                    {"addresses": [f"10.{100 + r}.{e}.{i % 250}"]} for e in range(endpoints)
                ],
            },
        ]
    return objects


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateways", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--endpoints", type=int, default=10, help="pods per backend Service")
    args = parser.parse_args()

    cert, key = self_signed_certificate("turn.example.com")
    objects = hierarchy(cert, key)
    for i in range(args.gateways):
        objects += gateway_objects(i, args.endpoints)
    snapshot_start = time.perf_counter()
    snapshot = Snapshot.from_objects(objects)
    snapshot_seconds = time.perf_counter() - snapshot_start

    walls, cpus = [], []
    plan = None
    for _ in range(args.repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        plan = render(snapshot, RenderSettings(), datetime.now(UTC))
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    assert plan is not None
    listeners = sum(len(c.listeners) for c in plan.configs.values())
    clusters = sum(len(c.clusters) for c in plan.configs.values())

    median_wall, median_cpu = statistics.median(walls), statistics.median(cpus)
    lines = [
        f"command: {' '.join([os.path.relpath(sys.executable), *sys.argv])}",
        f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        (
            f"snapshot: {len(objects)} objects indexed in {snapshot_seconds:.3f} s; "
            f"render: {len(plan.configs)} configs, {listeners} listeners, {clusters} clusters, "
            f"{len(plan.deployments)} Deployments, {len(plan.services)} Services, "
            f"{len(plan.statuses)} statuses, {len(plan.findings)} findings"
        ),
        (
            f"render of {args.gateways} Gateways (3 listeners, 2 routes each), {args.repeat} runs: "
            f"wall median {median_wall:.3f} s (best {min(walls):.3f} s), "
            f"CPU median {median_cpu:.3f} s (best {min(cpus):.3f} s)"
        ),
        (
            f"budget {BUDGET_SECONDS:.1f} s: the median wall is "
            f"{median_wall / BUDGET_SECONDS:.2f} of it, "
            f"{1000 * median_wall / args.gateways:.2f} ms per Gateway"
        ),
    ]
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
