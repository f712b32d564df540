"""The resource models of stunner_api.resources.

We test these aspects:
- Every example resource of GATEWAY-REFERENCE.md parses into its model and round-trips to the
  very same dict (defaults do not leak into the output).
- Unknown fields are kept at every level, so a patched-back object loses nothing.
- Defaults and camelCase aliases are the documented ones; snake_case names are accepted too.
- parse_resource dispatches on apiVersion/kind and names an unknown kind in its ValueError.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from stunner_api.resources import (
    KINDS,
    Dataplane,
    Gateway,
    GatewayClass,
    GatewayConfig,
    StaticService,
    UDPRoute,
    parse_resource,
)
from stunner_api.vocabulary import group_of

EXAMPLES = sorted((Path(__file__).parents[1] / "data" / "resources").glob("*.yaml"))


def load(path: Path) -> dict[str, Any]:
    obj = yaml.safe_load(path.read_text())
    assert isinstance(obj, dict)
    return obj


def test_every_kind_of_the_reference_has_an_example() -> None:
    kinds = {load(p)["kind"] for p in EXAMPLES}
    assert kinds == {k for _, k in KINDS}
    assert len(EXAMPLES) == 12  # with our TCPRoute (not in the reference)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_parse_and_round_trip(path: Path) -> None:
    obj = load(path)
    resource = parse_resource(obj)
    assert type(resource) is KINDS[obj["apiVersion"], obj["kind"]]
    assert resource.to_dict() == obj


@pytest.mark.parametrize(
    ("api_version", "kind", "model"),
    [
        ("gateway.networking.k8s.io/v1", "GatewayClass", GatewayClass),
        ("gateway.networking.k8s.io/v1beta1", "Gateway", Gateway),
        ("gateway.networking.k8s.io/v1alpha2", "UDPRoute", UDPRoute),
        ("stunner.l7mp.io/v1", "UDPRoute", UDPRoute),
        ("stunner.l7mp.io/v1", "GatewayConfig", GatewayConfig),
        ("stunner.l7mp.io/v1alpha1", "GatewayConfig", GatewayConfig),
        ("stunner.l7mp.io/v1", "StaticService", StaticService),
        ("stunner.l7mp.io/v1", "Dataplane", Dataplane),
    ],
)
def test_kinds_table(api_version: str, kind: str, model: type) -> None:
    assert KINDS[api_version, kind] is model


@pytest.mark.parametrize(
    ("obj", "needle"),
    [
        ({"apiVersion": "v1", "kind": "Secret"}, "unknown kind 'Secret' of apiVersion 'v1'"),
        ({"apiVersion": "stunner.l7mp.io/v1", "kind": "Gateway"}, "unknown kind 'Gateway'"),
        ({}, "unknown kind None of apiVersion None"),
    ],
)
def test_unknown_kinds_are_refused_by_name(obj: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match="unknown kind") as info:
        parse_resource(obj)
    assert needle in str(info.value)
    assert "GatewayConfig (stunner.l7mp.io/v1)" in str(info.value)


def test_unknown_fields_are_kept_at_every_level() -> None:
    obj = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "gw", "namespace": "stunner", "uid": "1234", "generation": 3},
        "spec": {
            "gatewayClassName": "stunner-gatewayclass",
            "infrastructure": {"labels": {"a": "b"}},
            "listeners": [
                {
                    "name": "l",
                    "port": 3478,
                    "protocol": "TURN-UDP",
                    "futureField": [1, 2],
                    "tls": {"certificateRefs": [{"name": "s", "x-extra": True}]},
                }
            ],
        },
        "status": {"conditions": [{"type": "Accepted", "status": "True"}]},
    }
    gateway = parse_resource(copy.deepcopy(obj))
    assert gateway.to_dict() == obj
    assert isinstance(gateway, Gateway)
    assert gateway.spec.listeners[0].model_extra == {"futureField": [1, 2]}


def test_defaults_and_aliases() -> None:
    config = parse_resource(
        {"apiVersion": "stunner.l7mp.io/v1", "kind": "GatewayConfig", "metadata": {"name": "c"}}
    )
    assert isinstance(config, GatewayConfig)
    spec = config.spec
    assert (spec.realm, spec.auth_type, spec.dataplane, spec.log_level) == (
        "stunner.l7mp.io",
        "static",
        "default",
        "all:INFO",
    )
    assert spec.auth_ref is None and spec.load_balancer_service_annotations == {}
    assert config.to_dict() == {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "GatewayConfig",
        "metadata": {"name": "c"},
    }

    gateway = Gateway.model_validate(
        {
            "api_version": "gateway.networking.k8s.io/v1",  # snake_case accepted too
            "kind": "Gateway",
            "spec": {
                "gatewayClassName": "c",
                "listeners": [{"name": "t", "port": 443, "protocol": "TURN-TLS", "tls": {}}],
                "addresses": [{"value": "1.2.3.4"}],
            },
        }
    )
    listener = gateway.spec.listeners[0]
    assert listener.tls is not None and listener.tls.mode == "Terminate"
    assert listener.allowed_routes.namespaces.from_ == "Same"
    assert gateway.spec.addresses[0].type == "IPAddress"
    assert gateway.to_dict()["apiVersion"] == "gateway.networking.k8s.io/v1"

    route = UDPRoute.model_validate(
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "UDPRoute",
            "spec": {
                "parentRefs": [{"name": "gw"}],
                "rules": [{"backendRefs": [{"name": "svc", "port": 1, "endPort": 9}]}],
            },
        }
    )
    parent, backend = route.spec.parent_refs[0], route.spec.rules[0].backend_refs[0]
    assert (parent.group, parent.kind) == ("gateway.networking.k8s.io", "Gateway")
    assert (backend.group, backend.kind, backend.port, backend.end_port) == ("", "Service", 1, 9)
    assert route.to_dict()["spec"]["rules"][0]["backendRefs"][0]["endPort"] == 9


def test_malformed_objects_raise_validation_errors() -> None:
    with pytest.raises(ValidationError, match="listeners"):
        parse_resource(
            {
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "Gateway",
                "spec": {"gatewayClassName": "c", "listeners": "nope"},
            }
        )


@pytest.mark.parametrize(
    ("api_version", "group"),
    [("v1", ""), ("stunner.l7mp.io/v1", "stunner.l7mp.io"), ("a.b/c/v1", "a.b/c")],
)
def test_group_of(api_version: str, group: str) -> None:
    assert group_of(api_version) == group
