"""The transport registry against the vocabulary's listener-protocol table, with real sockets.

We test: every protocol of `LISTENER_PROTOCOL_TABLE` has a registry entry and no entry lacks a
row; a listener of each protocol, started by `Stunner.apply`, holds its port on the row's
transport (a socket of that kind cannot bind it); a port already held on the row's transport
refuses the config with "<TRANSPORT> port N is already in use".
"""

from __future__ import annotations

import asyncio
import errno
import socket

import pytest

from stunner_api.vocabulary import LISTENER_PROTOCOL_TABLE, ProtocolFacts
from stunnerd.process.daemon import ApplyError, Stunner
from stunnerd.transport.listener import TRANSPORTS
from tests.support.turnclient import HOST, free_port, running_stunner

from .test_tls_dtls import tls_config

ROWS = list(LISTENER_PROTOCOL_TABLE.values())


def socket_kind(facts: ProtocolFacts) -> int:
    return socket.SOCK_STREAM if facts.stream else socket.SOCK_DGRAM


def test_every_protocol_of_the_table_has_one_transport() -> None:
    assert set(TRANSPORTS) == set(LISTENER_PROTOCOL_TABLE)


@pytest.mark.parametrize("facts", ROWS, ids=[row.protocol.value for row in ROWS])
def test_a_listener_holds_its_port_on_its_protocols_transport(facts: ProtocolFacts) -> None:
    async def scenario() -> None:
        port = free_port()
        config = tls_config([(facts.protocol.value, port)], [f"{HOST}/32"])
        async with running_stunner(config):
            with socket.socket(socket.AF_INET, socket_kind(facts)) as squatter:
                with pytest.raises(OSError) as refused:
                    squatter.bind((HOST, port))
                assert refused.value.errno == errno.EADDRINUSE

    asyncio.run(scenario())


@pytest.mark.parametrize("facts", ROWS, ids=[row.protocol.value for row in ROWS])
def test_a_busy_port_is_named_with_its_protocols_transport(facts: ProtocolFacts) -> None:
    async def scenario() -> None:
        with socket.socket(socket.AF_INET, socket_kind(facts)) as squatter:
            squatter.bind((HOST, 0))
            if facts.stream:
                squatter.listen()
            port = squatter.getsockname()[1]
            config = tls_config([(facts.protocol.value, port)], [f"{HOST}/32"])
            stunner = Stunner()
            try:
                with pytest.raises(ApplyError) as refused:
                    await stunner.apply(config)
            finally:
                await stunner.close()
        assert f"{facts.transport} port {port} is already in use" in str(refused.value)

    asyncio.run(scenario())
