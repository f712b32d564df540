"""The v1 dataplane config: parsing, defaults, aliases, env substitution, Go JSON, errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from stunner_api.dataplane import (
    SECRET,
    ZERO_CONFIG,
    ConfigError,
    ListenerConfig,
    StunnerConfig,
    dns_endpoint_error,
    is_zero_config,
    redacted,
    static_endpoint_error,
    validate_config,
    zero_config,
)
from stunner_api.dataplane_load import expand_env, load_config, load_config_checked

CREDENTIALS = {"username": "user-1", "password": "pass-1"}

MINIMAL_YAML = """
version: v1
auth:
  credentials: {username: user-1, password: pass-1}
"""
MINIMAL_JSON = (
    '{"version":"v1","admin":{"name":"default-stunnerd","loglevel":"all:INFO",'
    '"healthcheck_endpoint":"http://:8086","offload_engine":"None"},'
    '"auth":{"type":"static","realm":"stunner.l7mp.io",'
    '"credentials":{"password":"pass-1","username":"user-1"}}}'
)

FULL_YAML = """
version: v1
admin:
  name: ns/gw
  loglevel: all:DEBUG,turn:INFO
  metrics_endpoint: http://:8080/metrics
  healthcheck_endpoint: http://0.0.0.0:8086
  user_quota: 10
  offload_engine: xdp
  offload_interfaces: [eth1, eth0]
  license_config: {key: "turn-tcp:2030", hmac: license-hmac}
auth:
  type: longterm
  realm: example.com
  credentials: {secret: shared-secret}
listeners:
  - name: ns/gw/udp
    protocol: udp
    public_address: 1.2.3.4
    public_port: 30478
    address: 10.0.0.5
    port: 3478
    routes: [ns/media, ns/echo]
  - name: ns/gw/tls
    protocol: turn-tls
    port: 443
    cert: Y2VydA==
    key: a2V5
clusters:
  - name: ns/media
    type: strict_dns
    protocol: tcp
    endpoints: [media.ns.svc.cluster.local]
  - name: ns/echo
    endpoints: ["2001:db8::/32", "10.0.0.0/8:<10000-20000>", "192.168.1.1"]
