"""Host-network port clashes at admission (issue 23): Gateways whose stunnerd pods use their
nodes' network bind their listener ports and stunnerd's own (health check, metrics) on the
nodes themselves, so a second Gateway (any namespace) with the same transport and port is
refused, naming the field, the Gateway holding the port and the reason; with their own
health-check and metrics ports (the stunner.l7mp.io/health-check-port and metrics-port
annotations) two such Gateways are admitted side by side. Through the real webhook app, its
lookups answered by the fake API server through the official client
(webhook.kube.KubeLookup), as in a cluster."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from flask.testing import FlaskClient

from stunner_api.vocabulary import HEALTH_CHECK_PORT, METRICS_PORT_ANNOTATION
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


def gateway(
    name: str,
    namespace: str,
    class_name: str,
    *ports: tuple[str, int],
    health: int | None = None,
    metrics: int | None = None,
) -> Obj:
    """A Gateway with a listener `PROTOCOL-PORT` per port; `health`, `metrics`: its
    health-check-port and metrics-port annotations."""
    annotations = {
        key: str(port)
        for key, port in ((HEALTH_CHECK_PORT, health), (METRICS_PORT_ANNOTATION, metrics))
        if port is not None
    }
    listeners = [
        {"name": f"{protocol.lower()}-{port}", "port": port, "protocol": f"TURN-{protocol}"}
        for protocol, port in ports
    ]
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
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


def seed_full(fake: FakeApiServer) -> None:
    """Class `full` (Dataplane `node-full`: DaemonSet, hostNetwork, health check and metrics
    on) with Gateway other/first: TCP 3478, its health check on 9086, its metrics on 9080."""
    fake.seed(
        dataplane(
            "node-full", dataplaneResource="DaemonSet", hostNetwork=True, enableMetricsEndpoint=True
        )
    )
    fake.seed(config("full-config", "node-full"))
    fake.seed(our_class("full", "full-config"))
    fake.seed(gateway("first", "other", "full", ("TCP", 3478), health=9086, metrics=9080))


def test_host_network_gateways_with_their_own_daemon_ports_are_admitted(
    fake: FakeApiServer, kube_client: FlaskClient
) -> None:
    """Beside other/first (its stunnerd on 9086 and 9080), a Gateway on other ports is admitted
    whether it moves its own (9087, 9081) or keeps the defaults (8086, 8080)."""
    seed_full(fake)
    for second in (
        gateway("second", "stunner", "full", ("UDP", 3478), health=9087, metrics=9081),
        gateway("second", "stunner", "full", ("UDP", 3478), ("UDP", 3479)),
    ):
        response = answer(kube_client, "/validate", admission_review(second))
        assert response["allowed"] is True, response
        assert response.get("warnings") in (None, []), response


SHARED = (
    "the stunnerd pods of both use the host network (Dataplane 'node-full' sets hostNetwork), "
    "so they share the nodes' ports"
)
HEALTH_AT = f'metadata.annotations["{HEALTH_CHECK_PORT}"]'
METRICS_AT = f'metadata.annotations["{METRICS_PORT_ANNOTATION}"]'


@pytest.mark.parametrize(
    ("second", "message"),
    [
        (  # a listener on the other's listener port
            gateway("second", "stunner", "full", ("TCP", 3478), health=9087, metrics=9081),
            "spec.listeners[0].port: TCP port 3478 is already bound on the nodes by Gateway "
            f"other/first (listener 'tcp-3478'): {SHARED}; choose another port",
        ),
        (  # a listener on the other's health check
            gateway("second", "stunner", "full", ("TCP", 9086), health=9087, metrics=9081),
            "spec.listeners[0].port: TCP port 9086 is already bound on the nodes by Gateway "
            f"other/first (its health check): {SHARED}; choose another port",
        ),
        (  # the health check on the other's
            gateway("second", "stunner", "full", ("UDP", 3478), health=9086, metrics=9081),
            f"{HEALTH_AT}: TCP port 9086 (stunnerd: its health check) is already bound on the "
            f"nodes by Gateway other/first (its health check): {SHARED}; choose another port",
        ),
        (  # the metrics endpoint on the other's
            gateway("second", "stunner", "full", ("UDP", 3478), health=9087, metrics=9080),
            f"{METRICS_AT}: TCP port 9080 (stunnerd: its metrics endpoint) is already bound on "
            f"the nodes by Gateway other/first (its metrics endpoint): {SHARED}; choose another "
            "port",
        ),
        (  # the health check on the other's metrics endpoint
            gateway("second", "stunner", "full", ("UDP", 3478), health=9080, metrics=9081),
            f"{HEALTH_AT}: TCP port 9080 (stunnerd: its health check) is already bound on the "
            f"nodes by Gateway other/first (its metrics endpoint): {SHARED}; choose another port",
        ),
        (  # the metrics endpoint on the other's listener
            gateway("second", "stunner", "full", ("UDP", 3478), health=9087, metrics=3478),
            f"{METRICS_AT}: TCP port 3478 (stunnerd: its metrics endpoint) is already bound on "
            f"the nodes by Gateway other/first (listener 'tcp-3478'): {SHARED}; choose another "
            "port",
        ),
    ],
    ids=[
        "listener-listener",
        "listener-health",
        "health-health",
        "metrics-metrics",
        "health-metrics",
        "metrics-listener",
    ],
)
def test_a_clash_on_any_port_is_refused_naming_the_field_and_the_other_gateway(
    fake: FakeApiServer, kube_client: FlaskClient, second: Obj, message: str
) -> None:
    seed_full(fake)
    response = answer(kube_client, "/validate", admission_review(second))
    assert response["allowed"] is False
    assert response["status"]["message"] == message


def test_health_check_and_metrics_on_one_port_are_refused(
    fake: FakeApiServer, kube_client: FlaskClient
) -> None:
    seed_full(fake)
    same = gateway("second", "stunner", "full", ("UDP", 3478), health=9087, metrics=9087)
    response = answer(kube_client, "/validate", admission_review(same))
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        f"{METRICS_AT}: TCP port 9087 is also stunnerd's health check ({HEALTH_CHECK_PORT}): "
        "choose another port"
    )
