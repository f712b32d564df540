"""The manifest directory loader of local mode (reconciler.files), on real files.

We test: multi-document files in sorted order, nested directories and the file kinds read; a
malformed file (bad YAML, a document that is not an object, a missing name) is reported with file
and line and changes nothing, its last good objects staying until it is fixed; a removed file
takes its objects; an object defined twice is reported and the first wins; scan() says whether
anything changed; the watch yields after an edit.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from reconciler.files import ManifestDir, ManifestError, parse_manifest, read_manifest

GATEWAY = """\
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: {name}
  namespace: stunner
spec:
  gatewayClassName: stunner-gatewayclass
  listeners:
    - name: udp
      port: 3478
      protocol: TURN-UDP
"""

ROUTE = """\
apiVersion: stunner.l7mp.io/v1
kind: UDPRoute
metadata:
  name: route
  namespace: stunner
spec:
  parentRefs: [{name: gw}]
"""


def names(directory: ManifestDir) -> list[str]:
    return [f"{obj['kind']}/{obj['metadata']['name']}" for obj in directory.objects()]


def test_reads_multi_document_files_in_order(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text(GATEWAY.format(name="gw") + "---\n" + ROUTE)
    (tmp_path / "a.yml").write_text("---\n# only a comment\n---\n" + GATEWAY.format(name="first"))
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "c.json").write_text(
        '{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "stunner"}}'
    )
    (tmp_path / "notes.txt").write_text("not a manifest")
    (tmp_path / ".hidden.yaml").write_text("editor: swap file")
    directory = ManifestDir(tmp_path)
    assert directory.scan() is True
    assert names(directory) == [
        "Gateway/first",
        "Gateway/gw",
        "UDPRoute/route",
        "Namespace/stunner",
    ]
    assert directory.errors == []
    assert directory.scan() is False  # nothing changed


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (GATEWAY.format(name="gw") + "  bad: [unclosed\n", 13, "invalid YAML"),
        (GATEWAY.format(name="gw") + "---\n- a list\n", 13, "must be a mapping"),
        (GATEWAY.format(name="gw") + "---\nkind: Gateway\nmetadata: {name: x}\n", 13, "apiVersion"),
        (ROUTE.replace("  name: route\n", ""), 1, "UDPRoute without metadata.name"),
        ("apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n  namespace: [x]\n", 1, "namespace"),
        ("a: b\n\tc: d\n", 2, "invalid YAML"),
    ],
)
def test_a_malformed_file_is_reported_with_file_and_line(
    tmp_path: Path, text: str, line: int, message: str
) -> None:
    path = tmp_path / "bad.yaml"
    with pytest.raises(ManifestError) as info:
        parse_manifest(path, text)
    assert (info.value.path, info.value.line) == (path, line)
    assert message in info.value.message
    assert str(info.value).startswith(f"{path}:{line}: ")


def test_no_free_value_of_a_file_reaches_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 28 #10: a `kind` (or a name) is free text, and was quoted in ERROR lines
    (`TopSecretKindQQQ without metadata.name`); a log line names a kind STUNner reads, and
    names that are DNS names, nothing else: file and line say where."""
    secret = "TopSecretKindQQQ"
    (tmp_path / "a.yaml").write_text(f"apiVersion: v1\nkind: {secret}\nmetadata: {{}}\n")
    (tmp_path / "b.yaml").write_text(
        f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: {secret.lower()}\n  namespace: [x]\n"
    )
    twice = f"apiVersion: x/v1\nkind: {secret}\nmetadata: {{name: '{secret} pass'}}\n"
    (tmp_path / "c.yaml").write_text(twice + "---\n" + twice)
    (tmp_path / "d.yaml").write_text(ROUTE + "---\n" + ROUTE)  # names that are names
    directory = ManifestDir(tmp_path)
    with caplog.at_level(logging.DEBUG, logger="stunner.manifests"):
        directory.scan()
    assert secret.lower() not in caplog.text.lower()
    for error in (*directory.errors, *directory.duplicates):
        assert secret.lower() not in str(error).lower()
    assert f"{tmp_path / 'a.yaml'}:1: an object without metadata.name" in caplog.text
    assert f"{tmp_path / 'b.yaml'}:1: Secret: metadata.namespace must be a string" in caplog.text
    assert (
        f"{tmp_path / 'c.yaml'}:5: an object (named with something that is not a DNS name) is "
        f"already defined at {tmp_path / 'c.yaml'}:1" in caplog.text
    )
    assert f"{tmp_path / 'd.yaml'}:9: UDPRoute stunner/route is already defined" in caplog.text