"""
# json.Marshal of the validated Go struct: field order and omitempty from the json tags, map keys
# sorted, '<' and '>' escaped as \u003c and \u003e.
FULL_JSON = (
    '{"version":"v1",'
    '"admin":{"name":"ns/gw","loglevel":"all:DEBUG,turn:INFO",'
    '"metrics_endpoint":"http://:8080/metrics","healthcheck_endpoint":"http://0.0.0.0:8086",'
    '"user_quota":10,"offload_engine":"XDP","offload_interfaces":["eth0","eth1"],'
    '"license_config":{"key":"turn-tcp:2030","hmac":"license-hmac"}},'
    '"auth":{"type":"ephemeral","realm":"example.com","credentials":{"secret":"shared-secret"}},'
    '"listeners":['
    '{"name":"ns/gw/udp","protocol":"TURN-UDP","public_address":"1.2.3.4","public_port":30478,'
    '"address":"10.0.0.5","port":3478,"routes":["ns/echo","ns/media"]},'
    '{"name":"ns/gw/tls","protocol":"TURN-TLS","address":"0.0.0.0","port":443,'
    '"cert":"Y2VydA==","key":"a2V5"}],'
    '"clusters":['
    '{"name":"ns/media","type":"STRICT_DNS","protocol":"TCP",'
    '"endpoints":["media.ns.svc.cluster.local"]},'
    '{"name":"ns/echo","type":"STATIC","protocol":"UDP",'
    '"endpoints":["10.0.0.0/8:\\u003c10000-20000\\u003e","192.168.1.1","2001:db8::/32"]}]}'
)


def config_with(**sections: Any) -> dict[str, Any]:
    """A valid config dict (static auth) with some sections replaced."""
    return {"version": "v1", "auth": {"credentials": dict(CREDENTIALS)}} | sections


def load_dict(data: dict[str, Any], env: dict[str, str] | None = None) -> StunnerConfig:
    return load_config(json.dumps(data), env={} if env is None else env)


# --- parsing, defaults and Go JSON ---------------------------------------------------------


def test_minimal_config_gets_go_defaults() -> None:
    config = load_config(MINIMAL_YAML, env={})
    assert config.admin.name == "default-stunnerd"
    assert config.admin.loglevel == "all:INFO"
    assert config.admin.healthcheck_endpoint == "http://:8086"
    assert config.admin.metrics_endpoint == ""
    assert config.admin.offload_engine == "None"
    assert config.auth.type == "static"
    assert config.auth.realm == "stunner.l7mp.io"
    assert config.listeners == [] and config.clusters == []
    assert config.to_json() == MINIMAL_JSON


def test_full_config_to_json_is_what_go_emits() -> None:
    config = load_config(FULL_YAML, env={})
    assert config.to_json() == FULL_JSON
    assert config.to_dict() == json.loads(FULL_JSON)
    assert list(config.to_dict()) == ["version", "admin", "auth", "listeners", "clusters"]


def test_yaml_and_json_inputs_give_the_same_config() -> None:
    assert load_config(FULL_JSON, env={}) == load_config(FULL_YAML, env={})
    assert load_config(FULL_JSON.encode(), env={}) == load_config(FULL_YAML, env={})


CREDS = '"auth": {"credentials": {"username": "u", "password": "p"}}'


def test_json_objects_are_read_as_json_and_yaml_flow_style_still_loads() -> None:
    # What the config discovery service sends is a JSON object: read as JSON (Go's result for
    # JSON, and ~10x cheaper than PyYAML); a YAML flow mapping that is not JSON falls back.
    flow = "{version: v1, admin: {name: flow}, auth: {credentials: {username: u, password: p}}}"
    assert load_config(flow, env={}).admin.name == "flow"
    # YAML 1.1 would read the unquoted 1e3 as a string; JSON reads a number, as Go does.
    with pytest.raises(ConfigError):
        load_config('{"version": "v1", "admin": {"name": 1e3}, ' + CREDS + "}", env={})
    with pytest.raises(ConfigError, match="YAML parse error: line 1"):
        load_config('{"version": "v1", ', env={})


@pytest.mark.parametrize("text", [MINIMAL_YAML, FULL_YAML], ids=["minimal", "full"])
def test_round_trip_through_to_json(text: str) -> None:
    config = load_config(text, env={})
    again = load_config(config.to_json(), env={})
    assert again == config
    assert again.to_json() == config.to_json()


def test_listener_defaults() -> None:
    config = load_dict(config_with(listeners=[{"name": "l"}]))
    listener = config.listeners[0]
    assert (listener.protocol, listener.address, listener.port) == ("TURN-UDP", "0.0.0.0", 3478)
    assert (listener.public_address, listener.public_port, listener.routes) == ("", 0, [])
    assert listener.to_dict() == {
        "name": "l",
        "protocol": "TURN-UDP",
        "address": "0.0.0.0",
        "port": 3478,
    }


def test_cluster_defaults() -> None:
    cluster = load_dict(config_with(clusters=[{"name": "c"}])).clusters[0]
    assert (cluster.type, cluster.protocol, cluster.endpoints) == ("STATIC", "UDP", [])
    assert cluster.to_dict() == {"name": "c", "type": "STATIC", "protocol": "UDP"}


def test_zero_values_and_nulls_mean_defaults_so_equivalent_configs_compare_equal() -> None:
    terse = load_config(
        """
        version: v1
        auth: {credentials: {username: user-1, password: pass-1}}
        listeners: [{name: l, routes: [b, a]}]
        clusters: [{name: a, endpoints: [10.0.0.2, 10.0.0.1]}]
        """,
        env={},
    )
    verbose = load_dict(
        {
            "version": "v1",
            "admin": {
                "name": "",
                "loglevel": None,
                "healthcheck_endpoint": None,
                "user_quota": -5,
                "offload_engine": "NONE",
                "offload_interfaces": None,
            },
            "auth": {"type": "Plaintext", "realm": "", "credentials": dict(CREDENTIALS)},
            "listeners": [
                {"name": "l", "protocol": "udp", "address": "", "port": 0, "routes": ["a", "b"]}
            ],
            "clusters": [
                {
                    "name": "a",
                    "type": "static",
                    "protocol": "Udp",
                    "endpoints": ["10.0.0.1", "10.0.0.2"],
                }
            ],
        }
    )
    assert verbose == terse
    assert verbose.admin.user_quota == 0


def test_explicit_empty_healthcheck_endpoint_disables_and_is_emitted() -> None:
    config = load_dict(config_with(admin={"healthcheck_endpoint": ""}))
    assert config.admin.healthcheck_endpoint == ""
    assert '"healthcheck_endpoint":""' in config.to_json()


def test_localhost_address_becomes_loopback() -> None:
    config = load_dict(config_with(listeners=[{"name": "l", "address": "localhost"}]))
    assert config.listeners[0].address == "127.0.0.1"


@pytest.mark.parametrize(
    ("section", "field", "given", "normalized"),
    [
        ("listeners", "protocol", "udp", "TURN-UDP"),
        ("listeners", "protocol", "TCP", "TURN-TCP"),
        ("listeners", "protocol", "turn-tcp", "TURN-TCP"),
        ("listeners", "protocol", "Turn-Udp", "TURN-UDP"),
        ("clusters", "type", "strict_dns", "STRICT_DNS"),
        ("clusters", "type", "Static", "STATIC"),
        ("clusters", "protocol", "tcp", "TCP"),
        ("admin", "offload_engine", "auto", "Auto"),
        ("admin", "offload_engine", "tc", "TC"),
        ("auth", "type", "plaintext", "static"),
        ("auth", "type", "STATIC", "static"),
        ("auth", "type", "longterm", "ephemeral"),
        ("auth", "type", "timewindowed", "ephemeral"),
        ("auth", "type", "Ephemeral", "ephemeral"),
        ("auth", "type", "none", "none"),
    ],
)
def test_aliases_and_case_folding(section: str, field: str, given: str, normalized: str) -> None:
    credentials = {"username": "u", "password": "p", "secret": "s"}
    data = config_with(auth={"credentials": credentials})
    if section in ("listeners", "clusters"):
        data[section] = [{"name": "x", field: given}]
    elif section == "auth":
        data["auth"][field] = given
    else:
        data[section] = {field: given}
    config = load_dict(data)
    value = getattr(config, section)
    value = value[0] if isinstance(value, list) else value
    assert getattr(value, field) == normalized


def test_tls_listener_keeps_cert_and_key() -> None:
    listener = {"name": "l", "protocol": "DTLS", "cert": "Y2VydA==", "key": "a2V5"}
    config = load_dict(config_with(listeners=[listener]))
    assert (config.listeners[0].protocol, config.listeners[0].cert) == ("TURN-DTLS", "Y2VydA==")


def test_v1alpha1_is_converted_and_its_relay_port_range_dropped() -> None:
    listener = {"name": "l", "port": 3478, "min_relay_port": 10000, "max_relay_port": 20000}
    old = load_dict(config_with(version="v1alpha1", listeners=[listener]))
    new = load_dict(config_with(listeners=[{"name": "l", "port": 3478}]))
    assert old == new
    assert old.version == "v1"
    assert "relay" not in old.to_json()


def test_unknown_keys_are_ignored_as_go_json_unmarshal_does() -> None:
    data = config_with(
        unknown_section={"a": 1},
        listeners=[{"name": "l", "colour": "blue"}],
        clusters=[{"name": "c", "weight": 3}],
    )
    assert load_dict(data) == load_dict(
        config_with(listeners=[{"name": "l"}], clusters=[{"name": "c"}])
    )


def test_models_are_frozen() -> None:
    config = load_config(MINIMAL_YAML, env={})
    for model, field, value in ((config, "version", "v2"), (config.auth, "realm", "other")):
        with pytest.raises(ValidationError, match="frozen"):
            setattr(model, field, value)
    assert config.version == "v1" and config.auth.realm == "stunner.l7mp.io"


def test_lookup_by_name() -> None:
    config = load_config(FULL_YAML, env={})
    listener = config.listener("ns/gw/tls")
    cluster = config.cluster("ns/media")
    assert listener is not None and listener.port == 443
    assert cluster is not None and cluster.type == "STRICT_DNS"
    assert config.listener("nope") is None and config.cluster("nope") is None


# --- env substitution ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "env", "expanded"),
    [
        ("$A", {"A": "x"}, "x"),
        ("${A}b", {"A": "x"}, "xb"),
        ("$Ab", {"A": "x"}, ""),  # the name is "Ab", which is unset
        ("$A_1$B", {"A_1": "p", "B": "q"}, "pq"),
        ("pre-$UNSET-post", {}, "pre--post"),
        ("a$", {}, "a$"),  # a trailing dollar stays
        ("$ x", {}, "$ x"),  # no name after the dollar: it stays
        ("100$%", {}, "100$%"),
        ("$$", {}, ""),  # the special variable "$"
        ("$1x", {}, "x"),  # the special variable "1"
        ("${}", {}, ""),  # bad syntax is eaten
        ("${A", {"A": "x"}, "A"),  # an unclosed "${" is eaten
        ("${A B}", {"A B": "y"}, "y"),
        ("${*}", {"*": "star"}, "star"),
    ],
)
def test_expand_env_follows_go_os_expandenv(text: str, env: dict[str, str], expanded: str) -> None:
    assert expand_env(text, env) == expanded


@given(st.text().filter(lambda text: "$" not in text))
def test_expand_env_leaves_text_without_dollars_alone(text: str) -> None:
    assert expand_env(text, {"A": "x"}) == text


def test_env_substitution_everywhere_except_credentials() -> None:
    text = """
    version: v1
    admin: {name: "${STUNNER_NAMESPACE}/$STUNNER_NAME"}
    auth:
      realm: $REALM
      credentials: {username: "$USER_NAME", password: "pa$$word-${SECRET}-$HOME"}
    listeners:
      - {name: l, address: $STUNNER_ADDR, port: $STUNNER_PORT, public_address: $UNSET_VAR}
    """
    env = {
        "STUNNER_NAMESPACE": "ns",
        "STUNNER_NAME": "gw",
        "REALM": "example.org",
        "USER_NAME": "expanded-user",
        "SECRET": "expanded-secret",
        "HOME": "/root",
        "STUNNER_ADDR": "10.1.2.3",
    }
    config = load_config(text, env=env)
    assert config.admin.name == "ns/gw"
    assert config.auth.realm == "example.org"
    assert config.auth.credentials == {
        "username": "$USER_NAME",
        "password": "pa$$word-${SECRET}-$HOME",
    }
    listener = config.listeners[0]
    assert (listener.address, listener.port, listener.public_address) == ("10.1.2.3", 3478, "")


def test_dollar_in_json_password_survives() -> None:
    data = config_with(auth={"credentials": {"username": "u", "password": "$ecret$$"}})
    assert load_dict(data, env={"ecret": "leak"}).auth.credentials["password"] == "$ecret$$"


def test_unset_address_variable_falls_back_to_the_default_address() -> None:
    config = load_dict(config_with(listeners=[{"name": "l", "address": "$STUNNER_ADDR"}]))
    assert config.listeners[0].address == "0.0.0.0"


@pytest.mark.parametrize(
    ("env", "port"),
    [
        ({}, 3478),
        ({"STUNNER_PUBLIC_PORT": "30478"}, 30478),
        ({"STUNNER_PORT": "5000", "STUNNER_PUBLIC_PORT": "30478"}, 5000),
        ({"STUNNER_PORT": "", "STUNNER_PUBLIC_PORT": "30478"}, 30478),
        ({"STUNNER_PORT": "50x", "STUNNER_PUBLIC_PORT": "30478"}, 30478),
        ({"STUNNER_PORT": "50x", "STUNNER_PUBLIC_PORT": "nope"}, 3478),
    ],
)
def test_stunner_port_defaulting(env: dict[str, str], port: int) -> None:
    before = dict(env)
    text = MINIMAL_YAML + "listeners: [{name: l, port: $STUNNER_PORT}]\n"
    assert load_config(text, env=env).listeners[0].port == port
    assert env == before  # the caller's mapping is not changed


def test_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STUNNER_ADDR", "192.0.2.7")
    text = MINIMAL_YAML + "listeners: [{name: l, address: $STUNNER_ADDR}]\n"
    assert load_config(text).listeners[0].address == "192.0.2.7"


# --- validation errors name their field ------------------------------------------------------


def listener(**fields: Any) -> dict[str, Any]:
    return {"name": "l"} | fields


def cluster(**fields: Any) -> dict[str, Any]:
    return {"name": "c"} | fields


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (config_with(version="v2"), 'version: unsupported API version: "v2"'),
        ({"auth": {"credentials": CREDENTIALS}}, 'version: unsupported API version: ""'),
        (config_with(version=None), 'version: unsupported API version: ""'),
        ({"version": "v1"}, "auth.credentials: static: empty username or password"),
        (
            config_with(auth={"credentials": {"username": "u"}}),
            "auth.credentials: static: empty username or password",
        ),
        (
            config_with(auth={"type": "oauth", "credentials": CREDENTIALS}),
            'auth.type: unknown authentication type: "oauth" (valid: static, ephemeral, none)',
        ),
        (
            config_with(auth={"type": "ephemeral", "credentials": CREDENTIALS}),
            "auth.credentials: cannot handle auth config for type ephemeral: invalid secret",
        ),
        (
            config_with(auth={"credentials": {"username": "u", "password": 1234}}),
            "auth.credentials.password: Input should be a valid string",  # never the value
        ),
        (
            config_with(admin={"offload_engine": "dpdk"}),
            'admin.offload_engine: unknown offload mode: "dpdk" (valid: None, XDP, TC, Auto)',
        ),
        (
            config_with(admin={"metrics_endpoint": "http://[::1"}),
            "admin.metrics_endpoint: invalid metric server endpoint URL http://[::1: "
            "Invalid IPv6 URL",
        ),
        (
            config_with(admin={"healthcheck_endpoint": "http://:health"}),
            "admin.healthcheck_endpoint: invalid health-check server endpoint URL "
            "http://:health: Port could not be cast to integer value as 'health'",
        ),
        (
            config_with(listeners=[{"port": 3478}]),
            "listeners[0].name: missing name in listener configuration",
        ),
        (
            config_with(listeners=[listener(), listener(name="m", port=70000)]),
            "listeners[1].port: must be 1..65535, got 70000",
        ),
        (config_with(listeners=[listener(port=-1)]), "listeners[0].port: must be 1..65535, got -1"),
        (
            config_with(listeners=[listener(port="3478")]),
            "listeners[0].port: Input should be a valid integer, got '3478'",
        ),
        (
            config_with(listeners=[listener(public_port=65536)]),
            "listeners[0].public_port: must be 0..65535, got 65536",
        ),
        (
            config_with(listeners=[listener(protocol="SCTP")]),
            'listeners[0].protocol: unknown listener protocol: "SCTP" '
            "(valid: TURN-UDP, TURN-TCP, TURN-TLS, TURN-DTLS)",
        ),
        (
            config_with(listeners=[listener(protocol="TURN-TLS", key="a2V5")]),
            "listeners[0].cert: empty TLS cert for TURN-TLS listener",
        ),
        (
            config_with(listeners=[listener(protocol="dtls", cert="Y2VydA==")]),
            "listeners[0].key: empty TLS key for TURN-DTLS listener",
        ),
        (
            config_with(listeners=[listener(), listener(name="m"), listener()]),
            'listeners[2].name: duplicate listener name "l"',
        ),
        (config_with(listeners={"name": "l"}), "listeners: Input should be a valid list, got"),
        (config_with(clusters=[{}]), "clusters[0].name: missing name in cluster configuration"),
        (
            config_with(clusters=[cluster(type="EDS")]),
            'clusters[0].type: unknown cluster type: "EDS" (valid: STATIC, STRICT_DNS)',
        ),
        (
            config_with(clusters=[cluster(protocol="sctp")]),
            'clusters[0].protocol: unknown cluster protocol: "sctp" (valid: UDP, TCP)',
        ),
        (
            config_with(clusters=[cluster(endpoints=["10.0.0.1", "10.0.0.300"])]),
            'clusters[0].endpoints[1]: invalid endpoint "10.0.0.300": '
            "not an IP address or CIDR prefix",
        ),
        (
            config_with(clusters=[cluster(endpoints=["10.0.0.0/8:<20-10>"])]),
            'clusters[0].endpoints[0]: invalid endpoint "10.0.0.0/8:<20-10>": '
            "port range <20-10> must have 0 <= min <= max <= 65535",
        ),
        (
            config_with(clusters=[cluster(type="STRICT_DNS", endpoints=["bad name.svc"])]),
            'clusters[0].endpoints[0]: invalid endpoint "bad name.svc": not a DNS name',
        ),
        (
            config_with(clusters=[cluster(), cluster(name="d"), cluster(name="d")]),
            'clusters[2].name: duplicate cluster name "d"',
        ),
    ],
)
def test_validation_errors_name_the_field(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_dict(data)
    assert str(error.value).startswith(message)
    with pytest.raises(ConfigError) as direct:
        validate_config(data)
    assert str(direct.value) == str(error.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (config_with(auth=["s3cr3t-pw"]), "auth: Input should be a valid dictionary"),
        (config_with(listeners={"x": {"key": "s3cr3t-pw"}}), "listeners: Input should be"),
        (config_with(listeners=["s3cr3t-pw"]), "listeners[0]: Input should be"),
        (
            config_with(admin={"license_config": ["s3cr3t-pw"]}),
            "admin.license_config: Input should be",
        ),
    ],
)
def test_a_container_of_secrets_is_not_echoed(data: dict[str, Any], message: str) -> None:
    """A wrong-typed section that holds credentials or a TLS key is named by its type only."""
    with pytest.raises(ConfigError) as error:
        validate_config(data)
    assert str(error.value).startswith(message)
    assert "s3cr3t-pw" not in str(error.value)


def test_all_problems_are_reported_at_once() -> None:
    data = config_with(
        version="v3", listeners=[listener(port=0), listener(name="m", protocol="quic")]
    )
    with pytest.raises(ConfigError) as error:
        load_dict(data)
    assert str(error.value) == (
        'version: unsupported API version: "v3"; '
        'listeners[1].protocol: unknown listener protocol: "quic" '
        "(valid: TURN-UDP, TURN-TCP, TURN-TLS, TURN-DTLS)"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "could not parse config: YAML parse error: "),
        ("- a\n- b\n", "could not parse config: expected a mapping, got list"),
        ("just text", "could not parse config: expected a mapping, got str"),
        ("", 'version: unsupported API version: ""'),
    ],
)
def test_unparseable_text_raises_config_error(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(text, env={})
    assert str(error.value).startswith(message)


def test_non_utf8_bytes_raise_config_error() -> None:
    with pytest.raises(ConfigError, match="could not parse config: not UTF-8"):
        load_config(b"version: \xff", env={})


@pytest.mark.parametrize(
    "endpoint",
    [
        "10.0.0.1",
        "10.0.0.0/8",
        "1.2.3.4/16",  # host bits are allowed, as in Go's net.ParseCIDR
        "1.2.3.4/16:<1-2>",
        "0.0.0.0/0:<0-65535>",
        "::1",
        "2001:db8::/32:<1-2>",
        "10.0.0.1:<5-5>",
    ],
)
def test_valid_static_endpoints(endpoint: str) -> None:
    assert static_endpoint_error(endpoint) is None


@pytest.mark.parametrize(
    "endpoint",
    [
        "",
        "example.com",
        "10.0.0.0/33",
        "10.0.0.0/255.0.0.0",
        "10.0.0.1:<1-70000>",
        "10.0.0.1:<2-1>",
        "10.0.0.1:5000",
        "fe80::1%eth0",
        "[::1]",
    ],
)
def test_invalid_static_endpoints(endpoint: str) -> None:
    assert static_endpoint_error(endpoint) == (
        f"invalid endpoint {json.dumps(endpoint)}: "
        + (
            "port range <1-70000> must have 0 <= min <= max <= 65535"
            if endpoint.endswith("<1-70000>")
            else "port range <2-1> must have 0 <= min <= max <= 65535"
            if endpoint.endswith("<2-1>")
            else "not an IP address or CIDR prefix"
        )
    )


@pytest.mark.parametrize(
    ("endpoint", "valid"),
    [
        ("media.ns.svc.cluster.local", True),
        ("media.ns.svc.cluster.local.", True),
        ("_sip._udp.example.com", True),
        ("localhost", True),
        ("", False),
        ("a..b", False),
        ("-leading.example.com", False),
        ("under score.example.com", False),
        ("x" * 64 + ".example.com", False),
    ],
)
def test_dns_endpoints(endpoint: str, valid: bool) -> None:
    assert (dns_endpoint_error(endpoint) is None) == valid


# --- client URIs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "uri"),
    [
        ({"protocol": "TURN-UDP", "address": "10.0.0.1"}, "turn:10.0.0.1:3478?transport=udp"),
        ({"protocol": "TURN-TCP", "port": 3479}, "turn:0.0.0.0:3479?transport=tcp"),
        (
            {"protocol": "TURN-DTLS", "cert": "Y2VydA==", "key": "a2V5"},
            "turns:0.0.0.0:3478?transport=udp",
        ),
        (
            {"protocol": "TURN-TLS", "cert": "Y2VydA==", "key": "a2V5", "port": 443},
            "turns:0.0.0.0:443?transport=tcp",
        ),
        (
            {"address": "10.0.0.1", "port": 3478, "public_address": "1.2.3.4"},
            "turn:1.2.3.4:3478?transport=udp",
        ),
        (
            {"address": "10.0.0.1", "public_address": "1.2.3.4", "public_port": 30478},
            "turn:1.2.3.4:30478?transport=udp",
        ),
        ({"address": "10.0.0.1", "public_port": 30478}, "turn:10.0.0.1:30478?transport=udp"),
        ({"address": "2001:db8::1"}, "turn:[2001:db8::1]:3478?transport=udp"),  # RFC 7065; Go: bare
    ],
)
def test_listener_uri(fields: dict[str, Any], uri: str) -> None:
    config = load_dict(config_with(listeners=[listener(**fields)]))
    assert config.listeners[0].uri() == uri


def test_listener_uri_url_form() -> None:
    config = ListenerConfig(name="l", protocol="TURN-TCP", address="10.0.0.1")
    assert config.uri(rfc7065=False) == "turn://10.0.0.1:3478?transport=tcp"


# --- secrets ---------------------------------------------------------------------------------


SECRETS = ("pass-word-1", "user-name-1", "Q0VSVC1QRU0=", "S0VZLVBFTQ==", "license-hmac-1")
SECRET_YAML = """
version: v1
admin: {license_config: {key: k1, hmac: license-hmac-1}}
auth: {credentials: {username: user-name-1, password: pass-word-1}}
listeners:
  - {name: tls, protocol: TLS, cert: Q0VSVC1QRU0=, key: S0VZLVBFTQ==, routes: [c]}
  - {name: udp, protocol: UDP}
