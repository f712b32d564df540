"""The chart's `webhook.podCIDRs` / `webhook.serviceCIDRs` reach the webhook as the settings it
reads, with helm 3 and 4.

- Set, the webhook Deployment carries STUNNER_WEBHOOK_POD_CIDRS / _SERVICE_CIDRS, and the
  webhook's own parser (webhook.settings_from_env) reads them as the CIDRs to guard.
- Unset, neither variable is rendered: the webhook discovers the networks from the API (and
  where the API has no pod network, warns in every StaticService admission; tests/webhook/).
- Not a CIDR list: `helm template` refuses the value (values.schema.json), before any pod runs.
"""

from __future__ import annotations

from pathlib import Path

from tests.charts.conftest import of_kind, refused, render
from webhook import POD_CIDRS, SERVICE_CIDRS, settings_from_env


def webhook_env(manifests: list[dict[str, object]]) -> dict[str, str]:
    (deployment,) = [
        d
        for d in of_kind(manifests, "Deployment")
        if d["metadata"]["name"] == "stunner-webhook"  # type: ignore[index]
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]  # type: ignore[index]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_the_cidr_values_become_the_webhooks_settings(helm: Path) -> None:
    env = webhook_env(
        render(
            helm,
            "webhook.podCIDRs=10.244.0.0/16\\, fd00:10:244::/56",
            "webhook.serviceCIDRs=10.96.0.0/12",
        )
    )
    assert env[POD_CIDRS] == "10.244.0.0/16, fd00:10:244::/56"
    settings = settings_from_env(env)
    assert settings.pod_cidrs == ("10.244.0.0/16", "fd00:10:244::/56")
    assert settings.service_cidrs == ("10.96.0.0/12",)
    unset = webhook_env(render(helm))
    assert POD_CIDRS not in unset and SERVICE_CIDRS not in unset


def test_a_value_that_is_no_cidr_list_is_refused(helm: Path) -> None:
    message = refused(helm, "webhook.podCIDRs=10.244.0.0/16;10.0.0.0/8")
    assert "webhook.podCIDRs" in message or "podCIDRs" in message, message
