"""A listener's relay addresses (pion/turn's RelayAddressGenerator): the families it relays in,
the address its clients are told in each, where the relay sockets bind, and the sockets.

Which families (issue 31):

RFC 8656 lets a client ask for its relay in either family (REQUESTED-ADDRESS-FAMILY) or in
both (ADDITIONAL-ADDRESS-FAMILY), whatever the family of its own connection. A listener's
`address` is its relay address in one family; `admin.relay_address_family` chooses the
families its allocations are made in:

- unset (""): the family of the listener's address only (before issue 31, the only choice);
- `IPv4` or `IPv6`: that family only, and an Allocate that names no family gets it;
- `DualStack`: both; an Allocate that names no family gets IPv4 (RFC 8656 §7.2).

The relay address in the other family than the listener's is this host's: the loopback of
that family for a loopback listener (127.0.0.1 and ::1), else the source address the kernel
picks towards that family's public Internet (a connected UDP socket, nothing is sent: a
dual-stack pod's other address). A host with no address of the family serves none: such an
Allocate gets 440, and a dual one its other family alone, with ADDRESS-ERROR-CODE 440.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping

from stunner_api.stun import FAMILY_IPV4, FAMILY_IPV6

from .allocation import address_family
from .sockets import bound_udp

EVEN_PORT_ATTEMPTS = 16  # binds tried for an even port (EVEN-PORT) before 508
RELAY_SOCKET_BUFFER = 1 << 20  # SO_RCVBUF and SO_SNDBUF of a relay socket, where allowed

# admin.relay_address_family -> the families it relays in (None: the listener address's).
FAMILIES: Mapping[str, tuple[int, ...] | None] = {
    "": None,
    "IPv4": (FAMILY_IPV4,),
    "IPv6": (FAMILY_IPV6,),
    "DualStack": (FAMILY_IPV4, FAMILY_IPV6),
}
_LOOPBACK = {FAMILY_IPV4: "127.0.0.1", FAMILY_IPV6: "::1"}
# Where a connected socket is aimed to learn the source address of a family (documentation
# addresses, RFC 5737 and RFC 3849: nothing is sent, a UDP connect only picks a route).
_PROBE = {FAMILY_IPV4: "192.0.2.1", FAMILY_IPV6: "2001:db8::1"}


def relayed_families(choice: str, listener_family: int) -> tuple[int, ...]:
    """The families a listener whose address is of `listener_family` relays in."""
    families = FAMILIES.get(choice)
    return (listener_family,) if families is None else families


def default_family(choice: str, offered: tuple[int, ...]) -> int:
    """The family of an Allocate that names none: IPv4 (RFC 8656 §7.2), or IPv6 where the
    admin chose IPv6 alone (an IPv6-only cluster's listeners)."""
    if choice == "IPv6" and FAMILY_IPV6 in offered:
        return FAMILY_IPV6
    return FAMILY_IPV4


def other_family_address(listener_ip: str, family: int) -> str | None:
    """This host's relay address in `family`, for a listener at `listener_ip` of the other
    family (the module's docstring says which); None when the host has none."""
    try:
        if ipaddress.ip_address(listener_ip).is_loopback:
            return _LOOPBACK[family]
    except ValueError:
        return None
    af = socket.AF_INET6 if family == FAMILY_IPV6 else socket.AF_INET
    try:
        with socket.socket(af, socket.SOCK_DGRAM) as probe:
            probe.connect((_PROBE[family], 9))
            source: str = probe.getsockname()[0]
    except OSError:
        return None  # no route in that family
    source_ip = ipaddress.ip_address(source.partition("%")[0])
    if source_ip.is_link_local or source_ip.is_unspecified:
        return None
    return str(source_ip)


class NoRelaySocket(Exception):
    """No relay socket could be had (the server answers 508 with this reason)."""


class RelayAddresses:
    """One listener's relay addresses: `relay_ip` is the address clients are told in its own
    family, `bind_ip` where its relay sockets bind (the same, but where the relay address is not
    one of this host's: a node's public address behind 1:1 NAT, `sockets.local_bind_address`)."""

    def __init__(self, relay_ip: str, bind_ip: str) -> None:
        self.relay_ip = relay_ip
        self.local_ip = bind_ip
        self.family = address_family(relay_ip)
        self._other: dict[int, str | None] = {}  # family -> this host's, once looked up

    def offered(self, choice: str) -> tuple[int, ...]:
        """The families relayed under admin.relay_address_family `choice` that this host has
        an address of."""
        return tuple(f for f in relayed_families(choice, self.family) if self.told(f) is not None)

    def told(self, family: int) -> str | None:
        """The relay address clients are told in `family`: the listener's, or this host's
        address of the other family (looked up once); None where the host has none."""
        if family == self.family:
            return self.relay_ip
        if family not in self._other:
            self._other[family] = other_family_address(self.relay_ip, family)
        return self._other[family]

    def bind_address(self, family: int) -> str:
        """Where a relay socket of `family` binds: the listener's local address (the wildcard
        only where that is one), or the other family's relay address (this host's own)."""
        return self.local_ip if family == self.family else self.told(family) or ""

    def udp_socket(
        self, family: int, even_port: bool | None
    ) -> tuple[socket.socket, socket.socket | None]:
        """A UDP relay socket of `family` on any port, or (EVEN-PORT, RFC 8656 §14.6) an even
        one, with the next port bound too when `even_port` (the R bit) asks to reserve it.
        Raises NoRelaySocket."""
        where = self.bind_address(family)
        af = socket.AF_INET6 if family == FAMILY_IPV6 else socket.AF_INET
        for _ in range(EVEN_PORT_ATTEMPTS if even_port is not None else 1):
            sock = socket.socket(af, socket.SOCK_DGRAM)
            try:
                sock.bind((where, 0))
            except OSError as exc:
                sock.close()
                raise NoRelaySocket(f"no relay socket: {exc}") from None
            port = sock.getsockname()[1]
            if even_port is None or (port % 2 == 0 and not even_port):
                return _relay_ready(sock), None
            if port % 2 == 0 and port < 65535:
                following = bound_udp(where, port + 1)
                if following is not None:
                    return _relay_ready(sock), following
            sock.close()
        raise NoRelaySocket("no even relay port free")


def _relay_ready(sock: socket.socket) -> socket.socket:
    """Non-blocking, with room for a burst (a larger buffer where the kernel allows it)."""
    sock.setblocking(False)
    for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, RELAY_SOCKET_BUFFER)
        except OSError:
            pass
    return sock
