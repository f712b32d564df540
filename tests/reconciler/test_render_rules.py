"""One table row per render rule (ANCHORS §2.3, §2.4, §2.6, §2.7), on a small world.

`world()` is a GatewayClass of ours, its GatewayConfig (inline static auth), the default
Dataplane and Gateway stunner/gw with one UDP listener; each test changes what it is about.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from reconciler.render import Plan, RenderSettings, addresses, render
from reconciler.store import Snapshot
from stunnerd.transport.certificates import self_signed_certificate
from tests.reconciler import clusterkit as k
from tests.reconciler.clusterkit import Obj, dataplane, gateway_config, listener
from tests.support.objects import secret

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def gateway_class(name: str = "stunner", controller: str = k.CONTROLLER) -> Obj:
    obj = k.gateway_class(name, controller)
    obj["metadata"]["generation"] = 1
    return obj


def gateway(*listeners: Obj, name: str = "gw", namespace: str = "stunner", **meta: Any) -> Obj:
    return k.gateway(*listeners, name=name, **({"namespace": namespace, "generation": 1} | meta))


def route(
    *backends: Obj,
    name: str = "route",
    namespace: str = "stunner",
    parents: list[Obj] | None = None,
    api_version: str = "stunner.l7mp.io/v1",
    rules: list[Obj] | None = None,
) -> Obj:
    return {
        "apiVersion": api_version,
        "kind": "UDPRoute",
        "metadata": {"name": name, "namespace": namespace, "generation": 4},
        "spec": {
            "parentRefs": parents
            if parents is not None
            else [{"name": "gw", "namespace": "stunner"}],
            "rules": rules if rules is not None else [{"backendRefs": list(backends)}],
        },
    }


def service(
    name: str = "media",
    namespace: str = "stunner",
    cluster_ip: str = "10.96.0.1",
    ports: list[Obj] | None = None,
) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterIP": cluster_ip, "ports": ports or [{"port": 9000, "protocol": "UDP"}]},
    }


def endpoint_slice(
    service_name: str = "media",
    namespace: str = "stunner",
    endpoints: list[Obj] | None = None,
    address_type: str = "IPv4",
    name: str | None = None,
) -> Obj:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name or f"{service_name}-1",
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": service_name},
        },
        "addressType": address_type,
        "endpoints": endpoints or [],
    }


def namespace(name: str, **labels: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def grant(namespace_: str, from_namespace: str, from_kind: str = "UDPRoute", **to: str) -> Obj:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1beta1",
        "kind": "ReferenceGrant",
        "metadata": {"name": f"grant-{from_namespace}", "namespace": namespace_},
        "spec": {
            "from": [
                {
                    "group": "stunner.l7mp.io"
                    if from_kind == "UDPRoute"
                    else "gateway.networking.k8s.io",
                    "kind": from_kind,
                    "namespace": from_namespace,
                }
            ],
            "to": [{"group": "", "kind": "Service"} | to],
        },
    }


def world(*objects: Obj, base: tuple[Obj, ...] | None = None) -> list[Obj]:
    """The base hierarchy plus objects; an object of the same kind and name replaces its base."""
    base_objects = base if base is not None else (gateway_class(), gateway_config(), dataplane())
    out = [copy.deepcopy(o) for o in base_objects]
    has_gateway = any(o["kind"] == "Gateway" for o in objects)
    return out + ([] if has_gateway else [gateway()]) + list(objects)


def plan_of(*objects: Obj, settings: RenderSettings | None = None, **kw: Any) -> Plan:
    return render(Snapshot.from_objects(world(*objects, **kw)), settings or RenderSettings(), NOW)


def conditions(status: Mapping[str, Any] | None) -> dict[str, tuple[str, str]]:
    assert status is not None
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def listener_conditions(plan: Plan, name: str, gw: str = "gw") -> dict[str, tuple[str, str]]:
    status = plan.status_of("Gateway", "stunner", gw)
    assert status is not None
    entry = next(e for e in status["listeners"] if e["name"] == name)
    return conditions(entry)


def parent_conditions(plan: Plan, name: str = "route", ns: str = "stunner") -> list[dict[str, Any]]:
    status = plan.status_of("UDPRoute", ns, name)
    assert status is not None
    return [
        {
            "parent": p["parentRef"]["name"],
            **{c["type"]: (c["status"], c["reason"]) for c in p["conditions"]},
        }
        for p in status["parents"]
    ]


def cluster(plan: Plan, name: str = "stunner/route", gw: str = "stunner/gw") -> Any:
    found = plan.configs[gw].cluster(name)
    assert found is not None
    return found


def tls_pair() -> tuple[bytes, bytes]:
    """A fresh PEM certificate and key."""
    cert, key = self_signed_certificate("turn.example.com")
    return base64.b64decode(cert), base64.b64decode(key)


def tls_listener(name: str = "tls", secret_name: str = "cert", **ref: str) -> Obj:
    return listener(
        name,
        443,
        "TURN-TLS",
        tls={
            "mode": "Terminate",
            "certificateRefs": [{"kind": "Secret", "name": secret_name} | ref],
        },
    )


# --- the dataplane config (§2.3) --------------------------------------------------------------


def test_config_id_admin_name_and_listener_names() -> None:
    plan = plan_of()
    config = plan.configs["stunner/gw"]
    assert config.admin.name == "stunner/gw"
    assert config.admin.loglevel == "all:INFO"
    assert config.admin.healthcheck_endpoint == "http://:8086"
    assert config.admin.metrics_endpoint == ""
    assert [(lst.name, lst.address, lst.port) for lst in config.listeners] == [
        ("stunner/gw/udp", "$STUNNER_ADDR", 3478)
    ]


def test_admin_follows_the_gateway_config_and_dataplane() -> None:
    plan = plan_of(
        gateway_config(logLevel="all:DEBUG", userQuota=10),
        dataplane(disableHealthCheck=True, enableMetricsEndpoint=True, offloadEngine="XDP"),
    )
    admin = plan.configs["stunner/gw"].admin
    assert (admin.loglevel, admin.user_quota) == ("all:DEBUG", 10)
    assert admin.healthcheck_endpoint == ""
    assert admin.metrics_endpoint == "http://:8080/metrics"
    assert admin.offload_engine == "XDP"


@pytest.mark.parametrize(
    ("spec", "objects", "auth"),
    [
        ({}, [], ("static", {"username": "user", "password": "pass-word"})),
        (
            {"authType": "longterm", "sharedSecret": "s3cr3t"},
            [],
            ("ephemeral", {"secret": "s3cr3t"}),
        ),
        (
            {"authRef": {"name": "auth"}},
            [secret("auth", type=b"ephemeral", secret=b"from-secret")],
            ("ephemeral", {"secret": "from-secret"}),
        ),
        (
            {"authRef": {"name": "auth"}},
            [secret("auth", username=b"u2", password=b"p2")],
            ("static", {"username": "u2", "password": "p2"}),
        ),
    ],
    ids=["inline-static", "inline-longterm", "authref-ephemeral", "authref-static-default"],
)
def test_auth_from_inline_fields_or_the_auth_ref_secret(
    spec: Obj, objects: list[Obj], auth: tuple[str, dict[str, str]]
) -> None:
    config_spec = {"realm": "example.org"} | spec
    base = gateway_config(**config_spec)
    if "authRef" in spec:
        for key in ("authType", "userName", "password"):
            base["spec"].pop(key)
    plan = plan_of(*objects, base=(gateway_class(), base, dataplane()))
    rendered = plan.configs["stunner/gw"].auth
    assert (rendered.type, rendered.credentials) == auth
    assert rendered.realm == "example.org"


@pytest.mark.parametrize(
    "spec",
    [
        {"stunMode": True},  # the world's inline static credentials are ignored
        {"stunMode": True, "authType": None, "userName": None, "password": None},
        {"stunMode": True, "authType": None, "authRef": {"name": "gone"}},  # not even read
    ],
    ids=["with-credentials", "without-credentials", "authref-secret-missing"],
)
def test_stun_mode_renders_auth_type_none_without_credentials(spec: Obj) -> None:
    base = gateway_config(realm="example.org")
    base["spec"] |= spec
    base["spec"] = {k: v for k, v in base["spec"].items() if v is not None}
    plan = plan_of(base=(gateway_class(), base, dataplane()))
    config = plan.configs["stunner/gw"]
    # Go's wire form: stunnerd (Go's or ours) runs a pure STUN server on auth type none.
    assert config.to_dict()["auth"] == {"type": "none", "realm": "example.org", "credentials": {}}
    assert config.auth.stun_only
    assert conditions(plan.status_of("GatewayClass", "", "stunner")) == {
        "Accepted": ("True", "Accepted")
    }
    assert conditions(plan.status_of("Gateway", "stunner", "gw"))["Accepted"][0] == "True"


def test_stun_mode_false_renders_the_credentials() -> None:
    base = gateway_config(stunMode=False)
    plan = plan_of(base=(gateway_class(), base, dataplane()))
    assert plan.configs["stunner/gw"].auth.type == "static"


def test_routes_attach_by_allowed_routes_same_all_and_selector() -> None:
    listeners = [
        listener("same", 3478),
        listener("all", 3479, allowedRoutes={"namespaces": {"from": "All"}}),
        listener(
            "selector",
            3480,
            allowedRoutes={
                "namespaces": {"from": "Selector", "selector": {"matchLabels": {"team": "a"}}}
            },
        ),
    ]
    local = route(name="local")
    team_a = route(name="team-a", namespace="team-a")
    other = route(name="other", namespace="other")
    plan = plan_of(
        gateway(*listeners),
        namespace("team-a", team="a"),
        namespace("other"),
        local,
        team_a,
        other,
    )
    routes = {lst.name: lst.routes for lst in plan.configs["stunner/gw"].listeners}
    assert routes == {
        "stunner/gw/same": ["stunner/local"],
        "stunner/gw/all": ["other/other", "stunner/local", "team-a/team-a"],
        "stunner/gw/selector": ["team-a/team-a"],
    }


def test_a_route_no_listener_allows_is_not_allowed_by_listeners() -> None:
    plan = plan_of(route({"name": "gone"}, namespace="elsewhere"))
    parent = parent_conditions(plan, ns="elsewhere")[0]
    assert parent["Accepted"] == ("False", "NotAllowedByListeners")
    assert parent["ResolvedRefs"] == ("False", "BackendNotFound")  # said even when not attached
    assert plan.configs["stunner/gw"].clusters == []


def test_section_name_picks_one_listener_and_an_unknown_one_matches_no_parent() -> None:
    plan = plan_of(
        gateway(listener("a", 3478), listener("b", 3479)),
        route(name="to-b", parents=[{"name": "gw", "sectionName": "b"}]),
        route(name="to-c", parents=[{"name": "gw", "sectionName": "c"}]),
    )
    routes = {lst.name: lst.routes for lst in plan.configs["stunner/gw"].listeners}
    assert routes == {"stunner/gw/a": [], "stunner/gw/b": ["stunner/to-b"]}
    assert parent_conditions(plan, "to-c")[0]["Accepted"] == ("False", "NoMatchingParent")


def test_a_route_to_a_missing_gateway_matches_no_parent_and_others_gateways_are_not_ours() -> None:
    foreign = gateway(name="foreign")
    foreign["spec"]["gatewayClassName"] = "someone-else"
    plan = plan_of(
        gateway(),
        foreign,
        gateway_class("someone-else", "example.com/other"),
        route(parents=[{"name": "missing"}, {"name": "foreign"}, {"name": "gw"}]),
    )
    assert [(p["parent"], p["Accepted"]) for p in parent_conditions(plan)] == [
        ("missing", ("False", "NoMatchingParent")),
        ("gw", ("True", "Accepted")),
    ]
    assert plan.status_of("GatewayClass", "", "someone-else") is None
    assert "stunner/foreign" not in plan.configs


def test_only_the_first_rule_is_rendered() -> None:
    rules = [
        {"backendRefs": [{"name": "media"}]},
        {"backendRefs": [{"name": "second"}]},
    ]
    plan = plan_of(
        route(rules=rules),
        service(),
        service("second", cluster_ip="10.96.0.2"),
    )
    assert cluster(plan).endpoints == ["10.96.0.1"]


def test_every_endpoint_slice_address_ready_or_not_plus_the_cluster_ip() -> None:
    plan = plan_of(
        route({"name": "media"}),
        service(),
        endpoint_slice(
            endpoints=[
                {"addresses": ["10.244.0.1"], "conditions": {"ready": True}},
                {"addresses": ["10.244.0.2"], "conditions": {"ready": False, "terminating": True}},
                {"addresses": ["10.244.0.3"], "conditions": {"ready": False, "serving": False}},
            ]
        ),
        endpoint_slice(
            name="media-2",
            address_type="IPv6",
            endpoints=[{"addresses": ["fd00::5"]}],
        ),
        endpoint_slice(name="media-fqdn", address_type="FQDN", endpoints=[{"addresses": ["a.b"]}]),
    )
    assert cluster(plan).endpoints == sorted(
        ["10.244.0.1", "10.244.0.2", "10.244.0.3", "fd00::5", "10.96.0.1"]
    )
    assert cluster(plan).type == "STATIC"


def test_a_headless_service_contributes_its_endpoints_only() -> None:
    plan = plan_of(
        route({"name": "media"}),
        service(cluster_ip="None"),
        endpoint_slice(endpoints=[{"addresses": ["10.244.0.1"]}]),
    )
    assert cluster(plan).endpoints == ["10.244.0.1"]


@pytest.mark.parametrize(
    ("ref", "suffix"),
    [({}, ""), ({"port": 5000}, ":<5000-5000>"), ({"port": 5000, "endPort": 5100}, ":<5000-5100>")],
    ids=["all-ports", "one-port", "range"],
)
def test_the_port_range_suffix(ref: Obj, suffix: str) -> None:
    plan = plan_of(route({"name": "media"} | ref), service())
    assert cluster(plan).endpoints == [f"10.96.0.1{suffix}"]


def test_static_service_prefixes_with_the_port_suffix() -> None:
    static = {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "StaticService",
        "metadata": {"name": "static", "namespace": "stunner"},
        "spec": {"prefixes": ["192.0.2.0/24", "198.51.100.7"]},
    }
    ref = {"group": "stunner.l7mp.io", "kind": "StaticService", "name": "static"}
    assert cluster(plan_of(route(ref), static)).endpoints == ["192.0.2.0/24", "198.51.100.7"]
    ranged = cluster(plan_of(route(ref | {"port": 1, "endPort": 2}), static)).endpoints
    assert ranged == ["192.0.2.0/24:<1-2>", "198.51.100.7:<1-2>"]


def test_strict_dns_when_endpoint_discovery_is_off() -> None:
    settings = RenderSettings(endpoint_discovery=False)
    plan = plan_of(route({"name": "media", "port": 9000}), service(), settings=settings)
    assert (cluster(plan).type, cluster(plan).endpoints) == (
        "STRICT_DNS",
        ["media.stunner.svc.cluster.local"],
    )


def test_a_cross_namespace_backend_needs_a_reference_grant() -> None:
    backend = {"name": "media", "namespace": "media-ns"}
    denied = plan_of(route(backend), service(namespace="media-ns"))
    assert cluster(denied).endpoints == []
    assert parent_conditions(denied)[0]["ResolvedRefs"] == ("False", "RefNotPermitted")
    granted = plan_of(route(backend), service(namespace="media-ns"), grant("media-ns", "stunner"))
    assert cluster(granted).endpoints == ["10.96.0.1"]
    assert parent_conditions(granted)[0]["ResolvedRefs"] == ("True", "ResolvedRefs")
    named = grant("media-ns", "stunner", name="other")
    assert cluster(plan_of(route(backend), service(namespace="media-ns"), named)).endpoints == []


def test_a_tcp_backend_renders_a_tcp_cluster() -> None:
    tcp = service(ports=[{"port": 7000, "protocol": "TCP"}])
    assert cluster(plan_of(route({"name": "media", "port": 7000}), tcp)).protocol == "TCP"
    assert cluster(plan_of(route({"name": "media", "port": 9000}), service())).protocol == "UDP"
    assert cluster(plan_of(route({"name": "media"}), tcp)).protocol == "UDP"  # every port


@pytest.mark.parametrize(
    ("backend", "objects", "reason"),
    [
        ({"name": "nowhere"}, [], "BackendNotFound"),
        ({"group": "example.com", "kind": "Thing", "name": "x"}, [], "InvalidKind"),
    ],
)
def test_a_bad_backend_is_reported_and_the_rest_renders(
    backend: Obj, objects: list[Obj], reason: str
) -> None:
    plan = plan_of(route({"name": "media"}, backend), service(), *objects)
    assert cluster(plan).endpoints == ["10.96.0.1"]
    assert parent_conditions(plan)[0]["ResolvedRefs"] == ("False", reason)
    assert any(f.kind == "UDPRoute" and f.reason == reason for f in plan.findings)


def test_a_masked_gateway_api_route_is_pending() -> None:
    gwapi = route({"name": "second"}, api_version="gateway.networking.k8s.io/v1alpha2")
    plan = plan_of(
        route({"name": "media"}), gwapi, service(), service("second", cluster_ip="10.96.0.2")
    )
    assert cluster(plan).endpoints == ["10.96.0.1"]
    statuses = [s for s in plan.statuses if s.kind == "UDPRoute"]
    by_version = {s.api_version: s.status["parents"][0]["conditions"][0] for s in statuses}
    assert by_version["stunner.l7mp.io/v1"]["reason"] == "Accepted"
    masked = by_version["gateway.networking.k8s.io/v1alpha2"]
    assert (masked["status"], masked["reason"]) == ("False", "Pending")
    assert masked["message"] == "GwAPI.v1 UDPRoute masked by a STUNnerV1 UDPRoute"


def test_a_gateway_api_route_alone_renders_without_its_port() -> None:
    gwapi = route({"name": "media", "port": 1}, api_version="gateway.networking.k8s.io/v1alpha2")
    assert cluster(plan_of(gwapi, service())).endpoints == ["10.96.0.1"]


# --- listeners: certificates and conflicts ----------------------------------------------------


def test_a_tls_listener_carries_its_certificate_base64() -> None:
    cert, key = tls_pair()
    plan = plan_of(
        gateway(tls_listener()),
        secret("cert", "kubernetes.io/tls", **{"tls.crt": cert, "tls.key": key}),
    )
    rendered = plan.configs["stunner/gw"].listeners[0]
    assert base64.b64decode(rendered.cert) == cert and base64.b64decode(rendered.key) == key
    assert listener_conditions(plan, "tls")["ResolvedRefs"] == ("True", "ResolvedRefs")


def test_a_tls_secret_written_with_string_data() -> None:
    cert, key = tls_pair()
    written = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "cert", "namespace": "stunner"},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": cert.decode(), "tls.key": key.decode()},
    }
    rendered = plan_of(gateway(tls_listener()), written).configs["stunner/gw"].listeners[0]
    assert base64.b64decode(rendered.cert) == cert and base64.b64decode(rendered.key) == key


@pytest.mark.parametrize(
    ("objects", "ref", "reason"),
    [
        ([], {}, "InvalidCertificateRef"),
        (
            [secret("cert", **{"tls.crt": b"not a certificate", "tls.key": b"nor a key"})],
            {},
            "InvalidCertificateRef",
        ),
        ([], {"namespace": "elsewhere"}, "RefNotPermitted"),
    ],
    ids=["missing", "garbage", "other-namespace"],
)
def test_a_listener_with_a_bad_certificate_is_not_rendered(
    objects: list[Obj], ref: dict[str, str], reason: str
) -> None:
    cert, key = tls_pair()
    if ref:
        objects = [secret("cert", namespace="elsewhere", **{"tls.crt": cert, "tls.key": key})]
    plan = plan_of(gateway(listener(), tls_listener(**ref)), *objects)
    assert [lst.name for lst in plan.configs["stunner/gw"].listeners] == ["stunner/gw/udp"]
    assert listener_conditions(plan, "tls")["ResolvedRefs"] == ("False", reason)
    assert listener_conditions(plan, "udp")["ResolvedRefs"] == ("True", "ResolvedRefs")
    assert [p["name"] for p in plan.services["stunner/gw"]["spec"]["ports"]] == ["udp"]


def test_a_duplicate_transport_and_port_is_conflicted() -> None:
    plan = plan_of(
        gateway(
            listener("first", 3478, "TURN-UDP"),
            listener("second", 3478, "TURN-DTLS"),
            listener("tcp", 3478, "TURN-TCP"),
        )
    )
    assert [lst.name for lst in plan.configs["stunner/gw"].listeners] == [
        "stunner/gw/first",
        "stunner/gw/tcp",
    ]
    assert listener_conditions(plan, "second")["Conflicted"] == ("True", "ProtocolConflict")
    assert listener_conditions(plan, "first")["Conflicted"] == ("False", "NoConflicts")
    assert listener_conditions(plan, "tcp")["Conflicted"] == ("False", "NoConflicts")


def test_an_unknown_protocol_is_not_accepted() -> None:
    plan = plan_of(gateway(listener(), listener("sctp", 5000, "SCTP")))
    assert listener_conditions(plan, "sctp")["Accepted"] == ("False", "UnsupportedProtocol")
    assert len(plan.configs["stunner/gw"].listeners) == 1


# --- GatewayClass and Gateway conditions (§2.7) -----------------------------------------------


def test_an_accepted_class_and_gateway() -> None:
    gw = gateway()
    gw["spec"]["addresses"] = [{"value": "192.0.2.1"}]
    plan = plan_of(gw)
    assert conditions(plan.status_of("GatewayClass", "", "stunner")) == {
        "Accepted": ("True", "Accepted")
    }
    status = plan.status_of("Gateway", "stunner", "gw")
    assert conditions(status) == {
        "Accepted": ("True", "Accepted"),
        "Programmed": ("True", "Programmed"),
    }
    assert status is not None and status["addresses"] == [
        {"type": "IPAddress", "value": "192.0.2.1"}
    ]


@pytest.mark.parametrize(
    ("base", "message"),
    [
        ((gateway_class(), dataplane()), "No GatewayConfig found for name: stunner/config"),
        ((gateway_class(), gateway_config()), "missing Dataplane resource for Gateway"),
        (
            (gateway_class(), gateway_config(authRef={"name": "gone"}), dataplane()),
            "missing or invalid external authentication credentials",
        ),
        (
            (gateway_class(), gateway_config(password=None), dataplane()),
            "spec.password: required for static authentication",
        ),
    ],
    ids=["no-gateway-config", "no-dataplane", "auth-secret-missing", "no-password"],
)
def test_an_invalid_class_invalidates_its_gateways(base: tuple[Obj, ...], message: str) -> None:
    plan = plan_of(route(), base=base)
    class_status = plan.status_of("GatewayClass", "", "stunner")
    assert conditions(class_status) == {"Accepted": ("False", "InvalidParameters")}
    assert class_status is not None and message in class_status["conditions"][0]["message"]
    assert conditions(plan.status_of("Gateway", "stunner", "gw")) == {
        "Accepted": ("False", "Pending"),
        "Programmed": ("False", "Invalid"),
    }
    assert plan.configs == {} and plan.deployments == {} and plan.services == {}
    assert parent_conditions(plan)[0]["Accepted"] == ("False", "Pending")


def test_another_controller_name_is_judged_by_the_same_rules() -> None:
    bad = gateway(name="bad")
    bad["spec"]["addresses"] = [{"type": "IPAddress", "value": "not-an-ip"}]
    base = (gateway_class(controller="example.com/stunner"), gateway_config(), dataplane())
    settings = RenderSettings(controller_name="example.com/stunner")
    plan = plan_of(gateway(), bad, base=base, settings=settings)
    assert set(plan.configs) == {"stunner/gw"}
    assert conditions(plan.status_of("Gateway", "stunner", "bad"))["Accepted"] == (
        "False",
        "UnsupportedAddress",
    )


def test_a_class_of_another_controller_is_left_alone() -> None:
    plan = plan_of(
        base=(gateway_class(controller="example.com/other"), gateway_config(), dataplane())
    )
    assert plan.configs == {} and plan.statuses == ()


def test_a_gateway_failing_the_rules_is_skipped_and_the_rest_renders() -> None:
    bad = gateway(name="bad")
    bad["spec"]["addresses"] = [{"type": "IPAddress", "value": "not-an-ip"}]
    plan = plan_of(gateway(), bad)
    assert set(plan.configs) == {"stunner/gw"}
    assert conditions(plan.status_of("Gateway", "stunner", "bad")) == {
        "Accepted": ("False", "UnsupportedAddress"),
        "Programmed": ("False", "Invalid"),
    }
    assert [f.path for f in plan.findings if f.name == "bad"] == ["spec.addresses[0].value"]


def test_no_public_address_is_address_not_assigned() -> None:
    plan = plan_of()
    assert conditions(plan.status_of("Gateway", "stunner", "gw"))["Programmed"] == (
        "False",
        "AddressNotAssigned",
    )
    assert plan.configs["stunner/gw"].listeners[0].public_address == ""


def test_observed_generation_and_kept_transition_times() -> None:
    gw = gateway(generation=7)
    first = plan_of(gw)
    status = first.status_of("Gateway", "stunner", "gw")
    assert status is not None and {c["observedGeneration"] for c in status["conditions"]} == {7}
    gw["status"] = copy.deepcopy(dict(status))
    later = render(Snapshot.from_objects(world(gw)), RenderSettings(), NOW + timedelta(hours=1))
    again = later.status_of("Gateway", "stunner", "gw")
    assert again == status  # nothing changed, so nothing new to write


# --- public address discovery (§2.6) ----------------------------------------------------------


def live_service(
    type_: str = "LoadBalancer",
    ingress: list[Obj] | None = None,
    node_port: int = 0,
    name: str = "gw",
    owner_uid: str | None = None,
) -> Obj:
    port: Obj = {"name": "udp", "port": 3478, "protocol": "UDP"}
    if node_port:
        port["nodePort"] = node_port
    owners = [{"kind": "Gateway", "name": "gw", "uid": owner_uid}] if owner_uid else []
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": "stunner",
            "annotations": {"stunner.l7mp.io/related-gateway-name": "stunner/gw"},
            "ownerReferences": owners,
        },
        "spec": {"type": type_, "ports": [port]},
        "status": {"loadBalancer": {"ingress": ingress or []}},
    }


def node(*addresses: tuple[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n1"},
        "status": {"addresses": [{"type": t, "address": a} for t, a in addresses]},
    }


@pytest.mark.parametrize(
    ("objects", "public"),
    [
        ([live_service(ingress=[{"ip": "203.0.113.1"}])], ("203.0.113.1", 3478)),
        ([live_service(ingress=[{"hostname": "lb.example.com"}])], ("lb.example.com", 3478)),
        (
            [
                live_service(
                    ingress=[
                        {"ip": "203.0.113.1", "ports": [{"port": 443, "protocol": "TCP"}]},
                        {"ip": "203.0.113.2", "ports": [{"port": 3478, "protocol": "UDP"}]},
                    ]
                )
            ],
            ("203.0.113.2", 3478),
        ),
        (
            [
                live_service("NodePort", node_port=31000),
                node(("InternalIP", "10.0.0.1"), ("ExternalIP", "198.51.100.1")),
            ],
            ("198.51.100.1", 31000),
        ),
        (
            [live_service("NodePort", node_port=31000), node(("ExternalDNS", "node.example.com"))],
            ("node.example.com", 31000),
        ),
        (
            [live_service("NodePort", node_port=31000), node(("InternalIP", "192.168.1.5"))],
            ("192.168.1.5", 31000),
        ),
        (
            [
                live_service(node_port=31000),
                node(("Hostname", "n1"), ("InternalIP", "192.168.1.5")),
            ],
            ("192.168.1.5", 31000),
        ),
        ([live_service(node_port=31000), node(("Hostname", "n1"))], ("", 0)),
        ([live_service("NodePort", node_port=31000)], ("", 0)),
        ([live_service("ClusterIP")], ("", 0)),
    ],
    ids=[
        "lb-ip",
        "lb-hostname",
        "lb-per-port",
        "nodeport-ip",
        "nodeport-dns",
        "nodeport-internal-ip",
        "lb-without-ingress-internal-ip",
        "lb-without-ingress-no-node-address",
        "nodeport-no-nodes",
        "clusterip",
    ],
)
def test_public_address_discovery(objects: list[Obj], public: tuple[str, int]) -> None:
    rendered = plan_of(*objects).configs["stunner/gw"].listeners[0]
    assert (rendered.public_address, rendered.public_port) == public


def test_the_config_the_status_and_the_cli_agree_on_the_node_fallback() -> None:
    """A LoadBalancer with no ingress yet (no LB controller) on a node with only an InternalIP:
    the config's public address, the Gateway's status.addresses and Programmed all say the
    node's address and the nodePort; the ingress, once it comes, replaces it."""
    waiting = [live_service(node_port=31000), node(("InternalIP", "192.168.1.5"))]
    plan = plan_of(*waiting)
    rendered = plan.configs["stunner/gw"].listeners[0]
    assert (rendered.public_address, rendered.public_port) == ("192.168.1.5", 31000)
    status = plan.status_of("Gateway", "stunner", "gw")
    assert status is not None and status["addresses"] == [
        {"type": "IPAddress", "value": "192.168.1.5"}
    ]
    assert conditions(status)["Programmed"] == ("True", "Programmed")
    arrived = [live_service(ingress=[{"ip": "203.0.113.1"}], node_port=31000), waiting[1]]
    rendered = plan_of(*arrived).configs["stunner/gw"].listeners[0]
    assert (rendered.public_address, rendered.public_port) == ("203.0.113.1", 3478)
    nothing = plan_of(live_service(node_port=31000))
    status = nothing.status_of("Gateway", "stunner", "gw")
    assert status is not None and "addresses" not in status
    assert conditions(status)["Programmed"] == ("False", "AddressNotAssigned")


