"""The annotation table (stunner_api/annotations.py) through both of its readers: the admission
webhook (the Flask app, judging against a real Snapshot) and render.

For every row, each value the table accepts is honoured by render (the rendered Service or
Deployment shows the parsed value), and each value it refuses is refused by the webhook and
ignored by render (the default is rendered) with exactly one finding, worded as the webhook
words its refusal.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from reconciler.render import Finding, Plan, RenderSettings, render
from reconciler.store import Snapshot
from stunner_api import annotations as table
from stunner_api.annotations import Annotation, Limits, Refused
from stunner_api.rules import Settings
from stunner_api.vocabulary import NODE_ADDRESS_PLACEHOLDER, RELAY_STUN_SERVER_ENV
from tests.reconciler.clusterkit import dataplane, gateway, gateway_class, gateway_config, listener
from tests.support.docs import documentation_text
from webhook import create_app

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LIMITS = Limits(Settings().node_port_range)
# The health-check port a LoadBalancer Service exposes unless disable-health-check-expose.
HEALTH = {
    "service.beta.kubernetes.io/do-loadbalancer-healthcheck-port": "8086",
    "service.beta.kubernetes.io/do-loadbalancer-healthcheck-protocol": "tcp",
}
MIXED = {table.MIXED_PROTOCOL_LB_ROW.key: "true"}

Obj = dict[str, Any]


def annotated_gateway(annotations: Mapping[str, str]) -> Obj:
    return gateway(
        listener("udp", 3478),
        listener("tcp", 3479, "TURN-TCP"),
        annotations=dict(annotations),
        generation=1,
    )


def world(gw: Obj, config: Obj | None = None) -> list[Obj]:
    # Relay address discovery is for stunnerd pods in their node's network (else a warning).
    annotations = gw["metadata"].get("annotations") or {}
    host = {"hostNetwork": True} if table.RELAY_ADDRESS_DISCOVERY_ROW.key in annotations else {}
    # The metrics endpoint on, so that the metrics-port row has something to move.
    spec = host | {"enableMetricsEndpoint": True}
    return [gateway_class(), config or gateway_config(), dataplane(**spec), gw]


def plan_of(objects: list[Obj]) -> Plan:
    return render(Snapshot.from_objects(copy.deepcopy(objects)), RenderSettings(), NOW)


def webhook_answer(obj: Obj, objects: list[Obj]) -> dict[str, Any]:
    """The webhook app's AdmissionReview response for creating obj, its lookups answered by a
    Snapshot of `objects` (the reconciler's own cache type)."""
    app = create_app(Settings(), Snapshot.from_objects(copy.deepcopy(objects)))
    group, _, version = str(obj["apiVersion"]).rpartition("/")
    gvk = {"group": group, "version": version, "kind": obj["kind"]}
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": gvk,
            "resource": gvk | {"resource": obj["kind"].lower() + "s"},
            "name": obj["metadata"]["name"],
            "namespace": obj["metadata"].get("namespace", ""),
            "operation": "CREATE",
            "userInfo": {"username": "admin", "groups": ["system:masters"]},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
        },
    }
    resp = app.test_client().post("/validate", json=review)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    response: dict[str, Any] = resp.get_json()["response"]
    return response


# --- what render shows of each row ------------------------------------------------------------


def _service(plan: Plan) -> Obj:
    service: Obj = plan.services["stunner/gw"]
    return service


def _ports(plan: Plan, field: str) -> dict[str, int]:
    return {p["name"]: p[field] for p in _service(plan)["spec"]["ports"] if field in p}


def _container(plan: Plan) -> Obj:
    container: Obj = plan.deployments["stunner/gw"]["spec"]["template"]["spec"]["containers"][0]
    return container


def _health_port(plan: Plan) -> int:
    """The port the pod's probes ask, which must be where the config puts the health check."""
    container = _container(plan)
    port: int = container["readinessProbe"]["httpGet"]["port"]
    assert container["livenessProbe"]["httpGet"]["port"] == port
    assert plan.configs["stunner/gw"].admin.healthcheck_endpoint == f"http://:{port}"
    return port


def _metrics_port(plan: Plan) -> int:
    """The pod's metrics-port, which must be where the config puts the metrics endpoint."""
    [declared] = _container(plan)["ports"]
    assert declared["name"] == "metrics-port"
    port: int = declared["containerPort"]
    assert plan.configs["stunner/gw"].admin.metrics_endpoint == f"http://:{port}/metrics"
    return port


