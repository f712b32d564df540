"""Where the offload program runs: a tcx link on an interface's ingress (kernel 6.6).

A link holds the program on the interface for as long as a descriptor of it is open, and is
never pinned: when the process that made it exits, however it exits (kill -9 included), the
kernel closes its descriptors and the program is detached, so no relaying outlives stunnerd.
tcx keeps other programs on the same hook (a CNI's) and runs them after this one for whatever
it leaves (TCX_NEXT).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from . import bpf

ARPHRD_ETHER = 1
ARPHRD_LOOPBACK = 772


def interface_type(name: str) -> int:
    return int(Path(f"/sys/class/net/{name}/type").read_text())


@dataclass
class Attachment:
    """The program on one interface; `close()` detaches it."""

    interface: str
    ifindex: int
    link_fd: int

    def close(self) -> None:
        if self.link_fd >= 0:
            os.close(self.link_fd)
            self.link_fd = -1


def attach_tc(prog_fd: int, interface: str) -> Attachment:
    """Attaches the program at `interface`'s tcx ingress.

    Raises ValueError for an unknown interface or one the program cannot parse (it expects an
    Ethernet header, as Ethernet and the loopback interface have), BpfError for what the
    kernel refuses (EINVAL before 6.6, EPERM without CAP_NET_ADMIN)."""
    try:
        ifindex = socket.if_nametoindex(interface)
        kind = interface_type(interface)
    except OSError:
        raise ValueError(f"no interface {interface}") from None
    if kind not in (ARPHRD_ETHER, ARPHRD_LOOPBACK):
        raise ValueError(f"interface {interface} has no Ethernet header (type {kind})")
    link = bpf.link_create(prog_fd, ifindex, bpf.ATTACH_TCX_INGRESS)
    return Attachment(interface, ifindex, link)
