"""Run a test's function in a network namespace of its own (`unshare --net`, root): for tests
that attach programs to interfaces, so that nothing touches the machine's own; inside it, a
veth pair to a second namespace (`veth_pair`) for what needs a real Ethernet interface."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
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


CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _enter(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(descriptor, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {path}")
    finally:
        os.close(descriptor)


def ip(*args: str, namespace: str | None = None) -> None:
    """`ip ARGS` (iproute2), in `namespace` (a /proc/PID/ns/net path) or this one."""
    command = ["ip", *args]
    if namespace is not None:
        command = ["nsenter", f"--net={namespace}", *command]
    subprocess.run(command, check=True, capture_output=True, text=True)


@dataclass
class VethPair:
    """This namespace's end of a veth pair (`here`) and the other end (`there`) in a second
    namespace of its own, held by a sleeping process; `inside()` makes sockets there."""

    here: str
    there: str
    namespace: str  # the other namespace: /proc/PID/ns/net
    holder: subprocess.Popen[bytes]

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """Sockets this thread creates within are the other namespace's."""
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            _enter(self.namespace)
            try:
                yield
            finally:
                if _libc.setns(own, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns back")
        finally:
            os.close(own)

    def close(self) -> None:
        self.holder.kill()
        self.holder.wait()


def veth_pair(here: Mapping[str, str], there: Mapping[str, str | list[str]]) -> VethPair:
    """Inside a namespace of the test's own: a veth pair `xs` (here) - `xc` (in a second
    namespace), addressed as given ({"v4": "10.30.0.1/24", "v6": "fd30::1/64"}, the other end's
    values lists), both up, the other end's loopback too. The other end computes its UDP
    checksums itself (tx offload off), as a frame from the wire has them."""
    holder = subprocess.Popen(
        ["unshare", "--net", "sleep", "infinity"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # the test's output ends when the test does
    )
    namespace = f"/proc/{holder.pid}/ns/net"
    own = os.readlink("/proc/self/ns/net")
    while os.readlink(namespace) == own:  # until unshare(2) has run in the holder
        os.sched_yield()
    ip("link", "add", "xs", "type", "veth", "peer", "name", "xc", "netns", str(holder.pid))
    for key in ("v4", "v6"):
        ip("addr", "add", here[key], "dev", "xs", *(["nodad"] if key == "v6" else []))
        values = there[key]
        for value in [values] if isinstance(values, str) else values:
            ip(
                "addr",
                "add",
                value,
                "dev",
                "xc",
                *(["nodad"] if key == "v6" else []),
                namespace=namespace,
            )
    ip("link", "set", "xs", "up")
    ip("link", "set", "xc", "up", namespace=namespace)
    ip("link", "set", "lo", "up", namespace=namespace)
    subprocess.run(
        ["nsenter", f"--net={namespace}", "ethtool", "-K", "xc", "tx", "off", "gro", "on"],
        check=True,
        capture_output=True,
    )
    return VethPair("xs", "xc", namespace, holder)
