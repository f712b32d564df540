"""The auth service's TURN REST endpoints (`GET /`, `GET /ice`) served by reconciler.auth.

We test the Go auth service's answers: static and ephemeral credentials (the ephemeral ones
checked with stunnerd's own verifier and minted for the requested TTL), one iceServer per
Gateway with the URIs of its matching listeners, the filters (namespace, gateway, listener), the
public address precedence, and the errors (400 for a bad parameter, 404 when nothing matches,
500 with no config at all); and that the secret is in no log line.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
import pytest

from reconciler.auth import auth_app
from reconciler.cds.server import serve
from reconciler.cds.store import ConfigStore
from stunner_api.dataplane import StunnerConfig, validate_config

NOW = 1_700_000_000
TLS_PAIR = {"cert": "Y2VydA==", "key": "a2V5"}  # base64 "cert", "key": never used
SECRET = "the-shared-secret"


def gateway(
    id: str, auth: Mapping[str, Any], listeners: dict[str, tuple[str, int]]
) -> StunnerConfig:
    return validate_config(
        {
            "version": "v1",
            "admin": {"name": id},
            "auth": auth,
            "listeners": [
                {
                    "name": f"{id}/{name}",
                    "protocol": protocol,
                    "address": "$STUNNER_ADDR",
                    "port": port,
                    **(TLS_PAIR if protocol in ("TURN-TLS", "TURN-DTLS") else {}),
                }
                for name, (protocol, port) in listeners.items()
            ],
        }
    )


STATIC = {"type": "static", "credentials": {"username": "user-1", "password": "pass-1"}}
EPHEMERAL = {"type": "ephemeral", "credentials": {"secret": SECRET}}
CONFIGS = {
    "ns1/gw-a": gateway("ns1/gw-a", STATIC, {"udp": ("TURN-UDP", 3478), "tcp": ("TURN-TCP", 3479)}),
    "ns2/gw-b": gateway("ns2/gw-b", EPHEMERAL, {"udp": ("TURN-UDP", 3480)}),
}


def ask(
    path: str,
    configs: Mapping[str, StunnerConfig] = CONFIGS,
    public_address: str = "",
    **params: str,
) -> tuple[int, Any]:
    async def main() -> tuple[int, Any]:
        store = ConfigStore()
        store.publish(configs)
        app = auth_app(store, public_address=public_address, clock=lambda: NOW + 0.7)
        async with (
            serve(app) as served,
            aiohttp.ClientSession() as session,
            session.get(served.address + path, params=params) as response,
        ):
            return response.status, await response.json()

    return asyncio.run(asyncio.wait_for(main(), 10))


def test_ice_has_one_server_per_gateway_with_its_listeners() -> None:
    status, body = ask(
        "/ice", service="turn", username="alice", ttl="3600", iceTransportPolicy="relay"
    )
    assert status == 200
    expiry_user = f"{NOW + 3600}:alice"
    password = base64.b64encode(
        hmac.new(SECRET.encode(), expiry_user.encode(), hashlib.sha1).digest()
    ).decode()
    assert body == {
        "iceServers": [
            {
                "username": "user-1",
                "credential": "pass-1",
                "urls": [
                    "turn:0.0.0.0:3478?transport=udp",
                    "turn:0.0.0.0:3479?transport=tcp",
                ],
            },
            {
                "username": expiry_user,
                "credential": password,
                "urls": ["turn:0.0.0.0:3480?transport=udp"],
            },
        ],
        "iceTransportPolicy": "relay",
    }


def test_ephemeral_credentials_pass_stunnerds_check() -> None:
    from stunner_api.ice import ephemeral_password

    _, body = ask("/", service="turn", username="bob", namespace="ns2")
    assert body["ttl"] == 86400 and body["uris"] == ["turn:0.0.0.0:3480?transport=udp"]
    expiry, _, user = body["username"].partition(":")
    assert (int(expiry), user) == (NOW + 86400, "bob")
    assert body["password"] == ephemeral_password(SECRET, body["username"])


def test_turn_auth_takes_the_first_matching_gateway() -> None:
    status, body = ask("/", service="turn")
    assert status == 200
    assert body == {
        "username": "user-1",
        "password": "pass-1",
        "ttl": 86400,
        "uris": ["turn:0.0.0.0:3478?transport=udp", "turn:0.0.0.0:3479?transport=tcp"],
    }


@pytest.mark.parametrize(
    ("params", "urls"),
    [
        (
            {"namespace": "ns1"},
            [["turn:0.0.0.0:3478?transport=udp", "turn:0.0.0.0:3479?transport=tcp"]],
        ),
        (
            {"namespace": "ns1", "gateway": "gw-a", "listener": "tcp"},
            [["turn:0.0.0.0:3479?transport=tcp"]],
        ),
        ({"namespace": "ns2", "gateway": "gw-b"}, [["turn:0.0.0.0:3480?transport=udp"]]),
    ],
)
def test_filters(params: dict[str, str], urls: list[list[str]]) -> None:
    status, body = ask("/ice", service="turn", **params)
    assert status == 200
    assert [server["urls"] for server in body["iceServers"]] == urls
    assert body["iceTransportPolicy"] == "all"


def test_public_address_precedence() -> None:
    with_public = {
        "ns/gw": gateway("ns/gw", STATIC, {"udp": ("TURN-UDP", 3478)}).model_copy(
            update={
                "listeners": [
                    gateway("ns/gw", STATIC, {"udp": ("TURN-UDP", 3478)})
                    .listeners[0]
                    .model_copy(update={"public_address": "203.0.113.7", "public_port": 30478})
                ]
            }
        )
    }
    _, body = ask("/ice", with_public, service="turn")
    assert body["iceServers"][0]["urls"] == ["turn:203.0.113.7:30478?transport=udp"]
    _, body = ask("/ice", with_public, public_address="198.51.100.1", service="turn")
    assert body["iceServers"][0]["urls"] == ["turn:198.51.100.1:30478?transport=udp"]
    _, body = ask(
        "/ice",
        with_public,
        public_address="198.51.100.1",
        service="turn",
        **{"public-addr": "192.0.2.9"},
    )
    assert body["iceServers"][0]["urls"] == ["turn:192.0.2.9:30478?transport=udp"]


STUN_ONLY = {"type": "none", "credentials": {}}
WITH_STUN_ONLY = {
    **CONFIGS,
    "ns3/stun": gateway(
        "ns3/stun",
        STUN_ONLY,
        {
            "udp": ("TURN-UDP", 3478),
            "tcp": ("TURN-TCP", 3478),
            "tls": ("TURN-TLS", 443),
            "dtls": ("TURN-DTLS", 443),
        },
    ),
}


def test_a_stun_only_gateway_gets_stun_uris_of_its_udp_listeners_and_no_credentials() -> None:
    status, body = ask("/ice", WITH_STUN_ONLY, service="turn", **{"public-addr": "192.0.2.9"})
    assert status == 200
    assert body["iceServers"][2] == {"urls": ["stun:192.0.2.9:3478"]}
    assert [server["urls"][0].partition(":")[0] for server in body["iceServers"]] == [
        "turn",
        "turn",
        "stun",
    ]
    status, body = ask("/", WITH_STUN_ONLY, service="turn", namespace="ns3")
    assert status == 200
    assert body == {"username": "", "password": "", "ttl": 86400, "uris": ["stun:0.0.0.0:3478"]}


def test_the_unaddressed_listeners_of_a_stun_only_gateway_are_its_udp_ones() -> None:
    """`stunner ice` refuses to print URIs without an address: a STUN-only Gateway's TCP, TLS
    and DTLS listeners have no URI, so an address they lack does not matter."""
    from stunner_api.ice import IceQuery, unaddressed

    missing = unaddressed(WITH_STUN_ONLY, IceQuery(namespace="ns3"))
    assert [(id, listener.name) for id, listener in missing] == [("ns3/stun", "ns3/stun/udp")]


@pytest.mark.parametrize(
    ("path", "configs", "params", "status", "message"),
    [
        ("/ice", CONFIGS, {}, 400, '"service" must be "turn"'),
        ("/", CONFIGS, {"service": "stun"}, 400, '"service" must be "turn"'),
        ("/ice", CONFIGS, {"service": "turn", "ttl": "soon"}, 400, '"ttl" must be a number'),
        ("/ice", CONFIGS, {"service": "turn", "gateway": "gw-a"}, 400, '"gateway" needs'),
        ("/ice", CONFIGS, {"service": "turn", "iceTransportPolicy": "x"}, 400, "must be one of"),
        ("/ice", {}, {"service": "turn"}, 500, "no STUNner configuration available"),
        (
            "/ice",
            CONFIGS,
            {"service": "turn", "namespace": "ns3"},
            404,
            "could not generate ICE config: no valid listener found",
        ),
        (
            "/",
            CONFIGS,
            {"service": "turn", "namespace": "ns3"},
            404,
            "could not generate TURN auth token: no valid listener found",
        ),
    ],
)
def test_errors(
    path: str,
    configs: Mapping[str, StunnerConfig],
    params: dict[str, str],
    status: int,
    message: str,
) -> None:
    got_status, body = ask(path, configs, **params)
    assert got_status == status and body["code"] == status
    assert message in body["message"]


def test_secrets_are_in_no_log_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    ask("/ice", service="turn", username="alice")
    ask("/ice", service="nope")
    assert caplog.records
    assert SECRET not in caplog.text and "pass-1" not in caplog.text


@pytest.mark.parametrize(
    "ttl",
    [
        " 60",  # int() strips spaces
        "60 ",
        "+60",
        "1_000",  # int() takes underscores
        "\u0666\u0660",  # Arabic-Indic 60: int() takes any script's digits
        "0",
        "-5",
        "604801",  # a week and a second
        "10" + "0" * 11,  # 10^12: 31,000 years
        "9223372036854775807",  # int64's largest: Go's overflow
        "9" * 4000,
        "6e1",
    ],
)
def test_a_bad_ttl_is_400_and_not_echoed(ttl: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for path in ("/", "/ice"):
        status, body = ask(path, service="turn", username="alice", ttl=ttl)
        assert status == 400 and body["code"] == 400
        assert body["message"] == '"ttl" must be a number of seconds from 1 to 604800'
    # Nor logged: the log line says what is wrong, not what was sent.
    assert all(len(r.getMessage()) < 200 for r in caplog.records)
    assert "9" * 20 not in caplog.text


@pytest.mark.parametrize(("ttl", "expected"), [("1", 1), ("0060", 60), ("604800", 604800)])
def test_a_good_ttl_is_taken(ttl: str, expected: int) -> None:
    status, body = ask("/", service="turn", username="alice", namespace="ns2", ttl=ttl)
    assert status == 200 and body["ttl"] == expected
    assert body["username"] == f"{NOW + expected}:alice"