@pytest.mark.parametrize(
    ("objects", "missing"),
    [
        ([], "no Service exposes it yet"),
        (
            [live_service(node_port=31000)],
            "its Service stunner/gw (LoadBalancer) has no public address yet (no LoadBalancer "
            "ingress, nodePort 31000 but no Node with an address: "
            "ExternalIP/ExternalDNS/InternalIP)",
        ),
        (
            [live_service("NodePort", node_port=31000), node(("Hostname", "n1"))],
            "its Service stunner/gw (NodePort) has no public address yet (nodePort 31000 but no "
            "Node with an address: ExternalIP/ExternalDNS/InternalIP)",
        ),
        (
            [live_service()],
            "its Service stunner/gw (LoadBalancer) has no public address yet (no LoadBalancer "
            "ingress, no node port): is there a load-balancer controller?",
        ),
        ([live_service("ClusterIP")], "its Service stunner/gw is of type ClusterIP"),
    ],
    ids=["no-service", "lb-no-node", "nodeport-no-node", "lb-no-nodeport", "clusterip"],
)
def test_what_is_missing_is_said(objects: list[Obj], missing: str) -> None:
    """The phrase `stunner ice` prints when a listener has no public address."""
    gw = gateway()
    services = [o for o in objects if o["kind"] == "Service"]
    nodes = [o for o in objects if o["kind"] == "Node"]
    found = addresses.public_address(
        gw, addresses.gateway_service(gw, services), nodes, 3478, "UDP"
    )
    assert not found and found.missing.startswith(missing), found.missing


