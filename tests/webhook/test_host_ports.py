"""Host-network port clashes at admission (issue 23): Gateways whose stunnerd pods use their
nodes' network bind their listener ports on the nodes themselves, so a second Gateway (any
namespace) with the same transport and port is refused, naming the field, the Gateway holding
the port and the reason. Through the real webhook app, its lookups answered by the fake API
server through the official client (webhook.kube.KubeLookup), as in a cluster."""

from __future__ import annotations

import copy
from typing import Any

from flask.testing import FlaskClient

from tests.support.fakeapi import FakeApiServer
from tests.support.objects import gateway_class
from tests.webhook.conftest import admission_review, answer

Obj = dict[str, Any]


def config(name: str, dataplane: str) -> Obj:
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "GatewayConfig",
        "metadata": {"name": name, "namespace": "stunner"},
        "spec": {"dataplane": dataplane},
    }


def dataplane(name: str, **spec: Any) -> Obj:
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "Dataplane",
        "metadata": {"name": name},
        "spec": {"image": "l7mp/stunnerd:latest", **spec},
    }


def our_class(name: str, config_name: str) -> Obj:
    obj = gateway_class(name)
    obj["spec"]["parametersRef"] = {
        "group": "stunner.l7mp.io",
        "kind": "GatewayConfig",
        "name": config_name,
        "namespace": "stunner",
    }
    return obj


def gateway(name: str, namespace: str, class_name: str, *ports: tuple[str, int]) -> Obj:
    listeners = [
        {"name": f"{protocol.lower()}-{port}", "port": port, "protocol": f"TURN-{protocol}"}
        for protocol, port in ports
    ]
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"gatewayClassName": class_name, "listeners": listeners},
    }


def seed_world(fake: FakeApiServer) -> Obj:
    """Class `host` (Dataplane `node-local`: DaemonSet, hostNetwork, no health check) with
    Gateway media/first on UDP 3478; class `pods` (Dataplane `default`, its own network). The
    stored Gateway."""
    for obj in (
        dataplane(
            "node-local", dataplaneResource="DaemonSet", hostNetwork=True, disableHealthCheck=True
        ),
        dataplane("default"),
        config("host-config", "node-local"),
        config("pod-config", "default"),
        our_class("host", "host-config"),
        our_class("pods", "pod-config"),
    ):
        fake.seed(obj)
    return fake.seed(gateway("first", "media", "host", ("UDP", 3478)))


def test_a_second_host_network_gateway_on_the_same_port_is_refused(
    fake: FakeApiServer, kube_client: FlaskClient
) -> None:
    seed_world(fake)
    clash = gateway("second", "stunner", "host", ("TCP", 3478), ("UDP", 3478))
    response = answer(kube_client, "/validate", admission_review(clash))
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        "spec.listeners[1].port: UDP port 3478 is already bound on the nodes by Gateway "
        "media/first (listener 'udp-3478'): the stunnerd pods of both use the host network "
        "(Dataplane 'node-local' sets hostNetwork), so they share the nodes' ports; "
        "choose another port"
    )
    for fine in (
        gateway("second", "stunner", "host", ("UDP", 3479), ("TCP", 3478)),  # another port
        gateway("second", "stunner", "pods", ("UDP", 3478)),  # its pods have their own network
    ):
        response = answer(kube_client, "/validate", admission_review(fine))
        assert response["allowed"] is True, response


def test_an_update_that_brings_a_clash_in_is_refused_whatever_the_ages(
    fake: FakeApiServer, kube_client: FlaskClient
) -> None:
    """media/first is older than stunner/second: it keeps UDP 3478 when both hold it (render
    drops the younger one's listener), but it may not take a port the younger one holds."""
    first = seed_world(fake)
    second = fake.seed(gateway("second", "stunner", "host", ("UDP", 3479)))
    assert first["metadata"]["creationTimestamp"] <= second["metadata"]["creationTimestamp"]
    edited = copy.deepcopy(first)
    edited["spec"]["listeners"].append({"name": "b", "port": 3479, "protocol": "TURN-UDP"})
    review = admission_review(edited, operation="UPDATE", old=first)
    response = answer(kube_client, "/validate", review)
    assert response["allowed"] is False
    assert response["status"]["message"].startswith(
        "spec.listeners[1].port: UDP port 3479 is already bound on the nodes by Gateway "
        "stunner/second (listener 'udp-3479')"
    )
    # Both on UDP 3478 (stored before the webhook ran): an edit of the older one that leaves
    # its ports alone is admitted, any edit of the younger one is refused until it moves.
    rt = fake.resource_type("gateway.networking.k8s.io/v1", "Gateway")
    second["spec"]["listeners"][0]["port"] = 3478
    second = fake.replace(rt, "stunner", "second", second)
    relabelled = copy.deepcopy(first)
    relabelled["metadata"]["labels"] = {"team": "media"}
    review = admission_review(relabelled, operation="UPDATE", old=first)
    assert answer(kube_client, "/validate", review)["allowed"] is True
    grown = copy.deepcopy(second)
    grown["spec"]["listeners"].append({"name": "tcp", "port": 3478, "protocol": "TURN-TCP"})
    response = answer(
        kube_client, "/validate", admission_review(grown, operation="UPDATE", old=second)
    )
    assert response["allowed"] is False
    assert "Gateway media/first (listener 'udp-3478')" in response["status"]["message"]


def test_stunnerds_own_health_check_port_clashes_too(
    fake: FakeApiServer, kube_client: FlaskClient
) -> None:
    """With the health check on (the default), every host-network Gateway's pods bind TCP 8086
    on their nodes: a second such Gateway is refused whatever its listeners, and so is a
    listener on TCP 8086 of the first."""
    seed_world(fake)
    fake.seed(dataplane("node-health", dataplaneResource="DaemonSet", hostNetwork=True))
    fake.seed(config("health-config", "node-health"))
    fake.seed(our_class("health", "health-config"))
    fake.seed(gateway("first", "other", "health", ("UDP", 3478)))
    second = gateway("second", "stunner", "health", ("UDP", 3479))
    response = answer(kube_client, "/validate", admission_review(second))
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        "spec.gatewayClassName: TCP port 8086 (stunnerd: its health check) is already bound on "
        "the nodes by Gateway other/first (its health check): the stunnerd pods of both use the "
        "host network (Dataplane 'node-health' sets hostNetwork), so they share the nodes' "
        "ports; move it to a free port with the stunner.l7mp.io/health-check-port annotation "
        "(or set disableHealthCheck in one Dataplane)"
    )
    own = gateway("first", "other", "health", ("TCP", 8086))
    response = answer(kube_client, "/validate", admission_review(own))
    assert response["allowed"] is False
    assert response["status"]["message"].startswith(
        "spec.listeners[0].port: TCP port 8086 is its health check (stunnerd's own port, on "
        "the nodes' network: Dataplane 'node-health' sets hostNetwork): choose another port"
    )
