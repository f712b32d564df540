"""Issue 30's cluster test: the kernel offload on a real cluster, once per helm major, each a
phase on one release (the quick start's images, its own install):

- A Gateway whose Dataplane turns the offload on (``offloadEngine: TC``, the README's offload
  section): its stunnerd container gets ``CAP_BPF`` and ``CAP_NET_ADMIN`` and nothing else, is
  not privileged, and says the offload is on for the listener
  (``stunner_listener_offload{reason="tc"} 1``).
- TURN from the host through the Gateway's NodePort to the UDP echo pod: a channel bound, its
  ChannelData echoed back, and the kernel's counters carry those packets
  (``stunner_listener_offloaded_packets_total``, both directions), counted in the listener's
  own totals as well.
- The 403s still hold with the offload on: peers outside every route are refused
  (CreatePermission and ChannelBind), and the route deleted stops the kernel relaying to its
  peer (the bound channel's ChannelData no longer echoes) within a few seconds.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reconciler.render.deployment import CONTAINER_NAME
from stunner_api.stun import Class, Message, Method
from stunner_api.vocabulary import RELATED_GATEWAY_NAME
from tests.cluster import test_quickstart_cluster as quickstart
from tests.cluster.conftest import MEASURED, Kube, wait_for
from tests.cluster.test_quickstart_cluster import (
    BACKEND,
    CREDENTIALS,
    ECHO_PORT,
    GATEWAY_NS,
    Release,
    echo_peer,
    images,
    permitted,
    pod_condition,
    release,
    turn_allocation,
)
from tests.support.turnclient import RawClient, error_code

# the quick start's fixtures (a release of this module's own)
__all__ = ["echo_peer", "images", "release"]

NAME = "offload"  # the Dataplane, GatewayConfig and GatewayClass
GATEWAY = "offload-gateway"
ROUTE = "offload-route"
LABELS = {"app.kubernetes.io/part-of": "stunner-offload-test"}
METRICS_PORT = 8080  # stunnerd's metrics endpoint (the Dataplane's enableMetricsEndpoint)
CHANNEL = 0x4000
PACKETS = 50  # ChannelData round trips through the kernel
# Peers no route admits: the kubernetes Service, loopback, the link-local metadata address.
REFUSED_PEERS = (("10.96.0.1", 443), ("127.0.0.1", ECHO_PORT), ("169.254.169.254", 80))


def _meta(name: str, namespaced: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": LABELS}
    if namespaced:
        meta["namespace"] = GATEWAY_NS
    return meta


def _offload_objects(default_spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The chart's default Dataplane with the offload and the metrics endpoint on, its class and
    config, a NodePort Gateway with one TURN-UDP listener and a route to the echo Service."""
    dataplane = {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "Dataplane",
        "metadata": _meta(NAME, namespaced=False),
        "spec": {**default_spec, "offloadEngine": "TC", "enableMetricsEndpoint": True},
    }
    config = {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "GatewayConfig",
        "metadata": _meta(NAME),
        "spec": {
            "realm": "stunner.l7mp.io",
            "dataplane": NAME,
            "authType": "static",
            "userName": CREDENTIALS[0],
            "password": CREDENTIALS[1],
        },
    }
    klass = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GatewayClass",
        "metadata": _meta(NAME, namespaced=False),
        "spec": {
            "controllerName": "stunner.l7mp.io/gateway-operator",
            "parametersRef": {
                "group": "stunner.l7mp.io",
                "kind": "GatewayConfig",
                "name": NAME,
                "namespace": GATEWAY_NS,
            },
        },
    }
    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {**_meta(GATEWAY), "annotations": {"stunner.l7mp.io/service-type": "NodePort"}},
        "spec": {
            "gatewayClassName": NAME,
            "listeners": [{"name": "udp", "port": 3478, "protocol": "TURN-UDP"}],
        },
    }
    route = {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "UDPRoute",
        "metadata": _meta(ROUTE),
        "spec": {
            "parentRefs": [{"name": GATEWAY}],
            "rules": [{"backendRefs": [{"name": BACKEND, "port": ECHO_PORT}]}],
        },
    }
    return [dataplane, config, klass, gateway, route]