def test_the_load_balancer_service_the_gateway_owns_is_preferred() -> None:
    objects = [
        gateway(uid="gw-uid"),
        live_service("NodePort", node_port=31000, name="a", owner_uid="gw-uid"),
        live_service(ingress=[{"ip": "203.0.113.1"}], name="b", owner_uid="gw-uid"),
        live_service(ingress=[{"ip": "203.0.113.9"}], name="c", owner_uid="someone-else"),
        node(("ExternalIP", "198.51.100.1")),
    ]
    rendered = plan_of(*objects).configs["stunner/gw"].listeners[0]
    assert (rendered.public_address, rendered.public_port) == ("203.0.113.1", 3478)
    foreign_only = [gateway(uid="gw-uid"), objects[3]]
    assert plan_of(*foreign_only).configs["stunner/gw"].listeners[0].public_address == ""


def test_the_hinted_address_wins() -> None:
    gw = gateway()
    gw["spec"]["addresses"] = [{"type": "IPAddress", "value": "192.0.2.9"}]
    rendered = plan_of(gw, live_service(ingress=[{"ip": "203.0.113.1"}])).configs["stunner/gw"]
    assert (rendered.listeners[0].public_address, rendered.listeners[0].public_port) == (
        "192.0.2.9",
        3478,
    )


