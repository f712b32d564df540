"""Node-local dataplanes (issue 23): a Dataplane's `dataplaneResource: DaemonSet` and
`hostNetwork`, the host-network port clash between Gateways, and relay address discovery's
placeholder in the rendered config.

Render is pure and tested on snapshots; the switch between a Deployment and a DaemonSet is
tested through cluster mode against the fake API server (the writes it makes, and garbage
collection by owner reference when the Gateway goes).
"""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reconciler.apply import Verb, plan_writes
from reconciler.render import Plan, RenderSettings, render
from reconciler.store import Object, Snapshot
from stunner_api.vocabulary import NODE_ADDRESS_PLACEHOLDER, RELAY_ADDRESS_DISCOVERY
from tests.reconciler import clusterkit as k
from tests.reconciler.clusterkit import Obj, dataplane, gateway, gateway_class, gateway_config
from tests.reconciler.clusterkit import listener as lst
from tests.support.fakeapi import FakeApiServer

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def plan_of(*objects: Obj, **dataplane_spec: Any) -> Plan:
    world = [gateway_class(), gateway_config(), dataplane(**dataplane_spec), *objects]
    return render(Snapshot.from_objects(copy.deepcopy(world)), RenderSettings(), NOW)


def owned_gateway(*listeners: Obj, name: str = "gw", **meta: Any) -> Obj:
    return gateway(*listeners, name=name, uid=f"uid-{name}", **meta)


def test_a_daemonset_dataplane_renders_a_daemonset_with_the_deployments_pod_template() -> None:
    deployment = plan_of(owned_gateway(), replicas=3).deployments["stunner/gw"]
    daemonset = plan_of(owned_gateway(), replicas=3, dataplaneResource="DaemonSet").deployments[
        "stunner/gw"
    ]
    assert (deployment["kind"], daemonset["kind"]) == ("Deployment", "DaemonSet")
    assert daemonset["apiVersion"] == "apps/v1"
    assert deployment["spec"]["replicas"] == 3
    assert "replicas" not in daemonset["spec"]  # one per node, no count
    assert daemonset["spec"]["template"] == deployment["spec"]["template"]
    assert daemonset["spec"]["selector"] == deployment["spec"]["selector"]
    assert daemonset["metadata"] == deployment["metadata"]
    (owner,) = daemonset["metadata"]["ownerReferences"]  # garbage-collected with the Gateway
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "Gateway",
        "gw",
        "uid-gw",
        True,
    )


