"""The resources of local mode: Kubernetes objects read from YAML files in a directory.

`ManifestDir(path)` reads every `*.yaml`, `*.yml` and `*.json` file under `path` (sorted,
recursively; hidden files and directories skipped), each holding any number of YAML documents
(`---`). `scan()` re-reads the files that changed since the last scan (by mtime, size and inode:
no inotify needed) and says whether the set of objects changed; `watch()` scans every
`poll_interval` seconds and yields after each change. An empty file is a write in progress and
is skipped, as Go's file watch does (write big files atomically: rename a finished one into
place). A file's change is decided from its bytes: a file whose bytes hash as they did last time
(touched, or rewritten the same) is not parsed again, and new bytes that parse are a change.

Bad input loses nothing: a file that is not valid YAML, holds a document that is not a
Kubernetes object (`apiVersion`, `kind`, `metadata.name`) or passes a bound below is reported
once with file and line (`errors`, and the log) and changes nothing: the last good objects of
that file stay until it is fixed. A deleted file takes its objects with it. An object defined
twice (same kind, namespace and name) is reported and the first one (in file order) wins. A scan
that fails as a whole (the directory gone, no file descriptor left) is logged once and retried
at the next poll, the objects staying as they were; the watcher never dies of its input. Such a
report quotes no value of the file but a kind STUNner reads and names that are DNS names
(`described`): a `kind` or a name is free text (issue 28 #10).

The bounds, per file, the same for `stunner render/check/explain -f` (`read_text`, `documents`,
`read_manifest`, `manifest_paths`):
- at most `MAX_FILE_BYTES` (4 MiB; the API server takes requests of up to ~3 MiB), refused
  before it is read;
- nesting at most `MAX_DEPTH` (100) levels deep: deeper than any Kubernetes object, and what
  keeps the YAML composer (recursive) and every later walk of the objects within Python's
  recursion limit (100,000 `[` used to raise RecursionError);
- at most `MAX_NODES` (300,000) YAML nodes (a 4 MiB bundle of CRDs has ~260,000; parsing that
  many takes ~3 s of CPU), each alias (`*name`) counted as the nodes it names. Aliases are
  allowed, as the API server and kubectl allow them, and this bound is what disarms them (go-yaml,
  behind kubectl, bounds alias expansion the same way): a 586-byte "billion laughs" (9 levels of
  9 aliases, 387 million nodes expanded) is refused within milliseconds, where refusing aliases
  altogether would refuse files kubectl applies. An alias inside the node it names (a recursive
  structure, which no JSON object can be) is refused.
Documents have no bound of their own (it was 1,000, which refused 1,000 Gateways and their
GatewayClass in one 564 KB file): each is at least one node, so these two bound them too. A
4 MiB file of empty documents (`---` a million times) is refused at its 300,001st in ~2 CPU-s,
10,000 Gateways in one 2.3 MB file load in ~1 CPU-s.

Symbolic links: a link (to a file or a directory) whose target is outside the directory, or that
leads nowhere, is not followed and is reported once (a manifest directory holding
`zz.yaml -> /etc/shadow` must not make a reconciler running as root read it). A link to a file
inside the directory is read (a ConfigMap mounted as a volume is made of such links); a link to
a directory inside is not walked (its files are read where they are).

The objects are kept as written: the `Snapshot` defaults a missing namespace and reads a
Secret's `stringData`, as it does for objects from the API server.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import logging
import os
import stat as stat_module
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stunner_api.vocabulary import DNS_NAME

from .store import CLUSTER_SCOPED, kind_of, name_of, namespace_of
from .supervise import what_failed

log = logging.getLogger("stunner.manifests")

SUFFIXES = (".yaml", ".yml", ".json")
POLL_INTERVAL = 0.1
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 100
MAX_NODES = 300_000
MAX_NAME = 253  # a DNS subdomain, the longest Kubernetes name

Object = dict[str, Any]
Key = tuple[str, str, str]  # (kind, namespace, name)


class ManifestError(ValueError):
    """A file or document that cannot be used: where (file:line) and why."""

    def __init__(self, path: Path, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}" if line else f"{path}: {message}")
        self.path = path
        self.line = line
        self.message = message


@dataclass(frozen=True)
class _Stat:
    mtime_ns: int
    size: int
    inode: int

    @classmethod
    def of(cls, st: os.stat_result) -> _Stat:
        return cls(st.st_mtime_ns, st.st_size, st.st_ino)


_UNREAD = _Stat(-1, -1, -1)  # a file that could not be read: its next stat differs


@dataclass(frozen=True)
class _Seen:
    """A file as last read: its stat and the hash of its bytes (None: refused unread)."""

    stat: _Stat
    digest: bytes | None


def key_of(obj: Mapping[str, Any]) -> Key:
    """What makes an object unique, as the `Snapshot` indexes it (the versions of one kind name
    the same object; a cluster-scoped object has no namespace)."""
    kind = kind_of(obj)
    what = str(kind) if kind is not None else f"{obj['apiVersion']} {obj['kind']}"
    namespace = "" if kind in CLUSTER_SCOPED else namespace_of(obj)
    return (what, namespace, name_of(obj))


def _kind_word(obj: Mapping[str, Any]) -> str:
    """An object's kind as a log line says it: the word of our vocabulary when STUNner reads
    that kind, else "an object" (a `kind` value is free text: issue 28 #10)."""
    return str(obj["kind"]) if kind_of(obj) is not None else "an object"


def described(obj: Mapping[str, Any]) -> str:
    """How a log line names an object read from a file: its kind word (`_kind_word`) and its
    namespace/name when they are DNS names (what Kubernetes names are), else a placeholder: no
    other value of the file reaches a log line (a secret pasted in the wrong field, control
    characters, a megabyte); the file and line say where it is."""
    kind = kind_of(obj)
    names = [n for n in ("" if kind in CLUSTER_SCOPED else namespace_of(obj), name_of(obj)) if n]
    if not names:
        return _kind_word(obj)
    if all(len(n) <= MAX_NAME and DNS_NAME.match(n) for n in names):
        return f"{_kind_word(obj)} {'/'.join(names)}"
    return f"{_kind_word(obj)} (named with something that is not a DNS name)"


def _check_object(data: Any) -> str | None:
    """Why `data` is not a Kubernetes object, or None. No value of `data` is quoted
    (`described`)."""
    if not isinstance(data, dict):
        return f"a document must be a mapping (a Kubernetes object), got {type(data).__name__}"
    for field in ("apiVersion", "kind"):
        if not isinstance(data.get(field), str) or not data[field]:
            return f"missing {field}"
    meta = data.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        return f"{_kind_word(data)} without metadata.name"
    namespace = meta.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        return f"{_kind_word(data)}: metadata.namespace must be a string"
    return None


try:  # libyaml's parser (events in C): PyYAML's pure Python scanner is quadratic on long flows
    from yaml._yaml import CParser as _Parser
except ImportError:  # pragma: no cover - PyYAML built without libyaml

    class _Parser(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser):  # type: ignore[no-redef]
        def __init__(self, stream: str) -> None:
            yaml.reader.Reader.__init__(self, stream)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)


