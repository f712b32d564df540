"""charts/stunner with real helm 3 and helm 4: lint, schema, rendering, Kubernetes' own schemas,
the webhook registration against what webhook/ judges, the webhook's certificate."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from cryptography import x509

from stunner_api.rules import ON_DELETE, RULES
from stunner_api.vocabulary import JUDGED_KINDS
from tests.charts.conftest import CHART, NAMESPACE, ROOT, of_kind, refused, render, run_helm
from tests.envtest.cluster import TCP_ROUTE_CRD

# Values far from the defaults: every switch flipped, every optional object on.
NON_DEFAULT = (
    "crds.gatewayAPI.experimentalUDPRoute=true",
    "crds.gatewayAPI.keep=false",
    "reconciler.replicas=3",
    "reconciler.extraArgs={--endpoint-discovery=false}",
    "webhook.failurePolicy=Ignore",
    "webhook.timeoutSeconds=5",
    "webhook.excludedNamespaces={tenant-a,tenant-b}",
    "webhook.podCIDRs=10.244.0.0/16",
    "webhook.serviceCIDRs=10.96.0.0/12",
    "webhook.certificate.certManager=true",
    "dataplane.spec.hostNetwork=true",
    "dataplane.spec.enableMetricsEndpoint=true",
    "observability.podMonitor=true",
    "observability.serviceMonitor=true",
    "observability.prometheusRule=true",
    "observability.grafanaDashboard=true",
    "test.gateways={tenant-a/gw,tenant-a/gw2,tenant-b/gw}",
    "test.echoPort=9999",
    "test.targets={k8s://media/echo:9001,k8s://media/sfu:50000}",
    "test.clusterDomain=k8s.example",
    "image.repository=registry.example/stunner",
    "image.dataplaneRepository=registry.example/stunnerd",
    "image.tag=1.2.3",
)
VALUE_SETS = {"default": (), "non-default": NON_DEFAULT}
# Kinds whose CRDs belong to others (Prometheus Operator, cert-manager): no schema offline.
THIRD_PARTY = {"PodMonitor", "ServiceMonitor", "PrometheusRule", "Certificate", "Issuer"}
RECOMMENDED_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/part-of",
    "helm.sh/chart",
)


def crd_schemas(manifests: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> openAPIV3Schema of our CRDs and the rendered ones."""
    crds = [yaml.safe_load(p.read_text()) for p in sorted((CHART / "crds").glob("*.yaml"))]
    out = {}
    for crd in crds + of_kind(manifests, "CustomResourceDefinition"):
        spec = crd["spec"]
        for version in spec["versions"]:
            key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
            out[key] = version["schema"]["openAPIV3Schema"]
    return out


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_lint_strict_is_clean(helm: Path, values: str) -> None:
    args = ["lint", "--strict", str(CHART)]
    for value in VALUE_SETS[values]:
        args += ["--set", value]
    out = run_helm(helm, *args)
    assert "0 chart(s) failed" in out
    assert "[WARNING]" not in out and "[ERROR]" not in out and "[INFO]" not in out, out


def test_values_schema_is_generated_from_values_yaml() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "values_schema.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("webhook.timeoutSeconds=ten", "webhook.timeoutSeconds"),
        ("webhook.failurePolicy=Sometimes", "webhook.failurePolicy"),
        ("reconciler.cds.port=70000", "reconciler.cds.port"),
        ("webhook.tymeout=3", "tymeout"),
        ("dataplane.spec.args=--udp-thread-num=4", "dataplane.spec.args"),
        ("test.echoPort=53", "test.echoPort"),
        ("test.gateways={udp-gateway}", "test.gateways"),
        ("test.targets={media/echo:9001}", "test.targets"),
        ("dataplane.spec.enableMetricsEndpoint=maybe", "dataplane.spec.enableMetricsEndpoint"),
    ],
)
def test_values_schema_refuses_wrong_values(helm: Path, value: str, complaint: str) -> None:
    assert complaint in refused(helm, value).replace("/", ".")  # helm 4 names /webhook/port


