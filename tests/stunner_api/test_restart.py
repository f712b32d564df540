"""The restart rule stunnerd applies and `helm stunner diff` predicts with, one row per field."""

from __future__ import annotations

from typing import Any

import pytest

from stunner_api.dataplane import StunnerConfig, validate_config
from stunner_api.restart import ListenerChange, listener_changes

UDP = {"name": "ns/gw/udp", "protocol": "TURN-UDP", "port": 3478, "routes": ["ns/route"]}
TCP = {"name": "ns/gw/tcp", "protocol": "TURN-TCP", "port": 3478, "routes": ["ns/other"]}


def config(udp: dict[str, Any] | None = None, **changes: Any) -> StunnerConfig:
    data: dict[str, Any] = {
        "version": "v1",
        "admin": {"name": "ns/gw"},
        "auth": {"type": "static", "credentials": {"username": "u", "password": "p"}},
        "listeners": [UDP | (udp or {}), TCP],
        "clusters": [
            {"name": "ns/route", "endpoints": ["10.0.0.1"]},
            {"name": "ns/other", "endpoints": ["10.0.0.9"]},
        ],
    }
    for key, value in changes.items():
        data[key] = value
    return validate_config(data)


BASE = config()


@pytest.mark.parametrize(
    ("after", "udp", "tcp"),
    [
        (config(), "UNCHANGED", "UNCHANGED"),
        (config({"port": 3479}), "RESTARTED", "UNCHANGED"),
        (config({"protocol": "TURN-TCP", "port": 3480}), "RESTARTED", "UNCHANGED"),
        (config({"address": "10.1.1.1"}), "RESTARTED", "UNCHANGED"),
        (config({"public_address": "192.0.2.1"}), "IN_PLACE", "UNCHANGED"),
        (config({"routes": []}), "IN_PLACE", "UNCHANGED"),
        (
            config(
                clusters=[
                    {"name": "ns/route", "endpoints": ["10.0.0.2"]},
                    {"name": "ns/other", "endpoints": ["10.0.0.9"]},
                ]
            ),
            "IN_PLACE",
            "UNCHANGED",
        ),
        (
            config(auth={"type": "static", "credentials": {"username": "u", "password": "q"}}),
            "IN_PLACE",
            "IN_PLACE",
        ),
        (
            config(
                auth={
                    "type": "static",
                    "realm": "x.io",
                    "credentials": {"username": "u", "password": "p"},
                }
            ),
            "RESTARTED",
            "RESTARTED",
        ),
    ],
)
def test_listener_changes(after: StunnerConfig, udp: str, tcp: str) -> None:
    changes = listener_changes(BASE, after)
    assert changes == {"ns/gw/udp": ListenerChange[udp], "ns/gw/tcp": ListenerChange[tcp]}


def test_added_and_removed_listeners_and_configs() -> None:
    renamed = config({"name": "ns/gw/udp2"})
    assert listener_changes(BASE, renamed) == {
        "ns/gw/udp": ListenerChange.REMOVED,
        "ns/gw/udp2": ListenerChange.ADDED,
        "ns/gw/tcp": ListenerChange.UNCHANGED,
    }
    assert set(listener_changes(None, BASE).values()) == {ListenerChange.ADDED}
    assert set(listener_changes(BASE, None).values()) == {ListenerChange.REMOVED}
