"""Relay address discovery through the CDS (issue 23): a config whose listener address is the
node placeholder is served to each stunnerd patched with its Node's public address, the Node
named by the `node` parameter stunnerd's own client sends (STUNNER_NODENAME).

We test, with the real CDS server on loopback and stunnerd's `CdsSource`: two node names get
two patched configs (an ExternalIP, and an ExternalDNS name resolved by the CDS: `localhost`);
a Node without a public address, or no node name, gets `$STUNNER_ADDR` (which stunnerd expands
to its pod's own address); a watcher gets its config again when its Node's address changes and
not when another Node's does; and the daemon fed that config hands clients the Node's public
address in XOR-RELAYED-ADDRESS while its sockets bind the pod's address (the public one is not
this host's, as behind a cloud's 1:1 NAT), and relays through them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import pytest

from reconciler.cds.server import cds_app, serve
from reconciler.cds.store import ConfigStore
from stunner_api.cds import config_path
from stunner_api.dataplane import StunnerConfig, validate_config
from stunner_api.vocabulary import NODE_ADDRESS_PLACEHOLDER
from stunner_client.cds import CdsClient
from stunnerd.process.sources import CdsSource
from tests.support.ports import free_port
from tests.support.turnclient import HOST, RawClient, running_stunner, start_peer

ID = "media/gw"
CONFIG_PATH_OF_ID = config_path(*ID.split("/"))
STEP = 5.0
# A public address (TEST-NET-2) that is no address of this host, as a Node's ExternalIP is not
# one of the node's own behind a cloud's 1:1 NAT.
PUBLIC = "198.51.100.7"
# node-b's ExternalDNS: `localhost` resolves from /etc/hosts (no test asks a DNS server).
NODES = {"node-a": PUBLIC, "node-b": "localhost"}


def placeholder_config(port: int) -> StunnerConfig:
    return validate_config(
        {
            "version": "v1",
            "admin": {"name": ID},
            "auth": {
                "type": "static",
                "realm": "stunner.l7mp.io",
                "credentials": {"username": "user-1", "password": "pass-1"},
            },
            "listeners": [
                {
                    "name": f"{ID}/udp",
                    "protocol": "TURN-UDP",
                    "address": NODE_ADDRESS_PLACEHOLDER,
                    "port": port,
                    "routes": ["media/peers"],
                }
            ],
            "clusters": [{"name": "media/peers", "endpoints": ["127.0.0.1"]}],
        }
    )


@contextlib.asynccontextmanager
async def cds_server() -> AsyncGenerator[tuple[ConfigStore, str], None]:
    store = ConfigStore()
    async with serve(cds_app(store)) as served:
        yield store, served.address


def source(address: str, node: str | None) -> CdsSource:
    return CdsSource(
        address,
        *ID.split("/"),
        node=node,
        env={"STUNNER_ADDR": "127.0.0.1"},  # the pod's own address
        retry_period=0.1,
        ping_period=0.5,
        pong_wait=1.0,
    )


async def resolved(store: ConfigStore, node: str) -> None:
    for _ in range(int(STEP / 0.02)):
        if store.node_address(node) != "$STUNNER_ADDR":
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"Node {node}'s ExternalDNS never resolved")


def addresses(config: StunnerConfig) -> list[str]:
    return [listener.address for listener in config.listeners]


def run(main: Any) -> None:
    asyncio.run(asyncio.wait_for(main(), 30))


def test_two_nodes_get_two_patched_configs_and_the_others_the_pod_address() -> None:
    async def main() -> None:
        async with cds_server() as (store, address):
            store.set_nodes(NODES)
            store.set(ID, placeholder_config(3478))
            await resolved(store, "node-b")
            assert addresses(await source(address, "node-a").load()) == [PUBLIC]
            assert addresses(await source(address, "node-b").load()) == ["127.0.0.1"]
            # No public address (a Node without one, no node name): the placeholder becomes
            # $STUNNER_ADDR, the pod's own address (the CDS's patch, or stunnerd's own).
            for node in ("node-z", None):
                assert addresses(await source(address, node).load()) == ["127.0.0.1"], node
            # A reader with no node (the auth service, the CLI) sees the placeholder, as Go's
            # CDS serves it: which listeners have a stunnerd per node.
            served = await asyncio.to_thread(CdsClient(address).get, CONFIG_PATH_OF_ID)
            assert NODE_ADDRESS_PLACEHOLDER in served.decode()
            # The config itself is stored once, unpatched.
            assert NODE_ADDRESS_PLACEHOLDER in (store.text(ID) or "")

    run(main)


def test_a_watcher_gets_its_config_again_when_its_nodes_address_changes() -> None:
    async def main() -> None:
        async with cds_server() as (store, address):
            store.set_nodes({"node-a": PUBLIC, "node-b": "203.0.113.9"})
            store.set(ID, placeholder_config(3478))
            watch_a, watch_b = source(address, "node-a").watch(), source(address, "node-b").watch()
            async with contextlib.aclosing(watch_a), contextlib.aclosing(watch_b):
                assert addresses(await asyncio.wait_for(anext(watch_a), STEP)) == [PUBLIC]
                assert addresses(await asyncio.wait_for(anext(watch_b), STEP)) == ["203.0.113.9"]
                pending_b = asyncio.ensure_future(anext(watch_b))
                store.set_nodes({"node-a": "198.51.100.8", "node-b": "203.0.113.9"})
                assert addresses(await asyncio.wait_for(anext(watch_a), STEP)) == ["198.51.100.8"]
                await asyncio.sleep(0.3)
                assert not pending_b.done()  # node-b's address did not change
                store.set_nodes({"node-a": "198.51.100.8"})  # node-b lost its address
                assert addresses(await asyncio.wait_for(pending_b, STEP)) == ["127.0.0.1"]

    run(main)


@pytest.fixture
def stunner_log_levels() -> Iterator[None]:
    """The `stunner` loggers' levels as they were: the daemon applies its config's log level
    spec (admin.loglevel) to its scopes' loggers, which would reach the tests after this one."""
    loggers = [logging.getLogger("stunner")] + [
        logger
        for name, logger in logging.Logger.manager.loggerDict.items()
        if name.startswith("stunner.") and isinstance(logger, logging.Logger)
    ]
    levels = [(logger, logger.level) for logger in loggers]
    yield
    for logger, level in levels:
        logger.setLevel(level)
    for name, logger in logging.Logger.manager.loggerDict.items():
        if name.startswith("stunner.") and isinstance(logger, logging.Logger):
            if all(logger is not known for known, _ in levels):
                logger.setLevel(logging.NOTSET)


