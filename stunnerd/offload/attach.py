"""Where the offload program runs: a tcx link on an interface's ingress (kernel 6.6), or an XDP
link (driver mode where the driver has it, else generic).

A link holds the program on the interface for as long as a descriptor of it is open, and is
never pinned: when the process that made it exits, however it exits (kill -9 included), the
kernel closes its descriptors and the program is detached, so no relaying outlives stunnerd.
tcx keeps other programs on the same hook (a CNI's) and runs them after this one for whatever
it leaves (TCX_NEXT). XDP holds one program per interface and mode: an interface that already
has one (another stunnerd process's, a CNI's) refuses the link (EBUSY).
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import struct
from dataclasses import dataclass

from . import bpf

ARPHRD_ETHER = 1
ARPHRD_LOOPBACK = 772


SIOCGIFHWADDR = 0x8927


def interface_type(name: str) -> int:
    """The interface's hardware type (ARPHRD_*), asked of this network namespace's kernel (an
    ioctl, not /sys/class/net: that is the namespace's that mounted /sys). OSError for none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        answer = fcntl.ioctl(s, SIOCGIFHWADDR, struct.pack("16s16x", name.encode()[:15]))
    return int(struct.unpack_from("=H", answer, 16)[0])  # ifr_hwaddr.sa_family


@dataclass
class Attachment:
    """The program on one interface; `close()` detaches it."""

    interface: str
    ifindex: int
    link_fd: int
    mode: str = "tcx"  # "tcx", or XDP's "driver" or "generic"

    def close(self) -> None:
        if self.link_fd >= 0:
            os.close(self.link_fd)
            self.link_fd = -1


def ethernet_ifindex(interface: str) -> int:
    """The interface's index; ValueError for an unknown interface or one the program cannot
    parse (it expects an Ethernet header, as Ethernet and the loopback interface have)."""
    try:
        ifindex = socket.if_nametoindex(interface)
        kind = interface_type(interface)
    except OSError:
        raise ValueError(f"no interface {interface}") from None
    if kind not in (ARPHRD_ETHER, ARPHRD_LOOPBACK):
        raise ValueError(f"interface {interface} has no Ethernet header (type {kind})")
    return ifindex


def attach_tc(prog_fd: int, interface: str) -> Attachment:
    """Attaches the program at `interface`'s tcx ingress.

    Raises ValueError (see `ethernet_ifindex`), BpfError for what the kernel refuses (EINVAL
    before 6.6, EPERM without CAP_NET_ADMIN)."""
    ifindex = ethernet_ifindex(interface)
    link = bpf.link_create(prog_fd, ifindex, bpf.ATTACH_TCX_INGRESS)
    return Attachment(interface, ifindex, link)


# XDP's modes, tried in this order: the driver's (before any skb), then generic (any interface).
XDP_MODES = (("driver", bpf.XDP_FLAGS_DRV_MODE), ("generic", bpf.XDP_FLAGS_SKB_MODE))


def attach_xdp(
    prog_fd: int, interface: str, modes: tuple[str, ...] = ("driver", "generic")
) -> Attachment:
    """Attaches the XDP program to `interface` in the first of `modes` it takes: driver mode
    where the driver has XDP, else generic.

    Raises ValueError (see `ethernet_ifindex`), BpfError for what the kernel refuses in the last
    mode tried (EBUSY: the interface holds another XDP program; EPERM without CAP_NET_ADMIN)."""
    ifindex = ethernet_ifindex(interface)
    tried = [(name, flags) for name, flags in XDP_MODES if name in modes]
    for i, (name, flags) in enumerate(tried):
        try:
            link = bpf.link_create(prog_fd, ifindex, bpf.ATTACH_XDP, flags)
        except bpf.BpfError as exc:
            # No driver support says EOPNOTSUPP (or EINVAL); anything else the next mode
            # would say too.
            if i + 1 < len(tried) and exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                continue
            raise
        return Attachment(interface, ifindex, link, name)
    raise ValueError(f"no XDP mode among {modes}")


def why_not(exc: BaseException, hook: str = "TC") -> tuple[str, str]:
    """What a failure to load or attach the program for `hook` says to an operator (the missing
    piece), and its word for the metric."""
    if isinstance(exc, bpf.BpfError):
        if exc.errno in (errno.EPERM, errno.EACCES) and not exc.log:
            return f"{exc}: stunnerd needs CAP_BPF and CAP_NET_ADMIN", "capability"
        if exc.log:
            last = exc.log.strip().splitlines()[-3:]
            return (
                f"{exc}: the kernel's verifier refused the program: {' | '.join(last)}",
                "verifier",
            )
        if exc.errno == errno.EBUSY and hook == "XDP":
            return (
                f"{exc}: the interface holds another XDP program (one per interface: another "
                "stunnerd process's, a CNI's)",
                "busy",
            )
        if exc.errno == errno.EINVAL and "link" in str(exc):
            if hook == "TC":
                return f"{exc}: the kernel has no tcx (Linux 6.6 or later)", "kernel"
            return f"{exc}: the kernel has no XDP links (Linux 5.9 or later)", "kernel"
    if isinstance(exc, ValueError):
        return str(exc), "interface"
    return str(exc), "error"