clusters: [{name: c, endpoints: [10.0.0.0/8]}]
"""


def test_redacted_hides_every_secret() -> None:
    config = load_config(SECRET_YAML, env={})
    hidden = redacted(config)
    for text in (hidden.to_json(), str(hidden), repr(hidden), json.dumps(hidden.to_dict())):
        for secret in SECRETS:
            assert secret not in text
    assert hidden.auth.credentials == {"username": SECRET, "password": SECRET}
    assert (hidden.listeners[0].cert, hidden.listeners[0].key) == (SECRET, SECRET)
    assert (hidden.listeners[1].cert, hidden.listeners[1].key) == ("", "")
    assert hidden.admin.license_config is not None
    assert hidden.admin.license_config.hmac == SECRET
    # everything else is unchanged, and so is the original
    assert hidden.listeners[0].routes == ["c"] and hidden.clusters == config.clusters
    assert config.auth.credentials["password"] == "pass-word-1"


def test_str_and_repr_never_show_secrets() -> None:
    config = load_config(SECRET_YAML, env={})
    for text in (str(config), repr(config)):
        for secret in SECRETS:
            assert secret not in text


def test_str_is_a_one_line_go_style_summary() -> None:
    config = load_config(
        MINIMAL_YAML
        + "listeners: [{name: l, address: 10.0.0.1, routes: [c]}]\n"
        + "clusters: [{name: c, endpoints: [10.0.0.0/8]}]\n",
        env={},
    )
    assert str(config) == (
        '{version="v1",admin:{name="default-stunnerd",logLevel="all:INFO",'
        'health-check="http://:8086",offload=None[all],license_info=<MISSING>},'
        'auth:{realm="stunner.l7mp.io",type="static",username="<SECRET>",password="<SECRET>"},'
        'listeners=["l":{turn://10.0.0.1:3478?transport=TURN-UDP,public=-:-,cert/key=-/-,'
        'routes=[c]}],clusters=["c":{type="STATIC",protocol="UDP",endpoints=[10.0.0.0/8]}]}'
    )


# --- zero config -------------------------------------------------------------------------


def test_zero_config_content() -> None:
    assert ZERO_CONFIG.to_json() == (
        '{"version":"v1","admin":{"name":"default-stunnerd","loglevel":"all:INFO",'
        '"healthcheck_endpoint":"http://:8086","offload_engine":"None"},'
        '"auth":{"type":"static","realm":"stunner.l7mp.io",'
        '"credentials":{"password":"dummy-password","username":"dummy-username"}}}'
    )
    assert is_zero_config(ZERO_CONFIG)


def test_zero_config_sent_by_the_cds_is_recognised_for_any_name() -> None:
    sent = zero_config("ns/gw").to_json()
    assert is_zero_config(load_config(sent, env={}))
    # Go emits the zero config unvalidated too: it must be recognised after loading
    unvalidated = (
        '{"version":"v1","admin":{"name":"ns/gw"},"auth":{"type":"static",'
        '"realm":"stunner.l7mp.io","credentials":{"password":"dummy-password",'
        '"username":"dummy-username"}}}'
    )
    assert is_zero_config(load_config(unvalidated, env={}))


@pytest.mark.parametrize(
    "change",
    [
        {"listeners": [{"name": "l"}]},
        {"clusters": [{"name": "c"}]},
        {"auth": {"credentials": {"username": "dummy-username", "password": "other"}}},
        {
            "auth": {
                "realm": "other",
                "credentials": {"username": "dummy-username", "password": "dummy-password"},
            }
        },
    ],
)
def test_real_configs_are_not_zero_configs(change: dict[str, Any]) -> None:
    data = json.loads(zero_config("ns/gw").to_json()) | change
    assert not is_zero_config(load_dict(data))


# --- property: any valid listener survives the JSON round trip -----------------------------


@given(
    protocol=st.sampled_from(["udp", "TCP", "turn-udp", "TURN-TCP"]),
    port=st.integers(min_value=0, max_value=65535),
    public_port=st.integers(min_value=0, max_value=65535),
    routes=st.lists(st.text(alphabet="abc/-", min_size=1, max_size=5), max_size=4),
)
def test_listener_round_trip(protocol: str, port: int, public_port: int, routes: list[str]) -> None:
    data = config_with(
        listeners=[listener(protocol=protocol, port=port, public_port=public_port, routes=routes)]
    )
    config = load_dict(data)
    assert load_config(config.to_json(), env={}) == config
    assert config.listeners[0].routes == sorted(routes)


def test_unknown_keys_and_missing_clusters_are_reported_with_the_closest_key() -> None:
    text = """
