"""LoadBalancer presets (README, "LoadBalancer presets"): `loadBalancer.preset` picks the
annotations a cloud's UDP load balancer needs, `loadBalancer.annotations` adds to and overrides
them, and both go into the GatewayConfig the chart renders (`gatewayConfig.create`), rendered
by real helm 3 and 4. Then the reconciler's own render (reconciler.render) turns the chart's
GatewayConfig and Dataplane, plus a GatewayClass naming that GatewayConfig and a Gateway, into
the Gateway's LoadBalancer Service: the annotations are on it, and the health-check port is
exposed or not as each preset means it to be.

EXPECTED is written out here, not read from values.yaml: a change to a preset must change this
table too, deliberately.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.render import RenderSettings, render
from reconciler.store import Snapshot
from tests.charts.conftest import CHART, NAMESPACE, of_kind, refused, run_helm
from tests.charts.test_webhook_scope import entries_judging
from tests.support.objects import secret

AWS_LBC = "service.beta.kubernetes.io/aws-load-balancer-"
EXPECTED: dict[str, dict[str, str]] = {
    "none": {},
    "aws": {
        AWS_LBC + "type": "external",
        AWS_LBC + "nlb-target-type": "ip",
        AWS_LBC + "scheme": "internet-facing",
        AWS_LBC + "healthcheck-protocol": "http",
        AWS_LBC + "healthcheck-port": "8086",
        AWS_LBC + "healthcheck-path": "/ready",
        "stunner.l7mp.io/disable-health-check-expose": "true",
    },
    "azure": {},
    "digitalocean": {},
    "gcp": {"cloud.google.com/l4-rbs": "enabled"},
    "oci": {
        "oci.oraclecloud.com/load-balancer-type": "nlb",
        "stunner.l7mp.io/disable-session-affinity": "true",
    },
}
CREATE = "gatewayConfig.create=true"
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def helm_render(helm: Path, *sets: str) -> list[dict[str, Any]]:
    """`helm template` with these values; annotations are passed with --set-string (an
    annotation value is a string: "8086", "false")."""
    args = ["template", "stunner", str(CHART), "--namespace", NAMESPACE]
    for value in sets:
        flag = "--set-string" if value.startswith("loadBalancer.annotations.") else "--set"
        args += [flag, value]
    return [doc for doc in yaml.safe_load_all(run_helm(helm, *args)) if doc]


def chart_objects(helm: Path, *sets: str) -> dict[str, dict[str, Any]]:
    """The GatewayConfig and default Dataplane the chart renders, by kind."""
    manifests = helm_render(helm, CREATE, *sets)
    out = {}
    for kind in ("GatewayConfig", "Dataplane"):
        (obj,) = of_kind(manifests, kind)
        out[kind] = obj
    return out


def lb_annotations(helm: Path, *sets: str) -> dict[str, str] | None:
    spec = chart_objects(helm, *sets)["GatewayConfig"]["spec"]
    value = spec.get("loadBalancerServiceAnnotations")
    assert value is None or all(isinstance(v, str) for v in value.values()), value
    return value


def test_every_preset_is_tested_and_the_schema_names_exactly_them() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    assert sorted(["none", *values["loadBalancer"]["presets"]]) == sorted(EXPECTED)
    preset = schema["properties"]["loadBalancer"]["properties"]["preset"]
    assert sorted(preset["enum"]) == sorted(EXPECTED)
    assert values["loadBalancer"]["preset"] == "none"


@pytest.mark.parametrize("preset", sorted(EXPECTED))
def test_each_preset_renders_its_annotations_into_the_gateway_config(
    helm: Path, preset: str
) -> None:
    annotations = lb_annotations(helm, f"loadBalancer.preset={preset}")
    # A preset that sets nothing renders no field at all.
    assert (annotations or {}) == EXPECTED[preset]
    if not EXPECTED[preset]:
        assert annotations is None


def test_the_charts_gateway_config_names_its_auth_secret(helm: Path) -> None:
    objects = chart_objects(
        helm,
        "gatewayConfig.name=edge",
        "gatewayConfig.namespace=media",
        "gatewayConfig.realm=turn.example.com",
        "gatewayConfig.authSecretName=turn-users",
    )
    config = objects["GatewayConfig"]
    assert (config["metadata"]["name"], config["metadata"]["namespace"]) == ("edge", "media")
    assert config["spec"] == {
        "realm": "turn.example.com",
        "authRef": {"kind": "Secret", "name": "turn-users", "namespace": "media"},
    }
    # The release's namespace when none is named.
    default = chart_objects(helm)["GatewayConfig"]
    assert default["metadata"]["namespace"] == NAMESPACE


def test_the_charts_gateway_config_in_stun_mode_renders_a_pure_stun_server(helm: Path) -> None:
    """gatewayConfig.stunMode: stunMode and no authRef (no credentials are needed); the
    reconciler renders its Gateways' dataplane config with auth type none, with no Secret."""
    objects = chart_objects(helm, "gatewayConfig.stunMode=true")
    assert objects["GatewayConfig"]["spec"] == {"realm": "stunner.l7mp.io", "stunMode": True}
    config = objects["GatewayConfig"]["metadata"]
    plan = render(
        Snapshot.from_objects(
            [*objects.values(), *class_and_gateway(config, "stun", "stun-gateway")]
        ),
        RenderSettings(),
        NOW,
    )
    assert plan.configs["stunner/stun-gateway"].auth.to_dict() == {
        "type": "none",
        "realm": "stunner.l7mp.io",
        "credentials": {},
    }