SEEN: dict[str, Callable[[Plan], Any]] = {
    table.SERVICE_TYPE_ROW.key: lambda plan: _service(plan)["spec"]["type"],
    table.MIXED_PROTOCOL_LB_ROW.key: lambda plan: "tcp" in _ports(plan, "port"),
    table.EXTERNAL_TRAFFIC_POLICY_ROW.key: lambda plan: _service(plan)["spec"].get(
        "externalTrafficPolicy", "Cluster"
    ),
    table.DISABLE_MANAGED_DATAPLANE_ROW.key: lambda plan: "stunner/gw" not in plan.deployments,
    table.NODEPORT_ROW.key: lambda plan: _ports(plan, "nodePort"),
    table.TARGETPORT_ROW.key: lambda plan: _ports(plan, "targetPort"),
    table.DISABLE_HEALTH_CHECK_EXPOSE_ROW.key: lambda plan: (
        "gateway-health-check" not in _ports(plan, "port")
    ),
    table.DISABLE_SESSION_AFFINITY_ROW.key: lambda plan: (
        _service(plan)["spec"]["sessionAffinity"] == "None"
    ),
    table.RELAY_ADDRESS_DISCOVERY_ROW.key: lambda plan: (
        plan.configs["stunner/gw"].listeners[0].address == NODE_ADDRESS_PLACEHOLDER
    ),
    table.HEALTH_CHECK_PORT_ROW.key: _health_port,
    table.METRICS_PORT_ROW.key: _metrics_port,
    table.RELAY_STUN_SERVER_ROW.key: lambda plan: next(
        (
            e["value"]
            for e in plan.deployments["stunner/gw"]["spec"]["template"]["spec"]["containers"][0][
                "env"
            ]
            if e["name"] == RELAY_STUN_SERVER_ENV
        ),
        "",
    ),
    table.RELAY_ADDRESS_FAMILY_ROW.key: lambda plan: (
        plan.configs["stunner/gw"].admin.relay_address_family
    ),
}
# What else a row needs to be seen: both listeners on the Service (but for the mixed-protocol
# row itself), a health-check port to expose, a NodePort Service to keep nodePorts.
CONTEXT: dict[str, dict[str, str]] = {
    table.MIXED_PROTOCOL_LB_ROW.key: {},
    table.DISABLE_HEALTH_CHECK_EXPOSE_ROW.key: MIXED | HEALTH,
    table.NODEPORT_ROW.key: MIXED | {table.SERVICE_TYPE_ROW.key: "NodePort"},
    # The STUN server is for relay address discovery only.
    table.RELAY_STUN_SERVER_ROW.key: MIXED | {table.RELAY_ADDRESS_DISCOVERY_ROW.key: "true"},
}


def context(row: Annotation[Any]) -> dict[str, str]:
    return CONTEXT.get(row.key, MIXED)


# The one other finding these Gateways may have: UDP and TCP listeners without the
# mixed-protocol annotation (a warning on spec.listeners, not on the annotation).
MIXING = "spec.listeners"


def findings(plan: Plan) -> tuple[Finding, ...]:
    return tuple(f for f in plan.findings if f.path != MIXING)


def warnings(response: Mapping[str, Any]) -> list[str]:
    return [w for w in response.get("warnings", []) if not w.startswith(MIXING + ":")]


ACCEPTED: list[tuple[Annotation[Any], str]] = [
    (table.SERVICE_TYPE_ROW, "ClusterIP"),
    (table.SERVICE_TYPE_ROW, "NodePort"),
    (table.SERVICE_TYPE_ROW, "LoadBalancer"),
    (table.MIXED_PROTOCOL_LB_ROW, "true"),
    (table.MIXED_PROTOCOL_LB_ROW, "True"),
    (table.MIXED_PROTOCOL_LB_ROW, "false"),
    (table.EXTERNAL_TRAFFIC_POLICY_ROW, "local"),
    (table.EXTERNAL_TRAFFIC_POLICY_ROW, "Local"),
    (table.EXTERNAL_TRAFFIC_POLICY_ROW, "cluster"),
    (table.DISABLE_MANAGED_DATAPLANE_ROW, "true"),
    (table.DISABLE_MANAGED_DATAPLANE_ROW, "FALSE"),
    (table.NODEPORT_ROW, '{"udp":31000}'),
    (table.NODEPORT_ROW, '"udp": 30000'),  # Go adds the braces; the webhook refused it before
    (table.NODEPORT_ROW, ' {"udp": 32767, "tcp": 30001} '),
    (table.TARGETPORT_ROW, '{"tcp":44321}'),
    (table.TARGETPORT_ROW, '"udp":1,"tcp":65535'),
    (table.DISABLE_HEALTH_CHECK_EXPOSE_ROW, "true"),
    (table.DISABLE_HEALTH_CHECK_EXPOSE_ROW, "false"),
    (table.DISABLE_SESSION_AFFINITY_ROW, "true"),
    (table.DISABLE_SESSION_AFFINITY_ROW, "false"),
    (table.RELAY_ADDRESS_DISCOVERY_ROW, "true"),
    (table.RELAY_ADDRESS_DISCOVERY_ROW, "False"),
    (table.HEALTH_CHECK_PORT_ROW, "9086"),
    (table.HEALTH_CHECK_PORT_ROW, "1"),
    (table.HEALTH_CHECK_PORT_ROW, "65535"),
    (table.METRICS_PORT_ROW, "9080"),
    (table.METRICS_PORT_ROW, "65535"),
    (table.RELAY_STUN_SERVER_ROW, "stun.example.org:3478"),
    (table.RELAY_STUN_SERVER_ROW, "192.0.2.1:19302"),
    (table.RELAY_STUN_SERVER_ROW, "[2001:db8::1]:3478"),
    (table.RELAY_ADDRESS_FAMILY_ROW, "IPv6"),
    (table.RELAY_ADDRESS_FAMILY_ROW, "dualstack"),
    (table.RELAY_ADDRESS_FAMILY_ROW, "IPV4"),
]

