"""The chart's post-install/post-upgrade hook that waits until the API server reaches the
webhook (issue 32): rendered as hooks, with no more rights than a dry run needs, running a
command the image's CLI parses; absent where the webhook would never judge its probe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stunner_cli.parser import build_parser
from stunner_cli.webhook_ready import probe
from tests.charts.conftest import NAMESPACE, of_kind, render

HOOK = "stunner-webhook-ready"


def hook_objects(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {m["kind"]: m for m in manifests if m["metadata"]["name"] == HOOK}


def test_the_hook_runs_after_install_and_upgrade_with_only_a_dry_runs_rights(
    default_manifests: list[dict[str, Any]],
) -> None:
    objects = hook_objects(default_manifests)
    assert set(objects) == {"ServiceAccount", "Role", "RoleBinding", "Job"}
    weights = {}
    for kind, obj in objects.items():
        annotations = obj["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "post-install,post-upgrade", kind
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        assert obj["metadata"]["namespace"] == NAMESPACE
        weights[kind] = int(annotations["helm.sh/hook-weight"])
    assert weights["Job"] > max(w for kind, w in weights.items() if kind != "Job")
    group, _, _ = probe(NAMESPACE)["apiVersion"].partition("/")
    assert objects["Role"]["rules"] == [
        {"apiGroups": [group], "resources": ["gatewayconfigs"], "verbs": ["create"]}
    ]
    subject = objects["RoleBinding"]["subjects"][0]
    assert (subject["kind"], subject["name"]) == ("ServiceAccount", HOOK)
    assert not of_kind(default_manifests, "ClusterRoleBinding") or all(
        s.get("name") != HOOK
        for b in of_kind(default_manifests, "ClusterRoleBinding")
        for s in b.get("subjects", [])
    )
    pod = objects["Job"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == HOOK and pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["command"] == ["stunner"]
    args = build_parser().parse_args(container["args"])
    assert (args.command, args.namespace, args.timeout) == ("webhook-ready", NAMESPACE, 120)
    assert objects["Job"]["spec"]["activeDeadlineSeconds"] > args.timeout


def test_the_hook_is_absent_where_the_webhook_would_never_judge_its_probe(helm: Path) -> None:
    for sets in (
        ("webhook.enabled=false",),
        ("webhook.readyCheck.enabled=false",),
        (f"webhook.excludedNamespaces={{{NAMESPACE}}}",),
    ):
        assert hook_objects(render(helm, *sets)) == {}, sets
    assert set(hook_objects(render(helm, "webhook.readyCheck.timeoutSeconds=30"))) == {
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Job",
    }