def test_annotations_add_to_the_preset_and_override_it(helm: Path) -> None:
    annotations = lb_annotations(
        helm,
        "loadBalancer.preset=aws",
        f"loadBalancer.annotations.service\\.beta\\.kubernetes\\.io/{'aws-load-balancer-'}"
        "healthcheck-path=/live",
        "loadBalancer.annotations.service\\.beta\\.kubernetes\\.io/"
        "aws-load-balancer-scheme=internal",
        "loadBalancer.annotations.example\\.com/team=media",
    )
    assert annotations == EXPECTED["aws"] | {
        AWS_LBC + "healthcheck-path": "/live",
        AWS_LBC + "scheme": "internal",
        "example.com/team": "media",
    }
    # Without a preset, the annotations alone.
    assert lb_annotations(helm, "loadBalancer.annotations.example\\.com/team=media") == {
        "example.com/team": "media"
    }


def test_no_gateway_config_by_default(helm: Path) -> None:
    manifests = helm_render(helm)
    assert not of_kind(manifests, "GatewayConfig")
    assert not of_kind(helm_render(helm, CREATE), "GatewayClass")  # the user's to make


@pytest.mark.parametrize(
    ("sets", "says"),
    [
        # The schema names the presets (hetzner: its load balancers carry no UDP).
        (("loadBalancer.preset=hetzner",), "loadBalancer"),
        (("loadBalancer.preset=AWS",), "loadBalancer"),
        # Annotation values are strings: a number is refused, not rendered as one.
        ((CREATE, "loadBalancer.annotations.a=1"), "string"),
        # A preset with no GatewayConfig to go into is refused, saying what to set.
        (("loadBalancer.preset=gcp",), "set gatewayConfig.create=true"),
        (("loadBalancer.preset=azure",), "set gatewayConfig.create=true"),
        (("loadBalancer.annotations.a=b",), "set gatewayConfig.create=true"),
    ],
    ids=["unknown", "case", "not-a-string", "no-config", "no-config-empty-preset", "no-config-ann"],
)
def test_bad_values_are_refused(helm: Path, sets: tuple[str, ...], says: str) -> None:
    stderr = refused(helm, *sets)
    assert says in stderr, stderr
    if "preset=hetzner" in sets[0]:
        for name in EXPECTED:
            assert name in stderr, stderr  # the message lists the choices


def test_an_unknown_preset_fails_the_template_when_the_schema_is_skipped(helm: Path) -> None:
    stderr = refused(helm, CREATE, "loadBalancer.preset=hetzner", skip_schema=True)
    assert 'unknown preset "hetzner": choose none or one of aws, azure, digitalocean' in stderr


def test_the_webhook_leaves_out_the_charts_gateway_config(helm: Path) -> None:
    """Created in the same install as the webhook's pods, it must not wait for them (as the
    default Dataplane); a user's GatewayConfig is still judged, fail-closed. Without
    gatewayConfig.create, no object selector spares any GatewayConfig."""
    group, plural = "stunner.l7mp.io", "gatewayconfigs"
    manifests = helm_render(helm, CREATE)
    (own,) = of_kind(manifests, "GatewayConfig")
    assert not entries_judging(manifests, group, plural, own["metadata"]["labels"])
    users = entries_judging(manifests, group, plural, {})
    assert len(users) == 2, users  # validating and mutating
    assert {w["failurePolicy"] for w in users} == {"Fail"}
    default = helm_render(helm)
    assert len(entries_judging(default, group, plural, own["metadata"]["labels"])) == 2


# --- through the reconciler's render --------------------------------------------------------


