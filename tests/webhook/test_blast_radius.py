"""A STUNner fault never blocks another controller's Gateways (issue 10, fault 4).

The webhook sees every Gateway of the cluster; it judges one only when it can read the Gateway's
GatewayClass and the class is STUNner's. When the class cannot be read (RBAC 403, an API server
too slow or down) the Gateway is admitted, unjudged and undefaulted, with a warning: it may be
another controller's, and STUNner's reconciler reports problems of its own Gateways in status.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from flask.testing import FlaskClient

from stunner_api.rules import Settings
from tests.support.fakeapi import FakeApiServer
from tests.support.objects import gateway_class
from tests.webhook.conftest import admission_review, answer
from webhook import create_app
from webhook.kube import KubeLookup

# Invalid for STUNner (port 0): judged, it would be refused.
GATEWAY: dict[str, Any] = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "Gateway",
    "metadata": {"name": "web", "namespace": "shop"},
    "spec": {
        "gatewayClassName": "istio",
        "listeners": [{"name": "http", "port": 0, "protocol": "HTTP"}],
    },
}


@pytest.fixture
def impatient_client(fake: FakeApiServer) -> Iterator[FlaskClient]:
    lookup = KubeLookup(fake.api_client(), timeout=0.3)
    app = create_app(Settings(), lookup)
    try:
        yield app.test_client()
    finally:
        lookup.close()


def assert_admitted_unjudged(client: FlaskClient) -> None:
    response = answer(client, "/validate", admission_review(GATEWAY))
    assert response["allowed"] is True, response
    [warning] = response["warnings"]
    assert warning.startswith(
        "spec.gatewayClassName: the STUNner webhook could not read GatewayClass 'istio' ("
    )
    assert warning.endswith(
        "), so it did not check this Gateway: if STUNner manages it, STUNner reports any "
        "problem in its status"
    )
    mutated = answer(client, "/mutate", admission_review(GATEWAY))
    assert mutated["allowed"] is True and "patch" not in mutated


def test_a_gatewayclass_the_webhook_may_not_read(
    kube_client: FlaskClient, fake: FakeApiServer
) -> None:
    fake.forbid("gateway.networking.k8s.io", "gatewayclasses")
    assert_admitted_unjudged(kube_client)


def test_an_api_server_too_slow_to_answer(
    impatient_client: FlaskClient, fake: FakeApiServer
) -> None:
    fake.delay = 1.0
    assert_admitted_unjudged(impatient_client)


def test_an_api_server_that_fails(kube_client: FlaskClient, fake: FakeApiServer) -> None:
    fake.fail_status = 500
    assert_admitted_unjudged(kube_client)


def test_a_readable_class_of_another_controller_is_left_alone(
    kube_client: FlaskClient, fake: FakeApiServer
) -> None:
    fake.seed(gateway_class("istio", "istio.io/gateway-controller"))
    response = answer(kube_client, "/validate", admission_review(GATEWAY))
    assert response == {"uid": response["uid"], "allowed": True}


def test_stunners_own_gateways_are_still_judged(
    kube_client: FlaskClient, fake: FakeApiServer
) -> None:
    fake.seed(gateway_class("istio"))
    response = answer(kube_client, "/validate", admission_review(GATEWAY))
    assert response["allowed"] is False
    assert (
        "spec.listeners[0].port: must be between 1 and 65535, got 0"
        in (response["status"]["message"])
    )
