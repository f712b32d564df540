"""The resources of local mode: Kubernetes objects read from YAML files in a directory.

`ManifestDir(path)` reads every `*.yaml`, `*.yml` and `*.json` file under `path` (sorted,
recursively), each holding any number of YAML documents (`---`). `scan()` re-reads the files that
changed since the last scan (by mtime, size and inode: no inotify needed) and says whether the
set of objects changed; `watch()` scans every `poll_interval` seconds and yields after each
change. An empty file is a write in progress and is skipped, as Go's file watch does (write big
files atomically: rename a finished one into place).

Bad input loses nothing: a file that is not valid YAML, or holds a document that is not a
Kubernetes object (`apiVersion`, `kind`, `metadata.name`), is reported with file and line
(`errors`, and the log) and changes nothing: the last good objects of that file stay until it is
fixed. A deleted file takes its objects with it. An object defined twice (same kind, namespace
and name) is reported and the first one (in file order) wins.

The objects are kept as written: the `Snapshot` defaults a missing namespace and reads a
Secret's `stringData`, as it does for objects from the API server.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .store import CLUSTER_SCOPED, kind_of, name_of, namespace_of

log = logging.getLogger("stunner.manifests")

SUFFIXES = (".yaml", ".yml", ".json")
POLL_INTERVAL = 0.1

Object = dict[str, Any]
Key = tuple[str, str, str]  # (kind, namespace, name)


class ManifestError(ValueError):
    """A file or document that cannot be used: where (file:line) and why."""

    def __init__(self, path: Path, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line
        self.message = message


@dataclass(frozen=True)
class _Stat:
    mtime_ns: int
    size: int
    inode: int


def key_of(obj: Mapping[str, Any]) -> Key:
    """What makes an object unique, as the `Snapshot` indexes it (the versions of one kind name
    the same object; a cluster-scoped object has no namespace)."""
    kind = kind_of(obj)
    what = str(kind) if kind is not None else f"{obj['apiVersion']} {obj['kind']}"
    namespace = "" if kind in CLUSTER_SCOPED else namespace_of(obj)
    return (what, namespace, name_of(obj))


def _check_object(data: Any) -> str | None:
    """Why `data` is not a Kubernetes object, or None."""
    if not isinstance(data, dict):
        return f"a document must be a mapping (a Kubernetes object), got {type(data).__name__}"
    for field in ("apiVersion", "kind"):
        if not isinstance(data.get(field), str) or not data[field]:
            return f"missing {field}"
    meta = data.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        return f"{data['kind']} without metadata.name"
    namespace = meta.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        return f"{data['kind']} {meta['name']}: metadata.namespace must be a string"
    return None


def parse_manifest(path: Path, text: str) -> list[tuple[int, Object]]:
    """Every object of a YAML (or JSON) file with the line it starts on (1-based); the first
    problem raises `ManifestError` with file and line."""
    loader = yaml.SafeLoader(text)
    objects: list[tuple[int, Object]] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            line = node.start_mark.line + 1
            data = loader.construct_document(node)
            if data is None:
                continue
            problem = _check_object(data)
            if problem is not None:
                raise ManifestError(path, line, problem)
            objects.append((line, data))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        context = exc.context or ""
        if context and exc.context_mark is not None and exc.context_mark.line + 1 != line:
            context += f" (line {exc.context_mark.line + 1})"
        problem = " ".join(filter(None, (context, exc.problem))) or str(exc)
        raise ManifestError(path, line, f"invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise ManifestError(path, 1, f"invalid YAML: {exc}") from None
    finally:
        loader.dispose()
    return objects


class ManifestDir:
    """The objects defined by the YAML files under one directory, kept up to date by `scan`."""

    def __init__(self, path: str | Path, *, poll_interval: float = POLL_INTERVAL) -> None:
        self.path = Path(path)
        self.poll_interval = poll_interval
        self._stats: dict[Path, _Stat] = {}
        self._files: dict[Path, list[tuple[int, Object]]] = {}  # last good content per file
        self._errors: dict[Path, ManifestError] = {}
        self._objects: list[Object] = []
        self.duplicates: list[ManifestError] = []

    @property
    def errors(self) -> list[ManifestError]:
        """The files whose last change could not be used (their last good objects stay)."""
        return [self._errors[path] for path in sorted(self._errors)]

    def objects(self) -> list[Object]:
        """Every object, in file order, duplicates dropped (copies: change them freely)."""
        return copy.deepcopy(self._objects)

    def _paths(self) -> list[Path]:
        if not self.path.is_dir():
            raise ManifestError(self.path, 0, "not a directory")
        return sorted(
            path
            for path in self.path.rglob("*")
            if path.suffix in SUFFIXES and path.is_file() and not path.name.startswith(".")
        )

    def scan(self) -> bool:
        """Re-read the files that changed; True if the objects changed."""
        changed = False
        paths = self._paths()
        for gone in set(self._stats) - set(paths):
            log.info("manifest %s removed", gone)
            self._stats.pop(gone)
            self._errors.pop(gone, None)
            changed |= self._files.pop(gone, None) is not None
        for path in paths:
            try:
                stat = path.stat()
            except OSError:
                continue  # removed between the listing and now: the next scan sees it
            current = _Stat(stat.st_mtime_ns, stat.st_size, stat.st_ino)
            if self._stats.get(path) == current:
                continue
            if current.size == 0:
                # Truncated by a writer that has not written yet (as Go's file watch assumes):
                # the last good objects stay. Delete a file to remove its objects.
                log.debug("manifest %s is empty, ignoring it until it is written", path)
                continue
            try:
                text = path.read_bytes()
                after = path.stat()
            except OSError as exc:
                self._stats[path] = current
                changed |= self._use(path, ManifestError(path, 0, f"cannot read: {exc}"))
                continue
            if _Stat(after.st_mtime_ns, after.st_size, after.st_ino) != current:
                continue  # written while we read it: the next scan reads it whole
            self._stats[path] = current
            changed |= self._use(path, text)
        if changed:
            self._merge()
        return changed

    def _use(self, path: Path, content: bytes | ManifestError) -> bool:
        """Take a file's new content, or report why it cannot be used; True if its objects
        changed."""
        try:
            if isinstance(content, ManifestError):
                raise content
            objects = parse_manifest(path, content.decode("utf-8"))
        except UnicodeDecodeError as exc:
            error = ManifestError(path, 0, f"not UTF-8: {exc}")
        except ManifestError as exc:
            error = exc
        else:
            if path in self._errors:
                log.info("manifest %s is valid again", path)
            self._errors.pop(path, None)
            if self._files.get(path) == objects:
                return False
            self._files[path] = objects
            log.info("manifest %s: %d objects", path, len(objects))
            return True
        self._errors[path] = error
        kept = len(self._files.get(path, []))
        log.error("%s (ignoring this change; keeping the %d objects read before)", error, kept)
        return False

    def _merge(self) -> None:
        seen: dict[Key, tuple[Path, int]] = {}
        objects: list[Object] = []
        self.duplicates = []
        for path in sorted(self._files):
            for line, obj in self._files[path]:
                key = key_of(obj)
                if key in seen:
                    first, first_line = seen[key]
                    duplicate = ManifestError(
                        path,
                        line,
                        f"{obj['kind']} {'/'.join(filter(None, key[1:]))} is already defined at "
                        f"{first}:{first_line}; ignoring this one",
                    )
                    self.duplicates.append(duplicate)
                    log.error("%s", duplicate)
                    continue
                seen[key] = (path, line)
                objects.append(obj)
        self._objects = objects

    async def watch(self) -> AsyncIterator[list[Object]]:
        """The objects now, then again after every change (polling every `poll_interval` s)."""
        self.scan()
        yield self.objects()
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                changed = await asyncio.to_thread(self.scan)
            except ManifestError as exc:
                log.error("%s", exc)
                continue
            if changed:
                yield self.objects()
