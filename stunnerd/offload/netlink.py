"""The kernel's route to an address (RTM_GETROUTE over rtnetlink): local, or out of which
interface. The offload program redirects a datagram out of that interface (bpf_redirect_neigh
then does the route and neighbour lookup per packet) or, for a local destination, lets the
stack deliver it.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

NETLINK_ROUTE = 0
RTM_NEWROUTE = 24
RTM_GETROUTE = 26
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
RTA_DST = 1
RTA_OIF = 4
RTN_LOCAL = 2
RTN_UNICAST = 1
NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope,
# type, flags
RTATTR = struct.Struct("=HH")


@dataclass(frozen=True)
class RouteTo:
    """How the kernel reaches an address: `local` (one of this host's), else `ifindex`."""

    local: bool
    ifindex: int


def _align(n: int) -> int:
    return (n + 3) & ~3


def route_to(address: str) -> RouteTo | None:
    """The kernel's route to `address` now, or None when it has none (unreachable)."""
    ip = ipaddress.ip_address(address)
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    attribute = RTATTR.pack(RTATTR.size + len(ip.packed), RTA_DST) + ip.packed
    body = RTMSG.pack(family, ip.max_prefixlen, 0, 0, 0, 0, 0, 0, 0) + attribute
    request = NLMSG_HEADER.pack(NLMSG_HEADER.size + len(body), RTM_GETROUTE, NLM_F_REQUEST, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as sock:
        sock.settimeout(2.0)
        sock.sendto(request + body, (0, 0))
        answer = sock.recv(65536)
    length, kind, _, _, _ = NLMSG_HEADER.unpack_from(answer)
    if kind == NLMSG_ERROR:
        (code,) = struct.unpack_from("=i", answer, NLMSG_HEADER.size)
        if code in (-errno.ENETUNREACH, -errno.EHOSTUNREACH):
            return None
        raise OSError(-code, f"route to {address}: {os.strerror(-code)}")
    if kind != RTM_NEWROUTE:
        raise OSError(f"route to {address}: unexpected netlink message {kind}")
    offset = NLMSG_HEADER.size
    route_type = RTMSG.unpack_from(answer, offset)[7]
    offset += RTMSG.size
    ifindex = 0
    while offset + RTATTR.size <= length:
        size, attr = RTATTR.unpack_from(answer, offset)
        if size < RTATTR.size:
            break
        if attr == RTA_OIF:
            (ifindex,) = struct.unpack_from("=I", answer, offset + RTATTR.size)
        offset += _align(size)
    if route_type == RTN_LOCAL:
        return RouteTo(True, 0)
    if route_type != RTN_UNICAST or not ifindex:
        return None
    return RouteTo(False, ifindex)
