"""`helm test stunner --logs` with helm 3 and 4: the rule helm applies to the chart's test hooks,
checked on what `helm template` renders, default and non-default values.

No test here runs `helm test --logs` itself: that needs a cluster running the test pod (CI has
none; tests/cluster/ is the opt-in layer). So this encodes helm's own code, read in helm's
repository at v3.18.0 to v3.21.4 and v4.0.0 to v4.2.4 (the helm 3 and 4 that hack/helm.sh
installs are v3.18 and v4.2.3):

- `GetPodLogs` (pkg/action/release_testing.go) walks every hook whose events include `test`
  (`test-success` is the same event), by weight then name, and GETs the logs of the Pod named
  like the hook in the release namespace, whatever the hook's kind. A Service, UDPRoute or
  ReferenceGrant hook with a name no test Pod has ends the run in `Error: unable to get pod logs
  for stunner-test-echo: pods "stunner-test-echo" not found` (issue 19, helm 4). helm's main
  branch skips non-Pod hooks since 1a1ec6e ("fix: skip non-Pod test hooks in GetPodLogs"), in
  no release yet.
- helm 3's `execHook` (pkg/action/hooks.go) deletes the hooks with `hook-succeeded` once the
  tests pass, and a failed one with `hook-failed`, before `GetPodLogs` runs; helm 4's
  `execHookWithDelayedShutdown` defers both until after it. So for helm 3 the test Pod may carry
  neither policy; `before-hook-creation` alone keeps one pod at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.charts.conftest import NAMESPACE, render

TEST_EVENTS = {"test", "test-success"}
GONE_BEFORE_LOGS = {"hook-succeeded", "hook-failed"}  # helm 3 deletes these before GetPodLogs
VALUES = {
    "default": (),
    "gateways-in-two-namespaces": ("test.gateways={tenant-a/gw,tenant-a/gw2,tenant-b/gw}",),
    "no-gateways": ("test.gateways=null",),
}


def annotations(obj: dict[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def hooks_of_test(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        m
        for m in manifests
        if {e.strip() for e in annotations(m).get("helm.sh/hook", "").split(",")} & TEST_EVENTS
    ]


def logs_helm_cannot_read(manifests: list[dict[str, Any]]) -> list[str]:
    """Each test hook whose logs `helm test --logs` would fail to read, and why."""
    hooks = hooks_of_test(manifests)
    pods = {
        m["metadata"]["name"]: m
        for m in hooks
        if m.get("kind") == "Pod" and m["metadata"].get("namespace", NAMESPACE) == NAMESPACE
    }
    problems = []
    for hook in hooks:
        name, kind = hook["metadata"]["name"], hook.get("kind")
        pod = pods.get(name)
        if pod is None:
            problems.append(f"{kind} {name}: no test Pod {NAMESPACE}/{name} to read logs of")
            continue
        policies = {
            p.strip() for p in annotations(pod).get("helm.sh/hook-delete-policy", "").split(",")
        }
        if gone := sorted(policies & GONE_BEFORE_LOGS):
            problems.append(
                f"{kind} {name}: its Pod is deleted ({', '.join(gone)}) before helm 3 reads logs"
            )
    return problems


@pytest.mark.parametrize("values", sorted(VALUES))
def test_helm_test_logs_reads_a_pod_for_every_test_hook(helm: Path, values: str) -> None:
    manifests = render(helm, *VALUES[values])
    assert any(m.get("kind") == "Pod" for m in hooks_of_test(manifests))
    assert logs_helm_cannot_read(manifests) == []


def test_the_rule_catches_what_issue_19_hit() -> None:
    """The chart as it was: the echo Service named apart from the pod, the pod hook-succeeded."""
    pod = {
        "kind": "Pod",
        "metadata": {
            "name": "stunner-test",
            "namespace": NAMESPACE,
            "annotations": {
                "helm.sh/hook": "test",
                "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded",
            },
        },
    }
    service = {
        "kind": "Service",
        "metadata": {
            "name": "stunner-test-echo",
            "namespace": NAMESPACE,
            "annotations": {"helm.sh/hook": "test", "helm.sh/hook-weight": "-1"},
        },
    }
    assert logs_helm_cannot_read([pod, service]) == [
        "Pod stunner-test: its Pod is deleted (hook-succeeded) before helm 3 reads logs",
        f"Service stunner-test-echo: no test Pod {NAMESPACE}/stunner-test-echo to read logs of",
    ]