def _apply(kube: Kube, *objects: dict[str, Any]) -> None:
    """`kubectl apply`, retried for up to 30 s while the webhook's Service catches up with its
    Ready pod (README: the first apply after install can be refused for a moment)."""
    deadline = time.monotonic() + 30
    while True:
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
        done = kube.run("apply", "-f", "-", stdin=body)
        if done.returncode == 0:
            return
        assert time.monotonic() < deadline, done.stderr
        time.sleep(1)


def _delete_ours(kube: Kube) -> None:
    selector = "app.kubernetes.io/part-of=stunner-offload-test"
    kinds = "gateways.gateway.networking.k8s.io,udproutes.stunner.l7mp.io,gatewayconfigs"
    kube.run("delete", kinds, "-n", GATEWAY_NS, "-l", selector, "--ignore-not-found", "--wait")
    kube.run("delete", "gatewayclasses,dataplanes", "-l", selector, "--ignore-not-found")


@pytest.fixture(scope="module")
def installed(release: Release) -> Iterator[Release]:
    """The chart installed as the README says, the examples' namespace; ours gone after (the
    namespace too: the next module's examples are applied into one of the same name)."""
    quickstart.test_helm_install_as_the_readme_says(release)
    release.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": GATEWAY_NS}})
    node = release.kube.get("nodes")["items"][0]
    release.state["node_ip"] = next(
        a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"
    )
    yield release
    _delete_ours(release.kube)
    started = time.monotonic()
    release.kube.run("delete", "namespace", GATEWAY_NS, "--ignore-not-found", timeout=600)
    MEASURED["offload: namespace deleted"] = f"{time.monotonic() - started:.0f} s"


def _ready_pod(kube: Kube) -> dict[str, Any] | None:
    pods = kube.get("pods", "-n", GATEWAY_NS, "-l", f"{RELATED_GATEWAY_NAME}={GATEWAY}")
    for pod in pods["items"]:
        condition = pod_condition(pod, "Ready")
        if (
            condition
            and condition["status"] == "True"
            and not pod["metadata"].get("deletionTimestamp")
        ):
            return dict(pod)
    return None


def _metrics(pod_ip: str) -> dict[str, float]:
    """stunnerd's metrics, read from the host at the pod's address: sample name and labels
    (sorted, `k=v` joined by commas) -> value."""
    url = f"http://{pod_ip}:{METRICS_PORT}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (a pod's address)
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


def _summed(samples: dict[str, float], name: str, direction: str) -> float:
    """A counter summed over the pod's listeners (this Gateway has one), in one direction."""
    return sum(
        value
        for key, value in samples.items()
        if key.startswith(name + "{") and f"direction={direction}" in key
    )


def test_an_offload_gateway_runs_with_bpf_and_net_admin_only(
    installed: Release, echo_peer: tuple[str, int]
) -> None:
    kube = installed.kube
    default = kube.get("dataplane", "default")
    _apply(kube, *_offload_objects(default["spec"]))
    started = time.monotonic()
    pod = wait_for("the offload Gateway's stunnerd pod Ready", lambda: _ready_pod(kube), 180)
    MEASURED[f"{installed.name}: offload apply -> stunnerd Ready"] = (
        f"{time.monotonic() - started:.1f} s"
    )
    installed.state["pod"] = pod
    installed.state["ready_at"] = time.monotonic()
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == CONTAINER_NAME]
    context = container.get("securityContext", {})
    assert sorted(context.get("capabilities", {}).get("add", [])) == ["BPF", "NET_ADMIN"], context
    assert context.get("capabilities", {}).get("drop") == ["ALL"], context
    assert not context.get("privileged"), context
    assert context.get("allowPrivilegeEscalation") is False, context

    def offload_on() -> dict[str, float] | None:
        samples = _metrics(pod["status"]["podIP"])
        states = {k: v for k, v in samples.items() if k.startswith("stunner_listener_offload{")}
        return states if states and all(v == 1 for v in states.values()) else None

    try:
        states = wait_for("the listener's offload on", offload_on, within=30)
    except AssertionError:
        logs = kube.run("logs", "-n", GATEWAY_NS, pod["metadata"]["name"], "--tail=30")
        raise AssertionError(f"offload not on; stunnerd's log:\n{logs.stdout}") from None
    assert all(k.endswith("reason=tc}") for k in states), states  # on, and how: tc
    MEASURED[f"{installed.name}: offload state"] = ", ".join(sorted(states))