def test_a_malformed_edit_changes_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(GATEWAY.format(name="gw") + "---\n" + ROUTE)
    (tmp_path / "other.yaml").write_text(GATEWAY.format(name="other"))
    directory = ManifestDir(tmp_path)
    directory.scan()
    before = directory.objects()
    path.write_text(GATEWAY.format(name="renamed") + "---\n" + ROUTE + "spec: [oops\n")
    with caplog.at_level(logging.ERROR):
        assert directory.scan() is False
    assert directory.objects() == before  # the last good objects of that file stay
    # The stream ends (line 21) inside the flow sequence opened on line 20.
    assert [(e.path, e.line) for e in directory.errors] == [(path, 21)]
    assert f"{path}:21: invalid YAML: while parsing a flow sequence (line 20)" in caplog.text
    assert "keeping the 2 objects read before" in caplog.text
    # A new file that is bad from the start adds nothing.
    (tmp_path / "new.yaml").write_text("apiVersion: v1\nkind: Secret\n")
    assert directory.scan() is False
    assert len(directory.errors) == 2
    # Fixed: the new content is used and the error is gone.
    path.write_text(GATEWAY.format(name="renamed"))
    assert directory.scan() is True
    assert names(directory) == ["Gateway/renamed", "Gateway/other"]
    assert [e.path for e in directory.errors] == [tmp_path / "new.yaml"]


