"""The Dockerfile names only what exists: its COPY sources, the extras it installs, the images
the chart runs, the path of the webhook's gunicorn configuration. No test builds the image (no
docker engine, no registry to pull the base from, in CI): test_image_processes.py runs the
build stages' own commands and starts what the chart runs from their venvs; tests/cluster/
builds the image itself where a cluster is configured."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest
import yaml
from setuptools import find_packages

from hack.image_venv import DATAPLANE_SCRIPTS
from tests.charts.conftest import CHART, ROOT, helm_binary, render
from tests.image.conftest import IMAGE_PREFIX, stages

DOCKERFILE = (ROOT / "Dockerfile").read_text()
PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
STAGES = stages()


def installed_packages() -> set[str]:
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    return set(find_packages(str(ROOT), include=include))


def extras_of(stage: str) -> set[str]:
    (install,) = [r for r in STAGES[stage].runs if "pip install" in r]
    match = re.search(r'stunner-\*\.whl\)(?:\[([^\]]+)\])?"', install)
    assert match is not None, install
    return set(match.group(1).split(",")) if match.group(1) else set()


def test_copy_sources_exist_and_cover_every_package() -> None:
    copied = set()
    for source, _ in STAGES["build"].copies:
        matches = list(ROOT.glob(source.rstrip("/")))
        assert matches or source.endswith("*"), f"COPY {source}: not in the repository"
        copied.add(source.rstrip("/"))
    top_level = {p.split(".")[0] for p in installed_packages()}
    assert top_level <= copied, f"packages the image would lack: {top_level - copied}"


def test_the_images_and_their_extras() -> None:
    """Two runtime targets from one wheel: the control plane (the default, last stage) with
    every extra the chart's control-plane commands need; the dataplane with none."""
    assert list(STAGES)[-1] == "controlplane" and "dataplane" in STAGES
    optional = PYPROJECT["project"]["optional-dependencies"]
    assert extras_of("venv-controlplane") == {"reconciler", "webhook", "cli"} <= set(optional)
    assert extras_of("venv-dataplane") == set()
    for stage in ("venv-controlplane", "venv-dataplane"):
        assert STAGES[stage].workdir == "/", f"{stage}: its checks must not see the source tree"
        assert "image_venv.py check --native" in STAGES[stage].runs[-1]


def test_runs_as_a_numeric_non_root_user() -> None:
    (user,) = re.findall(r"^USER (\S+)", DOCKERFILE, re.M)
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0


def commands_by_image(manifests: list[dict[str, Any]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for manifest in manifests:
        if manifest["kind"] == "Dataplane":
            spec = manifest["spec"]
            out.setdefault(spec["image"], set()).add(spec["command"][0])
            continue
        pod = manifest.get("spec", {}).get("template", {}).get("spec") or manifest.get("spec", {})
        for container in pod.get("containers", []) if isinstance(pod, dict) else []:
            out.setdefault(container["image"], set()).add(container["command"][0])
    return out


def test_every_command_the_chart_runs_is_in_the_image_it_names() -> None:
    scripts = set(PYPROJECT["project"]["scripts"])
    by_image = commands_by_image(render(helm_binary("helm4")))
    assert by_image == {
        "localhost/stunner:0.1.0": {"stunner-reconciler", "gunicorn", "stunner"},
        "localhost/stunnerd:0.1.0": {"stunnerd"},
    }
    assert by_image["localhost/stunner:0.1.0"] <= scripts | {"gunicorn"}
    assert by_image["localhost/stunnerd:0.1.0"] <= DATAPLANE_SCRIPTS <= scripts


def test_the_gunicorn_configuration_the_chart_names_is_installed() -> None:
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    match = re.search(r"(/opt/stunner/lib/python(\d\.\d+)/site-packages/(\S+))", helpers)
    assert match is not None
    path, python, relative = match.groups()
    (base,) = re.findall(r"^ARG PYTHON=python:(\d\.\d+)", DOCKERFILE, re.M)
    assert python == base, "the chart's path names another Python than the image's"
    assert f"python -m venv {IMAGE_PREFIX}" in STAGES["venv-controlplane"].runs[0]
    package = relative.split("/")[0]
    assert package in installed_packages() and (ROOT / relative).is_file()


@pytest.mark.parametrize("path", ["README.md", "Dockerfile"])
def test_readme_says_how_to_build_and_load_both_images(path: str) -> None:
    text = (ROOT / path).read_text()
    assert "docker build -t localhost/stunner:" in text
    assert "docker build --target dataplane -t localhost/stunnerd:" in text
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == "localhost/stunner"
    assert values["image"]["dataplaneRepository"] == "localhost/stunnerd"
