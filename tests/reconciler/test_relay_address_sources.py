"""Where relay address discovery gets a Node's public address, through the real render: the
Node's ExternalIP, else its ExternalDNS, else the address the operator names in its
`stunner.l7mp.io/relay-address` annotation (ours), else, with the Gateway's
`stunner.l7mp.io/relay-address-stun-server`, what that STUN server tells the node's stunnerd (the
rendered pod template carries the server), else the pod's own address; and what status says.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from reconciler.render import Plan, RenderSettings, render
from reconciler.store import Snapshot
from stunner_api.vocabulary import (
    NODE_RELAY_ADDRESS,
    RELAY_ADDRESS_DISCOVERY,
    RELAY_STUN_SERVER,
    RELAY_STUN_SERVER_ENV,
)
from tests.reconciler.clusterkit import Obj, dataplane, gateway, gateway_class, gateway_config

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ANNOTATION_PATH = f'metadata.annotations["{NODE_RELAY_ADDRESS}"]'


def plan_of(*objects: Obj, **dataplane_spec: Any) -> Plan:
    world = [gateway_class(), gateway_config(), dataplane(**dataplane_spec), *objects]
    return render(Snapshot.from_objects(copy.deepcopy(world)), RenderSettings(), NOW)


def node(
    name: str, *addresses: tuple[str, str], relay: str | None = None, tainted: bool = False
) -> Obj:
    annotations = {NODE_RELAY_ADDRESS: relay} if relay is not None else {}
    taints = [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"taints": taints if tainted else []},
        "status": {"addresses": [{"type": t, "address": a} for t, a in addresses]},
    }


def discovering(**annotations: str) -> Obj:
    return gateway(
        name="gw", uid="uid-gw", annotations={RELAY_ADDRESS_DISCOVERY: "true", **annotations}
    )


def programmed_message(plan: Plan) -> str:
    status = plan.status_of("Gateway", "stunner", "gw")
    assert status is not None
    return str(next(c for c in status["conditions"] if c["type"] == "Programmed")["message"])


def pod_env(plan: Plan) -> dict[str, Any]:
    pod = plan.deployments["stunner/gw"]["spec"]["template"]["spec"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["containers"][0]["env"]}


def test_the_operator_named_address_comes_after_the_nodes_own_public_addresses() -> None:
    nodes = [
        # An ExternalIP wins over the annotation; so does an ExternalDNS.
        node("n1", ("InternalIP", "10.0.0.1"), ("ExternalIP", "198.51.100.1"), relay="192.0.2.1"),
        node("n2", ("ExternalDNS", "n2.example.net"), relay="192.0.2.2"),
        # No public address of its own: the operator's, an IP or a DNS name (lower-cased).
        node("n3", ("InternalIP", "10.0.0.3"), relay="203.0.113.7"),
        node("n4", ("InternalIP", "10.0.0.4"), relay="N4.Example.org"),
    ]
    plan = plan_of(discovering(), *nodes, hostNetwork=True)
    assert plan.node_addresses == {
        "n1": "198.51.100.1",
        "n2": "n2.example.net",
        "n3": "203.0.113.7",
        "n4": "n4.example.org",
    }
    # Every Node has a public address: nothing falls back, nothing to say.
    assert "relay address discovery" not in programmed_message(plan)
    assert not [f for f in plan.findings if f.reason in ("AddressNotAssigned", "Invalid")]


def test_a_bad_relay_address_annotation_is_a_finding_naming_the_node_and_is_ignored() -> None:
    nodes = [
        node("n1", ("InternalIP", "10.0.0.1"), relay="not an address"),
        node("n2", ("InternalIP", "10.0.0.2"), relay="203.0.113.9:3478"),
        node("n3", ("InternalIP", "10.0.0.3"), relay="203.0.113.7"),
    ]
    plan = plan_of(discovering(), *nodes, hostNetwork=True)
    assert plan.node_addresses == {"n3": "203.0.113.7"}
    invalid = [(f.kind, f.name, f.path, f.message) for f in plan.findings if f.kind == "Node"]
    assert invalid == [
        (
            "Node",
            "n1",
            ANNOTATION_PATH,
            "must be an IP address or a DNS name, got 'not an address'",
        ),
        (
            "Node",
            "n2",
            ANNOTATION_PATH,
            "must be an IP address or a DNS name, got '203.0.113.9:3478'",
        ),
    ]
    assert programmed_message(plan).endswith(
        "relay address discovery: Nodes n1, n2 have no ExternalIP, ExternalDNS or "
        "stunner.l7mp.io/relay-address annotation, so stunnerd there hands clients its pod's "
        "own address ($STUNNER_ADDR, likely private) as the relay address"
    )


def test_the_stun_server_reaches_the_pods_and_the_status_says_it_is_asked() -> None:
    nodes = [
        node("n1", ("ExternalIP", "198.51.100.1")),
        node("n2", ("InternalIP", "10.0.0.2")),
        node("cp", ("InternalIP", "10.0.0.9"), tainted=True),  # no stunnerd there: not named
    ]
    gw = discovering(**{RELAY_STUN_SERVER: "stun.example.org:3478"})
    plan = plan_of(gw, *nodes, hostNetwork=True, dataplaneResource="DaemonSet")
    assert plan.deployments["stunner/gw"]["kind"] == "DaemonSet"
    assert pod_env(plan)[RELAY_STUN_SERVER_ENV] == "stun.example.org:3478"
    note = (
        "relay address discovery: Node n2 has no ExternalIP, ExternalDNS or "
        "stunner.l7mp.io/relay-address annotation, so stunnerd there hands clients the address "
        "STUN server stun.example.org:3478 reports for it, else its pod's own address "
        "($STUNNER_ADDR, likely private) as the relay address"
    )
    assert programmed_message(plan).endswith(note)
    assert [f.message for f in plan.findings if f.reason == "AddressNotAssigned"] == [note]


def test_no_stun_server_in_the_pods_without_discovery_or_without_the_annotation() -> None:
    plain = gateway(name="gw", uid="uid-gw", annotations={RELAY_STUN_SERVER: "stun.example:3478"})
    assert RELAY_STUN_SERVER_ENV not in pod_env(plan_of(plain, hostNetwork=True))
    assert RELAY_STUN_SERVER_ENV not in pod_env(plan_of(discovering(), hostNetwork=True))
