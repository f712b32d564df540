"""Local mode's watcher against hostile manifest files, in the real `stunner-reconciler` process.

We test, with the bundled example in a directory the reconciler watches: a nesting bomb, block
nesting, an alias bomb written and rewritten, an oversized file, a file of a million empty
documents and a symlink to a Gateway outside the directory are each refused and logged once with
the file, while the process stays up and later edits of the Gateway still reach the CDS (the
linked Gateway never does); and, with the running process's descriptor limit lowered below what
it holds (from outside, as running out of descriptors does), the scan's `EMFILE` is logged once,
the objects stay, and once the limit is raised the edit made meanwhile is applied.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reconciler.demo_example import prepare
from tests.reconciler.test_files import alias_bomb, empty_documents, nesting_bomb
from tests.support.ports import free_port

HOST = "127.0.0.1"
GATEWAY_ID = "stunner/local-gateway"
DEADLINE = 30.0


def cds_get(port: int, path: str = "") -> Any:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{HOST}:{port}/api/v1/configs{path}", timeout=5) as response:
        return json.loads(response.read())


def listener_ports(cds_port: int) -> set[int]:
    try:
        config = cds_get(cds_port, f"/{GATEWAY_ID}")
    except (OSError, urllib.error.URLError):
        return set()
    return {listener["port"] for listener in config.get("listeners") or []}


def until(condition: Callable[[], bool], proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert proc.poll() is None, f"the reconciler exited ({proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE} s"
        time.sleep(0.05)


@contextmanager
def reconciler(
    manifests: Path, log: Path, cds_port: int, auth_port: int = 0
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as output:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reconciler", "--manifests", str(manifests)]
            + ["--cds-port", str(cds_port), "--auth-port", str(auth_port), "--address", HOST],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def edit_port(gateway: Path, old: int, new: int) -> None:
    text = gateway.read_text()
    assert f"port: {old}" in text
    gateway.write_text(text.replace(f"port: {old}", f"port: {new}"))


def test_hostile_files_are_refused_once_and_edits_still_apply(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    ports = [free_port() for _ in range(3)]
    prepare(manifests, ports[0], 9)
    gateway = manifests / "gateway.yaml"
    outside = tmp_path / "outside.yaml"
    outside.write_text(gateway.read_text().replace("local-gateway", "stolen-gateway"))
    cds_port = free_port()
    log = tmp_path / "reconciler.log"
    with reconciler(manifests, log, cds_port) as proc:
        until(lambda: listener_ports(cds_port) == {ports[0]}, proc, "first config")
        hostile = {
            "nest.yaml": nesting_bomb(),
            "deep.yaml": "".join(f"{' ' * n}k:\n" for n in range(1500)) + " " * 1500 + "v\n",
            "lol.yaml": alias_bomb("first"),
            "big.yaml": gateway.read_text() + "#" * (4 * 1024 * 1024) + "\n",
            "docs.yaml": empty_documents(),
        }
        for name, text in hostile.items():
            (manifests / name).write_text(text)
        (manifests / "zz.yaml").symlink_to(outside)
        (manifests / "lol.yaml").write_text(alias_bomb("rewritten"))
        # Later edits of another file still apply, twice (many polls after the refusals).
        edit_port(gateway, ports[0], ports[1])
        until(lambda: listener_ports(cds_port) == {ports[1]}, proc, "the first edit")
        edit_port(gateway, ports[1], ports[2])
        until(lambda: listener_ports(cds_port) == {ports[2]}, proc, "the second edit")
        # The Gateway behind the link out of the directory was never read.
        assert [c["admin"]["name"] for c in cds_get(cds_port)["items"]] == [GATEWAY_ID]
        assert proc.poll() is None
    text = log.read_text()
    errors = [line for line in text.splitlines() if " ERROR: " in line]
    for name in [*hostile, "zz.yaml"]:
        mine = [line for line in errors if f"{manifests / name}" in line]
        assert len(mine) == 1, (name, mine)
    assert "not followed" in next(line for line in errors if "zz.yaml" in line)
    assert "Traceback" not in text and "CRITICAL" not in text


def test_running_out_of_descriptors_is_survived(tmp_path: Path) -> None:
    """The running reconciler's `nofile` limit lowered below the descriptors it holds
    (prlimit, from outside): every scan fails with EMFILE until the limit is raised again."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    first, second = free_port(), free_port()
    prepare(manifests, first, 9)
    cds_port = free_port()
    log = tmp_path / "reconciler.log"
    with reconciler(manifests, log, cds_port) as proc:
        until(lambda: listener_ports(cds_port) == {first}, proc, "first config")
        limits = resource.prlimit(proc.pid, resource.RLIMIT_NOFILE)
        # A new descriptor takes the lowest free number, refused from the soft limit on: with 3,
        # every one (0-2 are stdin, stdout and stderr).
        resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (3, limits[1]))
        try:
            failed = f"scanning {manifests} failed"
            until(lambda: failed in log.read_text(), proc, "the scan failing")
            edit_port(manifests / "gateway.yaml", first, second)  # not lost meanwhile
            time.sleep(0.5)  # more polls fail the same way
        finally:
            resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, limits)
        until(lambda: listener_ports(cds_port) == {second}, proc, "the edit after EMFILE")
        assert proc.poll() is None
    text = log.read_text()
    scans = [line for line in text.splitlines() if f"scanning {manifests} failed" in line]
    assert len(scans) == 1, scans
    assert "Too many open files" in scans[0]
    assert "keeping the last good objects" in scans[0]
    assert f"scanning {manifests} works again" in text
