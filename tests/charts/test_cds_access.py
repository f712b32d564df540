"""The chart's side of "only a Gateway's own dataplane reads its config" (issue 20 #5).

By default the reconciler requires CDS tokens and lets the chart's reader account read every
config; the auth service and `helm test` run as that account with the same projected token the
reconciler renders into every stunnerd pod (one audience, one path: the chart's copy and
stunner_api's words agree); the reader account has no RBAC and mounts no API-server token;
NetworkPolicies admit only stunnerd pods, the auth service and `helm test` to the CDS port
(plus `networkPolicy.cds.extraFrom`) and the selected namespaces to the auth service;
`cdsAuth.mode=off` / `networkPolicy.enabled=false` take all of it away; and the chart's default
Dataplane leaves every Gateway the account rendered for it (issue 28 #3).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reconciler.cds.access import Account, AuthMode
from reconciler.render.deployment import CDS_TOKEN_SOURCE
from stunner_api.vocabulary import CDS_TOKEN_DIR, CDS_TOKEN_FILE, CDS_TOKEN_FILE_ENV
from tests.charts.conftest import NAMESPACE, of_kind, render

READER = "stunner-config-reader"


def named(manifests: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    (found,) = [m for m in of_kind(manifests, kind) if m["metadata"]["name"].endswith(suffix)]
    return found


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]
    return spec["template"]["spec"] if "template" in spec else spec


def reconciler_settings(manifests: list[dict[str, Any]]) -> Any:
    from reconciler.__main__ import build_parser, cluster_settings

    container = pod_spec(named(manifests, "Deployment", "-reconciler"))["containers"][0]
    return cluster_settings(build_parser().parse_args(container["args"]))


def test_readers_run_with_the_cds_token_stunnerd_pods_get(
    default_manifests: list[dict[str, Any]],
) -> None:
    settings = reconciler_settings(default_manifests)
    assert settings.cds_auth == AuthMode.REQUIRED
    assert settings.cds_readers == frozenset({Account(NAMESPACE, READER)})
    account = named(default_manifests, "ServiceAccount", READER)
    assert account["metadata"]["namespace"] == NAMESPACE
    assert account["automountServiceAccountToken"] is False
    for obj in (
        named(default_manifests, "Deployment", "-auth"),
        named(default_manifests, "Pod", "-test"),
    ):
        spec = pod_spec(obj)
        assert spec["serviceAccountName"] == READER
        assert spec["automountServiceAccountToken"] is False
        assert spec["volumes"] == [CDS_TOKEN_SOURCE]  # the rendered stunnerd pods' very volume
        (container,) = spec["containers"]
        assert {"name": CDS_TOKEN_FILE_ENV, "value": CDS_TOKEN_FILE} in container["env"]
        (mount,) = container["volumeMounts"]
        assert mount == {"name": "stunner-cds-token", "mountPath": CDS_TOKEN_DIR, "readOnly": True}
    # The reader account is bound to nothing: its tokens serve the CDS only.
    for binding in of_kind(default_manifests, "ClusterRoleBinding") + of_kind(
        default_manifests, "RoleBinding"
    ):
        assert all(s["name"] != READER for s in binding["subjects"])
    rules = named(default_manifests, "ClusterRole", "-reconciler")["rules"]
    assert {
        "apiGroups": ["authentication.k8s.io"],
        "resources": ["tokenreviews"],
        "verbs": ["create"],
    } in rules


def test_network_policies_admit_dataplanes_readers_and_what_the_values_add(
    helm: Path, default_manifests: list[dict[str, Any]]
) -> None:
    cds = named(default_manifests, "NetworkPolicy", "-cds")
    labels = named(default_manifests, "Deployment", "-reconciler")["spec"]["template"]["metadata"][
        "labels"
    ]
    assert cds["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert cds["spec"]["policyTypes"] == ["Ingress"]
    cds_rule, open_rule = cds["spec"]["ingress"]
    assert cds_rule["ports"] == [{"port": 13478, "protocol": "TCP"}]
    sources = cds_rule["from"]
    assert sources[0] == {
        "namespaceSelector": {},
        "podSelector": {"matchLabels": {"app": "stunner"}},
    }
    components = [
        s["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for s in sources[1:]
    ]
    assert components == ["auth", "test"]
    assert "from" not in open_rule  # metrics and health: anyone (Prometheus, probes)
    assert {p["port"] for p in open_rule["ports"]} == {8080, 8081}
    auth = named(default_manifests, "NetworkPolicy", "-auth")
    (auth_rule,) = auth["spec"]["ingress"]
    assert auth_rule == {
        "ports": [{"port": 8088, "protocol": "TCP"}],
        "from": [{"namespaceSelector": {}}],
    }
    opened = render(
        helm,
        "networkPolicy.cds.extraFrom[0].ipBlock.cidr=172.18.0.2/32",
        "networkPolicy.auth.namespaceSelector.matchLabels.media=yes",
    )
    extra = named(opened, "NetworkPolicy", "-cds")["spec"]["ingress"][0]["from"][-1]
    assert extra == {"ipBlock": {"cidr": "172.18.0.2/32"}}
    (auth_rule,) = named(opened, "NetworkPolicy", "-auth")["spec"]["ingress"]
    assert auth_rule["from"] == [{"namespaceSelector": {"matchLabels": {"media": "yes"}}}]
    assert of_kind(render(helm, "networkPolicy.enabled=false"), "NetworkPolicy") == []


def test_cds_auth_off_is_gos_open_cds(helm: Path) -> None:
    manifests = render(helm, "cdsAuth.mode=off")
    assert reconciler_settings(manifests).cds_auth == AuthMode.OFF
    assert [
        a for a in of_kind(manifests, "ServiceAccount") if a["metadata"]["name"] == READER
    ] == []
    auth = pod_spec(named(manifests, "Deployment", "-auth"))
    assert "serviceAccountName" not in auth and "volumes" not in auth


def test_the_charts_dataplane_leaves_each_gateway_its_own_account(
    default_manifests: list[dict[str, Any]],
) -> None:
    """Issue 28 #3: the chart's default Dataplane names no serviceAccountName, so every Gateway's
    pods run as the account rendered for it, and the namespace's `default` reads nothing; the
    reconciler's ClusterRole lets it manage those accounts."""
    from datetime import UTC, datetime

    from reconciler.render import RenderSettings, render
    from reconciler.store import Snapshot
    from tests.reconciler import clusterkit as k

    (installed,) = of_kind(default_manifests, "Dataplane")
    assert "serviceAccountName" not in installed["spec"]
    world = [k.gateway_class(), k.gateway_config(), installed, k.gateway(uid="u")]
    plan = render(Snapshot.from_objects(world), RenderSettings(), datetime.now(UTC))
    pod = plan.deployments["stunner/gw"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gw-stunnerd" == plan.dataplane_accounts["stunner/gw"]
    assert plan.service_accounts["stunner/gw"]["metadata"]["ownerReferences"][0]["uid"] == "u"
    rules = named(default_manifests, "ClusterRole", "-reconciler")["rules"]
    (accounts,) = [r for r in rules if "serviceaccounts" in r["resources"]]
    assert set(accounts["verbs"]) == {"get", "list", "watch", "create", "update", "delete"}
