"""A first end-to-end render of the spec's udp-gateway (the goldens cover every example)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import yaml

from reconciler.render import RenderSettings, render
from reconciler.store import Snapshot

DATA = Path(__file__).resolve().parent.parent / "data" / "render"


def test_udp_gateway_renders_its_config() -> None:
    objects = [
        *yaml.safe_load_all((DATA / "common.yaml").read_text()),
        *yaml.safe_load_all((DATA / "udp-gateway" / "objects.yaml").read_text()),
    ]
    plan = render(
        Snapshot.from_objects(objects), RenderSettings(), datetime(2026, 1, 1, tzinfo=UTC)
    )
    config = plan.configs["stunner/udp-gateway"]
    assert [listener.name for listener in config.listeners] == ["stunner/udp-gateway/udp-listener"]
    assert config.listeners[0].routes == ["stunner/media-plane-route"]
    assert config.clusters[0].endpoints == ["10.244.0.11", "10.244.1.12", "10.96.0.10"]
    assert set(plan.deployments) == set(plan.services) == {"stunner/udp-gateway"}
