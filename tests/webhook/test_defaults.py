"""The mutating hook fills every default the spec documents, with the settings validation uses
(issue 10, fault 5): GatewayConfig logLevel, the Dataplane's fields, and Gateways of the
GatewayClasses of STUNNER_CONTROLLER_NAME (not of the built-in default name)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import jsonpatch
import pytest
from flask.testing import FlaskClient

from tests.support.fakeapi import FakeApiServer
from tests.support.objects import gateway_class
from tests.webhook.conftest import admission_review, answer
from webhook import create_app, settings_from_env
from webhook.kube import KubeLookup


@pytest.fixture
def client(fake: FakeApiServer) -> Iterator[FlaskClient]:
    """The webhook as deployed with STUNNER_CONTROLLER_NAME=example.com/stunner."""
    fake.seed(gateway_class("ours", "example.com/stunner"))
    fake.seed(gateway_class("default-name"))
    lookup = KubeLookup(fake.api_client(), timeout=2.0)
    settings = settings_from_env({"STUNNER_CONTROLLER_NAME": "example.com/stunner"})
    try:
        yield create_app(settings, lookup).test_client()
    finally:
        lookup.close()


def mutated(client: FlaskClient, obj: dict[str, Any]) -> dict[str, Any]:
    response = answer(client, "/mutate", admission_review(obj))
    assert response["allowed"] is True
    if "patch" not in response:
        return obj
    patch = json.loads(base64.b64decode(response["patch"]))
    assert all(op["op"] == "add" for op in patch)
    patched: dict[str, Any] = jsonpatch.apply_patch(obj, patch)
    return patched


def gateway(class_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "gw", "namespace": "stunner"},
        "spec": {
            "gatewayClassName": class_name,
            "listeners": [{"name": "udp", "port": 3478, "protocol": "TURN-UDP"}],
        },
    }


def test_gateways_of_the_configured_controller_are_defaulted(client: FlaskClient) -> None:
    listener = mutated(client, gateway("ours"))["spec"]["listeners"][0]
    assert listener["allowedRoutes"] == {"namespaces": {"from": "Same"}}
    assert mutated(client, gateway("default-name")) == gateway("default-name")


def test_a_gatewayclass_of_ours_gets_its_parameters_group_and_kind(client: FlaskClient) -> None:
    """The spec lets parametersRef's group and kind be omitted; the Gateway API CRD requires
    them, so the hook fills them in (for our controller's classes only)."""
    ref = {"name": "stunner-gatewayconfig", "namespace": "stunner"}
    ours = gateway_class("new", "example.com/stunner")
    ours["spec"]["parametersRef"] = dict(ref)
    assert mutated(client, ours)["spec"]["parametersRef"] == {
        **ref,
        "group": "stunner.l7mp.io",
        "kind": "GatewayConfig",
    }
    theirs = gateway_class("other", "example.com/someone-else")
    theirs["spec"]["parametersRef"] = dict(ref)
    assert mutated(client, theirs) == theirs
    written = gateway_class("set", "example.com/stunner")  # what the user wrote is kept
    written["spec"]["parametersRef"] = {**ref, "group": "stunner.l7mp.io", "kind": "Other"}
    assert mutated(client, written) == written


def test_a_gatewayconfig_gets_the_default_log_level(client: FlaskClient) -> None:
    obj = {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "GatewayConfig",
        "metadata": {"name": "c", "namespace": "stunner"},
        "spec": {"userName": "u", "password": "p"},
    }
    spec = mutated(client, obj)["spec"]
    assert spec["logLevel"] == "all:INFO"
    assert (spec["realm"], spec["authType"], spec["dataplane"]) == (
        "stunner.l7mp.io",
        "static",
        "default",
    )


def test_a_stun_only_gatewayconfig_gets_no_auth_type_and_is_admitted_without_warnings(
    client: FlaskClient,
) -> None:
    """stunMode needs no credentials: a defaulted authType would only be "ignored" (a warning on
    every STUN-only GatewayConfig); what was defaulted passes validation with no warning."""
    obj = {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "GatewayConfig",
        "metadata": {"name": "c", "namespace": "stunner"},
        "spec": {"stunMode": True},
    }
    spec = mutated(client, obj)["spec"]
    assert "authType" not in spec and spec["realm"] == "stunner.l7mp.io"
    response = answer(client, "/validate", admission_review({**obj, "spec": spec}))
    assert response["allowed"] and not response.get("warnings"), response


def test_a_dataplane_gets_its_defaults(client: FlaskClient) -> None:
    obj = {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "Dataplane",
        "metadata": {"name": "default"},
        "spec": {"image": "docker.io/l7mp/stunnerd:1.1.0", "replicas": 2},
    }
    spec = mutated(client, obj)["spec"]
    assert spec["imagePullPolicy"] == "IfNotPresent"
    assert spec["replicas"] == 2  # the user's value stays
    assert spec["terminationGracePeriodSeconds"] == 3600
    assert (spec["disableHealthCheck"], spec["enableMetricsEndpoint"]) == (False, False)
    # What was defaulted passes validation.
    assert answer(client, "/validate", admission_review({**obj, "spec": spec}))["allowed"]
