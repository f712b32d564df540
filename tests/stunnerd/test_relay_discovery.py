"""Relay address discovery's STUN question (stunnerd/relay_discovery.py), with real parts.

End to end: a real CDS serves a relay-address-discovery config (the node placeholder) to a real
stunnerd process on a Node with no public address, so it gets `$STUNNER_ADDR` (127.0.0.2, the
"pod address"); its STUNNER_RELAY_STUN_SERVER names a STUN server on loopback that reports
203.0.113.7, as one outside would report a node behind a 1:1 NAT (a STUN server on loopback
can only see loopback addresses, which discovery refuses). An Allocate at the pod address then
gets 203.0.113.7 as its XOR-RELAYED-ADDRESS. The question itself is put to a real STUN server
(a second stunnerd) through a 1:1 NAT on loopback. And: a server that never answers gets a
bounded number of requests, the failure is logged once and the listeners keep serving at the
pod address; a changed address, twice answered, is adopted. What discovery refuses is in
test_relay_discovery_trust.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, cast

import pytest

from reconciler.cds.server import cds_app, serve
from reconciler.cds.store import ConfigStore
from stunner_api.dataplane import StunnerConfig, validate_config
from stunner_api.stun import Class
from stunner_api.vocabulary import NODE_ADDRESS_PLACEHOLDER, RELAY_STUN_SERVER_ENV
from stunnerd.process.daemon import Stunner
from stunnerd.process.relay_discovery import (
    DiscoveryError,
    RelayDiscovery,
    mapped_address,
    patch,
    relay_discovery_from_env,
)
from tests.stunnerd.conftest import StartStunnerd
from tests.support.ports import free_port
from tests.support.stunserver import FakeStunServer
from tests.support.turnclient import HOST, PASSWORD, USERNAME, RawClient, binding_answered

POD = "127.0.0.2"  # the "pod address": a second loopback address
PUBLIC = "203.0.113.7"  # what a STUN server outside reports: the node's NAT's public address
ID = "media/gw"
STEP = 20.0


def config(address: str, port: int) -> StunnerConfig:
    return validate_config(
        {
            "version": "v1",
            "admin": {"name": ID, "loglevel": "all:INFO", "healthcheck_endpoint": ""},
            "auth": {
                "type": "static",
                "credentials": {"username": USERNAME, "password": PASSWORD},
            },
            "listeners": [
                {"name": f"{ID}/udp", "protocol": "TURN-UDP", "address": address, "port": port}
            ],
        }
    )


class _Side(asyncio.DatagramProtocol):
    def __init__(self, received: Any) -> None:
        self.received = received
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.received(data, addr)


class Nat:
    """A 1:1 NAT on loopback: what a client sends to `front` leaves from the `outside` socket
    (127.0.0.1) to `server`; the answers go back to the client that sent last."""

    def __init__(self) -> None:
        self.clients: list[tuple[str, int]] = []
        self.front: _Side | None = None
        self.outside: _Side | None = None

    async def start(self, server: tuple[str, int]) -> None:
        loop = asyncio.get_running_loop()
        _, self.front = await loop.create_datagram_endpoint(
            lambda: _Side(self._from_client), local_addr=(HOST, 0)
        )
        _, self.outside = await loop.create_datagram_endpoint(
            lambda: _Side(self._from_server), local_addr=(HOST, 0), remote_addr=server
        )

    @property
    def address(self) -> tuple[str, int]:
        assert self.front is not None and self.front.transport is not None
        return cast(tuple[str, int], self.front.transport.get_extra_info("sockname"))

    def _from_client(self, data: bytes, addr: tuple[str, int]) -> None:
        self.clients.append(addr)
        assert self.outside is not None and self.outside.transport is not None
        self.outside.transport.sendto(data)

    def _from_server(self, data: bytes, addr: tuple[str, int]) -> None:
        assert self.front is not None and self.front.transport is not None
        self.front.transport.sendto(data, self.clients[-1])

    def close(self) -> None:
        for side in (self.front, self.outside):
            if side is not None and side.transport is not None:
                side.transport.close()


@contextlib.asynccontextmanager
async def cds(port: int) -> AsyncIterator[str]:
    store = ConfigStore()
    store.set_nodes({"node-a": "198.51.100.7"})  # another Node has one; node-c has none
    store.set(ID, config(NODE_ADDRESS_PLACEHOLDER, port))
    async with serve(cds_app(store)) as served:
        yield served.address


async def until_logged(process: Any, text: str) -> str:
    deadline = time.monotonic() + STEP
    while text not in process.stderr:
        assert process.running(), process.stderr
        assert time.monotonic() < deadline, f"never logged {text!r}:\n{process.stderr}"
        await asyncio.sleep(0.05)
    return str(process.stderr)


def test_the_question_is_answered_by_a_real_stun_server(stunnerd: StartStunnerd) -> None:
    """A Binding request from the pod address, through a 1:1 NAT on loopback, to a stunnerd:
    its answer is the NAT's outside address (unchecked here: a loopback one)."""
    stun_port = free_port()
    health = f"{HOST}:{free_port()}"  # not Go's 8086, which another stunnerd may hold
    server = stunnerd("--health-address", health, f"turn://u:p@{HOST}:{stun_port}?transport=udp")
    assert binding_answered(stun_port), server.stderr

    async def main() -> None:
        nat = Nat()
        await nat.start((HOST, stun_port))
        try:
            assert await mapped_address(nat.address, POD) == HOST
            assert {ip for ip, _ in nat.clients} == {POD}
        finally:
            nat.close()

    asyncio.run(main())


