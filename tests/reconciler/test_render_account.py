"""Each Gateway's dataplane runs as a ServiceAccount of its own (issue 28 #3: the namespace's
`default` account read every Gateway's config), rendered and owned like its Service, unless its
Dataplane names one; the plan says, per config, which account the CDS serves it to."""

from __future__ import annotations

import pytest

from reconciler.render.inputs import ACCOUNT_SUFFIX, MAX_NAME, account_name
from stunner_api.vocabulary import DNS_NAME
from tests.reconciler.clusterkit import dataplane
from tests.reconciler.test_render_rules import gateway, gateway_config, plan_of

UNMANAGED = {"stunner.l7mp.io/disable-managed-dataplane": "true"}


def test_every_gateway_gets_an_account_of_its_own_that_its_pods_run_as() -> None:
    plan = plan_of(
        gateway(uid="uid-1", labels={"team": "media"}),
        gateway(name="gw2", uid="uid-2"),
    )
    assert set(plan.service_accounts) == {"stunner/gw", "stunner/gw2"}
    assert plan.service_accounts["stunner/gw"] == {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": "gw-stunnerd",
            "namespace": "stunner",
            "labels": {
                "stunner.l7mp.io/owned-by": "stunner",
                "stunner.l7mp.io/related-gateway-name": "gw",
                "stunner.l7mp.io/related-gateway-namespace": "stunner",
            },
            "annotations": {"stunner.l7mp.io/related-gateway-name": "stunner/gw"},
            "ownerReferences": [
                {
                    "apiVersion": "gateway.networking.k8s.io/v1",
                    "kind": "Gateway",
                    "name": "gw",
                    "uid": "uid-1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        # stunnerd never calls the API server: its only credential is the projected CDS token.
        "automountServiceAccountToken": False,
    }
    for gw in ("gw", "gw2"):
        pod = plan.deployments[f"stunner/{gw}"]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == f"{gw}-stunnerd"
        assert pod["automountServiceAccountToken"] is False
    assert plan.dataplane_accounts == {"stunner/gw": "gw-stunnerd", "stunner/gw2": "gw2-stunnerd"}


def test_a_dataplane_that_names_an_account_keeps_it_and_none_is_rendered() -> None:
    plan = plan_of(dataplane(serviceAccountName="media-relay"))
    assert plan.service_accounts == {}
    pod = plan.deployments["stunner/gw"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "media-relay"
    assert plan.dataplane_accounts == {"stunner/gw": "media-relay"}
    assert plan.findings == ()
    # Naming `default` again is allowed, and warned about: every pod of the namespace reads.
    opened = plan_of(dataplane(serviceAccountName="default"))
    assert opened.dataplane_accounts == {"stunner/gw": "default"}
    (finding,) = opened.findings
    assert finding.path == "spec.serviceAccountName" and "could read" in finding.message


def test_an_unmanaged_dataplane_still_has_its_account_and_an_invalid_gateway_none() -> None:
    """disable-managed-dataplane: no Deployment, but the config is served, to the Gateway's own
    account (the stunnerd you run yourself runs as it). A Gateway whose config does not render
    has neither."""
    plan = plan_of(gateway(annotations=UNMANAGED))
    assert plan.deployments == {}
    assert plan.service_accounts["stunner/gw"]["metadata"]["name"] == "gw-stunnerd"
    assert plan.dataplane_accounts == {"stunner/gw": "gw-stunnerd"}
    broken = gateway_config()
    broken["spec"]["authType"] = "no-such-type"
    invalid = plan_of(broken)
    assert "stunner/gw" not in invalid.configs
    assert invalid.service_accounts == {} and invalid.dataplane_accounts == {}


@pytest.mark.parametrize(
    "gateway_name",
    [
        "gw",
        "default",  # never the namespace's default account
        "a.b-c",
        "x" * (MAX_NAME - len(ACCOUNT_SUFFIX)),  # the longest name kept whole
        "x" * (MAX_NAME - len(ACCOUNT_SUFFIX) + 1),
        "y" * 253,
        "z" * 240 + "-.-" + "w" * 10,  # cut where a "-" or "." would end a label
    ],
)
def test_account_names_are_valid_and_never_the_default(gateway_name: str) -> None:
    name = account_name(gateway_name)
    assert len(name) <= MAX_NAME and DNS_NAME.match(name), name
    assert name.endswith(ACCOUNT_SUFFIX) and name != "default"
    if len(gateway_name) + len(ACCOUNT_SUFFIX) <= MAX_NAME:
        assert name == gateway_name + ACCOUNT_SUFFIX


def test_two_gateways_never_share_an_account() -> None:
    """Kept whole, the suffix makes the name one Gateway's; cut, the digest of the whole name
    does: Gateways that differ only past the cut still get two."""
    long_names = ["q" * 250 + suffix for suffix in ("abc", "abd", "")]
    names = ["gw", "gw-stunnerd", "gw.stunnerd", "default", *long_names, "q" * 244]
    accounts = [account_name(n) for n in names]
    assert len(set(accounts)) == len(names), accounts
