"""RFC 6062 TCP allocations to a TCP backend through the cluster chart (issue 31), once per helm
major, on a release of its own (the quick start's images and install, the example Gateway).

- A TCP echo pod behind a Service, and a Gateway API TCPRoute naming it, attached to the example
  Gateway's TURN-TCP listener, applied with kubectl as docs/reference/stunnerd.md tells a user
  ("TCP backends: a TCPRoute"). The chart does not ship TCPRoute's CRD (Gateway API's
  experimental channel): the user installs it; here tests/data/crds/tcproutes.yaml stands in for
  upstream's (no network on this machine), applied after the reconciler runs, so the reconciler
  picks it up without a restart, as the docs say.
- Before the TCPRoute, a TCP Allocate from the host through the Gateway's TURN-TCP listener is
  refused (403: the listener routes to no TCP cluster). After it, the host's TCP allocation
  Connects to the echo pod, binds a data connection (ConnectionBind) through the same
  LoadBalancer address and gets its bytes echoed; a Connect to another port of the pod is
  refused (403). The Gateway runs one stunnerd replica: a data connection must reach the pod
  holding its allocation, which a Service balancing over several replicas does not promise.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stunner_api import stun
from stunner_api.stun import Class, Message, Method
from tests.cluster.conftest import MEASURED, wait_for
from tests.cluster.test_quickstart_cluster import (
    CREDENTIALS,
    GATEWAY,
    GATEWAY_NS,
    Release,
    gateway,
    images,
    pod_condition,
    release,
)
from tests.support.turnclient import RawClient, RawTcpClient, error_code

# the quick start's fixtures (a release of this module's own)
__all__ = ["gateway", "images", "release"]

TCP_ECHO = "tcp-echo"
TCP_ECHO_PORT = 9002
TCPROUTE_CRD = Path(__file__).resolve().parents[1] / "data" / "crds" / "tcproutes.yaml"
STEP = 10.0
PAYLOAD = b"over a TCPRoute on the real cluster"

TCP_ECHO_SERVER = (
    "import socketserver\n"
    "class Echo(socketserver.BaseRequestHandler):\n"
    "    def handle(self):\n"
    "        while data := self.request.recv(65536):\n"
    "            self.request.sendall(data)\n"
    "socketserver.ThreadingTCPServer.allow_reuse_address = True\n"
    f"socketserver.ThreadingTCPServer(('0.0.0.0', {TCP_ECHO_PORT}), Echo).serve_forever()\n"
)


def _tcp_echo_objects(image: str) -> list[dict[str, Any]]:
    labels = {"app": TCP_ECHO}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": TCP_ECHO, "namespace": GATEWAY_NS, "labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "echo",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "-u", "-c", TCP_ECHO_SERVER],
                    "ports": [{"containerPort": TCP_ECHO_PORT, "protocol": "TCP"}],
                }
            ],
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": TCP_ECHO, "namespace": GATEWAY_NS},
        "spec": {
            "selector": labels,
            "ports": [{"name": "echo", "port": TCP_ECHO_PORT, "protocol": "TCP"}],
        },
    }
    return [pod, service]


TCPROUTE = {
    "apiVersion": "gateway.networking.k8s.io/v1alpha2",
    "kind": "TCPRoute",
    "metadata": {"name": TCP_ECHO, "namespace": GATEWAY_NS},
    "spec": {
        "parentRefs": [{"name": GATEWAY, "sectionName": "tcp-listener"}],
        "rules": [{"backendRefs": [{"name": TCP_ECHO, "port": TCP_ECHO_PORT}]}],
    },
}


@pytest.fixture(scope="module")
def tcp_echo(gateway: Release, images: dict[str, str]) -> Iterator[tuple[str, int]]:
    """A TCP echo pod behind a Service (its pod IP and port); deleted after."""
    control_plane = next(iter(images))  # it has python; every node has it already
    gateway.kube.apply(*_tcp_echo_objects(control_plane))

    def ip() -> str | None:
        pod = gateway.kube.get("pod", TCP_ECHO, "-n", GATEWAY_NS)
        condition = pod_condition(pod, "Ready")
        return pod["status"]["podIP"] if condition and condition["status"] == "True" else None

    yield str(wait_for("the TCP echo pod Ready", ip, within=120)), TCP_ECHO_PORT
    for kind in ("tcproute", "service", "pod"):
        gateway.kube.run("delete", kind, TCP_ECHO, "-n", GATEWAY_NS, "--ignore-not-found")


async def _tcp_allocate(server: tuple[str, int]) -> tuple[RawClient, Message]:
    client = await RawTcpClient.connect(server, username=CREDENTIALS[0], password=CREDENTIALS[1])
    return client, await client.allocate(**{"REQUESTED-TRANSPORT": 6})


async def _refused_before_the_route(server: tuple[str, int]) -> int | None:
    client, answer = await _tcp_allocate(server)
    client.close()
    return error_code(answer)


async def _read_frame(reader: asyncio.StreamReader) -> Message:
    header = await reader.readexactly(stun.HEADER_LENGTH)
    length = struct.unpack_from("!H", header, 2)[0]
    return stun.parse_message(header + await reader.readexactly(length))


async def _connect(client: RawClient, peer: tuple[str, int]) -> Message:
    request = Message(Method.CONNECT, Class.REQUEST)
    request.attributes["XOR-PEER-ADDRESS"] = peer
    return await client.request(request, timeout=STEP)


async def _echoed_through(server: tuple[str, int], peer: tuple[str, int]) -> dict[str, Any]:
    """A TCP allocation and its Connect to `peer` (retried until the route reaches stunnerd), a data
    connection bound through `server`, the payload echoed; a Connect to another port."""
    started = time.monotonic()
    while True:  # the reconciler looks for a newly served TCPRoute every 30 s
        client, allocated = await _tcp_allocate(server)
        if allocated.message_class == Class.SUCCESS:
            connected = await _connect(client, peer)
            if connected.message_class == Class.SUCCESS:
                break
        client.close()
        assert time.monotonic() - started < 90, (error_code(allocated), "no TCP cluster yet")
        await asyncio.sleep(1)
    try:
        admitted = time.monotonic() - started
        reader, writer = await asyncio.open_connection(*server)
        bind = Message(Method.CONNECTION_BIND, Class.REQUEST)
        bind.attributes.update(
            {
                "CONNECTION-ID": connected.attributes["CONNECTION-ID"],
                "USERNAME": client.username,
                "REALM": client.realm,
                "NONCE": client.nonce,
            }
        )
        writer.write(bind.encode(integrity_key=client.key))
        bound = await asyncio.wait_for(_read_frame(reader), STEP)
        assert bound.message_class == Class.SUCCESS, bound.attributes
        sent = time.monotonic()
        writer.write(PAYLOAD)
        echoed = await asyncio.wait_for(reader.readexactly(len(PAYLOAD)), STEP)
        rtt = time.monotonic() - sent
        writer.close()
        other = await _connect(client, (peer[0], peer[1] + 1))
        return {
            "relay": "{}:{}".format(*allocated.attributes["XOR-RELAYED-ADDRESS"]),
            "admitted": admitted,
            "echoed": echoed,
            "rtt": rtt,
            "other_port": error_code(other),
        }
    finally:
        client.close()


def test_a_tcp_allocation_reaches_a_tcp_backend_named_by_a_tcproute(
    gateway: Release, tcp_echo: tuple[str, int]
) -> None:
    kube = gateway.kube
    server = (gateway.state["address"], 3478)
    assert asyncio.run(_refused_before_the_route(server)) == 403
    kube.ok("apply", "--server-side", "-f", str(TCPROUTE_CRD))
    kube.ok("wait", "--for=condition=Established", "crd/tcproutes.gateway.networking.k8s.io")
    started = time.monotonic()
    # the webhook judges TCPRoutes once it sees them served: retried until it does
    wait_for("the TCPRoute admitted", lambda: kube.apply(TCPROUTE), within=60)
    result = asyncio.run(_echoed_through(server, tcp_echo))
    MEASURED[f"{gateway.name}: RFC 6062 via a TCPRoute"] = (
        f"a TCP allocation ({result['relay']}) from the host via {server[0]}:3478 (TURN-TCP) "
        f"Connected to the TCP echo pod {tcp_echo[0]}:{tcp_echo[1]} "
        f"{time.monotonic() - started:.1f} s after the TCPRoute was applied (admitted "
        f"{result['admitted']:.1f} s into the retries); "
        f"{len(PAYLOAD)} B echoed over the bound data connection in {result['rtt'] * 1000:.1f} ms;"
        f" a Connect to port {tcp_echo[1] + 1}: {result['other_port']}"
    )
    assert result["echoed"] == PAYLOAD
    assert result["other_port"] == 403, result
