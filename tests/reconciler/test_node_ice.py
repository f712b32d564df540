"""Per-node addresses of a Gateway with a stunnerd on every node (relay address discovery):
clients reach each node at its public address, not a Service.

Through the real render: the Gateway's status.addresses lists every Node's public address (by
Node name, each once, a Node without one left out), and the config's public address is the
first node's with the port stunnerd binds on the node. Through the real CDS and the real
`stunner auth-server` (reconciler.auth.run) following it: GET /ice answers, in Go's ICE JSON,
one turn: URI per node address for each listener, in that order; `public-addr` still names one
address; an ordinary Gateway keeps its one URI.
"""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from reconciler.cds.store import ConfigStore
from reconciler.render import Plan, Renderer, RenderSettings, render
from reconciler.store import Snapshot
from stunner_api.vocabulary import (
    NODE_ADDRESS_PLACEHOLDER,
    NODE_RELAY_ADDRESS,
    RELAY_ADDRESS_DISCOVERY,
    TARGETPORT,
)
from tests.reconciler import clusterkit as k
from tests.reconciler.clusterkit import (
    Obj,
    dataplane,
    gateway,
    gateway_class,
    gateway_config,
    listener,
)
from tests.reconciler.test_auth import auth_server
from tests.reconciler.test_cds_access import READER, cds_token, get
from tests.support.fakeapi import FakeApiServer

NOW = datetime(2026, 1, 1, tzinfo=UTC)
# TEST-NET addresses and names: printed, never dialled.
NODES = [
    ("n2", [("InternalIP", "10.0.0.2"), ("ExternalIP", "198.51.100.2")]),
    ("n1", [("InternalIP", "10.0.0.1"), ("ExternalIP", "198.51.100.1")]),
    ("n3", [("InternalIP", "10.0.0.3")]),  # no public address: left out
    ("n4", [("ExternalDNS", "n4.example.net")]),
    ("n5", [("ExternalIP", "198.51.100.1")]),  # the same address as n1's: once
]
CONTROL_PLANE = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
# A kubeadm control-plane node: the DaemonSet runs no pod there unless its pods tolerate it.
TAINTED = ("n0", [("ExternalIP", "198.51.100.9")])


