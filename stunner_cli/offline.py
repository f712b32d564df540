"""`render -f` and `check -f`: the reconciler's own render and the admission rule table run over
manifest files, with no cluster. Every finding says file, line and field.

`render` gives what the reconciler would produce: each Gateway's dataplane config, Service and
Deployment. When the files hold no Dataplane `default` (the chart installs it, so users rarely
write one), the chart's is assumed (`default_dataplane`).

The files are read as local mode reads them (`reconciler.files`: the same walk of a directory,
the same bounds on size, documents, nesting and nodes, the same symbolic links not followed), so
`check -f DIR` says what `stunner-reconciler --manifests DIR` would take."""

from __future__ import annotations

import copy
import datetime
import functools
import importlib.metadata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from reconciler.files import ManifestError, compose_documents, manifest_paths, read_manifest
from reconciler.render import Plan, RenderSettings, render
from reconciler.store import Snapshot
from stunner_api.rules import Settings, validate
from stunner_api.vocabulary import (
    CHART_DATAPLANE_IMAGE_REPOSITORY,
    CHART_DATAPLANE_SPEC,
    DATAPLANE,
    DEFAULT_DATAPLANE,
)


@dataclass(frozen=True)
class Located:
    """An object and where it was written."""

    path: Path
    line: int  # of the document's first line
    text: str
    obj: dict[str, Any]


@dataclass(frozen=True)
class ManifestProblem:
    """A rule's Problem (stunner_api.rules) in a manifest file, at the line of its field: what
    `check` prints. (Render's findings are reconciler.render.Finding.)"""

    path: Path
    line: int
    field: str
    severity: str
    message: str
    reason: str

    def __str__(self) -> str:
        field = f" {self.field}:" if self.field else ""
        return f"{self.path}:{self.line}:{field} {self.severity}: {self.message} ({self.reason})"


def manifest_files(
    target: Path, skipped: Callable[[str], None] = lambda problem: None
) -> list[Path]:
    """The YAML/JSON files of a file or a directory (recursively, sorted, as local mode reads
    it); each symbolic link not followed is passed to `skipped` as `file: why`."""
    if target.is_file():
        return [target]
    if not target.is_dir():
        raise ManifestError(target, 0, "no such file or directory")
    paths, links = manifest_paths(target)
    for path, why in sorted(links.items()):
        skipped(f"{path}: {why}; not followed")
    return [path for path, _ in paths]


def load(target: Path, skipped: Callable[[str], None] = lambda problem: None) -> list[Located]:
    """Every object of the manifests; ManifestError (file and line) on a malformed file or one
    past a bound; the links not followed go to `skipped`."""
    out = []
    for path in manifest_files(target, skipped):
        text, objects = read_manifest(path)
        for line, obj in objects:
            out.append(Located(path, line, text, dict(obj)))
    return out


def _segments(field: str) -> Iterator[str | int]:
    for part in field.replace("]", "").split("."):
        name, *indices = part.split("[")
        if name:
            yield name
        for index in indices:
            yield int(index) if index.isdigit() else index


@functools.lru_cache(maxsize=1)  # findings come file by file
def _documents(path: Path, text: str) -> list[yaml.Node]:
    """A file's node trees, composed once for all its findings (libyaml's parser: PyYAML's own
    scanner is quadratic on long flow collections)."""
    return compose_documents(path, text)


def field_line(located: Located, field: str) -> int:
    """The line of `field` ("spec.listeners[1].port") in the object's document; the closest
    existing parent's line when the field is absent."""
    documents = _documents(located.path, located.text)
    node: Any = None
    for document in documents:
        if document is not None and document.start_mark.line + 1 == located.line:
            node = document
            break
    if node is None:
        return located.line
    line = int(node.start_mark.line) + 1
    for segment in _segments(field):
        child = None
        if isinstance(node, yaml.MappingNode) and isinstance(segment, str):
            child = next((v for k, v in node.value if k.value == segment), None)
            key_node = next((k for k, _ in node.value if k.value == segment), None)
            if key_node is not None:
                line = int(key_node.start_mark.line) + 1
        elif isinstance(node, yaml.SequenceNode) and isinstance(segment, int):
            if segment < len(node.value):
                child = node.value[segment]
                line = int(child.start_mark.line) + 1
        if child is None:
            break
        node = child
    return line


def check(objects: list[Located], settings: Settings | None = None) -> list[ManifestProblem]:
    """The admission rules' findings on every object, judged against all the others."""
    settings = settings or Settings()
    lookup = Snapshot.from_objects(o.obj for o in objects)
    findings = []
    for located in objects:
        verdict = validate(located.obj, None, "CREATE", lookup, settings)
        for problem in verdict.problems:
            findings.append(
                ManifestProblem(
                    located.path,
                    field_line(located, problem.path),
                    problem.path,
                    str(problem.severity),
                    problem.message,
                    str(problem.reason),
                )
            )
    return findings


def chart_image() -> str:
    """The image the chart's default Dataplane runs: the chart's dataplane image, tagged with its
    appVersion (this distribution's version)."""
    try:
        version = importlib.metadata.version("stunner")
    except importlib.metadata.PackageNotFoundError:
        version = "latest"
    return f"{CHART_DATAPLANE_IMAGE_REPOSITORY}:{version}"


def default_dataplane() -> dict[str, Any]:
    """The Dataplane `default` as the chart installs it."""
    return {
        "apiVersion": f"{DATAPLANE.group}/v1",
        "kind": DATAPLANE.kind,
        "metadata": {"name": DEFAULT_DATAPLANE},
        "spec": copy.deepcopy(dict(CHART_DATAPLANE_SPEC)) | {"image": chart_image()},
    }


def has_default_dataplane(objects: list[Located]) -> bool:
    return any(
        o.obj.get("kind") == DATAPLANE.kind
        and (o.obj.get("metadata") or {}).get("name") == DEFAULT_DATAPLANE
        for o in objects
    )


def plan(objects: list[Located], now: datetime.datetime | None = None) -> Plan:
    """What the reconciler would render of these objects (with the chart's default Dataplane
    when they hold no Dataplane `default`)."""
    found = [o.obj for o in objects]
    if not has_default_dataplane(objects):
        found.append(default_dataplane())
    snapshot = Snapshot.from_objects(found)
    return render(snapshot, RenderSettings(), now or datetime.datetime.now(datetime.UTC))
