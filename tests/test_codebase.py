"""The codebase itself: ruff (lint and format) and mypy --strict are clean, and the import
contracts of pyproject.toml ([tool.importlinter], from ../shared/LAYOUT.md) are kept.

They run as part of the tests so that the one test command checks everything CI checks.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["mypy"],
    ],
    ids=["ruff-check", "ruff-format", "mypy-strict"],
)
def test_tool_is_clean(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_contracts_are_kept() -> None:
    """stunner_api is pure, stunnerd imports no webhook/kubernetes, webhook and reconciler are
    independent: lint-imports reads the contracts from pyproject.toml."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _imports_relay(tree: ast.AST, package: str) -> bool:
    """Whether a module of `package` imports the C extension `stunnerd._relay`, in any form."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            if any(alias.name == "stunnerd._relay" for alias in node.names):
                return True
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the module's package
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            if base == "stunnerd._relay" or (
                base == "stunnerd" and any(a.name == "_relay" for a in node.names)
            ):
                return True
        elif isinstance(node, ast.Constant) and node.value == "stunnerd._relay":
            return True  # importlib.import_module("stunnerd._relay")
    return False


def test_one_module_of_stunnerd_imports_the_c_extension() -> None:
    """LAYOUT.md's last import contract: the C relay extension has one door,
    stunnerd.transport.native.
    lint-imports cannot check it (its module graph holds .py files only, not the .so), so
    this reads every module of stunnerd."""
    importers = set()
    for path in sorted((ROOT / "stunnerd").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        if _imports_relay(ast.parse(path.read_text(), str(path)), package):
            importers.add(module.removesuffix(".__init__"))
    assert importers == {"stunnerd.transport.native"}


PACKAGES = (
    "stunnerd",
    "stunner_api",
    "stunner_http",
    "stunner_client",
    "webhook",
    "reconciler",
    "stunner_cli",
)


def _private_imports(tree: ast.AST) -> list[str]:
    """`from M import _name` of a module: a private name taken across files (the extension's
    own `_relay`, a package's door, is no name of another module's)."""
    return [
        f"{node.module or '.'}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module != "__future__"
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__") and alias.name != "_relay"
    ]


def test_no_module_imports_a_private_name_of_another() -> None:
    """What one module keeps private stays its own: a name two modules share is public where it
    lives (issue 33: native_tcp took transports' _bound_socket, deployment manifests' _view)."""
    taken = {
        str(path.relative_to(ROOT)): names
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if (names := _private_imports(ast.parse(path.read_text(), str(path))))
    }
    assert taken == {}


# The reconciler's own ports (reconciler.cluster: Go's --metrics-bind-address 8080 and
# --health-probe-bind-address 8081) are another process's, named apart.
OWN_PORTS_OF_ANOTHER_PROCESS = {"reconciler/cluster.py"}


def test_stunnerds_admin_ports_are_written_once() -> None:
    """stunnerd's status and metrics ports (8086, 8080) are numbers in stunner_api.vocabulary
    only; every other module names them (issue 33: METRICS_PORT had a second copy)."""
    vocabulary = {"STATUS_PORT": 8086, "METRICS_PORT": 8080}
    copies = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            if where in OWN_PORTS_OF_ANOTHER_PROCESS:
                continue
            for node in ast.walk(ast.parse(path.read_text(), where)):
                if (
                    isinstance(node, ast.Assign)
                    and isinstance(node.value, ast.Constant)
                    and node.value.value in vocabulary.values()
                    and type(node.value.value) is int
                ):
                    copies.append(f"{where}:{node.lineno}")
    assert copies == [
        f"stunner_api/vocabulary.py:{_line_of('stunner_api/vocabulary.py', name)}"
        for name in vocabulary
    ]


def _line_of(where: str, name: str) -> int:
    for node in ast.parse((ROOT / where).read_text(), where).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == name for target in node.targets
        ):
            return node.lineno
    raise AssertionError(f"{name} is not assigned in {where}")
