"""Faults with live calls (issue 32), once per helm major, each a phase on one release (the quick
start's images and install, the example Gateway with its UDP and TCP listener, the echo pod).

During each fault, calls run through the Gateway's LoadBalancer address (tests/cluster/calls.py:
UDP and TURN-TCP, 50 timestamped packets a second each, echoed by the echo pod), and the phase
records calls kept, packets lost, the longest gap and the time until a new call works; the
numbers go to the run's summary (`cluster phases`) and tests/cluster/README.md's fault table.

- A rollout of the Gateway's stunnerd Deployment (``kubectl rollout restart``), then a ``helm
  upgrade --set image.tag=...`` to a new tag (both images tagged anew and loaded), which rolls the
  control plane and, through the reconciler, stunnerd: the calls on the old pod keep relaying
  until they end (0 lost), new calls land on the new pod, and the old pod leaves once its calls
  have ended.
- The reconciler's pod deleted, and the webhook scaled to 0: nothing lost, new calls work.
- The CDS unreachable for 60 s (a rule in each stunnerd pod's network namespace drops its
  packets to the CDS Service): relaying goes on (0 lost), new calls work, and a route applied
  during the outage reaches stunnerd once the CDS is back.
- Two replicas, one per node (the Dataplane's topologySpreadConstraints): a call through each
  pod's own address relays; one pod's stunnerd killed (SIGKILL from the node): the other pod's
  calls lose nothing, and the time until the restarted stunnerd relays again is measured.
- A node lost (its kubelet stopped, its pods deleted): the other node's calls lose nothing, the
  Service's endpoints follow.

The CDS and kill phases reach the pods' processes from this host (root, as on a node you made:
tests/cluster/README.md); the node phase needs `STUNNER_TEST_NODE_STOP`/`_START`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from stunner_api.vocabulary import CDS_SERVICE_NAME, RELATED_GATEWAY_NAME
from tests.cluster import calls
from tests.cluster.conftest import MEASURED, Kube, wait_for
from tests.cluster.podprocess import container_pid, in_network_of
from tests.cluster.test_quickstart_cluster import (
    BACKEND,
    CREDENTIALS,
    ECHO_PORT,
    GATEWAY,
    GATEWAY_NS,
    NAMESPACE,
    RELEASE,
    Release,
    echo_peer,
    gateway,
    image_loads,
    images,
    pod_condition,
    release,
)

# the quick start's fixtures (a release of this module's own)
__all__ = ["echo_peer", "gateway", "images", "release"]

CALL_SECONDS = 40.0
FAULT_AT = 10.0  # seconds into the calls
UDP_CALLS = 3
TCP_CALLS = 2


def _stunnerd_pods(kube: Kube) -> list[dict[str, Any]]:
    """The Gateway's stunnerd pods, terminating ones too."""
    items: list[dict[str, Any]] = kube.get("pods", "-n", GATEWAY_NS, "-l", "app=stunner")["items"]
    return items


def _ready(pod: dict[str, Any]) -> bool:
    return (pod_condition(pod, "Ready") or {}).get("status") == "True"


def _endpoints(kube: Kube) -> list[tuple[str, bool, bool, bool]]:
    """The Gateway Service's endpoints: (address, ready, serving, terminating)."""
    slices = kube.get(
        "endpointslices", "-n", GATEWAY_NS, "-l", f"kubernetes.io/service-name={GATEWAY}"
    )["items"]
    found = []
    for piece in slices:
        for endpoint in piece.get("endpoints") or []:
            conditions = endpoint.get("conditions", {})
            found.append(
                (
                    endpoint["addresses"][0],
                    bool(conditions.get("ready")),
                    bool(conditions.get("serving")),
                    bool(conditions.get("terminating")),
                )
            )
    return sorted(found)


def _start_calls(
    release: Release,
    peer: tuple[str, int],
    seconds: float = CALL_SECONDS,
    server: tuple[str, int] | None = None,
    kinds: tuple[str, ...] = ("udp",) * UDP_CALLS + ("tcp",) * TCP_CALLS,
) -> list[asyncio.Task[calls.CallResult]]:
    """Calls through `server` (the Gateway's LoadBalancer address unless said)."""
    server = server or (release.state["address"], 3478)
    loop = asyncio.get_running_loop()
    return [
        loop.create_task(calls.call(kind, server, peer, CREDENTIALS, seconds)) for kind in kinds
    ]