def node(name: str, addresses: list[tuple[str, str]], *taints: dict[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "spec": {"taints": list(taints)},
        "status": {"addresses": [{"type": t, "address": a} for t, a in addresses]},
    }


def plan_of(gw: Obj, **dataplane_spec: Any) -> Plan:
    world = [
        gateway_class(),
        gateway_config(),
        dataplane(hostNetwork=True, dataplaneResource="DaemonSet", **dataplane_spec),
        gw,
        *(node(name, addresses) for name, addresses in NODES),
        node(*TAINTED, CONTROL_PLANE),
        # Taints the DaemonSet controller tolerates for every pod: the node is served.
        node(
            "n6",
            [("ExternalIP", "198.51.100.6")],
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
        ),
    ]
    return render(Snapshot.from_objects(copy.deepcopy(world)), RenderSettings(), NOW)


def node_local(**annotations: str) -> Obj:
    return gateway(
        listener("udp", 3478),
        listener("tcp", 3479, "TURN-TCP"),
        annotations={RELAY_ADDRESS_DISCOVERY: "true", **annotations},
    )


def test_status_lists_every_nodes_public_address_and_the_config_the_first() -> None:
    plan = plan_of(node_local(**{TARGETPORT: '{"tcp": 4000}'}))
    status = plan.status_of("Gateway", "stunner", "gw")
    assert status is not None
    assert status["addresses"] == [
        {"type": "IPAddress", "value": "198.51.100.1"},
        {"type": "IPAddress", "value": "198.51.100.2"},
        {"type": "Hostname", "value": "n4.example.net"},
        {"type": "IPAddress", "value": "198.51.100.6"},
    ]
    assert plan.node_local == {
        "stunner/gw": ("198.51.100.1", "198.51.100.2", "n4.example.net", "198.51.100.6")
    }
    udp, tcp = plan.configs["stunner/gw"].listeners
    assert (udp.address, udp.public_address, udp.public_port) == (
        NODE_ADDRESS_PLACEHOLDER,
        "198.51.100.1",
        3478,
    )
    assert (tcp.port, tcp.public_port) == (4000, 4000)  # the port it binds on the node


def test_a_tainted_node_is_listed_once_the_dataplane_tolerates_its_taint() -> None:
    tolerated = plan_of(node_local(), tolerations=[{"operator": "Exists", "effect": "NoSchedule"}])
    assert tolerated.node_local["stunner/gw"][0] == "198.51.100.9"  # n0 sorts first
    keyed = plan_of(node_local(), tolerations=[{"key": CONTROL_PLANE["key"], "operator": "Exists"}])
    assert "198.51.100.9" in keyed.node_local["stunner/gw"]
    other = plan_of(node_local(), tolerations=[{"key": "gpu", "operator": "Exists"}])
    assert "198.51.100.9" not in other.node_local["stunner/gw"]


def _required(*terms: dict[str, Any]) -> dict[str, Any]:
    """A Dataplane affinity whose required node affinity has these terms."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


def test_only_the_nodes_the_dataplanes_node_affinity_selects_are_listed() -> None:
    """The DaemonSet runs pods only where the Dataplane's required node affinity selects (terms
    ORed, a term's requirements ANDed; labels by matchExpressions, the name by matchFields), so
    only those Nodes' addresses are where clients connect."""

    def listed(*terms: dict[str, Any], labels: dict[str, dict[str, str]]) -> tuple[str, ...]:
        world = [
            gateway_class(),
            gateway_config(),
            dataplane(hostNetwork=True, dataplaneResource="DaemonSet", affinity=_required(*terms)),
            node_local(),
            *(node(name, addresses) for name, addresses in NODES),
        ]
        for obj in world:
            if obj["kind"] == "Node" and obj["metadata"]["name"] in labels:
                obj["metadata"]["labels"] = labels[obj["metadata"]["name"]]
        plan = render(Snapshot.from_objects(world), RenderSettings(), NOW)
        return plan.node_local["stunner/gw"]

    media = {"n2": {"role": "media", "cpus": "16"}, "n4": {"role": "media", "cpus": "4"}}
    role = {"key": "role", "operator": "In", "values": ["media"]}
    assert listed({"matchExpressions": [role]}, labels=media) == ("198.51.100.2", "n4.example.net")
    big = {"key": "cpus", "operator": "Gt", "values": ["8"]}
    assert listed({"matchExpressions": [role, big]}, labels=media) == ("198.51.100.2",)
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    assert listed({"matchExpressions": [big]}, by_name, labels=media) == (
        "198.51.100.1",
        "198.51.100.2",
    )
    not_media = {"key": "role", "operator": "NotIn", "values": ["media"]}
    assert listed({"matchExpressions": [not_media]}, labels=media) == ("198.51.100.1",)
    assert listed({}, labels=media) == ()  # an empty term selects no Node


def test_an_edited_node_renders_the_node_local_gateway_again() -> None:
    """The incremental render (cluster mode's) re-renders a node-local Gateway when what render
    reads of a Node changes: its relay-address annotation, its taints, its labels (node
    affinity); not a heartbeat. Each
    time it agrees with a full render (a stale part kept the old addresses in status and in
    the per-node URIs on the real cluster)."""
    world = [
        gateway_class(),
        gateway_config(),
        dataplane(hostNetwork=True, dataplaneResource="DaemonSet"),
        node_local(),
        node("n1", [("InternalIP", "10.0.0.1")]),
    ]
    renderer = Renderer(RenderSettings())
    first = renderer.render(Snapshot.from_objects(copy.deepcopy(world)), NOW)
    assert first.node_local == {"stunner/gw": ()}
    named = copy.deepcopy(world)
    named[-1]["metadata"]["annotations"] = {NODE_RELAY_ADDRESS: "192.0.2.10"}
    second = renderer.render(Snapshot.from_objects(named), NOW)
    assert second.node_local == {"stunner/gw": ("192.0.2.10",)}
    tainted = copy.deepcopy(named)
    tainted[-1]["spec"]["taints"] = [CONTROL_PLANE]
    third = renderer.render(Snapshot.from_objects(tainted), NOW)
    assert third.node_local == {"stunner/gw": ()}
    full = render(Snapshot.from_objects(copy.deepcopy(tainted)), RenderSettings(), NOW)
    assert third.status_of("Gateway", "stunner", "gw") == full.status_of("Gateway", "stunner", "gw")
    labelled = copy.deepcopy(named)
    labelled[2]["spec"]["affinity"] = _required(
        {"matchExpressions": [{"key": "role", "operator": "Exists"}]}
    )
    unlabelled = renderer.render(Snapshot.from_objects(copy.deepcopy(labelled)), NOW)
    assert unlabelled.node_local == {"stunner/gw": ()}
    labelled[-1]["metadata"]["labels"] = {"role": "media"}
    fourth = renderer.render(Snapshot.from_objects(copy.deepcopy(labelled)), NOW)
    assert fourth.node_local == {"stunner/gw": ("192.0.2.10",)}  # a label change re-renders
    heartbeat = copy.deepcopy(labelled)
    heartbeat[-1]["status"]["conditions"] = [{"type": "Ready", "lastHeartbeatTime": "t2"}]
    renderer.render(Snapshot.from_objects(heartbeat), NOW)
    assert renderer.rendered_parts == 0


async def ice(port: int, **params: str) -> tuple[int, Any]:
    """GET /ice: (status, body), or (0, None) while the server is not up yet."""
    query = {"service": "turn", **params}
    url = f"http://127.0.0.1:{port}/ice"
    try:
        async with aiohttp.ClientSession() as session, session.get(url, params=query) as r:
            return r.status, await r.json(content_type=None)
    except aiohttp.ClientConnectionError:
        return 0, None


async def answered(port: int, **params: str) -> Any:
    """The /ice answer once the auth server has the configs and the Nodes."""
    for _ in range(250):
        status, body = await ice(port, **params)
        if status == 200 and len(body["iceServers"][0]["urls"]) > 2:
            return body
        await asyncio.sleep(0.02)
    raise AssertionError(f"no per-node answer: {status} {body}")


def test_the_auth_service_answers_a_uri_per_node_for_each_listener() -> None:
    plan = plan_of(node_local())
    store = ConfigStore()
    for id, config in plan.configs.items():
        store.set(id, config)

    async def main() -> None:
        store.node_local = dict(plan.node_local)  # as the reconciler's loop does
        async with auth_server(store) as port:
            body = await answered(port, username="ignored")
            assert body == {
                "iceServers": [
                    {
                        "username": "user",
                        "credential": "pass-word",
                        "urls": [
                            "turn:198.51.100.1:3478?transport=udp",
                            "turn:198.51.100.2:3478?transport=udp",
                            "turn:n4.example.net:3478?transport=udp",
                            "turn:198.51.100.6:3478?transport=udp",
                            "turn:198.51.100.1:3479?transport=tcp",
                            "turn:198.51.100.2:3479?transport=tcp",
                            "turn:n4.example.net:3479?transport=tcp",
                            "turn:198.51.100.6:3479?transport=tcp",
                        ],
                    }
                ],
                "iceTransportPolicy": "all",
            }
            # A listener filter keeps its node URIs; `public-addr` names the one address.
            status, one = await ice(port, namespace="stunner", gateway="gw", listener="tcp")
            assert status == 200 and one["iceServers"][0]["urls"][0].endswith("3479?transport=tcp")
            assert len(one["iceServers"][0]["urls"]) == 4
            status, named = await ice(port, **{"public-addr": "192.0.2.9"})
            assert status == 200
            assert named["iceServers"][0]["urls"] == [
                "turn:192.0.2.9:3478?transport=udp",
                "turn:192.0.2.9:3479?transport=tcp",
            ]

    asyncio.run(asyncio.wait_for(main(), 30))


def test_an_ordinary_gateway_keeps_its_one_uri_beside_the_nodes() -> None:
    ordinary = gateway(listener("udp", 3478))
    ordinary["spec"]["addresses"] = [{"value": "192.0.2.5"}]
    plan = plan_of(ordinary)
    store = ConfigStore()
    for id, config in plan.configs.items():
        store.set(id, config)

    async def main() -> None:
        store.node_local = dict(plan.node_local)
        async with auth_server(store) as port:
            for _ in range(250):
                status, body = await ice(port)
                if status == 200:
                    break
                await asyncio.sleep(0.02)
            assert body["iceServers"][0]["urls"] == ["turn:192.0.2.5:3478?transport=udp"]

    asyncio.run(asyncio.wait_for(main(), 30))


def test_the_cds_serves_the_nodes_public_addresses_to_an_authenticated_reader(
    tmp_path: Path,
) -> None:
    """Cluster mode: the reconciler's loop hands the CDS the Nodes' public addresses (an
    ExternalIP, the relay-address annotation; no name here: the CDS would resolve it), which
    GET /api/v1/nodes lists behind the same token check as the configs."""
    named = node("n2", [("InternalIP", "10.0.0.2")])
    named["metadata"]["annotations"] = {NODE_RELAY_ADDRESS: "203.0.113.7"}
    nodes = [
        node("n1", [("ExternalIP", "198.51.100.1")]),
        named,
        node("n3", []),
        node(*TAINTED, CONTROL_PLANE),
    ]

    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake, *nodes)

            def discover(gw: Obj) -> None:
                gw["metadata"]["annotations"] = {RELAY_ADDRESS_DISCOVERY: "true"}

            k.update(fake, "gateway.networking.k8s.io/v1", "Gateway", "gw", discover)
            rt = fake.resource_type("v1", "Node")
            for obj in nodes:  # the kubelet reports the addresses (a status write)
                status = {"status": obj["status"]}
                name = obj["metadata"]["name"]
                fake.patch(rt, "", name, "application/merge-patch+json", status, "status")
            async with k.reconciler(fake, tmp_path, cds_readers=frozenset({READER})) as running:
                cds = running.cds_address
                assert (await get(cds, "/api/v1/nodes")).status == 401
                reader = cds_token(fake, READER.namespace, READER.name)
                wanted = {
                    "version": "v1",
                    "nodes": {"n0": "198.51.100.9", "n1": "198.51.100.1", "n2": "203.0.113.7"},
                    # Where the Gateway's stunnerd runs: not on the tainted control plane.
                    "gateways": {"stunner/gw": ["198.51.100.1", "203.0.113.7"]},
                }
                for _ in range(500):  # until the informer has both Nodes and the loop ran
                    answer = await get(cds, "/api/v1/nodes", reader)
                    if answer.body == wanted:
                        break
                    await asyncio.sleep(0.02)
                assert answer.body == wanted

    asyncio.run(asyncio.wait_for(main(), 60))