version: v1
admin: {loglevl: all:DEBUG}
auth: {type: static, credentials: {username: u, password: p, anything: goes}}
listener: []
listeners:
  - {name: l, protocol: udp, port: 3478, rout: [c]}
  - {name: m, protocol: udp, port: 3479, routes: [c, nowhere]}
clusters: [{name: c, endpoints: [10.0.0.0/8], endpoint: [1.2.3.4]}]
"""
    config, warnings = load_config_checked(text, env={})
    assert config.listeners[0].routes == []  # still accepted, as Go STUNner does
    assert warnings == [
        'listener: unknown key, ignored (did you mean "listeners"?)',
        'admin.loglevl: unknown key, ignored (did you mean "loglevel"?)',
        'listeners[0].rout: unknown key, ignored (did you mean "routes"?)',
        'clusters[0].endpoint: unknown key, ignored (did you mean "endpoints"?)',
        'listeners[1].routes: cluster "nowhere" is not defined (its peers are unreachable)',
    ]


def test_a_clean_config_has_no_warnings() -> None:
    text = json.dumps(config_with())
    assert load_config_checked(text, env={})[1] == []


def test_an_unrelated_unknown_key_gets_no_guess() -> None:
    _, warnings = load_config_checked(json.dumps({**config_with(), "zzz": 1}), env={})
    assert warnings == ["zzz: unknown key, ignored"]


def test_an_unset_stunner_addr_is_named() -> None:
    text = json.dumps(
        config_with(listeners=[{"name": "l", "address": "$STUNNER_ADDR", "routes": []}])
    )
    config, warnings = load_config_checked(text, env={})
    assert config.listeners[0].address == "0.0.0.0"
    assert warnings == ["listeners[0].address: $STUNNER_ADDR is not set, so the address is 0.0.0.0"]
    assert load_config_checked(text, env={"STUNNER_ADDR": "10.0.0.1"})[1] == []


def test_a_dollar_in_a_password_is_not_a_variable() -> None:
    auth = {"credentials": {"username": "u", "password": "pa$$word$SECRET"}}
    assert load_config_checked(json.dumps(config_with(auth=auth)), env={})[1] == []


def test_ice_uris_bracket_ipv6_for_turn_stun_and_per_node_addresses() -> None:
    """RFC 7065 (turn:) and RFC 7064 (stun:) take RFC 3986's host: an IPv6 literal in brackets,
    the only form a browser's RTCPeerConnection parses (Go writes it bare)."""
    from stunner_api.ice import IceQuery, listener_uris
    from stunner_api.vocabulary import NODE_ADDRESS_PLACEHOLDER

    named = {"name": "ns/gw/udp", "port": 3478}
    turn = load_dict(config_with(listeners=[listener(address="2001:db8::1", **named)]))
    assert listener_uris(turn, IceQuery()) == ["turn:[2001:db8::1]:3478?transport=udp"]
    assert listener_uris(turn, IceQuery(public_address="2001:db8::7")) == [
        "turn:[2001:db8::7]:3478?transport=udp"
    ]
    stun = load_dict(
        config_with(auth={"type": "none"}, listeners=[listener(address="2001:db8::1", **named)])
    )
    assert stun.auth.stun_only
    assert listener_uris(stun, IceQuery()) == ["stun:[2001:db8::1]:3478"]
    per_node = load_dict(
        config_with(listeners=[listener(address=NODE_ADDRESS_PLACEHOLDER, **named)])
    )
    assert listener_uris(per_node, IceQuery(), node_addresses=["2001:db8::a", "10.0.0.2"]) == [
        "turn:[2001:db8::a]:3478?transport=udp",
        "turn:10.0.0.2:3478?transport=udp",
    ]
    v4 = load_dict(config_with(listeners=[listener(address="10.0.0.1", **named)]))
    assert listener_uris(v4, IceQuery()) == ["turn:10.0.0.1:3478?transport=udp"]


def test_listener_status_string_brackets_ipv6_addresses() -> None:
    """The status line (stunnerd's /status, its logs) writes a URI: an IPv6 address in
    brackets (RFC 7065 / RFC 3986 §3.2.2), its public address likewise."""
    listener = ListenerConfig(
        name="v6", address="2001:db8::1", public_address="2001:db8::7", public_port=30478
    )
    text = str(listener)
    assert "turn://[2001:db8::1]:3478?transport=TURN-UDP" in text
    assert "public=[2001:db8::7]:30478" in text
    assert "public=-:-" in str(ListenerConfig(name="v4", address="10.0.0.1"))