@pytest.mark.parametrize("kube_version", ["1.30.0", "1.33.0", kubernetes_validate.latest_version()])
@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_rendered_manifests_pass_kubernetes_schemas(
    helm: Path, values: str, kube_version: str
) -> None:
    manifests = render(helm, *VALUE_SETS[values])
    ours = crd_schemas(manifests)
    checked = set()
    for manifest in manifests:
        kind = manifest["kind"]
        key = (manifest["apiVersion"], kind)
        if key in ours:  # a custom resource: its CRD's schema
            jsonschema.validate(manifest.get("spec", {}), ours[key]["properties"]["spec"])
        elif kind in THIRD_PARTY:
            assert values == "non-default", f"{kind} rendered by default"
            continue
        else:
            kubernetes_validate.validate(manifest, kube_version, strict=True)
        checked.add(kind)
    assert {"Deployment", "ValidatingWebhookConfiguration", "Dataplane", "ClusterRole"} <= checked


def test_each_template_renders_one_kind(helm: Path) -> None:
    out = run_helm(
        helm, "template", "stunner", str(CHART), *sum((["--set", v] for v in NON_DEFAULT), [])
    )
    kinds: dict[str, set[str]] = {}
    for doc in out.split("\n---\n"):
        source = re.search(r"^# Source: (\S+)", doc, re.M)
        body = yaml.safe_load(doc)
        if source and body:
            kinds.setdefault(source.group(1), set()).add(body["kind"])
    assert len(kinds) >= 20
    assert {t: k for t, k in kinds.items() if len(k) != 1} == {}


def test_every_object_carries_the_recommended_labels(
    default_manifests: list[dict[str, Any]],
) -> None:
    for manifest in default_manifests:
        if manifest["kind"] == "CustomResourceDefinition":
            continue  # upstream's, unchanged
        labels = manifest["metadata"].get("labels", {})
        missing = [label for label in RECOMMENDED_LABELS if label not in labels]
        assert not missing, f"{manifest['kind']} {manifest['metadata']['name']} lacks {missing}"


