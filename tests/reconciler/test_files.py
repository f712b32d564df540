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
from pathlib import Path

import pytest

from reconciler.files import ManifestDir, ManifestError, parse_manifest

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