REFUSED: list[tuple[Annotation[Any], str]] = [
    (table.SERVICE_TYPE_ROW, "ExternalName"),  # render made one before; the API refuses it
    (table.SERVICE_TYPE_ROW, "nodeport"),  # case-sensitive, as Go matches it
    (table.SERVICE_TYPE_ROW, ""),
    (table.MIXED_PROTOCOL_LB_ROW, "yes"),
    (table.EXTERNAL_TRAFFIC_POLICY_ROW, "Global"),
    (table.DISABLE_MANAGED_DATAPLANE_ROW, "1"),
    (table.NODEPORT_ROW, "udp:31000"),
    (table.NODEPORT_ROW, '{"udp":80}'),  # render wrote it before; the API refuses the Service
    (table.NODEPORT_ROW, '{"udp":31000,"tcp":"31001"}'),
    (table.NODEPORT_ROW, '{"udp":31000.0}'),
    (table.NODEPORT_ROW, '["udp",31000]'),
    (table.TARGETPORT_ROW, '{"tcp":0}'),
    (table.TARGETPORT_ROW, '{"tcp":true}'),
    (table.TARGETPORT_ROW, "{"),
    (table.DISABLE_HEALTH_CHECK_EXPOSE_ROW, "no"),
    (table.DISABLE_SESSION_AFFINITY_ROW, "none"),
    (table.RELAY_ADDRESS_DISCOVERY_ROW, "on"),
    (table.HEALTH_CHECK_PORT_ROW, "0"),
    (table.HEALTH_CHECK_PORT_ROW, "65536"),
    (table.HEALTH_CHECK_PORT_ROW, "http://:9086"),
    (table.METRICS_PORT_ROW, "-1"),
    (table.METRICS_PORT_ROW, "9080.0"),
    (table.METRICS_PORT_ROW, "\u0669"),  # an Arabic-Indic digit: isdigit, not a port
    (table.RELAY_STUN_SERVER_ROW, "stun.example.org"),  # no port
    (table.RELAY_STUN_SERVER_ROW, "2001:db8::1:3478"),  # IPv6 without brackets
    (table.RELAY_STUN_SERVER_ROW, "stun.example.org:0"),
    (table.RELAY_STUN_SERVER_ROW, "stun_server:3478"),
    (table.RELAY_ADDRESS_FAMILY_ROW, "v6"),
    (table.RELAY_ADDRESS_FAMILY_ROW, "dual"),
    (table.RELAY_ADDRESS_FAMILY_ROW, ""),
]


def _id(case: tuple[Annotation[Any], str]) -> str:
    return f"{case[0].key.removeprefix('stunner.l7mp.io/')}={case[1]}"


def test_every_row_is_tested_and_seen() -> None:
    keys = {row.key for row in table.TABLE}
    assert {row.key for row, _ in ACCEPTED} == keys == {row.key for row, _ in REFUSED}
    assert set(SEEN) == keys


@pytest.mark.parametrize("row", table.TABLE, ids=lambda row: row.key)
def test_no_annotation_renders_the_default(row: Annotation[Any]) -> None:
    plan = plan_of(world(annotated_gateway(context(row))))
    assert SEEN[row.key](plan) == row.default
    assert findings(plan) == ()


@pytest.mark.parametrize("case", ACCEPTED, ids=_id)
def test_an_accepted_value_is_admitted_and_honoured(case: tuple[Annotation[Any], str]) -> None:
    row, text = case
    value = row.parse(text, LIMITS)
    assert not isinstance(value, Refused)
    objects = world(annotated_gateway(context(row) | {row.key: text}))
    response = webhook_answer(objects[-1], objects)
    assert response["allowed"], response
    assert warnings(response) == []
    plan = plan_of(objects)
    assert SEEN[row.key](plan) == value
    assert findings(plan) == ()