def _record(name: str, results: list[calls.CallResult], new_call: float | None) -> None:
    by_kind = {
        kind: calls.summary([r for r in results if r.transport == kind]) for kind in ("udp", "tcp")
    }
    first = "" if new_call is None else f"; a new call worked {new_call:.1f} s after the fault"
    MEASURED[name] = f"UDP {by_kind['udp']}; TCP {by_kind['tcp']}{first}"


# --- a rollout ------------------------------------------------------------------------------


async def _rollout_with_calls(
    release: Release, peer: tuple[str, int], roll: Callable[[], Any], within: float = 60
) -> dict[str, Any]:
    """Calls through the one stunnerd pod; `roll()` FAULT_AT s in; the new pod, the calls,
    a new call's pod and when the old pod left."""
    kube = release.kube
    server = (release.state["address"], 3478)
    (old,) = [p for p in _stunnerd_pods(kube) if not p["metadata"].get("deletionTimestamp")]
    old_ip = old["status"]["podIP"]
    running = _start_calls(release, peer)
    await asyncio.sleep(FAULT_AT)
    fault = time.monotonic()
    await asyncio.to_thread(roll)

    def replaced() -> dict[str, Any] | None:
        pods = _stunnerd_pods(kube)
        fresh = [p for p in pods if p["metadata"]["uid"] != old["metadata"]["uid"] and _ready(p)]
        gone = all(p["metadata"]["uid"] != old["metadata"]["uid"] or
                   p["metadata"].get("deletionTimestamp") for p in pods)  # fmt: skip
        return fresh[0] if fresh and gone else None

    new = await asyncio.to_thread(
        wait_for, "a new stunnerd pod Ready, the old one told", replaced, within
    )
    endpoints = await asyncio.to_thread(_endpoints, kube)
    replaced_after = time.monotonic() - fault
    new_call, probe = await calls.first_working_call("udp", server, peer, CREDENTIALS, within=30)
    results = list(await asyncio.gather(*running))
    ended = time.monotonic()

    def old_gone() -> bool:
        return all(p["metadata"]["uid"] != old["metadata"]["uid"] for p in _stunnerd_pods(kube))

    try:
        await asyncio.to_thread(wait_for, "the old stunnerd pod gone", old_gone, 60)
        old_left: float | None = time.monotonic() - ended
    except AssertionError:
        old_left = None
    return {
        "old_ip": old_ip,
        "new_ip": new["status"]["podIP"],
        "endpoints": endpoints,
        "results": results,
        "probe": probe,
        "replaced_after": replaced_after,
        "new_call": new_call,
        "old_left": old_left,
    }


def _rolled_without_hurt(release: Release, what: str, result: dict[str, Any]) -> None:
    """What a rollout measured, recorded; its calls on the old pod kept and lossless, a new call
    on the new pod, the old pod gone once its calls ended."""
    results: list[calls.CallResult] = result["results"]
    _record(f"{release.name}: {what}", results, None)
    MEASURED[f"{release.name}: {what}: new pod Ready"] = (
        f"{result['replaced_after']:.1f} s after it began; a new call relayed by it "
        f"{result['new_call']:.1f} s later"
    )
    MEASURED[f"{release.name}: {what}: endpoints once the new pod was Ready"] = json.dumps(
        result["endpoints"]
    )
    left = result["old_left"]
    MEASURED[f"{release.name}: {what}: old pod left after its calls ended"] = (
        "not within 60 s" if left is None else f"{left:.1f} s"
    )
    MEASURED[f"{release.name}: {what}: the calls' longest gaps began"] = ", ".join(
        f"{r.transport} {r.gap_at:.1f} s" for r in results
    )
    assert all(r.relayed == result["old_ip"] for r in results), [r.relayed for r in results]
    assert result["probe"].relayed == result["new_ip"], (
        f"a new call relayed by {result['probe'].relayed}, not the new pod {result['new_ip']}"
    )
    broken = [r for r in results if not r.kept or r.lost]
    assert not broken, f"calls on the old pod hurt by the rollout: {broken}"
    assert left is not None, "the old pod stayed after its calls had ended (and deleted theirs)"


def test_a_rollout_keeps_live_calls_and_new_calls_land_on_the_new_pod(
    gateway: Release, echo_peer: tuple[str, int]
) -> None:
    def restart() -> None:
        gateway.kube.ok("rollout", "restart", f"deployment/{GATEWAY}", "-n", GATEWAY_NS)

    _rolled_without_hurt(
        gateway, "rollout restart", asyncio.run(_rollout_with_calls(gateway, echo_peer, restart))
    )


