"""Run a test's function in a network namespace of its own (`unshare --net`, root): for tests
that attach programs to interfaces, so that nothing touches the machine's own."""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def run_in_new_namespace(module: str, function: str, *args: str, timeout: float = 300) -> str:
    """`module.function(*args)` in a new network namespace; returns what it wrote to stdout.
    Skips without root or unshare (util-linux); fails with the function's output if it fails."""
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare (util-linux) for a network namespace of its own")
    code = f"import sys, {module} as m; m.{function}(*sys.argv[1:])"
    done = subprocess.run(
        [unshare, "--net", sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-6000:]
    return done.stdout


def loopback_up() -> None:
    """Inside the namespace: its loopback interface up (a new namespace's is down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", b"lo", IFF_UP))