def judged_registration() -> set[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    """What webhook/ judges, from the vocabulary and the rule table: (group, resource, versions,
    validating operations)."""
    delete_kinds = {kind for kind, rules in RULES.items() if set(rules) & ON_DELETE}
    return {
        (
            info.group,
            info.plural,
            tuple(sorted(info.versions)),
            ("CREATE", "UPDATE", "DELETE") if info.kind in delete_kinds else ("CREATE", "UPDATE"),
        )
        for info in JUDGED_KINDS
    }


def registered(
    configuration: dict[str, Any],
) -> set[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    out = set()
    for webhook in configuration["webhooks"]:
        for rule in webhook["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    versions = tuple(sorted(rule["apiVersions"]))
                    out.add((group, resource, versions, tuple(rule["operations"])))
    return out


def test_webhook_registration_covers_exactly_what_the_webhook_judges(
    default_manifests: list[dict[str, Any]],
) -> None:
    (validating,) = of_kind(default_manifests, "ValidatingWebhookConfiguration")
    (mutating,) = of_kind(default_manifests, "MutatingWebhookConfiguration")
    assert registered(validating) == judged_registration()
    assert registered(mutating) == {
        (g, r, v, ("CREATE", "UPDATE")) for g, r, v, _ in judged_registration()
    }


def test_judged_versions_are_every_version_the_crds_serve() -> None:
    served: dict[tuple[str, str], set[str]] = {}
    files = [*(CHART / "crds").glob("*.yaml"), *(CHART / "gateway-api").glob("*/*.yaml")]
    # TCPRoute: Gateway API's experimental channel, not shipped; the tests' stand-in serves it.
    files.append(TCP_ROUTE_CRD)
    for path in files:
        spec = yaml.safe_load(path.read_text())["spec"]
        names = served.setdefault((spec["group"], spec["names"]["plural"]), set())
        names |= {v["name"] for v in spec["versions"] if v["served"]}
    for info in JUDGED_KINDS:
        assert served[(info.group, info.plural)] == set(info.versions), info.kind


def test_webhook_configurations_make_every_choice_explicit(helm: Path) -> None:
    for values, policy, excluded in (
        ((), "Fail", ["kube-system"]),
        (NON_DEFAULT, "Ignore", ["kube-system", "tenant-a", "tenant-b"]),
    ):
        manifests = render(helm, *values)
        for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
            (configuration,) = of_kind(manifests, kind)
            for webhook in configuration["webhooks"]:
                assert webhook["sideEffects"] == "None"
                assert webhook["matchPolicy"] == "Equivalent"
                assert webhook["admissionReviewVersions"] == ["v1"]
                groups = {g for rule in webhook["rules"] for g in rule["apiGroups"]}
                gateway_api = groups == {"gateway.networking.k8s.io"}
                assert gateway_api or groups == {"stunner.l7mp.io"}, groups
                assert webhook["failurePolicy"] == ("Ignore" if gateway_api else policy)
                (expression,) = webhook["namespaceSelector"]["matchExpressions"]
                assert expression["operator"] == "NotIn"
                assert expression["values"] == excluded
                service = webhook["clientConfig"]["service"]
                assert service["namespace"] == NAMESPACE


def test_webhook_certificate_is_one_ca_shared_by_secret_and_registrations(helm: Path) -> None:
    manifests = render(helm)
    (secret,) = [s for s in of_kind(manifests, "Secret") if s["type"] == "kubernetes.io/tls"]
    ca_pem = base64.b64decode(secret["data"]["ca.crt"])
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        (configuration,) = of_kind(manifests, kind)
        bundles = {w["clientConfig"]["caBundle"] for w in configuration["webhooks"]}
        assert bundles == {secret["data"]["ca.crt"]}
    ca = x509.load_pem_x509_certificate(ca_pem)
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    (service,) = [
        s for s in of_kind(manifests, "Service") if s["metadata"]["name"].endswith("webhook")
    ]
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{service['metadata']['name']}.{NAMESPACE}.svc" in names.get_values_for_type(
        x509.DNSName
    )
    (deployment,) = [
        d for d in of_kind(manifests, "Deployment") if "webhook" in d["metadata"]["name"]
    ]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "certs", "secret": {"secretName": secret["metadata"]["name"]}} in volumes


def test_the_webhooks_private_key_is_only_in_its_secret(
    default_manifests: list[dict[str, Any]],
) -> None:
    """The key the chart generates shows in the webhook Secret's data, in no other object (an
    annotation, an env var, a ConfigMap, a registration) and in no other field of the Secret."""
    (secret,) = [
        s for s in of_kind(default_manifests, "Secret") if s["type"] == "kubernetes.io/tls"
    ]
    key_b64 = secret["data"]["tls.key"]
    key_line = base64.b64decode(key_b64).decode().splitlines()[1]
    assert "PRIVATE KEY" in base64.b64decode(key_b64).decode()
    without_key = {**secret, "data": {k: v for k, v in secret["data"].items() if k != "tls.key"}}
    others = [o for o in default_manifests if o is not secret] + [without_key]
    text = json.dumps(others)
    assert key_b64[40:100] not in text and key_line not in text


def test_cert_manager_replaces_the_charts_own_ca(helm: Path) -> None:
    manifests = render(helm, "webhook.certificate.certManager=true")
    assert not [s for s in of_kind(manifests, "Secret") if s["type"] == "kubernetes.io/tls"]
    (certificate,) = of_kind(manifests, "Certificate")
    (issuer,) = of_kind(manifests, "Issuer")
    assert certificate["spec"]["issuerRef"]["name"] == issuer["metadata"]["name"]
    (validating,) = of_kind(manifests, "ValidatingWebhookConfiguration")
    assert "caBundle" not in validating["webhooks"][0]["clientConfig"]
    annotation = validating["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert annotation == f"{NAMESPACE}/{certificate['metadata']['name']}"


@pytest.mark.parametrize(
    ("sets", "udproute_versions", "crds"),
    [
        ((), {"v1"}, 4),
        (("crds.gatewayAPI.experimentalUDPRoute=true",), {"v1", "v1alpha2"}, 4),
        (("crds.gatewayAPI.standard=false",), None, 0),
        (
            ("crds.gatewayAPI.standard=false", "crds.gatewayAPI.experimentalUDPRoute=true"),
            {"v1", "v1alpha2"},
            1,
        ),
    ],
)
def test_gateway_api_crds_by_value(
    helm: Path, sets: tuple[str, ...], udproute_versions: set[str] | None, crds: int
) -> None:
    rendered = [
        c
        for c in of_kind(render(helm, *sets), "CustomResourceDefinition")
        if c["spec"]["group"] == "gateway.networking.k8s.io"
    ]
    assert len(rendered) == crds
    udproutes = [c for c in rendered if c["spec"]["names"]["plural"] == "udproutes"]
    if udproute_versions is None:
        assert not udproutes
    else:
        (udproute,) = udproutes
        served = {v["name"] for v in udproute["spec"]["versions"] if v["served"]}
        assert served == udproute_versions
    for crd in rendered:
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_pods_run_as_non_root_on_a_read_only_root(default_manifests: list[dict[str, Any]]) -> None:
    deployments = of_kind(default_manifests, "Deployment")
    pods = (
        [d["spec"]["template"]["spec"] for d in deployments]
        + [p["spec"] for p in of_kind(default_manifests, "Pod")]
        + [j["spec"]["template"]["spec"] for j in of_kind(default_manifests, "Job")]
    )
    assert len(pods) == 5  # reconciler, auth service, webhook, helm test, webhook-ready hook
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in pod["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["resources"]["limits"] and container["resources"]["requests"]


def test_reconciler_elects_a_leader_and_serves_cds_at_a_stable_name(
    default_manifests: list[dict[str, Any]],
) -> None:
    (reconciler,) = [
        d for d in of_kind(default_manifests, "Deployment") if "reconciler" in d["metadata"]["name"]
    ]
    (container,) = reconciler["spec"]["template"]["spec"]["containers"]
    assert "--leader-elect" in container["args"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    services = {s["metadata"]["name"]: s for s in of_kind(default_manifests, "Service")}
    cds = services["stunner-config-discovery"]
    assert cds["spec"]["ports"][0]["port"] == 13478
    pod_labels = reconciler["spec"]["template"]["metadata"]["labels"]
    assert cds["spec"]["selector"].items() <= pod_labels.items()
    url = f"--config-discovery-url=http://stunner-config-discovery.{NAMESPACE}.svc:13478"
    assert url in container["args"]
    auth = services["stunner-auth"]
    assert auth["spec"]["type"] == "ClusterIP"  # unauthenticated: never outside the cluster


def test_several_reconcilers_serve_the_cds_from_the_leader_only(helm: Path) -> None:
    """reconciler.replicas > 1: --cds-leader-only (a standby is not ready, so the CDS Service
    routes to the leader only), and a rollout that does not wait for a standby to be ready (it
    never is while the old leader runs); one replica serves as before; several without leader
    election are refused."""
    from reconciler.__main__ import build_parser, cluster_settings

    for replicas, leader_only in ((1, False), (2, True)):
        manifests = render(helm, f"reconciler.replicas={replicas}")
        (reconciler,) = [
            d for d in of_kind(manifests, "Deployment") if "reconciler" in d["metadata"]["name"]
        ]
        (container,) = reconciler["spec"]["template"]["spec"]["containers"]
        settings = cluster_settings(build_parser().parse_args(container["args"]))
        assert settings.leader_elect and settings.cds_leader_only == leader_only
        rollout = reconciler["spec"].get("strategy", {}).get("rollingUpdate", {})
        assert (rollout.get("maxUnavailable") == "100%") == leader_only
    complaint = refused(helm, "reconciler.replicas=2", "reconciler.leaderElection=false")
    assert "reconciler.replicas > 1 needs reconciler.leaderElection" in complaint


def test_the_reconciler_and_auth_service_accept_the_charts_arguments(
    default_manifests: list[dict[str, Any]],
) -> None:
    from reconciler.__main__ import build_parser as reconciler_parser
    from reconciler.__main__ import cluster_settings
    from stunner_cli.parser import build_parser as cli_parser

    containers = {
        c["name"]: c
        for d in of_kind(default_manifests, "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    args = reconciler_parser().parse_args(containers["reconciler"]["args"])
    assert args.manifests is None  # cluster mode
    settings = cluster_settings(args)
    assert settings.leader_elect and settings.lease_namespace == NAMESPACE
    assert settings.cds_port == 13478
    url = f"http://stunner-config-discovery.{NAMESPACE}.svc:13478"
    assert settings.render_settings.config_discovery_url == url
    auth = cli_parser().parse_args(containers["auth"]["args"])
    assert (auth.command, auth.cds_url, auth.port) == ("auth-server", url, 8088)


def test_the_webhook_and_the_reconciler_get_one_node_port_range(helm: Path) -> None:
    """webhook.nodePortRange reaches the webhook (which refuses a nodeport annotation outside
    it) and the reconciler (which would otherwise ignore one the webhook admitted)."""
    from reconciler.__main__ import build_parser as reconciler_parser
    from reconciler.__main__ import cluster_settings

    manifests = render(helm, "webhook.nodePortRange=20000-22767")
    containers = {
        c["name"]: c
        for d in of_kind(manifests, "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    args = reconciler_parser().parse_args(containers["reconciler"]["args"])
    assert cluster_settings(args).render_settings.rules.node_port_range == (20000, 22767)
    env = {e["name"]: e.get("value") for e in containers["webhook"]["env"]}
    assert env["STUNNER_WEBHOOK_NODE_PORT_RANGE"] == "20000-22767"


def test_default_dataplane_runs_the_charts_image(helm: Path) -> None:
    for sets, image in (
        ((), "localhost/stunnerd:0.1.0"),
        (NON_DEFAULT, "registry.example/stunnerd:1.2.3"),
    ):
        (dataplane,) = of_kind(render(helm, *sets), "Dataplane")
        assert dataplane["metadata"]["name"] == "default"
        spec = dataplane["spec"]
        assert spec["image"] == image
        assert spec["command"] == ["stunnerd"]
        assert spec["terminationGracePeriodSeconds"] == 3600
        assert spec["resources"]["limits"] == {"cpu": "2", "memory": "512Mi"}


def test_observability_is_off_by_default_and_complete_when_on(
    helm: Path, default_manifests: list[dict[str, Any]]
) -> None:
    assert not {m["kind"] for m in default_manifests} & THIRD_PARTY
    manifests = render(helm, *NON_DEFAULT)
    (rule,) = of_kind(manifests, "PrometheusRule")
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert alerts >= {
        "StunnerDataplaneDown",
        "StunnerDataplaneNotWatchingConfig",
        "StunnerAllocationsNearCap",
        "StunnerReconcilerNotLeader",
    }
    (dashboard,) = [
        c for c in of_kind(manifests, "ConfigMap") if "dashboard" in c["metadata"]["name"]
    ]
    text = dashboard["data"]["stunner.json"]
    for metric in (
        "stunner_allocations_active",
        "stunner_listener_packets_total",
        "stunner_cluster_bytes_total",
        "stunner_reconciler_render_duration_seconds_bucket",
    ):
        assert metric in text
    assert of_kind(manifests, "PodMonitor") and of_kind(manifests, "ServiceMonitor")


def test_helm_test_pod_runs_the_images_own_client(default_manifests: list[dict[str, Any]]) -> None:
    (pod,) = of_kind(default_manifests, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["stunner"] and container["args"][0] == "selftest"
    from stunner_cli.parser import build_parser

    build_parser().parse_args(container["args"])  # the CLI accepts exactly these arguments


def test_helm_test_checks_media_against_the_targets_it_is_given(helm: Path) -> None:
    manifests = render(
        helm, "test.targets={k8s://media/echo:9001}", "test.clusterDomain=k8s.example"
    )
    (pod,) = of_kind(manifests, "Pod")
    (container,) = pod["spec"]["containers"]
    assert container["args"][-2:] == [
        "--target=k8s://media/echo:9001",
        "--cluster-domain=k8s.example",
    ]
    from stunner_cli.parser import build_parser

    args = build_parser().parse_args(container["args"])
    assert [str(t) for t in args.target] == ["k8s://media/echo:9001"]
    assert args.cluster_domain == "k8s.example"


def test_the_reconcilers_lease_is_owned_by_its_deployment(
    default_manifests: list[dict[str, Any]],
) -> None:
    """`helm uninstall` deletes the Lease with the reconciler's Deployment (its owner), found
    on a real cluster (tests/cluster): the Lease outlived the release and held the next
    install's reconciler back for a lease duration. It may read that Deployment."""
    (deployment,) = [
        d for d in of_kind(default_manifests, "Deployment") if "reconciler" in d["metadata"]["name"]
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    name = deployment["metadata"]["name"]
    assert f"--leader-election-owner={name}" in container["args"]
    from reconciler.__main__ import build_parser as reconciler_parser

    args = reconciler_parser().parse_args(container["args"])
    assert args.leader_election_owner == name
    (role,) = [r for r in of_kind(default_manifests, "ClusterRole") if "reconciler" in str(r)]
    assert any(
        "deployments" in rule["resources"] and "get" in rule["verbs"] for rule in role["rules"]
    )
