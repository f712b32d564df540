"""STATIC cluster endpoints, parsed once for both sides: the config validator (`dataplane`)
and the dataplane's peer router (`stunnerd.turn.router`).

An endpoint is an IP address or CIDR prefix with an optional inclusive peer-port range:
"10.0.0.1", "10.0.0.0/8", "1.2.3.4/16:<1-2>", "::1", "2001:db8::/32:<1-2>".
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_PORT_RANGE = re.compile(r"(.*):<([0-9]+)-([0-9]+)>")
_PREFIX_LENGTH = re.compile(r"[0-9]+")


@dataclass(frozen=True, slots=True)
class EndpointRange:
    """A STATIC cluster endpoint: an IP network and an inclusive peer port range."""

    network: IPNetwork
    port_min: int = 0
    port_max: int = 65535

    def contains(self, ip: IPAddress) -> bool:
        """Whether `ip` falls in the network (any port)."""
        return ip in self.network

    def admits(self, ip: IPAddress, port: int) -> bool:
        """Whether `ip` falls in the network and `port` in the range."""
        return ip in self.network and self.port_min <= port <= self.port_max


class EndpointError(ValueError):
    """Why a text is not a STATIC endpoint. `port_range` is the (min, max) written when the
    port range is what is wrong; None when the address part is."""

    def __init__(self, endpoint: str, reason: str, port_range: tuple[int, int] | None = None):
        super().__init__(f"invalid endpoint {endpoint!r}: {reason}")
        self.reason = reason
        self.port_range = port_range


# Memoised: render asks it of every endpoint address of every backend Service in each render,
# and the addresses repeat from one render to the next; bounded for pod churn.
@functools.lru_cache(maxsize=1 << 16)
def is_ip(text: str) -> bool:
    """Whether `text` is an IPv4 or IPv6 address (not a name, not a prefix)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def normalize_ip(address: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address as its IPv4 address, without any IPv6 scope id."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.scope_id is not None:
            return ipaddress.IPv6Address(address.packed)
    return address


def parse_static_endpoint(text: str) -> EndpointRange:
    """Parse a STATIC cluster endpoint; raise EndpointError on anything else.

    As Go (net.ParseCIDR) host bits are masked off: "1.2.3.4/16" is 1.2.0.0/16. A plain address
    is a /32 or /128 network; without a port range every port is admitted. Stricter than Go,
    which logs and skips a bad endpoint, and accepts ports above 65535 or min > max silently.
    """
    address, port_min, port_max = text, 0, 65535
    if match := _PORT_RANGE.fullmatch(text):
        address = match.group(1)
        port_min, port_max = int(match.group(2)), int(match.group(3))
        written = (port_min, port_max)
        if port_min > 65535:
            raise EndpointError(text, f"port {port_min} is above 65535", written)
        if port_max > 65535:
            raise EndpointError(text, f"end port {port_max} is above 65535", written)
        if port_min > port_max:
            raise EndpointError(text, f"port range <{port_min}-{port_max}> is empty", written)
    if "%" in address:
        raise EndpointError(text, "scoped IPv6 addresses are not allowed")
    host, slash, prefix = address.partition("/")
    if slash and not _PREFIX_LENGTH.fullmatch(prefix):
        raise EndpointError(text, "prefix length must be a number")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise EndpointError(text, f"{host!r} is not an IP address") from None
    if not slash:
        ip = normalize_ip(ip)
        prefix = str(ip.max_prefixlen)
    try:
        network = ipaddress.ip_network(f"{ip}/{prefix}", strict=False)
    except ValueError:
        raise EndpointError(text, f"prefix length {prefix} is out of range") from None
    return EndpointRange(network, port_min, port_max)