def gateway_service(
    helm: Path, *sets: str, gateway_annotations: dict[str, str] | None = None
) -> tuple[dict[str, Any], Any]:
    """The LoadBalancer Service render makes for a Gateway whose class names the chart's
    GatewayConfig, and the plan."""
    objects = chart_objects(helm, *sets)
    config = objects["GatewayConfig"]["metadata"]
    class_and_gw = class_and_gateway(
        config,
        "stunner-gatewayclass",
        "udp-gateway",
        listener="udp-listener",
        annotations=gateway_annotations,
    )
    auth = secret(
        "stunner-auth-secret", namespace=NAMESPACE, type="static", username="u", password="p"
    )
    snapshot = Snapshot.from_objects([*objects.values(), *class_and_gw, auth])
    plan = render(snapshot, RenderSettings(), NOW)
    assert not [f for f in plan.findings if f.kind in ("GatewayClass", "GatewayConfig")], [
        str(f) for f in plan.findings
    ]
    return plan.services["stunner/udp-gateway"], plan


def ports_of(service: dict[str, Any]) -> dict[str, tuple[str, int]]:
    return {p["name"]: (p["protocol"], p["port"]) for p in service["spec"]["ports"]}


@pytest.mark.parametrize("preset", sorted(EXPECTED))
def test_render_puts_each_presets_annotations_on_the_gateways_service(
    helm: Path, preset: str
) -> None:
    service, plan = gateway_service(helm, f"loadBalancer.preset={preset}")
    assert service["spec"]["type"] == "LoadBalancer"
    annotations = service["metadata"]["annotations"]
    assert annotations == EXPECTED[preset] | {
        "stunner.l7mp.io/related-gateway-name": "stunner/udp-gateway"
    }
    # The health checks of every preset reach stunnerd without a public port: AWS checks the
    # pod's IP directly, the others check the node (kube-proxy) or nothing for UDP.
    assert ports_of(service) == {"udp-listener": ("UDP", 3478)}
    # OCI refuses session affinity; the others keep STUNner's ClientIP.
    affinity = "None" if preset == "oci" else "ClientIP"
    assert service["spec"]["sessionAffinity"] == affinity
    # The config is served: the GatewayConfig (authRef Secret) is whole.
    assert plan.configs["stunner/udp-gateway"].auth.credentials["username"] == "u"


def test_a_health_check_pair_in_the_annotations_exposes_stunnerds_health_port(
    helm: Path,
) -> None:
    """What users built by hand (S#96): a TCP/HTTP health check on :8086 that the load balancer
    reaches through the Service, which then carries the port; the AWS preset's own pair does
    not, as it turns the exposure off, until an override turns it back on."""
    do = "service.beta.kubernetes.io/do-loadbalancer-"
    service, _ = gateway_service(
        helm,
        f"loadBalancer.annotations.{do.replace('.', chr(92) + '.')}healthcheck-port=8086",
        f"loadBalancer.annotations.{do.replace('.', chr(92) + '.')}healthcheck-protocol=http",
    )
    assert ports_of(service) == {
        "udp-listener": ("UDP", 3478),
        "gateway-health-check": ("TCP", 8086),
    }
    service, _ = gateway_service(
        helm,
        "loadBalancer.preset=aws",
        "loadBalancer.annotations.stunner\\.l7mp\\.io/disable-health-check-expose=false",
    )
    assert ports_of(service)["gateway-health-check"] == ("TCP", 8086)


def test_a_gateways_own_annotation_still_wins_over_the_preset(helm: Path) -> None:
    service, _ = gateway_service(
        helm,
        "loadBalancer.preset=oci",
        gateway_annotations={"stunner.l7mp.io/disable-session-affinity": "false"},
    )
    assert service["spec"]["sessionAffinity"] == "ClientIP"
    assert service["metadata"]["annotations"]["oci.oraclecloud.com/load-balancer-type"] == "nlb"


def class_and_gateway(
    config: Any,
    klass: str,
    gateway: str,
    *,
    listener: str = "udp",
    annotations: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """A GatewayClass `klass` whose parametersRef is the chart's GatewayConfig (`config`: its
    metadata), and a Gateway `gateway` (namespace stunner) of it with one TURN-UDP listener on
    3478."""
    return [
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": klass},
            "spec": {
                "controllerName": "stunner.l7mp.io/gateway-operator",
                "parametersRef": {
                    "group": "stunner.l7mp.io",
                    "kind": "GatewayConfig",
                    "name": config["name"],
                    "namespace": config["namespace"],
                },
            },
        },
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": gateway, "namespace": "stunner", "annotations": annotations or {}},
            "spec": {
                "gatewayClassName": klass,
                "listeners": [{"name": listener, "port": 3478, "protocol": "TURN-UDP"}],
            },
        },
    ]
