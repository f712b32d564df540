"""`stunner status` asks each stunnerd pod's /status where that pod serves it: the port its
readiness probe asks (a Gateway's stunner.l7mp.io/health-check-port annotation moves it, so
host-network Gateways can share nodes), else 8086.

Two pods with the pod templates render makes for two Gateways (one annotated to 9086, one on
the default) are stored in the fake API server, whose pod proxy reaches each only at its own
port; both statuses are read through the official client.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from reconciler.render import RenderSettings, render
from reconciler.store import Snapshot
from stunner_api.vocabulary import HEALTH_CHECK_PORT
from stunner_cli.cluster import Target, dataplane_status
from stunner_cli.kube import Kube
from tests.reconciler.clusterkit import NS, dataplane, gateway, gateway_class, gateway_config
from tests.support.background import Background
from tests.support.fakeapi import FakeApiServer


def status_app(name: str) -> web.Application:
    async def status(_: web.Request) -> web.Response:
        return web.json_response({"admin": {"name": name}})

    app = web.Application()
    app.router.add_get("/status", status)
    return app


def test_status_is_read_at_each_pods_probe_port() -> None:
    gateways = [
        gateway(name="moved", uid="uid-moved", annotations={HEALTH_CHECK_PORT: "9086"}),
        gateway(name="plain", uid="uid-plain"),
    ]
    world = [gateway_class(), gateway_config(), dataplane(hostNetwork=True), *gateways]
    plan = render(Snapshot.from_objects(copy.deepcopy(world)), RenderSettings(), datetime.now(UTC))
    background = Background()
    try:
        with FakeApiServer() as fake:
            for name, port in (("moved", 9086), ("plain", 8086)):
                template: dict[str, Any] = plan.deployments[f"{NS}/{name}"]["spec"]["template"]
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"]}
                pod["metadata"] |= {"name": f"{name}-abc", "namespace": NS}
                pod["spec"] = template["spec"]
                fake.seed(pod)
                fake.proxy(NS, "pods", f"{name}-abc", port, background.serve(status_app(name)))
            kube = Kube(fake.api_client())
            try:
                entries = dataplane_status(kube, Target(NS))
            finally:
                kube.close()
    finally:
        background.close()
    assert sorted((e["pod"], e["status"]) for e in entries) == [
        (f"{NS}/moved-abc", {"admin": {"name": "moved"}}),
        (f"{NS}/plain-abc", {"admin": {"name": "plain"}}),
    ]
