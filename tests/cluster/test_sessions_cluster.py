"""Who is on the relay, seen from the real cluster (issues 29 and 32), once per helm major, each a
phase on one release (the quick start's images and install, the example Gateway, the echo pod).

- Two stunnerd replicas, one per node (the Dataplane's topologySpreadConstraints), so that the
  second node's NodePort has a stunnerd pod of its own.
- ``externalTrafficPolicy``: a TURN allocation from this host through the second node's
  NodePort. With the default (Cluster), kube-proxy SNATs it: stunnerd's log and ``helm stunner
  sessions`` name a node's address as the client. With the Gateway annotated
  ``stunner.l7mp.io/external-traffic-policy: local`` (docs/reference/annotations.md) the Service
  says ``externalTrafficPolicy: Local`` and both name this host's own address and port.
- ``helm stunner sessions`` through the real API server lists a live allocation of this host
  (its client address, user id, relay address, peers), never its password; ``helm stunner
  disconnect --user`` ends it: the allocation's Refresh gets 437 within 1 s of the command
  starting (polled every 50 ms), and by the time the command returns.
- A bandwidth cap (issue 29): the example's GatewayConfig patched with
  ``allocationBandwidthLimit`` as a user would (kubectl): a value under the bound is refused at
  admission naming the field; a valid one reaches the pods (``helm stunner sessions`` shows it on
  a new allocation), and a call sending at four times the cap gets back its echoes at the cap
  (within 5 %, the bucket's 0.2 s burst counted), each way capped on the relay; the cap lifted
  after.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from stunner_api.stun import Class, Message
from tests.cluster import calls
from tests.cluster.conftest import MEASURED, Kube, wait_for
from tests.cluster.test_faults_cluster import SPREAD
from tests.cluster.test_quickstart_cluster import (
    CREDENTIALS,
    GATEWAY,
    GATEWAY_NS,
    Release,
    echo_peer,
    gateway,
    images,
    permitted,
    pod_condition,
    release,
    turn_allocation,
)
from tests.support.turnclient import RawClient, error_code

# the quick start's fixtures (a release of this module's own)
__all__ = ["echo_peer", "gateway", "images", "release"]

ETP_ANNOTATION = "stunner.l7mp.io/external-traffic-policy"
GATEWAY_CONFIG = ("gatewayconfig", "stunner-gatewayconfig", "-n", GATEWAY_NS)
CAP = 64_000  # bits per second each way: 50 packets of 160 bytes a second
CAP_CALL_SECONDS = 10.0
SESSIONS = ("stunner", "sessions", f"{GATEWAY_NS}/{GATEWAY}")


def _pods_by_node(kube: Kube) -> dict[str, dict[str, Any]] | None:
    """The Gateway's stunnerd pods by node, once there are exactly two, Ready, on two nodes."""
    pods = kube.get("pods", "-n", GATEWAY_NS, "-l", "app=stunner")["items"]
    ready = [
        p
        for p in pods
        if (pod_condition(p, "Ready") or {}).get("status") == "True"
        and not p["metadata"].get("deletionTimestamp")
    ]
    by_node = {p["spec"]["nodeName"]: p for p in ready}
    return by_node if len(pods) == 2 and len(by_node) == 2 else None


