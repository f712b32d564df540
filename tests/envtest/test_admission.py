"""The webhook behind a real kube-apiserver: what ``kubectl apply`` gets.

We test these aspects:
- Every version the API server serves of every kind the webhook judges is in the registration
  (read from the server's discovery, not from a list of ours), and an invalid object at each of
  those versions is refused by the webhook, naming the field.
- Every example of the spec (the YAML blocks of shared/spec/GATEWAY-REFERENCE.md, and the
  STUNner objects of GATEWAY-REFERENCE-v1alpha1.md: its Gateway API objects are of versions
  Gateway API v1.6.1 no longer serves, and its UDPRoute predates the port Gateway API now
  requires), applied in hierarchy order, is admitted; one whose version the installed CRDs do
  not serve (the v1alpha2 UDPRoute on the standard channel) is skipped, saying so. An example
  with an annotation value that is not a string (the spec's complex-gateway writes
  ``enable-mixed-protocol-lb: true``) does not land as written (the API server's decoder refuses
  a non-string metadata value before any webhook sees it, or kubectl drops it): the test
  checks that, then applies it with the value quoted and finds every annotation stored. An
  example with a field its CRD does not define is refused by kubectl's strict field validation
  (its default), naming the field; it is then applied without. Which examples have such fields
  is pinned without a cluster (the v1alpha1 GatewayConfig's metricsEndpoint).
- A battery of invalid objects the CRD schemas let through is refused by the webhook with the
  field and the reason; what a CRD schema refuses (a negative Dataplane replicas) is refused by
  the API server before any webhook; the default Dataplane cannot be deleted (a DELETE review).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from stunner_api.vocabulary import (
    DEFAULT_CONTROLLER_NAME,
    GATEWAY_API_TCP_ROUTE,
    JUDGED_KINDS,
    STUNNER_GROUP,
    KindInfo,
    api_version,
    group_of,
)
from tests.envtest.cluster import (
    OUR_CRDS,
    TCP_ROUTE_CRD,
    Example,
    apply_order,
    namespaces_of,
    registered_versions,
    registrations,
    spec_examples,
    unknown_fields,
    with_string_metadata,
    without_fields,
)
from tests.envtest.conftest import CLASS, PARENT, Cluster, meta
from tests.support.shared import crd_schemas, crd_served_versions, gateway_api_crds

pytestmark = pytest.mark.envtest

DENIED = "denied the request"


def served_versions(cluster: Cluster, kind: KindInfo) -> list[str]:
    """The versions of `kind` the API server serves (its discovery)."""
    result = cluster.plane.kubectl("get", "--raw", f"/apis/{kind.group}")
    assert result.returncode == 0, result.stderr
    versions = [v["version"] for v in json.loads(result.stdout)["versions"]]
    out = []
    for version in versions:
        raw = cluster.plane.kubectl("get", "--raw", f"/apis/{kind.group}/{version}")
        assert raw.returncode == 0, raw.stderr
        if any(r["name"] == kind.plural for r in json.loads(raw.stdout)["resources"]):
            out.append(version)
    return out


def dry_run(cluster: Cluster, obj: dict[str, Any], user: str | None = None) -> Any:
    args = ("apply", "--dry-run=server", "-f", "-")
    if user is not None:
        return cluster.kubectl_as(user, *args, stdin=yaml.safe_dump(obj))
    return cluster.plane.kubectl(*args, stdin=yaml.safe_dump(obj))


# --- one invalid object per judged kind, at any version ----------------------------------------

# (the object without apiVersion, the field the refusal names, a phrase of its reason)
INVALID: dict[str, tuple[dict[str, Any], str, str]] = {
    "GatewayClass": (
        {
            "kind": "GatewayClass",
            "metadata": meta("envtest-bad-class", namespaced=False),
            "spec": {
                "controllerName": DEFAULT_CONTROLLER_NAME,
                "parametersRef": {"group": "stunner.l7mp.io", "kind": "GatewayConfig", "name": "c"},
            },
        },
        "spec.parametersRef.namespace",
        "GatewayConfigs are namespaced",
    ),
    "Gateway": (
        {
            "kind": "Gateway",
            "metadata": meta("envtest-bad-gateway", annotations={"stunner.l7mp.io/typo": "x"}),
            "spec": {
                "gatewayClassName": CLASS,
                "listeners": [{"name": "udp", "port": 3478, "protocol": "TURN-UDP"}],
            },
        },
        'metadata.annotations["stunner.l7mp.io/typo"]',
        "unknown STUNner annotation",
    ),
    "UDPRoute.gateway.networking.k8s.io": (
        {
            "kind": "UDPRoute",
            "metadata": meta("envtest-bad-route"),
            "spec": {
                "parentRefs": [{"name": PARENT}],
                "rules": [{"backendRefs": [{"group": "", "kind": "ConfigMap", "name": "cm"}]}],
            },
        },
        "spec.rules[0].backendRefs[0]",
        "is not a backend STUNner knows",
    ),
    "TCPRoute": (
        {
            "kind": "TCPRoute",
            "metadata": meta("envtest-bad-tcp-route"),
            "spec": {
                "parentRefs": [{"name": PARENT}],
                "rules": [{"backendRefs": [{"name": "svc"}]}],
            },
        },
        "spec.rules[0].backendRefs[0].port",
        "required for a Service: the port its TCP peers are reached on",
    ),
    "UDPRoute.stunner.l7mp.io": (
        {
            "kind": "UDPRoute",
            "metadata": meta("envtest-bad-route"),
            "spec": {
                "parentRefs": [{"name": "udp-gateway"}],
                "rules": [{"backendRefs": [{"name": "svc", "port": 9, "endPort": 8}]}],
            },
        },
        "spec.rules[0].backendRefs[0].endPort",
        "must not be below port 9",
    ),
    "GatewayConfig": (
        {
            "kind": "GatewayConfig",
            "metadata": meta("envtest-bad-config"),
            "spec": {"logLevel": "all:LOUD", "userName": "u", "password": "p"},
        },
        "spec.logLevel",
        "unknown level 'LOUD'",
    ),
    "Dataplane": (
        {"kind": "Dataplane", "metadata": meta("envtest-bad-dataplane", False), "spec": {}},
        "spec.image",
        "required: the stunnerd image",
    ),
    "StaticService": (
        {
            "kind": "StaticService",
            "metadata": meta("envtest-bad-static"),
            "spec": {"prefixes": ["not-a-prefix"]},
        },
        "spec.prefixes[0]",
        "not-a-prefix",
    ),
}


def invalid_key(kind: KindInfo) -> str:
    return kind.kind if kind.kind != "UDPRoute" else f"UDPRoute.{kind.group}"


# Tests without the cluster fixture run in every run (CI too): they keep the layer's inputs
# complete.


def test_the_battery_covers_every_judged_kind() -> None:
    assert {invalid_key(k) for k in JUDGED_KINDS} == set(INVALID)


def test_the_registration_covers_every_version_the_crd_files_serve() -> None:
    gateway_crds = gateway_api_crds("experimental")
    crds = [*sorted(OUR_CRDS.glob("*.yaml")), *gateway_crds, TCP_ROUTE_CRD]
    registered = set(registered_versions(registrations("https://127.0.0.1:1", b"")))
    judged = {(k.group, k.plural) for k in JUDGED_KINDS}
    served = {(g, v, p) for g, v, p, *_ in crd_served_versions(crds) if (g, p) in judged}
    assert {(g, p) for g, _, p in served} == judged
    assert served <= registered


@pytest.mark.parametrize("kind", JUDGED_KINDS, ids=invalid_key)
def test_every_served_version_is_registered_and_judged(ours: Cluster, kind: KindInfo) -> None:
    served = served_versions(ours, kind)
    assert served, f"the API server serves no version of {kind.plural}.{kind.group}"
    registered = set(registered_versions(ours.registrations))
    template, field, reason = INVALID[invalid_key(kind)]
    for version in served:
        assert (kind.group, version, kind.plural) in registered, (
            f"{kind.plural}.{kind.group} {version} is served but the webhook does not judge it "
            "(stunner_api.vocabulary lists the versions it judges)"
        )
        obj = {"apiVersion": api_version(kind.group, version), **copy.deepcopy(template)}
        result = dry_run(ours, obj)
        assert result.returncode != 0, f"{version}: admitted: {result.stdout}{result.stderr}"
        assert DENIED in result.stderr, result.stderr
        assert field in result.stderr and reason in result.stderr, result.stderr


# --- the spec's examples --------------------------------------------------------------------

EXAMPLES = sorted(
    (
        e
        for e in spec_examples()
        if e.source.startswith("GATEWAY-REFERENCE.md")
        or group_of(e.obj["apiVersion"]) == STUNNER_GROUP
    ),
    key=apply_order,
)
_SERVED: dict[tuple[str, str], bool] = {}


def _served(cluster: Cluster, group_version: str, kind: str) -> bool:
    if (group_version, kind) not in _SERVED:
        prefix = "/api" if "/" not in group_version else "/apis"
        raw = cluster.plane.kubectl("get", "--raw", f"{prefix}/{group_version}")
        resources = json.loads(raw.stdout)["resources"] if raw.returncode == 0 else []
        _SERVED[group_version, kind] = any(r.get("kind") == kind for r in resources)
    return _SERVED[group_version, kind]


@pytest.fixture(scope="module")
def example_namespaces(cluster: Cluster) -> Cluster:
    names = namespaces_of([e.obj for e in EXAMPLES]) - {"default"}
    cluster.plane.apply(
        *({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in names)
    )
    return cluster


def test_the_spec_has_examples_of_every_kind() -> None:
    kinds = {e.obj["kind"] for e in EXAMPLES}
    # TCPRoute is beyond the reference (our example: tests/data/resources/tcproute-media-tcp.yaml).
    assert {k.kind for k in JUDGED_KINDS if k is not GATEWAY_API_TCP_ROUTE} <= kinds, kinds


SCHEMAS = crd_schemas(sorted(OUR_CRDS.glob("*.yaml")) + gateway_api_crds("experimental"))
# Fields of the spec's examples that their CRD does not define. Go STUNner's v1alpha1
# GatewayConfig had metricsEndpoint; ours serves v1alpha1 with the v1 schema, so kubectl apply
# (strict field validation by default) refuses the v1alpha1 reference's example.
KNOWN_UNKNOWN_FIELDS = {
    "GATEWAY-REFERENCE-v1alpha1.md#2:stunner.l7mp.io/v1alpha1/GatewayConfig/"
    "stunner-gatewayconfig": ["spec.metricsEndpoint"],
}


def test_the_spec_examples_use_only_fields_their_crds_define() -> None:
    found = {}
    for example in EXAMPLES:
        if unknown := unknown_fields(
            SCHEMAS[example.obj["apiVersion"], example.obj["kind"]], example.obj
        ):
            found[example.id] = unknown
    assert found == KNOWN_UNKNOWN_FIELDS


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.id)
def test_spec_example_is_admitted(example_namespaces: Cluster, example: Example) -> None:
    cluster = example_namespaces
    if not _served(cluster, example.obj["apiVersion"], example.obj["kind"]):
        pytest.skip(
            f"{example.obj['apiVersion']} {example.obj['kind']} is not served with the "
            f"{cluster.channel} channel's CRDs"
        )
    obj = example.obj
    unknown = unknown_fields(SCHEMAS[obj["apiVersion"], obj["kind"]], obj)
    if unknown:  # kubectl's strict field validation refuses them (KNOWN_UNKNOWN_FIELDS)
        result = cluster.plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(obj))
        assert result.returncode != 0, result.stdout
        assert all(f'unknown field "{field}"' in result.stderr for field in unknown), result.stderr
        obj = without_fields(obj, unknown)
    quoted = with_string_metadata(obj)
    if quoted != obj:  # a YAML true where Kubernetes wants the string "true"
        assert_not_kept_as_written(cluster, obj)
        obj = quoted
    result = cluster.plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(obj))
    assert result.returncode == 0, result.stderr
    assert DENIED not in result.stderr
    stored = stored_object(cluster, obj)
    wanted = obj.get("metadata", {}).get("annotations", {})
    assert wanted.items() <= stored["metadata"].get("annotations", {}).items()


def stored_object(cluster: Cluster, obj: dict[str, Any]) -> Any:
    result = cluster.plane.kubectl("get", "-f", "-", "-o", "json", stdin=yaml.safe_dump(obj))
    assert result.returncode == 0, result.stderr
    stored = json.loads(result.stdout)
    if stored.get("kind") == "List":  # kubectl 1.3x answers `get -f` with a List of one
        [stored] = stored["items"]
    return stored


def assert_not_kept_as_written(cluster: Cluster, obj: dict[str, Any]) -> None:
    """Kubernetes refuses metadata values that are not strings (the API server's decoder), or
    kubectl drops them: either way the example does not land as the spec writes it."""
    result = cluster.plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(obj))
    if result.returncode != 0:
        assert "annotations" in result.stderr or "labels" in result.stderr, result.stderr
        return
    kept = stored_object(cluster, obj)["metadata"].get("annotations", {})
    wanted = with_string_metadata(obj)["metadata"].get("annotations", {})
    assert not wanted.items() <= kept.items(), f"stored as written: {kept}"


# --- a battery of invalid objects -----------------------------------------------------------


def _gateway(name: str, annotations: dict[str, str] | None = None, **spec: Any) -> Any:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": meta(name, annotations=annotations or {}),
        "spec": {
            "gatewayClassName": CLASS,
            "listeners": [{"name": "udp", "port": 3478, "protocol": "TURN-UDP"}],
            **spec,
        },
    }


BATTERY = [
    pytest.param(
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "GatewayConfig",
            "metadata": meta("battery-config"),
            "spec": {"logLevel": "all:INFO,WARNING", "userName": "u", "password": "p"},
        },
        "spec.logLevel",
        "'WARNING' is not scope:LEVEL",
        id="log-level-part-go-skips",
    ),
    pytest.param(
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "GatewayConfig",
            "metadata": meta("battery-config"),
            "spec": {"authType": "static"},
        },
        "spec",
        "userName",
        id="static-auth-without-credentials",
    ),
    pytest.param(
        _gateway("battery-gateway", {"stunner.l7mp.io/nodeport": '{"udp":80}'}),
        'metadata.annotations["stunner.l7mp.io/nodeport"]',
        "must be between 30000 and 32767, got 80",
        id="nodeport-outside-the-range",
    ),
    pytest.param(
        _gateway("battery-gateway", {"stunner.l7mp.io/service-type": "Headless"}),
        'metadata.annotations["stunner.l7mp.io/service-type"]',
        "Headless",
        id="unknown-service-type",
    ),
    pytest.param(
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": meta("battery-gateway"),
            "spec": {
                "gatewayClassName": CLASS,
                "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}],
            },
        },
        "spec.listeners[0].protocol",
        "HTTP",
        id="listener-protocol-stunner-does-not-serve",
    ),
]


@pytest.mark.parametrize(("obj", "field", "reason"), BATTERY)
def test_invalid_object_is_refused_with_field_and_reason(
    ours: Cluster, obj: dict[str, Any], field: str, reason: str
) -> None:
    result = dry_run(ours, obj)
    assert result.returncode != 0, result.stdout
    assert DENIED in result.stderr, result.stderr
    assert field in result.stderr and reason in result.stderr, result.stderr


def test_the_crd_schema_refuses_negative_replicas_before_the_webhook(ours: Cluster) -> None:
    """Our Dataplane CRD says ``minimum: 0``: the API server refuses -1 itself, naming the
    field, and never asks the webhook (whose own check stays for clients of other schemas)."""
    dataplane = {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "Dataplane",
        "metadata": meta("battery-dataplane", namespaced=False),
        "spec": {"image": "l7mp/stunnerd:latest", "replicas": -1},
    }
    result = dry_run(ours, dataplane)
    assert result.returncode != 0, result.stdout
    assert DENIED not in result.stderr
    assert "spec.replicas" in result.stderr and "greater than or equal to 0" in result.stderr


def test_the_default_dataplane_cannot_be_deleted(cluster: Cluster) -> None:
    cluster.plane.apply(
        {
            "apiVersion": "stunner.l7mp.io/v1",
            "kind": "Dataplane",
            "metadata": {"name": "default"},
            "spec": {"image": "l7mp/stunnerd:latest"},
        }
    )
    result = cluster.plane.kubectl("delete", "dataplane", "default")
    assert result.returncode != 0, result.stdout
    assert DENIED in result.stderr and "default Dataplane cannot be deleted" in result.stderr
    assert cluster.plane.kubectl("get", "dataplane", "default").returncode == 0
