"""The spec's examples (GATEWAY-REFERENCE.md, kept in tests/data/spec), each rendered to
golden files.

Every case is a directory of tests/data/render/: `common.yaml` (the spec's GatewayClass,
GatewayConfig and Dataplane, the auth Secret, the namespaces) plus the case's `objects.yaml`.
Its goldens, under `golden/`, are one dataplane config per Gateway (`<ns>_<name>.json`, as CDS
serves it, indented) and `plan.yaml` (Deployments, Services, ServiceAccounts, the account each
config is served to, statuses, findings).

Regenerate the goldens after an intended change, then review the diff line by line:

    STUNNER_REGEN_GOLDENS=1 .venv/bin/pytest tests/reconciler/test_render_golden.py
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.render import Plan, RenderSettings, render
from reconciler.store import Snapshot
from stunnerd.process.sources import FileSource

DATA = Path(__file__).resolve().parent.parent / "data" / "render"
CASES = sorted(p.name for p in DATA.iterdir() if (p / "objects.yaml").is_file())
NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
REGENERATE = os.environ.get("STUNNER_REGEN_GOLDENS") == "1"


def load_case(case: str) -> list[dict[str, Any]]:
    objects = []
    for path in (DATA / "common.yaml", DATA / case / "objects.yaml"):
        objects += [obj for obj in yaml.safe_load_all(path.read_text()) if obj]
    return objects


def render_case(case: str) -> Plan:
    return render(Snapshot.from_objects(load_case(case)), RenderSettings(), NOW)


def config_file(config_id: str) -> str:
    return config_id.replace("/", "_") + ".json"


def plan_document(plan: Plan) -> dict[str, Any]:
    return {
        "deployments": dict(plan.deployments),
        "services": dict(plan.services),
        "service_accounts": dict(plan.service_accounts),
        "dataplane_accounts": dict(plan.dataplane_accounts),
        "statuses": [asdict(s) for s in plan.statuses],
        "findings": [str(f) for f in plan.findings],
    }


def config_text(plan: Plan, config_id: str) -> str:
    return json.dumps(plan.configs[config_id].to_dict(), indent=2) + "\n"


@pytest.mark.parametrize("case", CASES)
def test_case_renders_its_goldens(case: str) -> None:
    plan = render_case(case)
    golden = DATA / case / "golden"
    document = yaml.safe_dump(plan_document(plan), sort_keys=False, width=100)
    if REGENERATE:
        golden.mkdir(exist_ok=True)
        for old in golden.glob("*.json"):
            old.unlink()
        for config_id in plan.configs:
            (golden / config_file(config_id)).write_text(config_text(plan, config_id))
        (golden / "plan.yaml").write_text(document)
    assert sorted(p.name for p in golden.glob("*.json")) == sorted(map(config_file, plan.configs))
    for config_id in plan.configs:
        assert config_text(plan, config_id) == (golden / config_file(config_id)).read_text()
    assert document == (golden / "plan.yaml").read_text()


def golden_configs() -> list[Path]:
    return sorted(DATA.glob("*/golden/*.json"))


def test_every_case_has_a_golden_config() -> None:
    assert CASES and {p.parent.parent.name for p in golden_configs()} == set(CASES)


@pytest.mark.parametrize("path", golden_configs(), ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_stunnerd_loads_the_golden_config_unchanged(path: Path) -> None:
    """stunnerd's own file source reads the file as it is, with the pod's environment."""
    env = {"STUNNER_ADDR": "10.244.9.9"}
    loaded = asyncio.run(FileSource(path, env=env).load())
    config_id = path.name.removesuffix(".json").replace("_", "/", 1)
    rendered = render_case(path.parent.parent.name).configs[config_id]
    assert loaded.admin.name == config_id
    assert loaded.listeners and all(lst.address == "10.244.9.9" for lst in loaded.listeners)
    assert loaded == rendered.model_copy(
        update={
            "listeners": [
                lst.model_copy(update={"address": "10.244.9.9"}) for lst in rendered.listeners
            ]
        }
    )