def test_host_network_pods_keep_cluster_dns_and_learn_their_node() -> None:
    pod = plan_of(owned_gateway(), dataplaneResource="DaemonSet", hostNetwork=True).deployments[
        "stunner/gw"
    ]["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"  # the CDS Service name resolves
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["STUNNER_NODENAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["STUNNER_ADDR"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    own = plan_of(owned_gateway()).deployments["stunner/gw"]["spec"]["template"]["spec"]
    assert own["hostNetwork"] is False and "dnsPolicy" not in own


def test_relay_address_discovery_renders_the_node_placeholder() -> None:
    annotated = owned_gateway(annotations={RELAY_ADDRESS_DISCOVERY: "true"})
    (listener,) = plan_of(annotated, hostNetwork=True).configs["stunner/gw"].listeners
    assert listener.address == NODE_ADDRESS_PLACEHOLDER
    (plain,) = plan_of(owned_gateway(), hostNetwork=True).configs["stunner/gw"].listeners
    assert plain.address == "$STUNNER_ADDR"


def test_switching_the_resource_writes_the_new_kind_and_deletes_the_other() -> None:
    """The pure diff: the cached Deployment of a Gateway whose plan is now a DaemonSet is
    deleted (by its uid) as the DaemonSet is created; and back."""
    before = plan_of(owned_gateway())
    after = plan_of(owned_gateway(), dataplaneResource="DaemonSet")
    gateway_key = ("gateway.networking.k8s.io/v1", "Gateway", "stunner", "gw")
    live: dict[tuple[str, str, str, str], Object] = {gateway_key: owned_gateway()}
    for manifest in before.deployments.values():
        stored = copy.deepcopy(manifest)
        stored["metadata"] |= {"uid": "deployment-uid", "resourceVersion": "1"}
        live["apps/v1", "Deployment", "stunner", "gw"] = stored

    def current(api_version: str, kind: str, namespace: str, name: str) -> Object | None:
        return live.get((api_version, kind, namespace, name))

    deployments = [o for o in live.values() if o["kind"] == "Deployment"]
    writes = plan_writes(after, current, {"stunner/gw"}, deployments=deployments)
    workload = [(w.verb, w.kind, w.name, w.uid) for w in writes if w.kind != "Gateway"]
    assert (Verb.CREATE, "DaemonSet", "gw", "") in workload
    assert (Verb.DELETE, "Deployment", "gw", "deployment-uid") in workload
    # Back to a Deployment: the DaemonSet goes.
    daemonset = copy.deepcopy(after.deployments["stunner/gw"])
    daemonset["metadata"] |= {"uid": "daemonset-uid", "resourceVersion": "2"}
    live = {("apps/v1", "DaemonSet", "stunner", "gw"): daemonset, gateway_key: owned_gateway()}
    writes = plan_writes(before, current, {"stunner/gw"}, daemonsets=[daemonset])
    workload = [(w.verb, w.kind, w.name, w.uid) for w in writes if w.kind != "Gateway"]
    assert (Verb.CREATE, "Deployment", "gw", "") in workload
    assert (Verb.DELETE, "DaemonSet", "gw", "daemonset-uid") in workload


def test_cluster_mode_switches_the_workload_and_the_gateway_takes_it_along(tmp_path: Path) -> None:
    """Against the fake API server: the Deployment, then (Dataplane edited) a DaemonSet and no
    Deployment, then (Gateway deleted) nothing: the DaemonSet carries the Gateway's owner
    reference, and the API server's garbage collector removes it."""

    def to_daemonset(obj: Obj) -> None:
        obj["spec"]["dataplaneResource"] = "DaemonSet"
        obj["spec"]["hostNetwork"] = True

    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                assert k.get(fake, "apps/v1", "Deployment", "gw") is not None
                k.update(fake, "stunner.l7mp.io/v1", "Dataplane", "default", to_daemonset, ns="")
                await k.eventually(
                    lambda: (
                        k.get(fake, "apps/v1", "DaemonSet", "gw") is not None
                        and k.get(fake, "apps/v1", "Deployment", "gw") is None
                    ),
                    what="the DaemonSet in place of the Deployment",
                )
                daemonset = k.get(fake, "apps/v1", "DaemonSet", "gw")
                assert daemonset is not None
                pod = daemonset["spec"]["template"]["spec"]
                assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
                k.delete(fake, "gateway.networking.k8s.io/v1", "Gateway", "gw")
                await k.eventually(
                    lambda: k.get(fake, "apps/v1", "DaemonSet", "gw") is None,
                    what="the DaemonSet collected with its Gateway",
                )

    asyncio.run(asyncio.wait_for(main(), 60))


# --- the host-network port clash, as render sees it ----------------------------------------


def test_render_keeps_a_host_port_for_the_older_gateway_only() -> None:
    """Two Gateways (two namespaces) on a host-network Dataplane with UDP 3478: the older keeps
    its listener; the younger's is not accepted (PortUnavailable) and a finding names the
    field, the other Gateway and the reason; its TCP listener on 3478 does not clash."""
    older = owned_gateway(name="first", creationTimestamp="2026-01-01T00:00:00Z")
    younger = owned_gateway(
        lst("udp", 3478), lst("tcp", 3478, "TURN-TCP"), name="second", namespace="media"
    )
    younger["metadata"]["creationTimestamp"] = "2026-01-02T00:00:00Z"
    plan = plan_of(older, younger, hostNetwork=True, disableHealthCheck=True)
    assert [lc.port for lc in plan.configs["stunner/first"].listeners] == [3478]
    assert [(lc.protocol, lc.port) for lc in plan.configs["media/second"].listeners] == [
        ("TURN-TCP", 3478)
    ]
    (finding,) = [f for f in plan.findings if f.reason == "PortUnavailable"]
    assert (finding.namespace, finding.name) == ("media", "second")
    assert finding.path == "spec.listeners[0].port"
    assert finding.reason == "PortUnavailable"
    assert "UDP port 3478 is already bound on the nodes by Gateway stunner/first" in finding.message
    status = plan.status_of("Gateway", "media", "second")
    assert status is not None
    udp = next(entry for entry in status["listeners"] if entry["name"] == "udp")
    accepted = next(c for c in udp["conditions"] if c["type"] == "Accepted")
    assert (accepted["status"], accepted["reason"]) == ("False", "PortUnavailable")
    # Without the host network each Gateway has its own pods: no clash.
    own = plan_of(older, younger)
    assert [lc.port for lc in own.configs["media/second"].listeners] == [3478, 3478]
    # With the health check on, the pods of both bind TCP 8086 on the nodes: the younger
    # Gateway is not rendered at all (its pods could not run beside the older one's).
    health = plan_of(
        older, owned_gateway(lst("udp", 3479), name="second", namespace="media"), hostNetwork=True
    )
    assert "stunner/first" in health.configs and "media/second" not in health.configs
    assert "media/second" not in health.deployments
    (finding,) = [f for f in health.findings if f.reason == "PortUnavailable"]
    assert finding.path == "spec.gatewayClassName"
    assert finding.message.startswith("TCP port 8086 (stunnerd: its health check) is already")


def node(name: str, *addresses: tuple[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": {"addresses": [{"type": t, "address": a} for t, a in addresses]},
    }


def test_the_status_names_the_nodes_whose_stunnerd_falls_back_to_its_pod_address() -> None:
    """The CDS gets each Node's public address (ExternalIP, else ExternalDNS; an InternalIP is
    none); with relay address discovery, Nodes without one are named in the Gateway's
    Programmed message and a finding (their stunnerd hand out the pod's own address)."""
    nodes = [
        node("n1", ("InternalIP", "10.0.0.1"), ("ExternalIP", "198.51.100.1")),
        node("n2", ("InternalIP", "10.0.0.2"), ("ExternalDNS", "n2.example.net")),
        node("n3", ("InternalIP", "10.0.0.3")),
    ]
    annotated = owned_gateway(annotations={RELAY_ADDRESS_DISCOVERY: "true"})
    plan = plan_of(annotated, *nodes, hostNetwork=True)
    assert plan.node_addresses == {"n1": "198.51.100.1", "n2": "n2.example.net"}
    status = plan.status_of("Gateway", "stunner", "gw")
    assert status is not None
    programmed = next(c for c in status["conditions"] if c["type"] == "Programmed")
    note = (
        "relay address discovery: Node n3 has no ExternalIP, ExternalDNS or "
        "stunner.l7mp.io/relay-address annotation, so stunnerd there hands clients its pod's own "
        "address ($STUNNER_ADDR, likely private) as the relay address"
    )
    assert programmed["message"].endswith(note)
    assert [(f.path, f.message) for f in plan.findings if f.reason == "AddressNotAssigned"] == [
        (f'metadata.annotations["{RELAY_ADDRESS_DISCOVERY}"]', note)
    ]
    # Every Node with a public address, or no discovery asked: nothing to say.
    everywhere = plan_of(annotated, *nodes[:2], hostNetwork=True)
    assert not [f for f in everywhere.findings if f.reason == "AddressNotAssigned"]
    plain = plan_of(owned_gateway(), *nodes, hostNetwork=True)
    assert not [f for f in plain.findings if "relay address discovery" in f.message]