@pytest.mark.parametrize("processes", [1, 2])  # alone, and with a UDP worker process
def test_stunnerd_hands_out_what_the_stun_server_reports(
    stunnerd: StartStunnerd, processes: int
) -> None:
    turn_port = free_port()

    async def main() -> None:
        server = await FakeStunServer.start(HOST)
        server.say(PUBLIC)
        try:
            async with cds(turn_port) as address:
                node = stunnerd(
                    "-w",
                    "-c",
                    address,
                    f"--udp-thread-num={processes}",
                    env={
                        "STUNNER_NAMESPACE": "media",
                        "STUNNER_NAME": "gw",
                        "STUNNER_NODENAME": "node-c",
                        "STUNNER_ADDR": POD,
                        RELAY_STUN_SERVER_ENV: server.address,
                    },
                )
                log = await until_logged(node, f"sees {POD} as {PUBLIC}, twice")
                # It started at the pod address (the CDS's fallback), then asked from there.
                assert f"relay address {POD}" in log
                await until_logged(node, f"relay address {PUBLIC} (a STUN server's answer")
                client = await RawClient.connect((POD, turn_port))  # it still binds the pod's
                try:
                    response = await client.allocate()
                    assert response.message_class == Class.SUCCESS, node.stderr
                    assert response.attributes["XOR-RELAYED-ADDRESS"][0] == PUBLIC
                finally:
                    client.close()
                await asyncio.to_thread(node.stop, at_once=True)
        finally:
            server.close()

    asyncio.run(main())


def discovery_log(
    caplog: pytest.LogCaptureFixture, level: int, main: Callable[[], Coroutine[Any, Any, None]]
) -> list[str]:
    """Run `main`; what relay address discovery logged at `level` and above meanwhile."""
    with caplog.at_level(level, "stunner.relay-discovery"):
        asyncio.run(main())
    return [r.getMessage() for r in caplog.records if r.name == "stunner.relay-discovery"]


async def adopted(server: FakeStunServer, discovery: RelayDiscovery, address: str) -> None:
    """Wait until `discovery` has adopted `address` and the daemon applied it (the question
    after that is asked only then)."""
    while discovery.discovered != address:
        await server.requests_reach(server.requests + 1)
    await server.requests_reach(server.requests + 1)


async def relayed(pod: str, port: int) -> str:
    """The relay address an Allocate at (pod, port) gets."""
    client = await RawClient.connect((pod, port))
    try:
        family = {"REQUESTED-ADDRESS-FAMILY": 2} if ":" in pod else {}
        response = await client.allocate(**family)
        assert response.message_class == Class.SUCCESS, response
        return str(response.attributes["XOR-RELAYED-ADDRESS"][0])
    finally:
        client.close()


class Silent(asyncio.DatagramProtocol):
    """A STUN server that never answers: it counts the requests."""

    def __init__(self) -> None:
        self.requests = 0

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.requests += 1


def test_a_silent_server_gets_a_bounded_number_of_requests() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        transport, silent = await loop.create_datagram_endpoint(Silent, local_addr=(HOST, 0))
        try:
            port = transport.get_extra_info("sockname")[1]
            with pytest.raises(DiscoveryError, match="no answer to 3 Binding requests"):
                await mapped_address((HOST, port), POD, timeouts=(0.05, 0.05, 0.05))
            assert silent.requests == 3
        finally:
            transport.close()

    asyncio.run(main())


