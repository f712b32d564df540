"""Cluster-wide user quotas in the chart (README, "Cluster-wide user quotas"):
`gatewayConfig.userQuota` renders the GatewayConfig's `userQuota` (Go's field), by real helm 3
and 4, and the reconciler's own render (reconciler.render) turns it into the `admin.user_quota`
of every dataplane config of that GatewayConfig's Gateways, which stunnerd enforces across its
pods through the CDS. 0 (the default) renders no field: no quota. A negative or non-integer
value is refused by the schema.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.render import RenderSettings, render
from reconciler.store import Snapshot
from tests.charts.conftest import refused
from tests.charts.test_lb_presets import CREATE, NOW, chart_objects, class_and_gateway
from tests.support.objects import secret


def _gateway_config_of(objects: dict[str, dict[str, object]]) -> list[dict[str, object]]:
    config = objects["GatewayConfig"]["metadata"]
    assert isinstance(config, dict)
    auth = secret(
        "stunner-auth-secret",
        namespace=str(config["namespace"]),
        type="static",
        username="user-1",
        password="pass-1",
    )
    return [*class_and_gateway(config, "quota", "quota-gateway"), auth]


def test_the_charts_user_quota_reaches_every_dataplane_config(helm: Path) -> None:
    objects = chart_objects(helm, "gatewayConfig.userQuota=2")
    assert objects["GatewayConfig"]["spec"]["userQuota"] == 2
    snapshot = Snapshot.from_objects([*objects.values(), *_gateway_config_of(objects)])
    plan = render(snapshot, RenderSettings(), NOW)
    assert plan.configs["stunner/quota-gateway"].admin.user_quota == 2


def test_no_quota_by_default(helm: Path) -> None:
    objects = chart_objects(helm)
    assert "userQuota" not in objects["GatewayConfig"]["spec"]
    snapshot = Snapshot.from_objects([*objects.values(), *_gateway_config_of(objects)])
    plan = render(snapshot, RenderSettings(), NOW)
    assert plan.configs["stunner/quota-gateway"].admin.user_quota == 0


@pytest.mark.parametrize("value", ["-1", "1.5", "many"])
def test_a_bad_user_quota_is_refused(helm: Path, value: str) -> None:
    stderr = refused(helm, CREATE, f"gatewayConfig.userQuota={value}")
    assert "userQuota" in stderr, stderr
