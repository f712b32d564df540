"""The images' virtualenvs, built here by the Dockerfile's own RUN lines.

No docker runs in CI, so the build stages' commands are run as written, with the image's paths
mapped into a temporary directory (/opt/stunner, /wheels, the COPY'd image_venv.py), the host's
Python 3.11 for the base image's, and pip's cache allowed. Everything else is the Dockerfile's:
the wheel, the extras, pip and setuptools removed, the dataplane pruned, the objects stripped,
the checks run from /. What these venvs hold is what the images hold, and nothing from the test
extra (pytest, packaging's other carriers) can hide a missing module.
"""

from __future__ import annotations

import concurrent.futures
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
DOCKERFILE = ROOT / "Dockerfile"
IMAGE_PREFIX = "/opt/stunner"  # where both images keep their venv (the chart names paths in it)


@dataclass(frozen=True)
class Stage:
    name: str
    base: str
    workdir: str | None
    runs: tuple[str, ...]
    copies: tuple[tuple[str, str], ...]  # (source, destination)


def stages(text: str | None = None) -> dict[str, Stage]:
    """The Dockerfile's stages by name, each with its RUN commands (continuations joined)."""
    joined = re.sub(r"\\\n", " ", text if text is not None else DOCKERFILE.read_text())
    out: dict[str, Stage] = {}
    current: dict[str, object] | None = None
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else f"#{len(out)}"
            current = {"name": name, "base": parts[0], "workdir": None, "runs": [], "copies": []}
            out[name] = Stage(name, parts[0], None, (), ())
        elif current is not None and word in ("RUN", "WORKDIR", "COPY"):
            if word == "RUN":
                current["runs"].append(" ".join(rest.split()))  # type: ignore[attr-defined]
            elif word == "WORKDIR":
                current["workdir"] = rest.strip()
            elif not rest.startswith("--from="):
                *sources, destination = rest.split()
                for source in sources:
                    current["copies"].append((source, destination))  # type: ignore[attr-defined]
            name = str(current["name"])
            out[name] = Stage(
                name,
                str(current["base"]),
                current["workdir"],  # type: ignore[arg-type]
                tuple(current["runs"]),  # type: ignore[call-overload]
                tuple(current["copies"]),  # type: ignore[call-overload]
            )
    return out


def run_stage(stage: Stage, paths: dict[str, str]) -> str:
    """Run a stage's RUN lines with bash, image paths mapped by `paths`, from its WORKDIR
    (/ for the venv stages, so only the venv can be imported). Returns their output."""
    output = []
    for command in stage.runs:
        for image_path, here in sorted(paths.items(), key=lambda kv: -len(kv[0])):
            command = command.replace(image_path, here)
        # The base image's `python` is the host's 3.11; pip's cache may be used here.
        command = re.sub(r"(?<![\w/.-])python(?= -m )", sys.executable, command)
        command = command.replace(" --no-cache-dir", "")
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", command],
            cwd=paths.get(stage.workdir or "/", stage.workdir or "/"),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, f"{stage.name}: {command}\n{done.stdout}\n{done.stderr}"
        output.append(done.stdout)
    return "".join(output)


@dataclass(frozen=True)
class ImageVenvs:
    controlplane: Path
    dataplane: Path
    checks: dict[str, str]  # stage name -> what its `image_venv.py check` printed

    def bin(self, image: str, command: str) -> str:
        venv = self.controlplane if image == "controlplane" else self.dataplane
        return str(venv / "bin" / command)


@pytest.fixture(scope="session")
def image_venvs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImageVenvs]:
    """The wheel (the `build` stage's pip wheel, from this checkout) and both runtime venvs."""
    base = tmp_path_factory.mktemp("image")
    all_stages = stages()
    build = all_stages["build"]
    copies = {destination: str(ROOT / source) for source, destination in build.copies}
    wheel_runs = tuple(r for r in build.runs if "pip wheel" in r)
    wheel_only = Stage("build", build.base, "/src", wheel_runs, ())
    (base / "wheels").mkdir()
    run_stage(wheel_only, {"/wheels": str(base / "wheels"), "/src": str(ROOT)})

    def venv_stage(name: str) -> str:
        paths = {IMAGE_PREFIX: str(base / name), "/wheels": str(base / "wheels")}
        paths |= {dest: src for dest, src in copies.items() if dest.endswith(".py")}
        return run_stage(all_stages[name], paths)

    # The two runtime stages are independent (as BuildKit runs them): side by side, each in its
    # own venv from the same wheels.
    names = ("venv-controlplane", "venv-dataplane")
    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        checks = dict(zip(names, pool.map(venv_stage, names), strict=True))
    yield ImageVenvs(base / "venv-controlplane", base / "venv-dataplane", checks)
