"""Every served version of every kind is judged (issue 10, fault 2).

Registered with `apiVersions: ["*"]`, the webhook gets each object in the version it was sent
in. A Gateway API v1 UDPRoute (standard channel since Gateway API v1.6) whose backend is a
ConfigMap was admitted because only v1alpha2 was judged. Here an invalid object of each kind is
refused in every version the vocabulary lists, and in a version it does not list yet.
"""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient

from stunner_api.vocabulary import GATEWAY_API_UDP_ROUTE, JUDGED_KINDS, KindInfo, api_version
from tests.support.fakeapi import FakeApiServer
from tests.support.objects import gateway, gateway_class
from tests.webhook.conftest import admission_review, answer

# kind -> (an invalid spec, the field the refusal names)
INVALID: dict[str, tuple[dict[str, Any], str]] = {
    "GatewayClass": ({"controllerName": "stunner.l7mp.io/gateway-operator"}, "spec.parametersRef"),
    "Gateway": (
        {
            "gatewayClassName": "stunner-gatewayclass",
            "listeners": [{"name": "udp", "port": 0, "protocol": "TURN-UDP"}],
        },
        "spec.listeners[0].port",
    ),
    "UDPRoute": (
        {
            "parentRefs": [{"name": "udp-gateway"}],
            "rules": [{"backendRefs": [{"name": "cm", "kind": "ConfigMap", "port": 1}]}],
        },
        "spec.rules[0].backendRefs[0]",
    ),
    "TCPRoute": (
        {
            "parentRefs": [{"name": "udp-gateway"}],
            "rules": [{"backendRefs": [{"name": "svc"}]}],  # a Service without its port
        },
        "spec.rules[0].backendRefs[0].port",
    ),
    "GatewayConfig": ({"realm": "Not A Realm"}, "spec.realm"),
    "Dataplane": (
        {"image": "l7mp/stunnerd", "imagePullPolicy": "Sometimes"},
        "spec.imagePullPolicy",
    ),
    "StaticService": ({"prefixes": ["10.0.0.0/33"]}, "spec.prefixes[0]"),
}

CASES = [
    (info, version)
    for info in JUDGED_KINDS
    for version in (*info.versions, "v9")  # v9: a version served later, judged all the same
]


def obj_of(info: KindInfo, version: str) -> dict[str, Any]:
    metadata = {"name": "x", "namespace": "stunner"} if info.namespaced else {"name": "x"}
    return {
        "apiVersion": api_version(info.group, version),
        "kind": info.kind,
        "metadata": metadata,
        "spec": INVALID[info.kind][0],
    }


def test_the_gateway_api_udproute_is_served_at_v1() -> None:
    versions = {
        api_version(i.group, v) for i in JUDGED_KINDS if i.kind == "UDPRoute" for v in i.versions
    }
    assert "gateway.networking.k8s.io/v1" in versions
    assert "gateway.networking.k8s.io/v1alpha2" in versions


@pytest.mark.parametrize(
    ("info", "version"), CASES, ids=[f"{i.group or 'core'}/{v}/{i.kind}" for i, v in CASES]
)
def test_an_invalid_object_is_refused_in_every_version(
    kube_client: FlaskClient, fake: FakeApiServer, info: KindInfo, version: str
) -> None:
    fake.seed(gateway_class("stunner-gatewayclass"))
    fake.seed(gateway("udp-gateway", "stunner-gatewayclass"))
    response = answer(kube_client, "/validate", admission_review(obj_of(info, version)))
    assert response["allowed"] is False, response
    assert response["status"]["message"].startswith(INVALID[info.kind][1] + ": ")


def test_a_v1_udproute_needs_a_port_for_a_service(
    kube_client: FlaskClient, fake: FakeApiServer
) -> None:
    fake.seed(gateway_class("stunner-gatewayclass"))
    fake.seed(gateway("gw", "stunner-gatewayclass"))
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "UDPRoute",
        "metadata": {"name": "r", "namespace": "stunner"},
        "spec": {"parentRefs": [{"name": "gw"}], "rules": [{"backendRefs": [{"name": "svc"}]}]},
    }
    response = answer(kube_client, "/validate", admission_review(route))
    assert response["status"]["message"] == (
        "spec.rules[0].backendRefs[0].port: required by gateway.networking.k8s.io/v1 for a "
        "Service (any port: STUNner ignores it), or use apiVersion stunner.l7mp.io/v1"
    )


def test_another_controllers_udproute_is_not_judged(
    kube_client: FlaskClient, fake: FakeApiServer
) -> None:
    """A UDPRoute of another controller's Gateway may name any backend (its controller's
    business); through a STUNner Gateway the same route is refused."""
    fake.seed(gateway_class("envoy", controller="example.com/envoy"))
    fake.seed(gateway("envoy-gw", "envoy"))
    fake.seed(gateway_class("stunner-gatewayclass"))
    fake.seed(gateway("udp-gateway", "stunner-gatewayclass"))
    route = obj_of(GATEWAY_API_UDP_ROUTE, "v1")
    route["spec"] = {**route["spec"], "parentRefs": [{"name": "envoy-gw"}]}
    assert answer(kube_client, "/validate", admission_review(route))["allowed"] is True
    route["spec"] = {**route["spec"], "parentRefs": [{"name": "udp-gateway"}]}
    assert answer(kube_client, "/validate", admission_review(route))["allowed"] is False