class _BoundedLoader(
    yaml.composer.Composer, _Parser, yaml.constructor.SafeConstructor, yaml.resolver.Resolver
):
    """PyYAML's safe loader with the bounds of this module: its parser (libyaml's when there),
    then PyYAML's composer counting depth and nodes, before anything is constructed."""

    def __init__(self, path: Path, text: str) -> None:
        _Parser.__init__(self, text)
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)
        self.path = path
        self._depth = 0
        self._inner: list[int] = []  # nodes counted so far inside each open collection
        self._anchor_sizes: dict[str, int] = {}  # nodes an anchor names (complete ones only)
        self._nodes = 0  # in the file, each alias counted as the nodes it names

    def refuse(self, mark: Any, message: str) -> ManifestError:
        return ManifestError(self.path, mark.line + 1 if mark is not None else 1, message)

    def _count(self, nodes: int, mark: Any, alias: bool) -> None:
        self._nodes += nodes
        if self._nodes > MAX_NODES:
            why = "; an alias bomb?" if alias else ""
            raise self.refuse(
                mark, f"more than {MAX_NODES} nodes, each alias counted as what it names{why}"
            )
        if self._inner:
            self._inner[-1] += nodes

    def compose_document(self) -> yaml.Node | None:
        self._anchor_sizes = {}  # anchors do not cross documents
        return super().compose_document()

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event: Any = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            node = super().compose_node(parent, index)  # an undefined alias raises there
            size = self._anchor_sizes.get(str(event.anchor))
            if size is None:
                raise self.refuse(
                    event.start_mark,
                    f"alias *{event.anchor} is inside the node it names (a recursive structure)",
                )
            self._count(size, event.start_mark, alias=True)
            return node
        if self._depth >= MAX_DEPTH:
            raise self.refuse(event.start_mark, f"nested more than {MAX_DEPTH} levels deep")
        self._depth += 1
        self._inner.append(0)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            inner = self._inner.pop()
        size = 1 + inner
        self._nodes -= inner  # counted already, inside; counted again with this node
        self._count(size, event.start_mark, alias=False)
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self._anchor_sizes[str(anchor)] = size
        return node


