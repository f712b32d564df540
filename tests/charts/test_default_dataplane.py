"""One source of truth for the default Dataplane: the chart installs exactly the Dataplane
`stunner render` assumes when the files hold none (stunner_api.vocabulary.CHART_DATAPLANE_SPEC,
stunner_cli.offline.default_dataplane)."""

from __future__ import annotations

from typing import Any

from stunner_cli.offline import default_dataplane
from tests.charts.conftest import of_kind


def test_the_chart_installs_the_dataplane_render_assumes(
    default_manifests: list[dict[str, Any]],
) -> None:
    (installed,) = [d for d in of_kind(default_manifests, "Dataplane")]
    assumed = default_dataplane()
    assert installed["metadata"]["name"] == assumed["metadata"]["name"]
    assert installed["apiVersion"] == assumed["apiVersion"]
    assert installed["spec"] == assumed["spec"]
