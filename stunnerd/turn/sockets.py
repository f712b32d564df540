"""Sockets bound where a listener or a relay says: a listener's socket (on its address, or
dual-stack on the wildcard), a TURN-UDP listener's SO_REUSEPORT group, and the address a
listener's relay sockets bind when the address its clients are told is not one of this host's.
Both Python transports, the native ones and the relay address discovery bind through here.
"""

from __future__ import annotations

import errno
import socket

from stunner_api.endpoints import is_ip

from .allocation import address_family

WILDCARDS = ("0.0.0.0", "::", "")


def bound_socket(
    kind: socket.SocketKind, host: str, port: int, reuse_port: bool = False
) -> socket.socket:
    """A socket on the listener's address `host` and `port`; for the wildcard address
    (0.0.0.0 or ::) a dual-stack one where the host has IPv6.

    Unlike Go STUNner, which binds the wildcard whatever the listener's `address` says, a
    listener on 127.0.0.1 is not reachable on other interfaces (issue 15; in a pod the address
    is the pod IP, so binding it costs nothing there).
    """
    if host not in WILDCARDS:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return _bind(socket.socket(family, kind), (host, port), kind, reuse_port)
    if socket.has_ipv6:
        try:
            sock = socket.socket(socket.AF_INET6, kind)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            return _bind(sock, ("::", port), kind, reuse_port)
        except OSError as exc:
            if exc.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                raise  # port in use, permission: the caller reports it
    return _bind(socket.socket(socket.AF_INET, kind), ("0.0.0.0", port), kind, reuse_port)


def _bind(
    sock: socket.socket, address: tuple[str, int], kind: socket.SocketKind, reuse_port: bool
) -> socket.socket:
    try:
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if kind == socket.SOCK_STREAM:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        else:
            for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                sock.setsockopt(socket.SOL_SOCKET, option, 4 << 20)
        sock.bind(address)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def bound_udp_group(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` UDP sockets on `port`, in one SO_REUSEPORT group when there are several: all
    bound before any is read, so the kernel's 5-tuple hash does not move as the group forms."""
    if port != 0:
        # A port already held by another SO_REUSEPORT group of this user would quietly be
        # shared with it: try a plain bind first, so "address in use" is reported as always.
        bound_socket(socket.SOCK_DGRAM, host, port).close()
    group = [bound_socket(socket.SOCK_DGRAM, host, port, reuse_port=True)]
    if count <= 1:
        return group  # SO_REUSEPORT all the same: ClientPins binds the port again
    try:
        port = group[0].getsockname()[1]  # port 0: the group shares the one the kernel chose
        for _ in range(count - 1):
            group.append(bound_socket(socket.SOCK_DGRAM, host, port, reuse_port=True))
    except OSError:
        for sock in group:
            sock.close()
        raise
    return group


def local_bind_address(relay_ip: str, pod_address: str | None) -> tuple[str, str]:
    """(address to bind, why) for a listener whose clients are told `relay_ip`: `relay_ip`
    itself when it is an address of this host; else (a node's public address behind 1:1 NAT,
    relay address discovery) the pod's own address `pod_address` ($STUNNER_ADDR) when it is one
    of this host's of the same family, else the family's wildcard. `why` is "" when `relay_ip`
    binds, else what a log line says about it."""
    if _bindable(relay_ip):
        return relay_ip, ""
    family = address_family(relay_ip)
    if pod_address and is_ip(pod_address) and address_family(pod_address) == family:
        if _bindable(pod_address):
            return pod_address, f"not an address of this host: sockets bind {pod_address} "
    wildcard = "::" if ":" in relay_ip else "0.0.0.0"
    return wildcard, f"not an address of this host: sockets bind {wildcard} "


def _bindable(ip: str) -> bool:
    """Whether a UDP socket binds (ip, any port) here: an address of this host."""
    sock = bound_udp(ip, 0)
    if sock is None:
        return False
    sock.close()
    return True


def bound_udp(host: str, port: int) -> socket.socket | None:
    """A UDP socket bound to (host, port), or None if the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        return None
    return sock
