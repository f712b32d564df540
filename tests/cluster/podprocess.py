"""A pod's processes, reached from the host its node runs on (the fault phases' kill -9 and the
rule that cuts stunnerd off the CDS; tests/cluster/README.md, "What it needs").

On a node you made on this machine (a kubelet and containerd here, or in a network namespace of
their own) every container's processes are this host's processes: a pod's stunnerd is the
process named stunnerd whose network namespace holds the pod's address. On kind or minikube the
nodes are containers or VMs: `container_pid` finds nothing, and the phases that need it skip.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def _command_of(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _addresses(pid: str) -> str:
    done = subprocess.run(
        ["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "-o", "addr", "show"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    return done.stdout


def container_pid(pod_ip: str, command: str = "stunnerd") -> int | None:
    """The first process (the container's PID 1: the lowest PID) whose command line names
    `command` and whose network namespace holds `pod_ip`; None if there is none here."""
    if os.geteuid() != 0:
        return None
    found: dict[str, list[int]] = {}  # network namespace -> its pids running `command`
    for entry in os.listdir("/proc"):
        if entry.isdigit() and command.encode() in _command_of(entry):
            try:
                found.setdefault(os.readlink(f"/proc/{entry}/ns/net"), []).append(int(entry))
            except OSError:
                continue
    for pids in found.values():
        if f" {pod_ip}/" in _addresses(str(min(pids))):
            return min(pids)
    return None


def in_network_of(pid: int, *command: str) -> None:
    """Run `command` in the network namespace of process `pid` (iptables, say)."""
    done = subprocess.run(
        ["nsenter", f"--net=/proc/{pid}/ns/net", *command],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, f"{' '.join(command)} in {pid}'s network: {done.stderr}"