def parse_manifest(path: Path, text: str | bytes) -> list[tuple[int, Object]]:
    """Every object of a YAML (or JSON) file with the line it starts on (1-based); the first
    problem, or a bound passed (the module's docstring), raises `ManifestError` with file and
    line."""
    objects: list[tuple[int, Object]] = []
    for line, data in documents(path, text):
        problem = _check_object(data)
        if problem is not None:
            raise ManifestError(path, line, problem)
        objects.append((line, data))
    return objects


def documents(path: Path, text: str | bytes) -> Iterator[tuple[int, Any]]:
    """Every non-empty YAML (or JSON) document of a file, whatever it holds, with the line it
    starts on, within the bounds; the first problem raises `ManifestError` (file and line)."""
    size = (
        len(text)
        if isinstance(text, bytes) or len(text) > MAX_FILE_BYTES
        else len(text.encode("utf-8", "surrogatepass"))
    )
    if size > MAX_FILE_BYTES:
        raise _too_large(path, size)
    if isinstance(text, bytes):
        text = _decoded(path, text)
    loader = _BoundedLoader(path, text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            data = loader.construct_document(node)
            if data is not None:
                yield node.start_mark.line + 1, data
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


def _decoded(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(path, 0, f"not UTF-8: {exc}") from None


def compose_documents(path: Path, text: str) -> list[yaml.Node]:
    """The YAML node tree of each document of a file (for the lines of fields), composed as
    `parse_manifest` composes it (libyaml's parser, within the bounds)."""
    loader = _BoundedLoader(path, text)
    nodes: list[yaml.Node] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is not None:
                nodes.append(node)
    finally:
        loader.dispose()
    return nodes


def _too_large(path: Path, size: int) -> ManifestError:
    return ManifestError(
        path,
        0,
        f"{size} bytes, more than the {MAX_FILE_BYTES // (1024 * 1024)} MiB a file may have",
    )


def _read(path: Path) -> tuple[bytes, os.stat_result, os.stat_result]:
    """A regular file's bytes (at most MAX_FILE_BYTES) and its stat before and after the read.
    A symbolic link is not followed (ELOOP: `manifest_paths` decides about links), a FIFO or a
    device is refused without blocking; OSError as it comes."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        before = os.fstat(fd)
        if not stat_module.S_ISREG(before.st_mode):
            raise ManifestError(path, 0, "not a regular file")
        if before.st_size > MAX_FILE_BYTES:
            raise _too_large(path, before.st_size)
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, min(1 << 20, MAX_FILE_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_FILE_BYTES:
            raise _too_large(path, size)
        return b"".join(chunks), before, os.fstat(fd)
    finally:
        os.close(fd)


def read_text(path: Path) -> str:
    """A file's text, at most MAX_FILE_BYTES (refused unread past it) of UTF-8; ManifestError
    otherwise, or when it cannot be read. Every reader of a user's file goes through here."""
    try:
        data = _read(path)[0]
    except OSError as exc:
        raise ManifestError(path, 0, f"cannot read: {exc.strerror or what_failed(exc)}") from None
    return _decoded(path, data)


def read_manifest(path: Path) -> tuple[str, list[tuple[int, Object]]]:
    """A file's text and objects, within the bounds; ManifestError (file and line) otherwise,
    or when it cannot be read."""
    text = read_text(path)
    return text, parse_manifest(path, text)


def manifest_paths(root: Path) -> tuple[list[tuple[Path, Path]], dict[Path, str]]:
    """The manifest files under `root`, sorted, as (the path listed, the file to read: a link's
    target), and the links not followed with why (the module's docstring). OSError when a
    directory cannot be listed: a scan must not take a file it could not list for deleted."""
    if not root.is_dir():
        raise ManifestError(root, 0, "not a directory")
    real_root = Path(os.path.realpath(root))
    found: list[tuple[Path, Path]] = []
    refused: dict[Path, str] = {}
    pending = [root]
    while pending:
        directory = pending.pop()
        with os.scandir(directory) as entries:
            listed = list(entries)
        for entry in listed:
            if entry.name.startswith("."):
                continue
            path = Path(entry.path)
            if entry.is_symlink():
                real = Path(os.path.realpath(path))
                if not real.is_relative_to(real_root) or not real.exists():
                    refused[path] = "a symbolic link out of the directory or to nothing"
                elif path.suffix in SUFFIXES and real.is_file():
                    found.append((path, real))
            elif entry.is_dir(follow_symlinks=False):
                pending.append(path)
            elif path.suffix in SUFFIXES and entry.is_file(follow_symlinks=False):
                found.append((path, path))
    found.sort()
    return found, refused


class ManifestDir:
    """The objects defined by the YAML files under one directory, kept up to date by `scan`."""

    def __init__(self, path: str | Path, *, poll_interval: float = POLL_INTERVAL) -> None:
        self.path = Path(path)
        self.poll_interval = poll_interval
        self._seen: dict[Path, _Seen] = {}
        self._files: dict[Path, list[tuple[int, Object]]] = {}  # last good content per file
        self._errors: dict[Path, ManifestError] = {}
        self._links: dict[Path, str] = {}  # links not followed, reported once
        self._objects: list[Object] = []
        self._dirty = False  # the files' objects changed since the last merge
        self.duplicates: list[ManifestError] = []

    @property
    def errors(self) -> list[ManifestError]:
        """The files whose last change could not be used (their last good objects stay), and
        the links not followed."""
        return [self._errors[path] for path in sorted(self._errors)]

    def objects(self) -> list[Object]:
        """Every object, in file order, duplicates dropped (copies: change them freely)."""
        return copy.deepcopy(self._objects)

    def scan(self) -> bool:
        """Re-read the files that changed; True if the objects changed. A directory that cannot
        be listed raises (ManifestError, OSError) and changes nothing."""
        paths, links = manifest_paths(self.path)
        self._note_links(links)
        listed = {path for path, _ in paths}
        for gone in (self._seen.keys() | self._files.keys() | self._errors.keys()) - listed:
            if gone in links:
                continue
            log.info("manifest %s removed", gone)
            self._seen.pop(gone, None)
            self._errors.pop(gone, None)
            if self._files.pop(gone, None) is not None:
                self._dirty = True
        for path, real in paths:
            self._scan_file(path, real)
        if not self._dirty:
            return False
        self._merge()
        self._dirty = False
        return True

    def _note_links(self, links: dict[Path, str]) -> None:
        for path, why in links.items():
            if self._links.get(path) != why:
                log.error("%s: %s; not followed", path, why)
            self._errors[path] = ManifestError(path, 0, f"{why}; not followed")
            if self._files.pop(path, None) is not None:  # a file replaced by such a link
                self._dirty = True
            self._seen.pop(path, None)
        for gone in self._links.keys() - links.keys():
            self._errors.pop(gone, None)
        self._links = dict(links)

    def _scan_file(self, path: Path, real: Path) -> None:
        try:
            current = _Stat.of(os.stat(real, follow_symlinks=False))
        except FileNotFoundError:
            return  # removed between the listing and now: the next scan sees it
        except OSError as exc:
            self._unreadable(path, exc)
            return
        seen = self._seen.get(path)
        if seen is not None and seen.stat == current:
            return
        if current.size == 0:
            # Truncated by a writer that has not written yet (as Go's file watch assumes): the
            # last good objects stay. Delete a file to remove its objects.
            log.debug("manifest %s is empty, ignoring it until it is written", path)
            return
        try:
            data, before, after = _read(real)
        except ManifestError as exc:  # too large, not a regular file: refused unread
            self._seen[path] = _Seen(current, None)
            self._report(path, ManifestError(path, 0, exc.message))
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            self._unreadable(path, exc)
            return
        if _Stat.of(before) != _Stat.of(after) or _Stat.of(after) != current:
            return  # written while we read it: the next scan reads it whole
        digest = hashlib.sha256(data).digest()
        self._seen[path] = _Seen(current, digest)
        if seen is not None and seen.digest == digest:
            return  # the same bytes (touched, or rewritten the same): nothing to parse
        self._use(path, data)

    def _unreadable(self, path: Path, exc: OSError) -> None:
        """No descriptor left, no permission: reported once, and read again at the next scan
        (its bytes then parsed whatever they are: the error must not outlive the problem)."""
        self._seen[path] = _Seen(_UNREAD, None)
        self._report(path, ManifestError(path, 0, f"cannot read: {exc.strerror or exc}"))

    def _use(self, path: Path, data: bytes) -> None:
        """Take a file's new bytes, or report why they cannot be used."""
        try:
            objects = parse_manifest(path, data)
        except ManifestError as exc:
            self._report(path, exc)
            return
        except Exception as exc:  # a bug of ours or of the parser: this file's, not the watch's
            self._report(path, ManifestError(path, 0, f"cannot be parsed ({what_failed(exc)})"))
            return
        if path in self._errors:
            log.info("manifest %s is valid again", path)
        self._errors.pop(path, None)
        self._files[path] = objects
        self._dirty = True
        log.info("manifest %s: %d objects", path, len(objects))

    def _report(self, path: Path, error: ManifestError) -> None:
        """A file's change cannot be used: logged once (until the problem changes)."""
        previous = self._errors.get(path)
        self._errors[path] = error
        if previous is not None and str(previous) == str(error):
            return
        kept = len(self._files.get(path, []))
        log.error("%s (ignoring this change; keeping the %d objects read before)", error, kept)

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
                        f"{described(obj)} is already defined at {first}:{first_line}; "
                        "ignoring this one",
                    )
                    self.duplicates.append(duplicate)
                    log.error("%s", duplicate)
                    continue
                seen[key] = (path, line)
                objects.append(obj)
        self._objects = objects

    async def watch(self) -> AsyncIterator[list[Object]]:
        """The objects now, then again after every change (polling every `poll_interval` s).
        A scan that fails is logged once (until it works again or fails otherwise) and tried
        again at the next poll; the objects stay as they were meanwhile."""
        failing: str | None = None
        first = True
        while True:
            if not first:
                await asyncio.sleep(self.poll_interval)
            try:
                changed = await asyncio.to_thread(self.scan)
            except Exception as exc:
                problem = str(exc) if isinstance(exc, ManifestError) else what_failed(exc)
                if problem != failing:
                    log.error(
                        "scanning %s failed: %s; keeping the last good objects, trying again "
                        "every %.1f s",
                        self.path,
                        problem,
                        self.poll_interval,
                    )
                    log.debug("scanning %s failed", self.path, exc_info=True)
                    failing = problem
                changed = False
            else:
                if failing is not None:
                    log.info("scanning %s works again", self.path)
                    failing = None
            if changed or first:
                yield self.objects()
            first = False
