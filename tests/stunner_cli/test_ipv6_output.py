"""`stunner config` and `stunner status` write an IPv6 address with its port bracketed, as a
URI's authority (RFC 7065, RFC 3986 §3.2.2): `[2001:db8::1]:3478`, never `2001:db8::1:3478`."""

from __future__ import annotations

from stunner_api.dataplane import validate_config
from stunner_cli.output import public, summary


def test_summary_brackets_ipv6_relay_and_public_addresses() -> None:
    config = validate_config(
        {
            "version": "v1",
            "auth": {"credentials": {"username": "u", "password": "p"}},
            "listeners": [
                {
                    "name": "v6",
                    "address": "fd00::5",
                    "public_address": "2001:db8::7",
                    "public_port": 30478,
                }
            ],
        }
    )
    text = summary(config)
    assert "Relay address: [fd00::5]:3478" in text
    assert "Public address: [2001:db8::7]:30478" in text


def test_status_public_address_brackets_ipv6() -> None:
    assert public({"public_address": "2001:db8::7", "port": 3478}) == "[2001:db8::7]:3478"
    assert public({"public_address": "1.2.3.4", "public_port": 30478}) == "1.2.3.4:30478"
    assert public({"port": 3478}) == "pending"