UPGRADE_TAG = "upgraded"  # the quick start's images tagged anew: an upgrade to a new image tag


def _retag(release: Release, images: dict[str, str]) -> str:
    """Both images under UPGRADE_TAG too, handed to every node; their new repository:tag."""
    builder = release.settings.builder[0]
    tagged = []
    for image in images:
        new = f"{image.rsplit(':', 1)[0]}:{UPGRADE_TAG}"
        done = subprocess.run([builder, "tag", image, new], capture_output=True, text=True,
                              check=False)  # fmt: skip
        assert done.returncode == 0, f"{builder} tag {image} {new}: {done.stderr}"
        tagged.append(new)
    for shell in image_loads(release.settings, tagged):
        done = subprocess.run(shell, shell=True, capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"{shell}: {done.stdout}{done.stderr}"
    return UPGRADE_TAG


def test_helm_upgrade_to_a_new_image_tag_keeps_live_calls(
    gateway: Release, echo_peer: tuple[str, int], images: dict[str, str]
) -> None:
    tag = _retag(gateway, images)

    def upgrade() -> None:
        done = gateway.run_helm(
            "upgrade", RELEASE, "charts/stunner", "-n", NAMESPACE, "--reuse-values",
            "--set", f"image.tag={tag}",
        )  # fmt: skip
        assert done.returncode == 0, f"helm upgrade --set image.tag={tag}: {done.stderr}"

    started = time.monotonic()
    result = asyncio.run(_rollout_with_calls(gateway, echo_peer, upgrade, within=180))
    _rolled_without_hurt(gateway, f"helm upgrade image.tag={tag}", result)
    pods = _live_pods(gateway.kube)
    running = {c["image"] for p in pods for c in p["spec"]["containers"]}
    assert all(i.endswith(f":{tag}") for i in running), f"stunnerd pods run {running}"
    MEASURED[f"{gateway.name}: helm upgrade image.tag={tag}: the phase"] = (
        f"{time.monotonic() - started:.1f} s; stunnerd runs {sorted(running)}"
    )


# --- faults that keep every call -------------------------------------------------------------


async def _calls_during(
    release: Release,
    peer: tuple[str, int],
    fault: Callable[[], Awaitable[Any]],
    seconds: float = CALL_SECONDS,
    after: Callable[[], Awaitable[Any]] | None = None,
) -> tuple[list[calls.CallResult], float, Any]:
    """Calls of `seconds`; `fault` FAULT_AT s in; then the time until a new call works (from the
    fault's start), `after` (while the calls still run), and the calls' results."""
    server = (release.state["address"], 3478)
    running = _start_calls(release, peer, seconds)
    await asyncio.sleep(FAULT_AT)
    started = time.monotonic()
    await fault()
    faulted = time.monotonic() - started
    waited, _ = await calls.first_working_call("udp", server, peer, CREDENTIALS, within=60)
    extra = await after() if after is not None else None
    return list(await asyncio.gather(*running)), faulted + waited, extra


def _no_call_hurt(name: str, results: list[calls.CallResult], new_call: float) -> None:
    _record(name, results, new_call)
    hurt = [r for r in results if not r.kept or r.lost]
    assert not hurt, f"{name}: calls hurt: {hurt}"


def test_the_reconciler_restarted_loses_nothing(
    gateway: Release, echo_peer: tuple[str, int]
) -> None:
    kube = gateway.kube

    async def fault() -> None:
        await asyncio.to_thread(
            kube.ok, "delete", "pods", "-n", NAMESPACE, "-l",
            "app.kubernetes.io/component=reconciler", "--wait=false",
        )  # fmt: skip

    results, new_call, _ = asyncio.run(_calls_during(gateway, echo_peer, fault))
    _no_call_hurt(f"{gateway.name}: reconciler restarted", results, new_call)


def test_the_webhook_down_loses_nothing(gateway: Release, echo_peer: tuple[str, int]) -> None:
    kube = gateway.kube

    def scale(replicas: int) -> str:
        return kube.ok("scale", "deployment", "stunner-webhook", "-n", NAMESPACE,
                       f"--replicas={replicas}")  # fmt: skip

    def webhook_pods() -> list[dict[str, Any]]:
        selector = "app.kubernetes.io/component=webhook"
        pods: list[dict[str, Any]] = kube.get("pods", "-n", NAMESPACE, "-l", selector)["items"]
        return pods

    async def fault() -> None:
        await asyncio.to_thread(scale, 0)
        await asyncio.to_thread(wait_for, "the webhook's pods gone", lambda: not webhook_pods(), 60)

    try:
        results, new_call, _ = asyncio.run(_calls_during(gateway, echo_peer, fault))
    finally:
        scale(1)
        wait_for("the webhook Ready again", lambda: any(_ready(p) for p in webhook_pods()), 180)
    _no_call_hurt(f"{gateway.name}: webhook down", results, new_call)


# --- the CDS out of reach --------------------------------------------------------------------

OUTAGE = 60.0
NODE_CALL_SECONDS = 100.0  # the Node turns NotReady 40 s after its kubelet stopped (default)
OUTAGE_ROUTE = "cds-outage-route"


def _status(pod_ip: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{pod_ip}:8086/status", timeout=5) as answer:
        status: dict[str, Any] = json.loads(answer.read())
    return status


def _has_route(pod_ip: str, route: str) -> bool:
    return any(
        c.get("name") == f"{GATEWAY_NS}/{route}" for c in _status(pod_ip).get("clusters", [])
    )


def _live_pods(kube: Kube) -> list[dict[str, Any]]:
    return [p for p in _stunnerd_pods(kube) if not p["metadata"].get("deletionTimestamp")]


def _route(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "UDPRoute",
        "metadata": {"name": name, "namespace": GATEWAY_NS},
        "spec": {
            "parentRefs": [{"name": GATEWAY}],
            "rules": [{"backendRefs": [{"name": BACKEND, "port": ECHO_PORT}]}],
        },
    }


def test_the_cds_unreachable_for_a_minute_keeps_relaying(
    gateway: Release, echo_peer: tuple[str, int]
) -> None:
    kube = gateway.kube
    pids = {p["status"]["podIP"]: container_pid(p["status"]["podIP"]) for p in _live_pods(kube)}
    if not pids or None in pids.values():
        pytest.skip("the stunnerd pods' processes are not on this host (README: What it needs)")
    cds = kube.get("service", CDS_SERVICE_NAME, "-n", NAMESPACE)["spec"]
    address, port = cds["clusterIP"], str(cds["ports"][0]["port"])
    rules = [  # both ways: data the CDS pushes on a watch would still arrive without the second
        ["OUTPUT", "-p", "tcp", "-d", address, "--dport", port, "-j", "DROP"],
        ["INPUT", "-p", "tcp", "-s", address, "--sport", port, "-j", "DROP"],
    ]
    cut: list[int] = []
    seen: dict[str, Any] = {}

    async def fault() -> None:
        seen["cut"] = time.monotonic()
        for pid in pids.values():
            assert pid is not None
            for rule in rules:
                await asyncio.to_thread(in_network_of, pid, "iptables", "-I", *rule)
            cut.append(pid)

    async def after() -> None:
        await asyncio.to_thread(kube.apply, _route(OUTAGE_ROUTE))  # a change during the outage
        await asyncio.sleep(max(0.0, seen["cut"] + OUTAGE - time.monotonic()))
        seen["during"] = {ip: _has_route(ip, OUTAGE_ROUTE) for ip in pids}
        for pid in list(cut):
            for rule in rules:
                await asyncio.to_thread(in_network_of, pid, "iptables", "-D", *rule)
            cut.remove(pid)
        back = time.monotonic()

        def applied() -> bool:
            return all(_has_route(ip, OUTAGE_ROUTE) for ip in pids)

        await asyncio.to_thread(wait_for, "the route applied after the outage", applied, 60, 0.1)
        seen["applied_after"] = time.monotonic() - back

    try:
        results, new_call, _ = asyncio.run(
            _calls_during(gateway, echo_peer, fault, FAULT_AT + OUTAGE + 15, after)
        )
    finally:
        for pid in cut:
            for rule in rules:
                in_network_of(pid, "iptables", "-D", *rule)
        kube.run("delete", "udproute.stunner.l7mp.io", OUTAGE_ROUTE, "-n", GATEWAY_NS,
                 "--ignore-not-found")  # fmt: skip
    MEASURED[f"{gateway.name}: CDS unreachable 60 s: a route applied during it"] = (
        f"not in stunnerd during the outage ({seen['during']}), applied "
        f"{seen['applied_after']:.1f} s after the CDS was back"
    )
    assert not any(seen["during"].values()), "the rule did not cut stunnerd off the CDS"
    _no_call_hurt(f"{gateway.name}: CDS unreachable 60 s", results, new_call)


# --- two replicas, one per node ---------------------------------------------------------------

SPREAD = {
    "maxSkew": 1,
    "topologyKey": "kubernetes.io/hostname",
    "whenUnsatisfiable": "DoNotSchedule",
    "nodeTaintsPolicy": "Honor",  # a lost node (tainted unreachable) is no domain to spread to
    "labelSelector": {"matchLabels": {"app": "stunner", RELATED_GATEWAY_NAME: GATEWAY}},
}


def test_two_replicas_land_one_per_node_and_each_relays(
    gateway: Release, echo_peer: tuple[str, int]
) -> None:
    kube = gateway.kube
    if len(kube.get("nodes")["items"]) < 2:
        pytest.skip("one node: two replicas on two nodes need a second (README: What it needs)")
    patch = {"spec": {"replicas": 2, "topologySpreadConstraints": [SPREAD]}}
    kube.ok("patch", "dataplane", "default", "--type=merge", "-p", json.dumps(patch))

    def spread() -> list[dict[str, Any]] | None:
        pods = _stunnerd_pods(kube)
        ready = [p for p in pods if _ready(p) and not p["metadata"].get("deletionTimestamp")]
        nodes = {p["spec"]["nodeName"] for p in ready}
        return ready if len(ready) == 2 and len(nodes) == 2 and len(pods) == 2 else None

    started = time.monotonic()
    pods = wait_for("two stunnerd pods Ready on two nodes", spread, within=180)
    MEASURED[f"{gateway.name}: two replicas, one per node"] = (
        f"Ready {time.monotonic() - started:.1f} s after the Dataplane patch: "
        + ", ".join(f"{p['metadata']['name']} on {p['spec']['nodeName']}" for p in pods)
    )
    gateway.state["pods"] = {p["spec"]["nodeName"]: p["status"]["podIP"] for p in pods}
    for node, ip in gateway.state["pods"].items():
        waited, result = asyncio.run(
            calls.first_working_call("udp", (ip, 3478), echo_peer, CREDENTIALS, within=30)
        )
        assert result.relayed == ip, f"a call to {ip} on {node} relayed by {result.relayed}"


def _pinned_and_balanced(
    release: Release, peer: tuple[str, int], seconds: float = CALL_SECONDS
) -> list[asyncio.Task[calls.CallResult]]:
    """Calls through the LoadBalancer address, and one UDP and one TCP call through each pod's
    own address (so each pod has calls whatever kube-proxy picks), once both pods are Ready."""
    wanted = set(release.state["pods"].values())
    wait_for(
        "both stunnerd pods Ready",
        lambda: wanted <= {p["status"].get("podIP") for p in _live_pods(release.kube) if _ready(p)},
        within=120,
    )
    running = _start_calls(release, peer, seconds, kinds=("udp",) * 4 + ("tcp",) * 2)
    for ip in wanted:
        running += _start_calls(release, peer, seconds, server=(ip, 3478), kinds=("udp", "tcp"))
    return running


def _split(results: list[calls.CallResult], ip: str) -> tuple[list[calls.CallResult], ...]:
    return [r for r in results if r.relayed == ip], [r for r in results if r.relayed != ip]


def test_a_stunnerd_killed_the_other_replica_loses_nothing(
    gateway: Release, echo_peer: tuple[str, int]
) -> None:
    if "pods" not in gateway.state:
        pytest.skip("needs the two replicas of the phase before")
    victim_node, victim = sorted(gateway.state["pods"].items())[0]
    pid = container_pid(victim)
    if pid is None:
        pytest.skip("the stunnerd pods' processes are not on this host (README: What it needs)")

    async def run() -> tuple[list[calls.CallResult], float]:
        running = _pinned_and_balanced(gateway, echo_peer)
        await asyncio.sleep(FAULT_AT)
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        waited, _ = await calls.first_working_call(
            "udp", (victim, 3478), echo_peer, CREDENTIALS, within=120
        )
        back = time.monotonic() - killed
        return list(await asyncio.gather(*running)), back

    results, back = asyncio.run(run())
    on_victim, others = _split(results, victim)
    _record(f"{gateway.name}: kill -9 one of two replicas: the other's calls", others, None)
    _record(f"{gateway.name}: kill -9 one of two replicas: the killed one's calls", on_victim, None)
    MEASURED[f"{gateway.name}: kill -9: the restarted stunnerd relays again"] = (
        f"{back:.1f} s after the kill (on {victim_node})"
    )
    assert others, "no call on the other replica"
    hurt = [r for r in others if not r.kept or r.lost]
    assert not hurt, f"the other replica's calls hurt: {hurt}"


# --- a node lost ------------------------------------------------------------------------------


def _node_commands() -> tuple[str, str, str] | None:
    env = os.environ
    names = ("STUNNER_TEST_LOSE_NODE", "STUNNER_TEST_NODE_STOP", "STUNNER_TEST_NODE_START")
    values = tuple(env.get(n, "") for n in names)
    return values if all(values) else None  # type: ignore[return-value]


def test_a_node_lost_the_other_nodes_calls_lose_nothing(
    gateway: Release, echo_peer: tuple[str, int]
) -> None:
    commands = _node_commands()
    if commands is None or "pods" not in gateway.state:
        pytest.skip("needs STUNNER_TEST_LOSE_NODE/_NODE_STOP/_NODE_START and two replicas")
    lost, stop, start = commands
    kube = gateway.kube
    assert lost in gateway.state["pods"], f"no stunnerd pod on {lost}: {gateway.state['pods']}"
    lost_ip = gateway.state["pods"][lost]
    seen: dict[str, Any] = {}

    async def run() -> tuple[list[calls.CallResult], dict[str, float]]:
        running = _pinned_and_balanced(gateway, echo_peer, seconds=NODE_CALL_SECONDS)
        await asyncio.sleep(FAULT_AT)
        began = time.monotonic()
        await asyncio.to_thread(subprocess.run, stop, shell=True, check=True, capture_output=True)
        await asyncio.to_thread(
            wait_for, f"{lost} NotReady", lambda: not _node_ready(kube, lost), 120, 1
        )
        marks = {"the Node NotReady": time.monotonic() - began}
        await asyncio.to_thread(
            kube.ok, "delete", "pods", "-A", "--field-selector", f"spec.nodeName={lost}",
            "--force", "--grace-period=0",
        )  # fmt: skip
        marks["its pods deleted"] = time.monotonic() - began

        def endpoint_gone() -> bool:
            return all(address != lost_ip for address, *_ in _endpoints(kube))

        await asyncio.to_thread(wait_for, "its endpoint gone", endpoint_gone, 60, 0.2)
        marks["endpoint gone"] = time.monotonic() - began
        waited, _ = await calls.first_working_call(
            "udp", (gateway.state["address"], 3478), echo_peer, CREDENTIALS, within=60
        )
        marks["a new call works"] = time.monotonic() - began
        seen["status"] = await asyncio.to_thread(
            lambda: kube.get("gateway", GATEWAY, "-n", GATEWAY_NS)["status"]
        )
        return list(await asyncio.gather(*running)), marks

    try:
        results, marks = asyncio.run(run())
    finally:
        subprocess.run(start, shell=True, check=False, capture_output=True, timeout=300)
    on_lost, others = _split(results, lost_ip)
    _record(f"{gateway.name}: node lost: the other node's calls", others, None)
    _record(f"{gateway.name}: node lost: the lost node's calls", on_lost, None)
    MEASURED[f"{gateway.name}: node lost"] = ", ".join(f"{k} {v:.1f} s" for k, v in marks.items())
    gateway.state.pop("pods")
    assert others, "no call on the other node"
    hurt = [r for r in others if not r.kept or r.lost]
    assert not hurt, f"the other node's calls hurt: {hurt}"
    status = seen["status"]
    programmed = [c for c in status["conditions"] if c["type"] == "Programmed"]
    MEASURED[f"{gateway.name}: node lost: the Gateway's status"] = (
        f"addresses {[a['value'] for a in status.get('addresses', [])]}, "
        f"Programmed {programmed[0]['status'] if programmed else '?'}"
    )
    assert programmed and programmed[0]["status"] == "True", status
    wait_for(f"{lost} Ready again", lambda: _node_ready(kube, lost), within=180)


def _node_ready(kube: Kube, name: str) -> bool:
    node = kube.get("node", name)
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
