"""The listener-protocol table of the vocabulary and what is derived from it.

We test: the dataplane model's `ListenerProtocol` Literal and the vocabulary's enum name exactly
the table's protocols; each protocol and its alias load to the canonical name; a listener's
client URI carries the row's scheme and transport, and that URI read back as the shorthand
config gives the same protocol (TLS rows with a certificate, which they alone require).
"""

from __future__ import annotations

import json
from typing import get_args

import pytest

from stunner_api import dataplane
from stunner_api.dataplane_load import load_config
from stunner_api.turn_uri import config_from_uri
from stunner_api.vocabulary import LISTENER_PROTOCOL_TABLE, ListenerProtocol, ProtocolFacts

ROWS = list(LISTENER_PROTOCOL_TABLE.values())
IDS = [row.protocol.value for row in ROWS]
CERT, KEY = "Y2VydA==", "a2V5"  # the model checks presence; stunnerd decodes the PEM


def test_the_literal_and_the_enum_name_the_tables_protocols() -> None:
    assert list(get_args(dataplane.ListenerProtocol)) == list(LISTENER_PROTOCOL_TABLE)
    assert [p.value for p in ListenerProtocol] == list(LISTENER_PROTOCOL_TABLE)
    assert all(name == row.protocol for name, row in LISTENER_PROTOCOL_TABLE.items())


def listener_config(protocol: str, port: int = 3478) -> dataplane.StunnerConfig:
    listener = {"name": "l", "protocol": protocol, "address": "10.0.0.1", "port": port}
    listener |= {"cert": CERT, "key": KEY}
    text = {"version": "v1", "auth": {"credentials": {"username": "u", "password": "p"}}}
    return load_config(json.dumps(text | {"listeners": [listener]}))


@pytest.mark.parametrize("facts", ROWS, ids=IDS)
def test_name_and_alias_load_to_the_canonical_protocol(facts: ProtocolFacts) -> None:
    for spelling in (facts.protocol.value, facts.protocol.value.lower(), facts.alias):
        assert listener_config(spelling).listeners[0].protocol == facts.protocol.value


@pytest.mark.parametrize("facts", ROWS, ids=IDS)
def test_the_client_uri_round_trips_through_the_shorthand(facts: ProtocolFacts) -> None:
    listener = listener_config(facts.protocol.value, port=3479).listeners[0]
    uri = listener.uri(rfc7065=False)
    assert uri == f"{facts.scheme}://10.0.0.1:3479?transport={facts.uri_transport}"
    with_user = uri.replace("://", "://user:pass@")
    back = config_from_uri(with_user, certificate=(CERT, KEY)).listeners[0]
    assert (back.protocol, back.port, back.facts) == (facts.protocol.value, 3479, facts)
    if facts.tls:
        with pytest.raises(dataplane.ConfigError, match="needs a certificate"):
            config_from_uri(with_user)
    else:
        assert config_from_uri(with_user).listeners[0].cert == ""
