"""A rendered TCPRoute end to end, over real sockets: render -> the dataplane config as stunnerd's
file source reads it -> stunnerd -> a raw TURN-TCP client's TCP allocation (RFC 6062).

We test these aspects:
- A Gateway API TCPRoute to a StaticService (127.0.0.1/32, the echo backend's port) renders a
  cluster of protocol TCP that admits a Connect to the backend: ConnectionBind, bytes echoed.
- The backend's port bounds what it admits: a Connect to another port of the same address is
  refused (403).
- A UDPRoute to the same backend admits no TCP peer: the TCP Allocate itself gets 403 (the
  listener routes to no TCP cluster); the TCPRoute is what opens it.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from reconciler.render import RenderSettings, render
from reconciler.store import Snapshot
from stunner_api.stun import Class
from stunnerd.process.daemon import Stunner
from stunnerd.process.sources import FileSource
from tests.stunnerd.test_tcp_allocations import (
    STEP,
    closed_port,
    connect,
    connection_bind,
    echo_backend,
    run,
    tcp_allocation,
)
from tests.support.turnclient import HOST, RawTcpClient, error_code, free_port

COMMON = Path(__file__).resolve().parent.parent / "data" / "render" / "common.yaml"
NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
GATEWAY_API = "gateway.networking.k8s.io"


def objects(listener_port: int, backend_port: int, route_kind: str) -> list[dict[str, Any]]:
    """The chart's hierarchy (the render cases' common.yaml), a Gateway with one TURN-TCP
    listener, a StaticService of 127.0.0.1/32 and a route of `route_kind` to its
    `backend_port`."""
    route_api = f"{GATEWAY_API}/v1alpha2"
    common = [obj for obj in yaml.safe_load_all(COMMON.read_text()) if obj]
    return [
        *common,
        {
            "apiVersion": f"{GATEWAY_API}/v1",
            "kind": "Gateway",
            "metadata": {"name": "tcp-gateway", "namespace": "stunner"},
            "spec": {
                "gatewayClassName": "stunner-gatewayclass",
                "listeners": [{"name": "tcp", "port": listener_port, "protocol": "TURN-TCP"}],
            },
        },
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "StaticService",
            "metadata": {"name": "loopback", "namespace": "stunner"},
            "spec": {"prefixes": [f"{HOST}/32"]},
        },
        {
            "apiVersion": route_api,
            "kind": route_kind,
            "metadata": {"name": "echo", "namespace": "stunner"},
            "spec": {
                "parentRefs": [{"name": "tcp-gateway"}],
                "rules": [
                    {
                        "backendRefs": [
                            {
                                "group": "stunner.l7mp.io",
                                "kind": "StaticService",
                                "name": "loopback",
                                "port": backend_port,
                            }
                        ]
                    }
                ],
            },
        },
    ]


async def rendered_stunnerd(tmp_path: Path, objs: list[dict[str, Any]]) -> Stunner:
    """stunnerd on the config rendered for stunner/tcp-gateway, as its file source reads it with
    the pod's address on loopback (its health check off: no fixed port in a test)."""
    plan = render(Snapshot.from_objects(objs), RenderSettings(), NOW)
    path = tmp_path / "stunnerd.conf"
    path.write_text(json.dumps(plan.configs["stunner/tcp-gateway"].to_dict()))
    loaded = await FileSource(path, env={"STUNNER_ADDR": HOST}).load()
    admin = loaded.admin.model_copy(update={"healthcheck_endpoint": ""})
    stunner = Stunner()
    await stunner.apply(loaded.model_copy(update={"admin": admin}))
    return stunner


def test_a_rendered_tcproute_admits_a_tcp_connect_to_its_backend(tmp_path: Path) -> None:
    async def main() -> None:
        async with echo_backend() as (backend, _):
            port = free_port()
            stunner = await rendered_stunnerd(tmp_path, objects(port, backend, "TCPRoute"))
            try:
                assert stunner.config is not None
                (cluster,) = stunner.config.clusters
                assert (cluster.name, cluster.protocol) == ("tcp:stunner/echo", "TCP")
                control = await tcp_allocation(port)
                response = await connect(control, (HOST, backend))
                assert response.message_class == Class.SUCCESS, response.attributes
                connection_id = response.attributes["CONNECTION-ID"]
                reader, writer, bound = await connection_bind(control, port, connection_id)
                assert bound.message_class == Class.SUCCESS, bound.attributes
                writer.write(b"over a rendered TCP cluster")
                echoed = await asyncio.wait_for(reader.readexactly(27), STEP)
                assert echoed == b"over a rendered TCP cluster"
                # Another port of the same address: outside the route's port.
                refused = await connect(control, (HOST, closed_port()))
                assert error_code(refused) == 403, refused.attributes
                writer.close()
                control.close()
            finally:
                await stunner.close()

    run(main)


def test_a_udproute_to_the_same_backend_admits_no_tcp_peer(tmp_path: Path) -> None:
    async def main() -> None:
        async with echo_backend() as (backend, sources):
            port = free_port()
            stunner = await rendered_stunnerd(tmp_path, objects(port, backend, "UDPRoute"))
            try:
                client = await RawTcpClient.connect((HOST, port))
                response = await client.allocate(**{"REQUESTED-TRANSPORT": 6})
                assert error_code(response) == 403, response.attributes
                assert sources == []
                client.close()
            finally:
                await stunner.close()

    run(main)
