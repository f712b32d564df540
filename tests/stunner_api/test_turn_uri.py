"""The URI shorthand (`stunnerd turn://user:pass@host:port?transport=udp`): Go's default
config from a URI, its protocols and ports, errors that hide the password, TLS listeners and
their certificate."""

from __future__ import annotations

import base64

import pytest

from stunner_api.dataplane import ConfigError
from stunner_api.dataplane_load import load_config
from stunner_api.turn_uri import config_from_uri

URI_JSON = (
    '{"version":"v1","admin":{"name":"default-stunnerd","loglevel":"all:INFO",'
    '"healthcheck_endpoint":"http://:8086","offload_engine":"None"},'
    '"auth":{"type":"static","realm":"stunner.l7mp.io",'
    '"credentials":{"password":"pass","username":"user"}},'
    '"listeners":[{"name":"default-listener","protocol":"TURN-UDP","address":"127.0.0.1",'
    '"port":3478,"routes":["allow-any"]}],'
    '"clusters":[{"name":"allow-any","type":"STATIC","protocol":"UDP","endpoints":["0.0.0.0/0"]}]}'
)


def test_config_from_uri_builds_the_go_default_config() -> None:
    config = config_from_uri("turn://user:pass@127.0.0.1:3478?transport=udp")
    assert config.to_json() == URI_JSON
    assert load_config(config.to_json(), env={}) == config


@pytest.mark.parametrize(
    ("uri", "protocol", "address", "port", "username", "password"),
    [
        (
            "turn://user:pass@10.0.0.1:5000?transport=tcp",
            "TURN-TCP",
            "10.0.0.1",
            5000,
            "user",
            "pass",
        ),
        ("turn://user:pass@10.0.0.1", "TURN-UDP", "10.0.0.1", 3478, "user", "pass"),
        ("TURN://user:pass@10.0.0.1:1?transport=UDP", "TURN-UDP", "10.0.0.1", 1, "user", "pass"),
        ("turn://user:pass@localhost:3478", "TURN-UDP", "127.0.0.1", 3478, "user", "pass"),
        ("turn://user:pass@:3478", "TURN-UDP", "0.0.0.0", 3478, "user", "pass"),
        ("turn://user:pass@[::1]:3479", "TURN-UDP", "::1", 3479, "user", "pass"),
        ("turn://us%40er:p%3Ass$$@10.0.0.1", "TURN-UDP", "10.0.0.1", 3478, "us@er", "p:ss$$"),
    ],
)
def test_config_from_uri_cases(
    uri: str, protocol: str, address: str, port: int, username: str, password: str
) -> None:
    config = config_from_uri(uri)
    listener = config.listeners[0]
    assert (listener.protocol, listener.address, listener.port) == (protocol, address, port)
    assert config.auth.credentials == {"username": username, "password": password}


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("turn://127.0.0.1:3478", "username/password must be set: 'turn://127.0.0.1:3478'"),
        (
            "turn://user@127.0.0.1:3478",
            "username/password must be set: 'turn://user@127.0.0.1:3478'",
        ),
        (
            "turn://user:@127.0.0.1",
            "username/password must be set: 'turn://user:<SECRET>@127.0.0.1'",
        ),
        (
            "turns://user:secret-pw@1.2.3.4:443?transport=tcp",
            "TURN-TLS listener from URI 'turns://user:<SECRET>@1.2.3.4:443?transport=tcp': "
            "needs a certificate",
        ),
        (
            "turns://user:secret-pw@1.2.3.4",
            "TURN-DTLS listener from URI 'turns://user:<SECRET>@1.2.3.4': needs a certificate",
        ),
        (
            "turn://user:secret-pw@1.2.3.4?transport=tls",
            "TURN-TLS listener from URI 'turn://user:<SECRET>@1.2.3.4?transport=tls': "
            "needs a certificate",
        ),
        (
            "turn://user:secret-pw@1.2.3.4?transport=sctp",
            "invalid URI 'turn://user:<SECRET>@1.2.3.4?transport=sctp': invalid scheme/protocol",
        ),
        (
            "http://user:secret-pw@1.2.3.4",
            "invalid URI 'http://user:<SECRET>@1.2.3.4': invalid scheme/protocol",
        ),
        (
            "turn://user:secret-pw@1.2.3.4:port",
            "invalid URI 'turn://user:<SECRET>@1.2.3.4:port': "
            "Port could not be cast to integer value as 'port'",
        ),
        (
            "turn://user:secret-pw@1.2.3.4:70000",
            "invalid URI 'turn://user:<SECRET>@1.2.3.4:70000': Port out of range 0-65535",
        ),
    ],
)
def test_config_from_uri_errors_hide_the_password(uri: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        config_from_uri(uri)
    assert str(error.value) == message
    assert "secret-pw" not in str(error.value)


@pytest.mark.parametrize(
    ("uri", "protocol", "port"),
    [
        ("turns://user:pw@1.2.3.4?transport=tcp", "TURN-TLS", 443),
        ("turns://user:pw@1.2.3.4:5349", "TURN-DTLS", 5349),
        ("turn://user:pw@1.2.3.4?transport=tls", "TURN-TLS", 443),
    ],
)
def test_config_from_uri_tls_takes_the_certificate(uri: str, protocol: str, port: int) -> None:
    cert, key = base64.b64encode(b"cert-pem").decode(), base64.b64encode(b"key-pem").decode()
    listener = config_from_uri(uri, certificate=(cert, key)).listeners[0]
    assert (listener.protocol, listener.port, listener.cert, listener.key) == (
        protocol,
        port,
        cert,
        key,
    )