@pytest.mark.parametrize("case", REFUSED, ids=_id)
def test_a_refused_value_is_refused_once_and_ignored(case: tuple[Annotation[Any], str]) -> None:
    row, text = case
    refused = row.parse(text, LIMITS)
    assert isinstance(refused, Refused)
    objects = world(annotated_gateway(context(row) | {row.key: text}))
    path = f'metadata.annotations["{row.key}"]'
    response = webhook_answer(objects[-1], objects)
    assert not response["allowed"]
    assert response["status"]["message"] == f"{path}: {refused.reason}"
    plan = plan_of(objects)
    assert SEEN[row.key](plan) == row.default
    assert findings(plan) == (Finding("Gateway", "stunner", "gw", path, refused.reason, "Invalid"),)


def test_a_refused_value_in_the_gateway_config_is_refused_once_and_ignored() -> None:
    row, text = table.NODEPORT_ROW, '"udp": 80'
    refused = row.parse(text, LIMITS)
    assert isinstance(refused, Refused)
    lb_annotations = {row.key: text} | MIXED | {table.SERVICE_TYPE_ROW.key: "NodePort"}
    config = gateway_config(loadBalancerServiceAnnotations=lb_annotations)
    objects = world(annotated_gateway(MIXED), config)
    path = f'spec.loadBalancerServiceAnnotations["{row.key}"]'
    response = webhook_answer(config, objects)
    assert not response["allowed"]
    assert response["status"]["message"] == f"{path}: {refused.reason}"
    plan = plan_of(objects)  # the class stays valid: the Gateway renders without the nodePort
    assert _service(plan)["spec"]["type"] == "NodePort"
    assert _ports(plan, "nodePort") == {}
    assert plan.findings == (
        Finding("GatewayConfig", "stunner", "config", path, refused.reason, "Invalid"),
    )


def test_the_gateway_config_gives_what_the_gateway_does_not_say() -> None:
    config = gateway_config(
        loadBalancerServiceAnnotations={
            table.SERVICE_TYPE_ROW.key: "ClusterIP",
            table.DISABLE_SESSION_AFFINITY_ROW.key: "true",
        }
    )
    plan = plan_of(world(annotated_gateway({table.SERVICE_TYPE_ROW.key: "NodePort"}), config))
    assert _service(plan)["spec"]["type"] == "NodePort"  # the Gateway's wins
    assert _service(plan)["spec"]["sessionAffinity"] == "None"  # the GatewayConfig's applies


def test_a_gateway_only_row_has_no_effect_in_a_gateway_config() -> None:
    row = table.DISABLE_MANAGED_DATAPLANE_ROW
    assert table.GATEWAY_CONFIG not in row.scope
    config = gateway_config(loadBalancerServiceAnnotations={row.key: "true"})
    objects = world(annotated_gateway(MIXED), config)
    path = f'spec.loadBalancerServiceAnnotations["{row.key}"]'
    response = webhook_answer(config, objects)
    assert response["allowed"]
    assert response["warnings"] == [
        f"{path}: has no effect in a GatewayConfig: it is read from a Gateway only"
    ]
    plan = plan_of(objects)
    assert "stunner/gw" in plan.deployments  # as Go: read from the Gateway's annotations only


def test_a_port_map_naming_no_listener_warns_once_and_keeps_the_others() -> None:
    row = table.NODEPORT_ROW
    objects = world(annotated_gateway(MIXED | {row.key: '{"udp":31000,"ghost":31001}'}))
    path = f'metadata.annotations["{row.key}"]'
    message = "no listener named 'ghost' (listeners: tcp, udp): the entry is ignored"
    response = webhook_answer(objects[-1], objects)
    assert response["allowed"] and response["warnings"] == [f"{path}: {message}"]
    plan = plan_of(objects)
    assert _ports(plan, "nodePort") == {"udp": 31000}
    assert plan.findings == (Finding("Gateway", "stunner", "gw", path, message, "Invalid"),)


def readme_row(row: Annotation[Any]) -> str:
    """The row's line in the documentation's annotation table."""
    default = row.default
    shown = "none" if isinstance(default, Mapping) else str(default).lower()
    shown = shown if not isinstance(default, str) else default or "none"
    scope = " and ".join(
        "the Gateway"
        if kind == table.GATEWAY
        else "its GatewayConfig's `loadBalancerServiceAnnotations`"
        for kind in row.scope
    )
    return f"| `{row.key}` | {row.grammar} | {shown} | {scope} | {row.effect} |"


def test_the_documentation_has_the_table() -> None:
    lines = documentation_text().splitlines()
    assert [line for line in lines if line.startswith("| `stunner.l7mp.io/")] == [
        readme_row(row) for row in table.TABLE
    ]