@pytest.mark.usefixtures("stunner_log_levels")
def test_stunnerd_hands_out_the_nodes_public_address_and_relays_on_the_pods(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The config node-a's stunnerd gets (listener address 198.51.100.7, not this host's) with
    STUNNER_ADDR 127.0.0.1: the listener and relay sockets bind 127.0.0.1, the Allocate answer
    names 198.51.100.7 with the relay port, a peer's datagram to 127.0.0.1 at that port reaches
    the client, and 127.0.0.1 at the listener's port counts as stunnerd's own (never a peer)."""
    monkeypatch.setenv("STUNNER_ADDR", HOST)

    async def main() -> None:
        port = free_port()
        async with cds_server() as (store, address):
            store.set_nodes({"node-a": PUBLIC})
            store.set(ID, placeholder_config(port))
            config = await source(address, "node-a").load()
        assert addresses(config) == [PUBLIC]
        peer = await start_peer(echo=True)
        async with running_stunner(config) as stunner:
            # The pod's address is stunnerd's own too: never a peer at its listener's port.
            assert stunner.router.is_own_ip(HOST) and port in stunner.router.own_ports
            client = await RawClient.connect((HOST, port))
            try:
                response = await client.allocate()
                relay_ip, relay_port = response.attributes["XOR-RELAYED-ADDRESS"]
                assert relay_ip == PUBLIC
                assert (await client.create_permission((HOST, peer.port))).message_class.name == (
                    "SUCCESS"
                )
                client.send_indication((HOST, peer.port), b"to the peer")
                for _ in range(int(STEP / 0.02)):
                    if peer.received:
                        break
                    await asyncio.sleep(0.02)
                (data, source_address), *_ = peer.received
                assert data == b"to the peer"
                assert source_address == (HOST, relay_port)  # bound at the pod's address
                indication = await asyncio.wait_for(client.indications.get(), STEP)
                assert indication.attributes["DATA"] == b"to the peer"  # echoed back through
            finally:
                client.close()
                peer.close()

    run(main)