def test_a_failed_question_is_logged_once_and_the_listeners_keep_the_pod_address(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        transport, silent = await loop.create_datagram_endpoint(Silent, local_addr=(HOST, 0))
        port = transport.get_extra_info("sockname")[1]
        discovery = RelayDiscovery(f"{HOST}:{port}", POD, timeouts=(0.02, 0.02), retry_after=0.05)
        stunner = Stunner(relay_discovery=discovery)
        turn_port = free_port()
        try:
            await stunner.apply(config(POD, turn_port))
            while silent.requests < 6:  # three questions of two requests each
                await asyncio.sleep(0.02)
            assert stunner.config is not None
            assert [lc.address for lc in stunner.config.listeners] == [POD]
            assert discovery.discovered is None
            client = await RawClient.connect((POD, turn_port))
            try:
                response = await client.allocate()
                assert response.attributes["XOR-RELAYED-ADDRESS"][0] == POD
            finally:
                client.close()
        finally:
            await stunner.close()
            transport.close()

    warnings = discovery_log(caplog, logging.WARNING, main)
    assert len(warnings) == 1
    assert warnings[0].startswith(f"relay address discovery: STUN server {HOST}:")
    assert f"the relay address stays the pod's own, {POD} (likely private)" in warnings[0]


def test_a_changed_public_address_is_rediscovered_and_a_silent_recheck_keeps_the_last(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Once adopted, the address is asked again every recheck period: a new one, answered
    twice, restarts the listeners at the pod address with it (an Allocate then gets it); a
    server that stops answering leaves the last address in place."""

    async def main() -> None:
        server = await FakeStunServer.start(HOST)
        discovery = RelayDiscovery(
            server.address, POD, timeouts=(0.05,), retry_after=0.05, recheck_after=0.1
        )
        stunner = Stunner(relay_discovery=discovery)
        turn_port = free_port()
        try:
            await stunner.apply(config(POD, turn_port))
            for answer in ("203.0.113.7", "203.0.113.8"):
                server.say(answer)
                await adopted(server, discovery, answer)
                assert await relayed(POD, turn_port) == answer
            server.say(None)  # silent: the re-checks fail
            await server.requests_reach(server.requests + 3)
            assert discovery.discovered == "203.0.113.8"
            assert await relayed(POD, turn_port) == "203.0.113.8"
        finally:
            await stunner.close()
            server.close()

    logged = discovery_log(caplog, logging.INFO, main)
    assert any("now sees 127.0.0.2 as 203.0.113.8 (was 203.0.113.7), twice" in m for m in logged)
    assert not any("stays the pod's own" in m for m in logged)  # a failed re-check is no news


def test_only_listeners_at_the_pod_address_of_the_same_family_are_patched() -> None:
    base = config(POD, 3478)
    other = base.listeners[0].model_copy(update={"name": f"{ID}/v6", "address": "::1"})
    public = base.listeners[0].model_copy(update={"name": f"{ID}/pub", "address": "192.0.2.9"})
    both = base.model_copy(update={"listeners": [base.listeners[0], other, public]})
    patched = patch(both, POD, "203.0.113.7")
    assert [lc.address for lc in patched.listeners] == ["203.0.113.7", "::1", "192.0.2.9"]
    assert patch(both, POD, "2001:db8::7").listeners == both.listeners  # no IPv6 at POD


def test_the_environment_turns_it_on_and_a_bad_value_turns_it_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert relay_discovery_from_env({"STUNNER_ADDR": POD}) is None
    on = relay_discovery_from_env({"STUNNER_ADDR": POD, RELAY_STUN_SERVER_ENV: "stun.example:3478"})
    assert on is not None and on.server == ("stun.example", 3478)
    with caplog.at_level(logging.ERROR, "stunner.relay-discovery"):
        bad = {"STUNNER_ADDR": POD, RELAY_STUN_SERVER_ENV: "stun.example"}
        assert relay_discovery_from_env(bad) is None
        assert relay_discovery_from_env({RELAY_STUN_SERVER_ENV: "stun.example:3478"}) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"{RELAY_STUN_SERVER_ENV}='stun.example': no relay address discovery: STUN server: must "
        "be host:port ([IPv6]:port), like stun.example.org:3478, got 'stun.example'",
        f"{RELAY_STUN_SERVER_ENV}='stun.example:3478': no relay address discovery: the pod "
        "address '' is not an IP address",
    ]
