"""`stunner render -f` and `stunner check -f` on hostile files: the bounds local mode applies
(reconciler.files), each refusal one `file:line: why` line on stderr and exit code 1, never a
traceback; a symbolic link out of the directory is not followed and said so.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stunner_cli.__main__ import main
from tests.reconciler.test_files import BOMBS, GATEWAY

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", ["render", "check"])
@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_a_hostile_file_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, bomb: str
) -> None:
    make, line, message = BOMBS[bomb]
    path = tmp_path / "hostile.yaml"
    path.write_text(make())
    assert main([command, "-f", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    where = f"{path}:{line}" if line else f"{path}"
    assert err == f"stunner: {where}: {message}" + err.split(message, 1)[1]
    assert err.count("\n") == 1 and out == ""


def test_a_nesting_bomb_prints_no_traceback(tmp_path: Path) -> None:
    """The red team's finding: 100,000 `[` gave a raw RecursionError traceback."""
    path = tmp_path / "nest.yaml"
    path.write_text("[" * 100_000)
    for command in ("render", "check"):
        result = subprocess.run(
            [sys.executable, "-m", "stunner_cli", command, "-f", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert result.returncode == 1
        assert result.stderr.startswith(f"stunner: {path}:1: invalid YAML: ")
        assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1


def test_a_symlink_out_of_the_directory_is_not_followed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    outside = tmp_path / "outside.yaml"
    outside.write_text(GATEWAY.format(name="outside").replace("3478", "0"))  # an error if read
    (manifests / "gateway.yaml").write_text(GATEWAY.format(name="gw"))
    (manifests / "zz.yaml").symlink_to(outside)
    assert main(["check", "-f", str(manifests)]) == 0
    out, err = capsys.readouterr()
    assert f"stunner: {manifests / 'zz.yaml'}: a symbolic link out of the directory" in err
    assert "not followed" in err
    assert "outside" not in out and "1 objects, 0 errors" in err