def test_an_empty_file_is_a_write_in_progress(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(GATEWAY.format(name="gw"))
    directory = ManifestDir(tmp_path)
    directory.scan()
    path.write_text("")  # truncated, not yet written
    assert directory.scan() is False
    assert names(directory) == ["Gateway/gw"]
    path.write_text(GATEWAY.format(name="gw") + "---\n" + ROUTE)
    assert directory.scan() is True
    assert names(directory) == ["Gateway/gw", "UDPRoute/route"]


def test_a_removed_file_takes_its_objects(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(GATEWAY.format(name="a"))
    (tmp_path / "b.yaml").write_text(GATEWAY.format(name="b"))
    directory = ManifestDir(tmp_path)
    directory.scan()
    (tmp_path / "a.yaml").unlink()
    assert directory.scan() is True
    assert names(directory) == ["Gateway/b"]


def test_an_object_defined_twice_is_reported_and_the_first_wins(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(GATEWAY.format(name="gw"))
    second = GATEWAY.format(name="gw").replace("3478", "3479")
    # Another version of the same kind names the same object.
    (tmp_path / "b.yaml").write_text(ROUTE + "---\n" + second)
    directory = ManifestDir(tmp_path)
    directory.scan()
    objects = directory.objects()
    assert [obj["kind"] for obj in objects] == ["Gateway", "UDPRoute"]
    assert objects[0]["spec"]["listeners"][0]["port"] == 3478
    [duplicate] = directory.duplicates
    assert (duplicate.path, duplicate.line) == (tmp_path / "b.yaml", 9)
    assert f"already defined at {tmp_path / 'a.yaml'}:1" in duplicate.message


def test_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="not a directory"):
        ManifestDir(tmp_path / "nowhere").scan()


def test_watch_yields_after_each_change(tmp_path: Path) -> None:
    async def main() -> None:
        path = tmp_path / "gateway.yaml"
        path.write_text(GATEWAY.format(name="one"))
        watch = ManifestDir(tmp_path, poll_interval=0.02).watch()
        first = await asyncio.wait_for(anext(watch), 5)
        assert [obj["metadata"]["name"] for obj in first] == ["one"]
        path.write_text("kind: [")  # malformed: nothing yielded
        pending = asyncio.ensure_future(anext(watch))
        await asyncio.sleep(0.2)
        assert not pending.done()
        path.write_text(GATEWAY.format(name="two"))
        second = await asyncio.wait_for(pending, 5)
        assert [obj["metadata"]["name"] for obj in second] == ["two"]
        await watch.aclose()

    asyncio.run(main())


# --- hostile files: bounded, reported once, the last good objects kept -------------------------


def nesting_bomb() -> str:
    return "[" * 100_000  # 100,000 nested flow sequences: RecursionError in the parser before


def block_nesting_bomb() -> str:
    return "".join(f"{' ' * level}k:\n" for level in range(1500)) + " " * 1500 + "v\n"


def alias_bomb(comment: str = "") -> str:
    """A ConfigMap whose data is 9 levels of 9 aliases (387 million nodes expanded)."""
    lines = [f"# {comment}", "apiVersion: v1", "kind: ConfigMap", "metadata: {name: lol}", "data:"]
    lines.append("  a0: &a0 [x, x, x, x, x, x, x, x, x]")
    for level in range(1, 9):
        lines.append(f"  a{level}: &a{level} [{', '.join([f'*a{level - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


def empty_documents() -> str:
    """4 MiB (at the cap, not past it) of empty documents: a million `---`."""
    return "---\n" * (1024 * 1024)


def oversized() -> str:
    # A valid object padded with a comment past 4 MiB.
    return GATEWAY.format(name="big") + "#" * (4 * 1024 * 1024) + "\n"


BOMBS = {
    "nesting": (nesting_bomb, 1, "invalid YAML: while increasing flow level exceeded maximum"),
    "block nesting": (block_nesting_bomb, 100, "nested more than 100 levels deep"),
    "block sequences": (lambda: "- " * 3000 + "x\n", 1, "nested more than 100 levels deep"),
    "alias bomb": (alias_bomb, 11, "more than 300000 nodes, each alias counted as what it names"),
    "recursive alias": (lambda: "a: &a [b, *a]\n", 1, "alias *a is inside the node it names"),
    "empty documents": (empty_documents, 300_002, "more than 300000 nodes"),
    "oversized": (oversized, 0, f"{len(oversized())} bytes, more than the 4 MiB a file may have"),
}


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_a_hostile_file_is_refused_once_and_keeps_the_last_good_objects(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, bomb: str
) -> None:
    make, line, message = BOMBS[bomb]
    path = tmp_path / "hostile.yaml"
    path.write_text(GATEWAY.format(name="kept"))
    other = tmp_path / "other.yaml"
    other.write_text(GATEWAY.format(name="other"))
    directory = ManifestDir(tmp_path)
    directory.scan()
    with caplog.at_level(logging.ERROR, logger="stunner.manifests"):
        path.write_text(make())
        assert directory.scan() is False
        assert names(directory) == ["Gateway/kept", "Gateway/other"]
        [error] = directory.errors
        assert (error.path, error.line) == (path, line)
        assert message in error.message
        # Other files' edits still apply; the refusal is not logged again.
        other.write_text(GATEWAY.format(name="edited"))
        assert directory.scan() is True
        assert names(directory) == ["Gateway/kept", "Gateway/edited"]
    assert caplog.text.count(str(path)) == 1
    assert "keeping the 1 objects read before" in caplog.text
    # The same refusal through the loader `stunner render/check -f` uses.
    with pytest.raises(ManifestError) as info:
        read_manifest(path)
    assert str(info.value) == str(error)


def test_thousands_of_gateways_in_one_file_are_read(tmp_path: Path) -> None:
    """Issue 28: 1,000 documents per file refused 1,000 Gateways and their GatewayClass in
    one 564 KB file; documents are bounded by the node and size bounds now."""
    path = tmp_path / "gateways.yaml"
    path.write_text("---\n".join(GATEWAY.format(name=f"gw{n}") for n in range(5000)))
    directory = ManifestDir(tmp_path)
    assert directory.scan() is True and directory.errors == []
    assert len(directory.objects()) == 5000
    assert len(read_manifest(path)[1]) == 5000


def test_an_alias_bomb_rewritten_is_refused_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Rewritten, the old loader compared the old and new parsed objects: 33 s expanding both.
    path = tmp_path / "lol.yaml"
    path.write_text(alias_bomb("first"))
    directory = ManifestDir(tmp_path)
    with caplog.at_level(logging.ERROR, logger="stunner.manifests"):
        assert directory.scan() is False
        path.write_text(alias_bomb("rewritten"))
        assert directory.scan() is False
    assert directory.objects() == []
    assert [(e.path, e.line) for e in directory.errors] == [(path, 11)]
    assert caplog.text.count(f"{path}:11: more than 300000 nodes") == 1


def test_aliases_within_the_bound_are_read(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"
        "data: {base: &base [x, y], copy: *base, merged: {<<: {k: v}, l: w}}\n"
    )
    directory = ManifestDir(tmp_path)
    assert directory.scan() is True
    [config] = directory.objects()
    assert config["data"]["copy"] == ["x", "y"]
    assert config["data"]["merged"] == {"k": "v", "l": "w"}


def test_a_change_is_decided_from_the_bytes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(GATEWAY.format(name="gw"))
    directory = ManifestDir(tmp_path)
    with caplog.at_level(logging.INFO, logger="stunner.manifests"):
        directory.scan()
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # touched
        assert directory.scan() is False  # the same bytes: not parsed again
        assert caplog.text.count(f"manifest {path}: 1 objects") == 1
        path.write_text("# a comment\n" + GATEWAY.format(name="gw"))  # new bytes: parsed
        assert directory.scan() is True
        assert caplog.text.count(f"manifest {path}: 1 objects") == 2


def test_a_symlink_out_of_the_directory_is_not_followed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manifests = tmp_path / "manifests"
    (manifests / "sub").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.yaml").write_text(GATEWAY.format(name="outside"))
    (manifests / "gateway.yaml").write_text(GATEWAY.format(name="gw"))
    (manifests / "zz.yaml").symlink_to(outside / "secret.yaml")
    (manifests / "linked-dir").symlink_to(outside)
    (manifests / "nowhere.yaml").symlink_to(tmp_path / "missing.yaml")
    # A link inside the directory is read (a ConfigMap volume is made of such links); hidden
    # directories (the volume's ..data) are not walked themselves.
    (manifests / "..data").mkdir()
    (manifests / "..data" / "route.yaml").write_text(ROUTE)
    (manifests / "route.yaml").symlink_to(manifests / "..data" / "route.yaml")
    directory = ManifestDir(manifests)
    with caplog.at_level(logging.ERROR, logger="stunner.manifests"):
        assert directory.scan() is True
        assert names(directory) == ["Gateway/gw", "UDPRoute/route"]
        assert directory.scan() is False
    refused = [manifests / "linked-dir", manifests / "nowhere.yaml", manifests / "zz.yaml"]
    assert [e.path for e in directory.errors] == refused
    for path in refused:
        assert caplog.text.count(f"{path}: a symbolic link out of the directory") == 1
    assert "outside" not in names(directory)
    # The link removed: its report goes.
    (manifests / "zz.yaml").unlink()
    directory.scan()
    assert [e.path for e in directory.errors] == refused[:2]


def test_the_watch_survives_a_scan_that_fails(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The directory taken away (a volume unmounted): logged once, the objects kept, the watch
    goes on and takes the directory back."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "gateway.yaml").write_text(GATEWAY.format(name="one"))

    async def main() -> None:
        watch = ManifestDir(manifests, poll_interval=0.02).watch()
        first = await asyncio.wait_for(anext(watch), 5)
        assert [obj["metadata"]["name"] for obj in first] == ["one"]
        pending = asyncio.ensure_future(anext(watch))
        manifests.rename(tmp_path / "away")
        while caplog.text.count("scanning") < 1:
            await asyncio.sleep(0.02)
        for _ in range(5):  # several more polls fail the same way
            await asyncio.sleep(0.02)
        (tmp_path / "away").rename(manifests)
        (manifests / "gateway.yaml").write_text(GATEWAY.format(name="two"))
        second = await asyncio.wait_for(pending, 5)
        assert [obj["metadata"]["name"] for obj in second] == ["two"]
        await watch.aclose()

    with caplog.at_level(logging.INFO, logger="stunner.manifests"):
        asyncio.run(main())
    assert caplog.text.count(f"scanning {manifests} failed: {manifests}: not a directory") == 1
    assert f"scanning {manifests} works again" in caplog.text
