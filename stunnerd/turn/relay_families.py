"""Which address families a listener relays in, and its relay address in each (issue 31).

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
