"""STATIC cluster endpoints: one parser for the config validator and the peer router."""

from __future__ import annotations

import ipaddress

import pytest

from stunner_api.dataplane import static_endpoint_error
from stunner_api.endpoints import EndpointError, EndpointRange, parse_static_endpoint

# --- parse_static_endpoint ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "network", "port_min", "port_max"),
    [
        ("1.2.3.4/16:<1-2>", "1.2.0.0/16", 1, 2),  # host bits masked, as Go's net.ParseCIDR
        ("1.2.3.4/16", "1.2.0.0/16", 0, 65535),
        ("1.2.3.4:<1-2>", "1.2.3.4/32", 1, 2),
        ("1.2.3.4", "1.2.3.4/32", 0, 65535),
        ("10.0.0.0/8", "10.0.0.0/8", 0, 65535),
        ("0.0.0.0/0", "0.0.0.0/0", 0, 65535),
        ("10.0.0.1:<5000-5000>", "10.0.0.1/32", 5000, 5000),
        ("10.0.0.1:<0-65535>", "10.0.0.1/32", 0, 65535),
        ("2001:db8:3333:4444:5555:6666:7777:8888/32:<1-2>", "2001:db8::/32", 1, 2),
        ("2001:db8:3333:4444:5555:6666:7777:8888/32", "2001:db8::/32", 0, 65535),
        (
            "2001:db8:3333:4444:5555:6666:7777:8888:<1-2>",
            "2001:db8:3333:4444:5555:6666:7777:8888/128",
            1,
            2,
        ),
        ("2001:db8::/32:<1-2>", "2001:db8::/32", 1, 2),
        ("::1", "::1/128", 0, 65535),
        ("::/0", "::/0", 0, 65535),
        ("::ffff:10.0.0.1", "10.0.0.1/32", 0, 65535),  # IPv4-mapped: the IPv4 address
    ],
)
def test_parse(text: str, network: str, port_min: int, port_max: int) -> None:
    assert parse_static_endpoint(text) == EndpointRange(
        ipaddress.ip_network(network), port_min, port_max
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (":<1-65535>", "'' is not an IP address"),
        ("dummy", "'dummy' is not an IP address"),
        ("", "is not an IP address"),
        ("10.0.0.256", "is not an IP address"),
        ("010.0.0.1", "is not an IP address"),
        ("kubernetes.default.svc", "is not an IP address"),
        (" 10.0.0.1", "is not an IP address"),
        ("10.0.0.1/33", "prefix length 33 is out of range"),
        ("::1/129", "prefix length 129 is out of range"),
        ("10.0.0.0/255.0.0.0", "prefix length must be a number"),
        ("10.0.0.0/", "prefix length must be a number"),
        ("10.0.0.0/-1", "prefix length must be a number"),
        ("10.0.0.1:<2-1>", "port range <2-1> is empty"),
        ("10.0.0.1:<1-65536>", "end port 65536 is above 65535"),
        ("10.0.0.1:<99999999999999999999-1>", "port 99999999999999999999 is above 65535"),
        ("10.0.0.1:<1-2", "is not an IP address"),
        ("10.0.0.1:<a-b>", "is not an IP address"),
        ("10.0.0.1:1", "is not an IP address"),
        ("fe80::1%eth0", "scoped IPv6 addresses are not allowed"),
        ("10.0.0.1:<1-2>\n", "is not an IP address"),
    ],
)
def test_parse_rejects(text: str, message: str) -> None:
    with pytest.raises(EndpointError, match="invalid endpoint") as excinfo:
        parse_static_endpoint(text)
    assert message in str(excinfo.value)
    assert repr(text) in str(excinfo.value)


@pytest.mark.parametrize(
    "text",
    ["10.0.0.0/08", "10.0.0.0/0008", "::ffff:10.0.0.1/128", "10.0.0.1:<00-01>", "1.2.3.4/0"],
)
def test_validator_accepts_exactly_what_the_router_parses(text: str) -> None:
    # Edge cases where two separate parsers used to be able to disagree (prefix digits,
    # leading zeros, IPv4-mapped prefixes): admission must refuse nothing the router takes.
    parse_static_endpoint(text)
    assert static_endpoint_error(text) is None


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("10.0.0.1:<1-70000>", "port range <1-70000> must have 0 <= min <= max <= 65535"),
        ("10.0.0.1:<99999999999999999999-1>", "port range <99999999999999999999-1> must have"),
        ("10.0.0.1/33", "not an IP address or CIDR prefix"),
        ("fe80::1%eth0", "not an IP address or CIDR prefix"),
    ],
)
def test_validator_words_the_router_refusal(text: str, reason: str) -> None:
    with pytest.raises(EndpointError):
        parse_static_endpoint(text)
    error = static_endpoint_error(text)
    assert error is not None and reason in error