def _nodeport(kube: Kube) -> int:
    service = kube.get("service", GATEWAY, "-n", GATEWAY_NS)
    assert service["spec"]["type"] == "NodePort", service["spec"]
    (port,) = [p["nodePort"] for p in service["spec"]["ports"] if p["protocol"] == "UDP"]
    return int(port)


async def _round_trips(client: RawClient, count: int, tag: bytes) -> tuple[int, list[float]]:
    """`count` ChannelData sent one at a time, each awaiting its echo (1 s): echoes, RTTs (ms)."""
    echoed, rtts = 0, []
    for i in range(count):
        payload = tag + b"-%04d" % i
        sent = time.monotonic()
        client.send_channel_data(CHANNEL, payload)
        try:
            channel, data = await asyncio.wait_for(client.channel_data.get(), 1.0)
        except TimeoutError:
            continue
        if channel == CHANNEL and data == payload:
            echoed += 1
            rtts.append((time.monotonic() - sent) * 1000)
    return echoed, rtts


async def _offloaded_session(
    server: tuple[str, int], peer: tuple[str, int], pod_ip: str
) -> dict[str, Any]:
    async with turn_allocation(server) as (client, _):
        waited = await permitted(client, peer, within=30)
        bound = await client.channel_bind(CHANNEL, peer)
        assert bound.message_class == Class.SUCCESS, f"ChannelBind: {error_code(bound)}"
        before = await asyncio.to_thread(_metrics, pod_ip)
        echoed, rtts = await _round_trips(client, PACKETS, b"offload")

        def counted() -> dict[str, float] | None:
            now = _metrics(pod_ip)
            deltas = {
                f"{name} {direction}": _summed(now, name, direction)
                - _summed(before, name, direction)
                for name in (
                    "stunner_listener_offloaded_packets_total",
                    "stunner_listener_packets_total",
                )
                for direction in ("rx", "tx")
            }
            offloaded = [v for k, v in deltas.items() if "offloaded" in k]
            return deltas if all(v >= echoed for v in offloaded) else None

        try:  # stunnerd folds the kernel's counters in every second
            deltas = await asyncio.to_thread(wait_for, "the kernel's counters", counted, 10)
        except AssertionError as e:
            deltas = {"error": str(e)}
        return {"waited": waited, "echoed": echoed, "rtts": rtts, "deltas": deltas}


async def _binding(server: tuple[str, int]) -> bool:
    client = await RawClient.connect(server)
    try:
        request = Message(Method.BINDING, Class.REQUEST)
        return (await client.request(request, sign=False, timeout=0.5)).message_class == (
            Class.SUCCESS
        )
    except TimeoutError:
        return False
    finally:
        client.close()