def _node_ip(kube: Kube, name: str) -> str:
    node = kube.get("node", name)
    return str(next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"))


def test_two_replicas_give_the_second_node_a_stunnerd_pod(gateway: Release) -> None:
    kube = gateway.kube
    nodes = [n["metadata"]["name"] for n in kube.get("nodes")["items"]]
    if len(nodes) < 2:
        pytest.skip("one node: the client address through another node needs a second")
    patch = {"spec": {"replicas": 2, "topologySpreadConstraints": [SPREAD]}}
    kube.ok("patch", "dataplane", "default", "--type=merge", "-p", json.dumps(patch))
    pods = wait_for("two stunnerd pods Ready on two nodes", lambda: _pods_by_node(kube), 180)
    second = nodes[1]
    gateway.state["second"] = {
        "node": second,
        "ip": _node_ip(kube, second),
        "pod": pods[second]["metadata"]["name"],
    }


def _own_address(towards: tuple[str, int]) -> str:
    """The address this host sends from towards `towards` (its route's source)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(towards)
        return str(probe.getsockname()[0])


def _sessions(release: Release, *more: str) -> str:
    done = release.run_helm(*SESSIONS, *more, timeout=60)
    assert done.returncode == 0, f"helm {' '.join(SESSIONS + more)}: {done.stderr}"
    return done.stdout


def _rows(listed: str) -> list[dict[str, Any]]:
    """The allocations of `sessions -o json` (one answer per Gateway)."""
    return [s for answer in json.loads(listed) for s in answer.get("sessions") or []]


@contextlib.asynccontextmanager
async def _allocation_from_here(server: tuple[str, int]) -> AsyncIterator[tuple[str, Message]]:
    """A UDP allocation through `server` from this host's own address towards it ("ip:port"),
    deleted on the way out."""
    user, password = CREDENTIALS
    _, client = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: RawClient(server, username=user, password=password),
        local_addr=(_own_address(server), 0),
    )
    try:
        allocated = await client.allocate()
        assert allocated.message_class == Class.SUCCESS, error_code(allocated)
        assert client.transport is not None
        local = client.transport.get_extra_info("sockname")
        yield f"{local[0]}:{local[1]}", allocated
        with contextlib.suppress(Exception):
            await client.refresh(0)
    finally:
        client.close()


async def _client_seen(release: Release, server: tuple[str, int]) -> dict[str, Any]:
    """An allocation through `server`: the client address `sessions` and the relaying pod's log
    name (kube-proxy may send it to either pod)."""
    async with _allocation_from_here(server) as (local, allocated):
        relay = "{}:{}".format(*allocated.attributes["XOR-RELAYED-ADDRESS"])

        def listed() -> dict[str, Any] | None:
            rows = _rows(_sessions(release, "-o", "json"))
            return next((r for r in rows if r.get("relay") == relay), None)

        row = await asyncio.to_thread(wait_for, f"the allocation {relay} in sessions", listed, 30)

        def logged() -> str | None:
            log = release.kube.ok("logs", row["pod"], "-n", GATEWAY_NS, "--all-containers")
            lines = [ln for ln in log.splitlines() if "allocation created" in ln]
            lines = [ln for ln in lines if f"relay {relay}" in ln]
            return lines[-1] if lines else None

        line = await asyncio.to_thread(wait_for, f"{row['pod']}'s log of it", logged, 30)
        return {"local": local, "log": line, "session": row}


def _service_policy(kube: Kube) -> str:
    return str(kube.get("service", GATEWAY, "-n", GATEWAY_NS)["spec"]["externalTrafficPolicy"])


def test_external_traffic_policy_local_keeps_the_hosts_address(gateway: Release) -> None:
    if "second" not in gateway.state:
        pytest.skip("needs the second node's stunnerd pod of the phase before")
    kube, second = gateway.kube, gateway.state["second"]
    nodeport = gateway.state["nodeports"]["UDP"]
    server = (second["ip"], nodeport)
    host = _own_address(server)
    # Cluster (the default): what the client address is without the annotation
    assert _service_policy(kube) == "Cluster"
    before = asyncio.run(_client_seen(gateway, server))
    assert not before["session"]["client"].startswith(f"{host}:"), before
    kube.ok("annotate", "gateway", GATEWAY, "-n", GATEWAY_NS, f"{ETP_ANNOTATION}=local")
    started = time.monotonic()
    wait_for("the Service's externalTrafficPolicy Local", lambda: _service_policy(kube) == "Local",
             30, 0.2)  # fmt: skip
    MEASURED[f"{gateway.name}: ETP Local: the Service said Local"] = (
        f"{time.monotonic() - started:.1f} s after the annotation"
    )
    after = asyncio.run(_client_seen(gateway, server))
    MEASURED[f"{gateway.name}: ETP Cluster via {server[0]}:{nodeport}"] = (
        f"the host {before['local']} seen as {before['session']['client']}: {before['log']}"
    )
    MEASURED[f"{gateway.name}: ETP Local via {server[0]}:{nodeport}"] = (
        f"the host {after['local']} seen as {after['session']['client']}: {after['log']}"
    )
    assert after["session"]["client"] == after["local"], after
    assert after["session"]["pod"] == second["pod"], "ETP Local: relayed by another node's pod"
    assert f"for {after['local']}" in after["log"], after


async def _disconnected(release: Release, server: tuple[str, int], peer: tuple[str, int]) -> Any:
    """An allocation with a permission for the echo pod; `sessions`, then `disconnect --user`
    while Refresh is sent every 50 ms: the time from the command's start to the first 437."""
    async with turn_allocation(server) as (client, allocated):
        await permitted(client, peer, within=30)
        assert client.transport is not None
        local = client.transport.get_extra_info("sockname")
        table = await asyncio.to_thread(_sessions, release, "--user", CREDENTIALS[0])
        listed = await asyncio.to_thread(_sessions, release, "-o", "json")
        marks: dict[str, Any] = {}

        def disconnect() -> None:
            marks["started"] = time.monotonic()
            marks["done"] = release.run_helm(
                "stunner", "disconnect", f"{GATEWAY_NS}/{GATEWAY}", "--user", CREDENTIALS[0],
                timeout=60,
            )  # fmt: skip
            marks["returned"] = time.monotonic()

        command = threading.Thread(target=disconnect)
        command.start()
        while "started" not in marks:
            await asyncio.sleep(0.01)
        ended = None
        while time.monotonic() - marks["started"] < 30:
            answer = await client.refresh(600)
            if error_code(answer) == 437:
                ended = time.monotonic()
                break
            await asyncio.sleep(0.05)
        await asyncio.to_thread(command.join)
        return {
            "local": f"{local[0]}:{local[1]}",
            "table": table,
            "json": listed,
            "done": marks["done"],
            "returned": marks["returned"] - marks["started"],
            "ended": None if ended is None else ended - marks["started"],
            "ended_after_return": None if ended is None else ended - marks["returned"],
        }


def test_sessions_lists_a_call_and_disconnect_ends_it(
    gateway: Release, echo_peer: tuple[str, int]
) -> None:
    server = (gateway.state["address"], 3478)
    result = asyncio.run(_disconnected(gateway, server, echo_peer))
    done = result["done"]
    MEASURED[f"{gateway.name}: helm stunner sessions --user {CREDENTIALS[0]}"] = result["table"]
    MEASURED[f"{gateway.name}: helm stunner disconnect"] = (
        f"{done.stdout.strip()} (the command returned after {result['returned']:.2f} s; "
        f"Refresh got 437 {result['ended'] or -1:.2f} s after it started)"
    )
    for output in (result["table"], result["json"], done.stdout, done.stderr):
        assert CREDENTIALS[1] not in output, "the password in helm stunner's output"
    assert CREDENTIALS[0] in result["table"], result["table"]
    rows = _rows(result["json"])
    assert any(r.get("user") == CREDENTIALS[0] and r.get("peers") for r in rows), rows
    assert done.returncode == 0, f"helm stunner disconnect: {done.stderr}"
    assert "ended" in done.stdout, done.stdout
    assert result["ended"] is not None, "the allocation still answered Refresh 30 s later"
    assert result["ended_after_return"] <= 1.0, result
    assert result["ended"] <= result["returned"] + 1.0, result


def _cap(kube: Kube, value: int | None) -> Any:
    patch = json.dumps({"spec": {"allocationBandwidthLimit": value}})
    return kube.run("patch", *GATEWAY_CONFIG, "--type=merge", "-p", patch)


def test_a_bandwidth_cap_applied_with_kubectl_holds_a_call_at_the_cap(
    gateway: Release, echo_peer: tuple[str, int]
) -> None:
    kube = gateway.kube
    refused = _cap(kube, 100)
    assert refused.returncode != 0, refused.stdout
    assert "spec.allocationBandwidthLimit" in refused.stderr, refused.stderr
    assert _cap(kube, CAP).returncode == 0
    server = (gateway.state["address"], 3478)
    try:

        async def shown() -> bool:
            async with turn_allocation(server) as (client, _):
                await permitted(client, echo_peer, within=30)
                listed = await asyncio.to_thread(_sessions, gateway, "-o", "json")
            return any(r.get("bandwidthLimit") == CAP for r in _rows(listed))

        started = time.monotonic()
        wait_for("the cap in helm stunner sessions", lambda: asyncio.run(shown()), within=60)
        reached = time.monotonic() - started
        rate = 4 * CAP / 8 / calls.PAYLOAD_SIZE  # packets a second: four times the cap
        result = asyncio.run(
            calls.call("udp", server, echo_peer, CREDENTIALS, CAP_CALL_SECONDS, rate=rate)
        )
        assert not result.error, result.error
        # what came back: capped to the peer, then capped to the client; the bucket's 0.2 s
        # burst passes on top of the window's share
        echoed_bps = result.echoed * calls.PAYLOAD_SIZE * 8 / CAP_CALL_SECONDS
        burst_bps = CAP * 0.2 / CAP_CALL_SECONDS
        MEASURED[f"{gateway.name}: allocationBandwidthLimit {CAP} bps"] = (
            f"in helm stunner sessions {reached:.1f} s after kubectl patch; a call sending "
            f"{result.sent} packets of {calls.PAYLOAD_SIZE} B in {CAP_CALL_SECONDS:.0f} s "
            f"({result.sent * calls.PAYLOAD_SIZE * 8 / CAP_CALL_SECONDS:.0f} bps) got "
            f"{result.echoed} back: {echoed_bps:.0f} bps"
        )
        assert 0.95 * CAP <= echoed_bps <= 1.05 * CAP + burst_bps, MEASURED
    finally:
        assert _cap(kube, None).returncode == 0