# --- Deployment (§2.4) ------------------------------------------------------------------------


OFFLOAD_SECURITY = {
    "capabilities": {"add": ["BPF", "NET_ADMIN"], "drop": ["ALL"]},
    "runAsUser": 0,
    "runAsNonRoot": False,
    "allowPrivilegeEscalation": False,
    "privileged": False,
}


def stunnerd_container(plan: Plan) -> dict[str, Any]:
    container: dict[str, Any] = plan.deployments["stunner/gw"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    return container


@pytest.mark.parametrize("engine", [None, "None", "none"])
def test_without_the_offload_stunnerd_gets_no_capability(engine: str | None) -> None:
    spec = {} if engine is None else {"offloadEngine": engine}
    plan = plan_of(dataplane(**spec))
    assert "securityContext" not in stunnerd_container(plan)
    assert plan.configs["stunner/gw"].admin.offload_engine == "None"


@pytest.mark.parametrize("engine", ["TC", "Auto", "XDP"])
def test_the_offload_adds_cap_bpf_and_cap_net_admin_and_only_them(engine: str) -> None:
    plan = plan_of(dataplane(offloadEngine=engine, offloadInterfaces=["eth0"]))
    assert stunnerd_container(plan)["securityContext"] == OFFLOAD_SECURITY
    admin = plan.configs["stunner/gw"].admin
    assert (admin.offload_engine, admin.offload_interfaces) == (engine, ["eth0"])


def test_the_offload_keeps_what_the_dataplane_sets_itself() -> None:
    own = {"readOnlyRootFilesystem": True, "capabilities": {"add": ["NET_BIND_SERVICE"]}}
    plan = plan_of(dataplane(offloadEngine="TC", containerSecurityContext=own))
    assert stunnerd_container(plan)["securityContext"] == {
        "readOnlyRootFilesystem": True,
        "capabilities": {"add": ["NET_BIND_SERVICE", "BPF", "NET_ADMIN"], "drop": ["ALL"]},
        "runAsUser": 0,
        "runAsNonRoot": False,
        "allowPrivilegeEscalation": False,
        "privileged": False,
    }


@pytest.mark.parametrize(
    ("container", "pod"),
    [
        ({"runAsNonRoot": True}, None),
        ({"runAsUser": 10001}, None),
        (None, {"runAsNonRoot": True}),
        (None, {"runAsUser": 10001}),
    ],
)
def test_the_offload_keeps_a_user_the_dataplane_chose(
    container: dict[str, Any] | None, pod: dict[str, Any] | None
) -> None:
    """A non-root user of the Dataplane's own stays: stunnerd then warns that it lacks the
    capabilities, instead of a pod the kubelet refuses (runAsNonRoot with uid 0)."""
    spec: dict[str, Any] = {"offloadEngine": "TC"}
    if container is not None:
        spec["containerSecurityContext"] = container
    if pod is not None:
        spec["securityContext"] = pod
    context = stunnerd_container(plan_of(dataplane(**spec)))["securityContext"]
    assert context["capabilities"] == {"add": ["BPF", "NET_ADMIN"], "drop": ["ALL"]}
    assert {k: context.get(k) for k in ("runAsUser", "runAsNonRoot")} == {
        "runAsUser": (container or {}).get("runAsUser"),
        "runAsNonRoot": (container or {}).get("runAsNonRoot"),
    }


def test_the_deployment() -> None:
    gw = gateway(
        uid="1234",
        labels={
            "team": "a",
            "argocd.argoproj.io/instance": "x",
            "app.kubernetes.io/managed-by": "helm",
        },
        annotations={"note": "kept"},
    )
    plan = plan_of(
        gw,
        dataplane(
            labels={"app": "overridden", "pod": "label"},
            annotations={"pod": "annotation"},
            env=[{"name": "EXTRA", "value": "1"}],
            envFrom=[{"configMapRef": {"name": "more-env"}}],
            replicas=3,
            hostNetwork=True,
        ),
    )
    deployment = plan.deployments["stunner/gw"]
    meta = deployment["metadata"]
    assert meta["labels"] == {
        "team": "a",
        "stunner.l7mp.io/owned-by": "stunner",
        "stunner.l7mp.io/related-gateway-name": "gw",
        "stunner.l7mp.io/related-gateway-namespace": "stunner",
    }
    assert meta["annotations"] == {
        "note": "kept",
        "stunner.l7mp.io/related-gateway-name": "stunner/gw",
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "name": "gw",
            "uid": "1234",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    spec = deployment["spec"]
    assert spec["replicas"] == 3
    assert [e["key"] for e in spec["selector"]["matchExpressions"]] == [
        "app",
        "stunner.l7mp.io/related-gateway-name",
        "stunner.l7mp.io/related-gateway-namespace",
    ]
    template = spec["template"]
    assert template["metadata"]["labels"] == {
        "app": "stunner",
        "pod": "label",
        "stunner.l7mp.io/related-gateway-name": "gw",
        "stunner.l7mp.io/related-gateway-namespace": "stunner",
    }
    assert "team" not in template["metadata"]["labels"]  # Gateway labels would restart pods
    pod = template["spec"]
    assert pod["terminationGracePeriodSeconds"] == 3600 and pod["hostNetwork"] is True
    container = pod["containers"][0]
    assert container["name"] == "stunner-daemon"
    assert [e["name"] for e in container["env"]] == [
        "STUNNER_ADDR",
        "STUNNER_NAME",
        "STUNNER_NAMESPACE",
        "STUNNER_NODENAME",
        "STUNNER_CONFIG_ORIGIN",
        "STUNNER_CDS_TOKEN_FILE",
        "STUNNER_FORCE_READY_STATUS",
        "EXTRA",
    ]
    assert container["envFrom"] == [{"configMapRef": {"name": "more-env"}}]
    origin = container["env"][4]["value"]
    assert origin == RenderSettings().config_discovery_url and "svc" in origin  # never a pod IP
    assert container["livenessProbe"]["httpGet"] == {
        "path": "/live",
        "port": 8086,
        "scheme": "HTTP",
    }
    assert container["livenessProbe"]["periodSeconds"] == 15  # Go's
    assert container["readinessProbe"]["periodSeconds"] == 1  # Ready a second after its config
    assert container["resources"] == {"limits": {"memory": "20M"}, "requests": {"cpu": "250m"}}


def test_the_deployment_carries_a_cds_token_of_the_cds_audience_only() -> None:
    """stunnerd's credential for the CDS (issue 20 #5): a projected token bound to the CDS's
    audience, mounted read-only where STUNNER_CDS_TOKEN_FILE says; no API-server token; the pod
    runs as the Gateway's own account (tests/reconciler/test_render_account.py)."""
    pod = plan_of(dataplane()).deployments["stunner/gw"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == "gw-stunnerd"
    assert pod["volumes"] == [
        {
            "name": "stunner-cds-token",
            "projected": {
                "sources": [
                    {
                        "serviceAccountToken": {
                            "audience": "stunner.l7mp.io/config-discovery",
                            "expirationSeconds": 3600,
                            "path": "token",
                        }
                    }
                ]
            },
        }
    ]
    container = pod["containers"][0]
    assert container["volumeMounts"] == [
        {
            "name": "stunner-cds-token",
            "mountPath": "/var/run/secrets/stunner.l7mp.io/cds",
            "readOnly": True,
        }
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["STUNNER_CDS_TOKEN_FILE"] == "/var/run/secrets/stunner.l7mp.io/cds/token"


def test_the_rendered_stunnerd_stays_ready_while_it_drains() -> None:
    """Issue 32: a rollout broke every UDP call on the old pod. Its stunnerd went unready on
    SIGTERM, its endpoint stopped `serving`, and kube-proxy flushed the UDP conntrack entries
    pointing at it, so the calls' next packets went to the new pod. The rendered pod sets
    STUNNER_FORCE_READY_STATUS (stunnerd's --force-ready-status), unless the Dataplane's own env
    names it: an operator can still say false."""
    plan = plan_of(dataplane())
    container = plan.deployments["stunner/gw"]["spec"]["template"]["spec"]["containers"][0]
    env = [(e["name"], e.get("value")) for e in container["env"]]
    assert ("STUNNER_FORCE_READY_STATUS", "true") in env
    own = dataplane(env=[{"name": "STUNNER_FORCE_READY_STATUS", "value": "false"}])
    container = plan_of(own).deployments["stunner/gw"]["spec"]["template"]["spec"]["containers"][0]
    env = [(e["name"], e.get("value")) for e in container["env"]]
    assert [v for n, v in env if n == "STUNNER_FORCE_READY_STATUS"] == ["false"]


def test_deployment_defaults_and_switches() -> None:
    plan = plan_of(dataplane(replicas=1, disableHealthCheck=True, terminationGracePeriodSeconds=30))
    deployment = plan.deployments["stunner/gw"]
    assert "replicas" not in deployment["spec"]  # an HPA owns the count
    assert "ownerReferences" not in deployment["metadata"]  # no uid: read from a file
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "livenessProbe" not in container and "readinessProbe" not in container
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 30


def test_disable_managed_dataplane_keeps_config_and_service() -> None:
    plan = plan_of(gateway(annotations={"stunner.l7mp.io/disable-managed-dataplane": "true"}))
    assert "stunner/gw" in plan.configs and "stunner/gw" in plan.services
    assert plan.deployments == {}


# --- Service (§2.4) ---------------------------------------------------------------------------


def gw_service(
    *objects: Obj, annotations: dict[str, str] | None = None, config: Obj | None = None
) -> Obj:
    gw = gateway(
        listener("udp", 3478), listener("tcp", 3479, "TURN-TCP"), annotations=annotations or {}
    )
    base = (gateway_class(), config or gateway_config(), dataplane())
    return plan_of(gw, *objects, base=base).services["stunner/gw"]


def test_service_annotations_labels_selector_and_defaults() -> None:
    config = gateway_config(loadBalancerServiceAnnotations={"a": "from-config", "b": "from-config"})
    svc = gw_service(annotations={"b": "from-gateway"}, config=config)
    assert svc["metadata"]["annotations"] == {
        "a": "from-config",
        "b": "from-gateway",
        "stunner.l7mp.io/related-gateway-name": "stunner/gw",
    }
    assert svc["metadata"]["labels"] == {
        "stunner.l7mp.io/owned-by": "stunner",
        "stunner.l7mp.io/related-gateway-name": "gw",
        "stunner.l7mp.io/related-gateway-namespace": "stunner",
    }
    spec = svc["spec"]
    assert spec["selector"] == {
        "app": "stunner",
        "stunner.l7mp.io/related-gateway-name": "gw",
        "stunner.l7mp.io/related-gateway-namespace": "stunner",
    }
    assert (spec["type"], spec["sessionAffinity"]) == ("LoadBalancer", "ClientIP")
    assert [(p["name"], p["protocol"], p["port"]) for p in spec["ports"]] == [("udp", "UDP", 3478)]
    assert "externalTrafficPolicy" not in spec and "loadBalancerIP" not in spec


def test_service_mixed_protocols_ports_maps_and_switches() -> None:
    svc = gw_service(
        annotations={
            "stunner.l7mp.io/enable-mixed-protocol-lb": "true",
            "stunner.l7mp.io/service-type": "NodePort",
            "stunner.l7mp.io/nodeport": '{"udp":31000,"nope":31001}',
            "stunner.l7mp.io/targetport": '"tcp":13479',  # missing braces are tolerated
            "stunner.l7mp.io/disable-session-affinity": "true",
            "stunner.l7mp.io/external-traffic-policy": "local",
        }
    )
    spec = svc["spec"]
    assert spec["ports"] == [
        {"name": "udp", "protocol": "UDP", "port": 3478, "nodePort": 31000},
        {"name": "tcp", "protocol": "TCP", "port": 3479, "targetPort": 13479},
    ]
    assert (spec["type"], spec["sessionAffinity"], spec["externalTrafficPolicy"]) == (
        "NodePort",
        "None",
        "Local",
    )


def test_service_health_check_port_on_load_balancers_only() -> None:
    health = {
        "service.beta.kubernetes.io/do-loadbalancer-healthcheck-port": "8086",
        "service.beta.kubernetes.io/do-loadbalancer-healthcheck-protocol": "http",
    }
    ports = gw_service(annotations=health)["spec"]["ports"]
    assert ports[-1] == {"name": "gateway-health-check", "protocol": "TCP", "port": 8086}
    disabled = health | {"stunner.l7mp.io/disable-health-check-expose": "true"}
    assert [p["name"] for p in gw_service(annotations=disabled)["spec"]["ports"]] == ["udp"]
    node_port = health | {"stunner.l7mp.io/service-type": "NodePort"}
    assert [p["name"] for p in gw_service(annotations=node_port)["spec"]["ports"]] == ["udp"]


def test_service_load_balancer_ip_from_the_hinted_address() -> None:
    gw = gateway()
    gw["spec"]["addresses"] = [{"type": "IPAddress", "value": "192.0.2.9"}]
    assert plan_of(gw).services["stunner/gw"]["spec"]["loadBalancerIP"] == "192.0.2.9"
    gw["spec"]["addresses"] = [{"type": "Hostname", "value": "turn.example.com"}]
    assert "loadBalancerIP" not in plan_of(gw).services["stunner/gw"]["spec"]


def test_no_rendered_listener_means_no_service() -> None:
    plan = plan_of(gateway(tls_listener()))
    assert plan.configs["stunner/gw"].listeners == []
    assert plan.services == {}


# --- purity and secrecy -----------------------------------------------------------------------


def test_render_leaves_the_snapshot_unchanged() -> None:
    template = dataplane(
        resources={"limits": {"cpu": "1"}},
        env=[{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        tolerations=[{"key": "k", "operator": "Exists"}],
        labels={"pod": "label"},
    )
    objects = world(route({"name": "media"}), service(), template)
    before = copy.deepcopy(objects)
    plan = render(Snapshot.from_objects(objects), RenderSettings(), NOW)
    pod = plan.deployments["stunner/gw"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    container["resources"]["limits"]["cpu"] = "9"
    container["env"][-1]["valueFrom"]["fieldRef"]["fieldPath"] = "changed"
    pod["spec"]["tolerations"][0]["key"] = "changed"
    pod["metadata"]["labels"]["pod"] = "changed"
    plan.services["stunner/gw"]["metadata"]["annotations"]["changed"] = "yes"
    assert objects == before


def test_credentials_never_reach_status_or_findings() -> None:
    auth_secret = secret("auth", type=b"static", username=b"user-x", password=b"hunter2-secret")
    base = gateway_config(authRef={"name": "auth"}, authType=None, userName=None, password=None)
    bad_cert = secret("cert", **{"tls.crt": b"hunter2-secret", "tls.key": b"hunter2-secret"})
    plan = plan_of(
        auth_secret,
        bad_cert,
        gateway(listener(), tls_listener()),
        base=(gateway_class(), base, dataplane()),
    )
    text = repr(plan.statuses) + repr(plan.findings)
    assert "hunter2" not in text and "user-x" not in text


def test_objects_of_unknown_kinds_are_reported_not_fatal() -> None:
    plan = plan_of({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})
    assert "stunner/gw" in plan.configs
    assert any(f.kind == "ConfigMap" for f in plan.findings)