def test_channel_data_through_the_nodeport_is_relayed_and_counted_by_the_kernel(
    installed: Release, echo_peer: tuple[str, int]
) -> None:
    node_ip, pod = installed.state["node_ip"], installed.state["pod"]
    server = (node_ip, _nodeport(installed.kube))
    # Ready is the health check's word; the listener's own is a Binding answered through the
    # NodePort (on main at 03ba5b4 the first Allocate right after Ready went unanswered: the
    # first Binding came 0.7 s after Ready; kube-proxy's sync or the listener's start)
    wait_for(f"a Binding answered at {server}", lambda: asyncio.run(_binding(server)), 30, 0.1)
    MEASURED[f"{installed.name}: offload Ready -> first Binding answered via NodePort"] = (
        f"{time.monotonic() - installed.state['ready_at']:.1f} s"
    )
    result = asyncio.run(_offloaded_session(server, echo_peer, pod["status"]["podIP"]))
    assert result["echoed"] == PACKETS, f"{result['echoed']} of {PACKETS} echoed: {result}"
    deltas = result["deltas"]
    assert "error" not in deltas, f"the kernel's counters: {deltas}"
    for direction in ("rx", "tx"):
        offloaded = deltas[f"stunner_listener_offloaded_packets_total {direction}"]
        total = deltas[f"stunner_listener_packets_total {direction}"]
        assert offloaded == PACKETS, f"{direction}: {offloaded} offloaded, want {PACKETS}"
        assert total >= offloaded, f"{direction}: listener counted {total} < {offloaded}"
    rtts = sorted(result["rtts"])
    MEASURED[f"{installed.name}: offloaded ChannelData via NodePort {server}"] = (
        f"{result['echoed']}/{PACKETS} echoed, RTT median {rtts[len(rtts) // 2]:.2f} ms, "
        f"kernel counted rx {deltas['stunner_listener_offloaded_packets_total rx']:.0f} / "
        f"tx {deltas['stunner_listener_offloaded_packets_total tx']:.0f}"
    )


async def _refusals(server: tuple[str, int]) -> dict[str, tuple[int | None, int | None]]:
    codes = {}
    async with turn_allocation(server) as (client, _):
        for n, peer in enumerate(REFUSED_PEERS):
            permission = error_code(await client.create_permission(peer))
            bind = error_code(await client.channel_bind(CHANNEL + 1 + n, peer))
            codes[f"{peer[0]}:{peer[1]}"] = (permission, bind)
    return codes


def test_peers_outside_every_route_are_refused_with_the_offload_on(installed: Release) -> None:
    server = (installed.state["node_ip"], _nodeport(installed.kube))
    codes = asyncio.run(_refusals(server))
    wrong = {peer: c for peer, c in codes.items() if c != (403, 403)}
    assert not wrong, f"(CreatePermission, ChannelBind) codes, want (403, 403): {wrong}"


async def _route_deleted_mid_flow(
    kube: Kube, server: tuple[str, int], peer: tuple[str, int]
) -> dict[str, Any]:
    async with turn_allocation(server) as (client, _):
        await permitted(client, peer, within=30)
        bound = await client.channel_bind(CHANNEL, peer)
        assert bound.message_class == Class.SUCCESS, f"ChannelBind: {error_code(bound)}"
        echoed, _ = await _round_trips(client, 5, b"before")
        assert echoed == 5, f"{echoed} of 5 echoed before the route's deletion"
        started = time.monotonic()
        route = ("udproutes.stunner.l7mp.io", ROUTE, "-n", GATEWAY_NS)
        await asyncio.to_thread(kube.ok, "delete", *route)
        stopped = None  # from before `kubectl delete` to the first probe that got no echo
        while time.monotonic() - started < 10:
            probe = time.monotonic()
            echoed, _ = await _round_trips(client, 1, b"after")
            if echoed == 0:
                stopped = probe - started
                break
            await asyncio.sleep(0.05)
        # it stays stopped, and stunnerd refuses the peer
        late, _ = await _round_trips(client, 5, b"late")
        permission = error_code(await client.create_permission(peer))
        return {"stopped": stopped, "late": late, "permission": permission}


def test_the_route_deleted_stops_the_kernel_relaying(
    installed: Release, echo_peer: tuple[str, int]
) -> None:
    kube = installed.kube
    server = (installed.state["node_ip"], _nodeport(kube))
    result = asyncio.run(_route_deleted_mid_flow(kube, server, echo_peer))
    assert result["stopped"] is not None, f"ChannelData still echoed 10 s after: {result}"
    assert result["late"] == 0, f"{result['late']} of 5 echoed after it stopped: {result}"
    assert result["permission"] == 403, result
    MEASURED[f"{installed.name}: route deleted -> kernel relaying stopped"] = (
        f"{result['stopped']:.2f} s (kubectl delete included; the first probe sent after it "
        "that got no echo within 1 s)"
    )
