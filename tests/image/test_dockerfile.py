"""The Dockerfile names only what exists: its COPY sources, the extras it installs, the entry
points the chart runs in the image, the path of the webhook's gunicorn configuration. No test
builds the image (no registry to pull the base from here)."""

from __future__ import annotations

import re
import shlex
import tomllib
from typing import Any

import pytest
import yaml
from setuptools import find_packages

from tests.charts.conftest import CHART, ROOT, helm_binary, render

DOCKERFILE = (ROOT / "Dockerfile").read_text()
PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())


def instructions(name: str) -> list[str]:
    joined = re.sub(r"\\\n", " ", DOCKERFILE)
    return [line.split(None, 1)[1] for line in joined.splitlines() if line.startswith(name + " ")]


def installed_packages() -> set[str]:
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    return set(find_packages(str(ROOT), include=include))


def test_copy_sources_exist_and_cover_every_package() -> None:
    copied: set[str] = set()
    for args in instructions("COPY"):
        if args.startswith("--from="):
            continue
        *sources, _ = shlex.split(args)
        for source in sources:
            matches = list(ROOT.glob(source.rstrip("/")))
            assert matches or source.endswith("*"), f"COPY {source}: not in the repository"
            copied.add(source.rstrip("/"))
    top_level = {p.split(".")[0] for p in installed_packages()}
    assert top_level <= copied, f"packages the image would lack: {top_level - copied}"


def test_installed_extras_exist() -> None:
    (install,) = [r for r in instructions("RUN") if "pip install" in r]
    extras = re.search(r'"\.\[([^\]]+)\]"', install)
    assert extras is not None
    for extra in extras.group(1).split(","):
        assert extra in PYPROJECT["project"]["optional-dependencies"], extra


def test_runs_as_a_numeric_non_root_user() -> None:
    (user,) = instructions("USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0


def test_every_command_the_chart_runs_is_an_entry_point_of_the_image() -> None:
    scripts = set(PYPROJECT["project"]["scripts"])
    (install,) = [r for r in instructions("RUN") if "pip install" in r]
    extras = re.search(r'"\.\[([^\]]+)\]"', install)
    assert extras is not None
    deps = [
        d
        for extra in extras.group(1).split(",")
        for d in PYPROJECT["project"]["optional-dependencies"][extra]
    ]
    provided = scripts | {"gunicorn"} if any(d.startswith("gunicorn") for d in deps) else scripts
    manifests = render(helm_binary("helm4"))
    commands = set()
    for manifest in manifests:
        pod = manifest.get("spec", {}).get("template", {}).get("spec") or manifest.get("spec", {})
        for container in pod.get("containers", []) if isinstance(pod, dict) else []:
            commands.add(container["command"][0])
        if manifest["kind"] == "Dataplane":
            commands.add(manifest["spec"]["command"][0])
    assert commands == {"stunnerd", "stunner-reconciler", "gunicorn", "stunner"}
    assert commands <= provided
    # Each command's extra (what it imports beyond the base dependencies) is installed.
    installed = set(extras.group(1).split(","))
    assert {"reconciler", "webhook", "cli"} <= installed


def test_the_gunicorn_configuration_the_chart_names_is_installed() -> None:
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    match = re.search(r"(/opt/stunner/lib/python(\d\.\d+)/site-packages/(\S+))", helpers)
    assert match is not None
    path, python, relative = match.groups()
    (base,) = re.findall(r"^ARG PYTHON=python:(\d\.\d+)", DOCKERFILE, re.M)
    assert python == base, "the chart's path names another Python than the image's"
    assert "python -m venv /opt/stunner" in DOCKERFILE
    package = relative.split("/")[0]
    assert package in installed_packages() and (ROOT / relative).is_file()


@pytest.mark.parametrize("path", ["README.md", "Dockerfile"])
def test_readme_says_how_to_build_and_load(path: str) -> None:
    text = (ROOT / path).read_text()
    assert "docker build -t localhost/stunner:" in text
    assert "kind load docker-image localhost/stunner:" in text
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == "localhost/stunner"
