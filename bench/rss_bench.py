"""Baseline RSS of a running stunnerd, per relay path and UDP process count, and where the
primary's memory goes (the RSS each import adds, in order: what every stunnerd loads, then
what only some configs load).

stunnerd runs from turn_bench's config (TURN-UDP and TURN-TCP listeners, static auth), without
allocations; VmRSS is read from /proc 2 s after start, per process (primary and UDP workers).

    .venv/bin/python bench/rss_bench.py
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import turn_bench  # noqa: E402  (bench/ is not a package)

MODES = [
    ("native path, default", "stunnerd", None),
    ("native path, `-u 2`", "stunnerd", 2),
    ("Python path, default", "stunnerd-py", None),
    ("Python path, `-u 1`", "stunnerd-py", 1),
]
IMPORTS = [
    "asyncio", "uvloop", "pydantic", "stunner_api.dataplane", "stunnerd.transport.native",
    "stunnerd.process.worker_process", "stunnerd.process.cli",
    # Loaded only when a config needs them: a TLS/DTLS listener, an admin endpoint (health
    # check, metrics), a metrics scrape, a CDS watch.
    "cryptography.x509", "stunnerd.transport.dtls", "aiohttp.web", "prometheus_client",
    "websockets.asyncio.client",
]  # fmt: skip


def own_rss_kib(pid: int) -> int:
    children = turn_bench.descendants(pid)
    return turn_bench.rss_kib(pid) - sum(turn_bench.rss_kib(c) for c in children)


def running_rss() -> str:
    out = ["| stunnerd | processes | RSS MiB | per process MiB |", "|---|---:|---:|---|"]
    for label, server, threads in MODES:
        with tempfile.TemporaryDirectory(prefix="rss-bench-") as tmp:
            stunnerd = turn_bench.Server(server, Path(tmp), threads)
            stunnerd.start()
            try:
                time.sleep(2)
                pids = [stunnerd.pid, *turn_bench.descendants(stunnerd.pid)]
                each = [own_rss_kib(pid) / 1024 for pid in pids]
            finally:
                stunnerd.stop()
        parts = " + ".join(f"{mib:.1f}" for mib in each)
        out.append(f"| {label} | {len(pids)} | {sum(each):.1f} | {parts} |")
    return "\n".join(out)


def import_costs() -> str:
    """Each import's RSS, in a fresh interpreter, one after the other."""
    script = (
        "import importlib, sys\n"
        "def rss():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmRSS'): return int(line.split()[1]) / 1024\n"
        "print(f'| the interpreter | | {rss():.1f} |')\n"
        "for name in sys.argv[1:]:\n"
        "    before = rss(); importlib.import_module(name); after = rss()\n"
        "    print(f'| {name} | +{after - before:.1f} | {after:.1f} |')\n"
    )
    rows = subprocess.run(
        [sys.executable, "-c", script, *IMPORTS], capture_output=True, text=True, check=True
    ).stdout
    return "| import | adds MiB | RSS MiB |\n|---|---:|---:|\n" + rows


def main() -> int:
    importlib.import_module("stunnerd")  # fail early outside the project's venv
    sys.stdout.write(running_rss() + "\n\n" + import_costs())
    return 0


if __name__ == "__main__":
    sys.exit(main())
