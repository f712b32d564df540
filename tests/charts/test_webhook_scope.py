"""The chart's webhook never judges the chart's own objects (found on a real kube-apiserver,
tests/envtest/test_helm.py: the fake API server calls no webhook).

The release renders one object of a kind its webhook judges, the default Dataplane. Judged, it
made ``helm upgrade`` (a patch of it) fail whenever the webhook's pods were not up, fail-closed,
the very upgrade that would fix them, and the webhook's DELETE rule refused ``helm uninstall``.

We test these aspects, with helm 3 and 4, default and non-default values:
- every rendered object of a judged kind (not the `helm test` hooks, which `helm test` creates
  when the webhook's pods run) is left out of every webhook entry whose rules cover it, by the
  entry's objectSelector (evaluated as the API server does on the object's labels);
- a user's Dataplane (other labels) is still judged, by an entry with webhook.failurePolicy;
- no other kind is left out by an objectSelector (a tenant could set such a label).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stunner_api.vocabulary import JUDGED_KINDS, group_of
from tests.charts.conftest import of_kind, render

JUDGED = {(k.group, k.kind): k.plural for k in JUDGED_KINDS}


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector on labels (an absent selector selects everything)."""
    if not selector:
        return True
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression["values"]
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def entries_judging(
    manifests: list[dict[str, Any]], group: str, plural: str, labels: dict[str, str]
) -> list[dict[str, Any]]:
    """The webhook entries (both configurations) that would be called for such an object."""
    out = []
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        for configuration in of_kind(manifests, kind):
            for webhook in configuration["webhooks"]:
                covers = any(
                    group in rule["apiGroups"] and plural in rule["resources"]
                    for rule in webhook["rules"]
                )
                if covers and selects(webhook.get("objectSelector"), labels):
                    out.append(webhook)
    return out


@pytest.mark.parametrize(
    "values", [(), ("webhook.failurePolicy=Ignore",)], ids=["default", "ignore"]
)
def test_the_webhook_leaves_out_the_releases_own_objects(
    helm: Path, values: tuple[str, ...]
) -> None:
    manifests = render(helm, *values)
    # The release's resources; not its `helm test` hooks, created by `helm test` only, when
    # the webhook's pods run.
    own = [
        m
        for m in manifests
        if (group_of(m["apiVersion"]), m["kind"]) in JUDGED
        and "helm.sh/hook" not in (m["metadata"].get("annotations") or {})
    ]
    assert own, "the chart renders no object of a judged kind (the default Dataplane)"
    for obj in own:
        plural = JUDGED[group_of(obj["apiVersion"]), obj["kind"]]
        labels = obj["metadata"].get("labels") or {}
        judging = entries_judging(manifests, group_of(obj["apiVersion"]), plural, labels)
        assert not judging, f"{obj['kind']} {obj['metadata']['name']}: {judging}"
        # A user's object of the same kind is judged, by both configurations.
        users = entries_judging(manifests, group_of(obj["apiVersion"]), plural, {})
        assert len(users) == 2, users
        policy = "Ignore" if values else "Fail"
        assert {w["failurePolicy"] for w in users} == {policy}


def test_only_dataplanes_are_left_out_by_an_object_selector(helm: Path) -> None:
    manifests = render(helm)
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        (configuration,) = of_kind(manifests, kind)
        for webhook in configuration["webhooks"]:
            if "objectSelector" in webhook:
                resources = {r for rule in webhook["rules"] for r in rule["resources"]}
                groups = {g for rule in webhook["rules"] for g in rule["apiGroups"]}
                assert (groups, resources) == ({"stunner.l7mp.io"}, {"dataplanes"}), webhook
