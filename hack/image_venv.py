"""Shape and check the virtualenv an image ships, with that virtualenv's own Python.

    python hack/image_venv.py prune-dataplane   # leave only what stunnerd needs
    python hack/image_venv.py check [--native]  # every installed entry point starts from it

The Dockerfile runs both in its build stages and tests/image/test_image_deps.py runs them on the
venvs it builds the same way, so what the image ships is what CI starts. Run it by path from a
directory that holds no source checkout: `check` fails when a module of ours is imported from
anywhere but the venv (the fault that once hid a missing C extension behind `WORKDIR /src`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import runpy
import shutil
import sys
from pathlib import Path

DISTRIBUTION = "stunner"
# The dataplane image runs stunnerd alone: its command and the packages it imports.
DATAPLANE_SCRIPTS = frozenset({"stunnerd"})
# stunner_http: the connection discipline of stunnerd's admin server (health check, metrics);
# stunner_client: its CDS client (stunner_client.cds; the package's TURN client and echo peer
# are there too, a few kB, unimportable without the demo/cli extras and never imported).
DATAPLANE_PACKAGES = frozenset({"stunnerd", "stunner_api", "stunner_http", "stunner_client"})
# The webhook's gunicorn configuration, which the chart names by its path in the venv.
WEBHOOK_GUNICORN_CONF = ("webhook", "gunicorn.conf.py")


def console_scripts() -> list[importlib.metadata.EntryPoint]:
    dist = importlib.metadata.distribution(DISTRIBUTION)
    return [ep for ep in dist.entry_points if ep.group == "console_scripts"]


def our_packages() -> set[str]:
    dist = importlib.metadata.distribution(DISTRIBUTION)
    return {
        f.parts[0]
        for f in dist.files or []
        if len(f.parts) > 1 and f.parts[0].isidentifier()  # not ../../bin, *.dist-info
    }


def site_packages() -> Path:
    return Path(importlib.import_module("stunner_api").__file__ or "").parent.parent


def prune_dataplane() -> list[str]:
    """Remove the control plane's packages and commands; return what was removed."""
    removed = []
    root = site_packages()
    for package in sorted(our_packages() - DATAPLANE_PACKAGES):
        shutil.rmtree(root / package)
        removed.append(f"{package}/")
    for ep in console_scripts():
        script = Path(sys.prefix) / "bin" / ep.name
        if ep.name not in DATAPLANE_SCRIPTS and script.exists():
            script.unlink()
            removed.append(f"bin/{ep.name}")
    return removed


def _inside_venv(module_name: str) -> None:
    origin = Path(sys.modules[module_name].__file__ or "").resolve()
    prefix = Path(sys.prefix).resolve()
    if prefix not in origin.parents:
        raise SystemExit(f"{module_name} was imported from {origin}, not from the venv {prefix}")


def check(native: bool) -> list[str]:
    """Load every console script the venv has, and what they load late; return what was."""
    checked = []
    for ep in console_scripts():
        if not (Path(sys.prefix) / "bin" / ep.name).exists():
            continue
        ep.load()
        _inside_venv(ep.module)
        checked.append(f"{ep.name} -> {ep.value}")
    conf = site_packages().joinpath(*WEBHOOK_GUNICORN_CONF)
    if conf.exists():
        # gunicorn imports its worker class only when it starts: import it the way it does.
        from gunicorn.util import load_class

        worker_class = runpy.run_path(str(conf))["worker_class"]
        load_class(worker_class)
        checked.append(f"gunicorn worker_class {worker_class}")
    if native:
        importlib.import_module("stunnerd._relay")
        _inside_venv("stunnerd._relay")
        checked.append("stunnerd._relay")
        # The kernel offload's program, compiled by the build (clang's BPF target).
        program = importlib.import_module("stunnerd.offload.program")
        program.read_object()
        _inside_venv("stunnerd.offload.program")
        checked.append(f"stunnerd/offload/{program.OBJECT.name}")
    if not checked:
        raise SystemExit("nothing to check: the venv has no command of ours")
    return checked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prune-dataplane", help="leave only stunnerd and what it imports")
    checker = sub.add_parser("check", help="every installed command of ours loads from the venv")
    checker.add_argument(
        "--native",
        action="store_true",
        help="the C relay extension and the offload program must load",
    )
    args = parser.parse_args()
    if args.command == "prune-dataplane":
        lines = prune_dataplane()
    else:
        lines = check(args.native)
    for line in lines:
        print(f"{args.command}: {line}")


if __name__ == "__main__":
    main()
