"""The CDS server (reconciler.cds.server), spoken to by stunnerd's own client and by raw clients.

We test: GET of one config, a namespace and all configs; 404 with `{code, message}` for an
unknown id; a watch gets the current config and every change, over stunnerd's `CdsSource`; a
deleted Gateway's watchers get the zero config (and stunnerd's client keeps its config); list and
namespace watches; a watch without a WebSocket upgrade is refused; a watcher that stops reading
is dropped while another watcher keeps getting every update; a publish is level-based.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import time
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any

import aiohttp
import pytest
from websockets.asyncio.client import connect

from reconciler.cds.server import cds_app, serve
from reconciler.cds.store import ConfigStore
from stunner_api.dataplane import StunnerConfig, validate_config, zero_config
from stunnerd.process.sources import CdsSource, SourceError

STEP = 5.0


def make_config(id: str, realm: str = "stunner.l7mp.io", endpoints: int = 1) -> StunnerConfig:
    namespace, name = id.split("/")
    rng = random.Random(f"{id}/{realm}/{endpoints}")
    return validate_config(
        {
            "version": "v1",
            "admin": {"name": id},
            "auth": {
                "type": "static",
                "realm": realm,
                "credentials": {"username": "user-1", "password": "pass-1"},
            },
            "listeners": [
                {
                    "name": f"{id}/udp",
                    "protocol": "TURN-UDP",
                    "address": "127.0.0.1",
                    "port": 3478,
                    "routes": [f"{namespace}/route"],
                }
            ],
            "clusters": [
                {
                    "name": f"{namespace}/route",
                    "endpoints": [
                        f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(256)}"
                        for _ in range(endpoints)
                    ],
                }
            ],
        }
    )


def run(coro: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(coro(), 20))


async def eventually(predicate: Callable[[], bool], what: str) -> None:
    for _ in range(int(STEP / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.asynccontextmanager
async def cds_server(**kwargs: Any) -> AsyncGenerator[tuple[ConfigStore, str], None]:
    store = ConfigStore()
    async with serve(cds_app(store, **kwargs)) as served:
        yield store, served.address


async def http_get(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.json(content_type=None)


def client(address: str, id: str) -> CdsSource:
    namespace, name = id.split("/")
    return CdsSource(address, namespace, name, retry_period=0.1, ping_period=0.5, pong_wait=1.0)


def test_get_one_a_namespace_and_all() -> None:
    async def main() -> None:
        async with cds_server() as (store, address):
            for id in ("ns1/gw-a", "ns1/gw-b", "ns2/gw-a"):
                store.set(id, make_config(id))
            config = await client(address, "ns1/gw-b").load()
            assert config == make_config("ns1/gw-b")
            status, body = await http_get(f"{address}/api/v1/configs/ns1")
            assert status == 200 and body["version"] == "v1"
            assert [item["admin"]["name"] for item in body["items"]] == ["ns1/gw-a", "ns1/gw-b"]
            status, body = await http_get(f"{address}/api/v1/configs")
            assert [item["admin"]["name"] for item in body["items"]] == [
                "ns1/gw-a",
                "ns1/gw-b",
                "ns2/gw-a",
            ]
            assert validate_config(body["items"][2]) == make_config("ns2/gw-a")
            status, body = await http_get(f"{address}/api/v1/configs/nowhere")
            assert (status, body) == (200, {"version": "v1", "items": []})

    run(main)


def test_unknown_id_is_404_with_code_and_message() -> None:
    async def main() -> None:
        async with cds_server() as (store, address):
            store.set("ns1/gw-a", make_config("ns1/gw-a"))
            status, body = await http_get(f"{address}/api/v1/configs/ns1/gw-x")
            assert (status, body) == (404, {"code": 404, "message": "config ns1/gw-x not found"})
            with pytest.raises(SourceError, match="HTTP 404: config ns1/gw-x not found"):
                await client(address, "ns1/gw-x").load()
            status, _ = await http_get(f"{address}/api/v1/configs/ns1/gw-a/extra")
            assert status == 404

    run(main)


def test_watch_without_websocket_is_refused() -> None:
    async def main() -> None:
        async with cds_server() as (store, address):
            store.set("ns1/gw-a", make_config("ns1/gw-a"))
            status, body = await http_get(f"{address}/api/v1/configs/ns1/gw-a?watch=true")
            assert status == 400 and "WebSocket" in body["message"]

    run(main)


def test_watch_with_stunnerds_client_sees_every_change_and_survives_delete() -> None:
    async def main() -> None:
        async with cds_server() as (store, address):
            watch = client(address, "ns1/gw-a").watch()
            async with contextlib.aclosing(watch):
                pending = asyncio.ensure_future(anext(watch))
                await eventually(lambda: len(store.watchers) == 1, "the watcher")
                assert not pending.done()  # an unknown id: the watch waits for it
                store.set("ns1/gw-a", make_config("ns1/gw-a", realm="r1"))
                assert (await asyncio.wait_for(pending, STEP)).auth.realm == "r1"
                store.set("ns1/gw-b", make_config("ns1/gw-b", realm="other"))  # not watched
                store.set("ns1/gw-a", make_config("ns1/gw-a", realm="r2"))
                config = await asyncio.wait_for(anext(watch), STEP)
                assert config.auth.realm == "r2"
                # Deleted: the client gets the zero config, ignores it and keeps serving r2.
                pending = asyncio.ensure_future(anext(watch))
                other = make_config("ns1/gw-b", realm="other")
                assert store.publish({"ns1/gw-b": other}) == ["ns1/gw-a"]
                await asyncio.sleep(0.3)
                assert not pending.done()
                store.set("ns1/gw-a", make_config("ns1/gw-a", realm="r3"))  # recreated
                assert (await asyncio.wait_for(pending, STEP)).auth.realm == "r3"

    run(main)


def test_deleted_gateways_watchers_get_the_zero_config() -> None:
    async def main() -> None:
        async with cds_server() as (store, address):
            store.set("ns1/gw-a", make_config("ns1/gw-a"))
            ws_address = address.replace("http://", "ws://")
            async with connect(f"{ws_address}/api/v1/configs/ns1/gw-a?watch=true") as ws:
                first = json.loads(await asyncio.wait_for(ws.recv(), STEP))
                assert validate_config(first) == make_config("ns1/gw-a")
                store.publish({})
                deleted = await asyncio.wait_for(ws.recv(), STEP)
                assert deleted == zero_config("ns1/gw-a").to_json()
            status, _ = await http_get(f"{address}/api/v1/configs/ns1/gw-a")
            assert status == 404

    run(main)


def test_list_and_namespace_watches() -> None:
    async def main() -> None:
        async with cds_server() as (store, address):
            store.set("ns1/gw-a", make_config("ns1/gw-a"))
            store.set("ns2/gw-a", make_config("ns2/gw-a"))
            ws_address = address.replace("http://", "ws://")
            async with (
                connect(f"{ws_address}/api/v1/configs?watch=true") as every,
                connect(f"{ws_address}/api/v1/configs/ns2?watch=true") as ns2,
            ):

                async def names(ws: Any, count: int) -> list[str]:
                    frames = [await asyncio.wait_for(ws.recv(), STEP) for _ in range(count)]
                    return [json.loads(frame)["admin"]["name"] for frame in frames]

                assert await names(every, 2) == ["ns1/gw-a", "ns2/gw-a"]
                assert await names(ns2, 1) == ["ns2/gw-a"]
                store.set("ns1/gw-b", make_config("ns1/gw-b"))
                store.set("ns2/gw-a", make_config("ns2/gw-a", realm="changed"))
                assert await names(every, 2) == ["ns1/gw-b", "ns2/gw-a"]
                frame = json.loads(await asyncio.wait_for(ns2.recv(), STEP))
                assert frame["auth"]["realm"] == "changed"  # ns1/gw-b never reached ns2's watch
                store.publish({"ns1/gw-a": make_config("ns1/gw-a")})  # the others are deleted
                deleted = {await asyncio.wait_for(every.recv(), STEP) for _ in range(2)}
                assert deleted == {zero_config(id).to_json() for id in ("ns1/gw-b", "ns2/gw-a")}
                assert await asyncio.wait_for(ns2.recv(), STEP) == zero_config("ns2/gw-a").to_json()

    run(main)


def test_publish_is_level_based() -> None:
    store = ConfigStore()
    a, b = make_config("ns/a"), make_config("ns/b")
    assert store.publish({"ns/a": a, "ns/b": b}) == ["ns/a", "ns/b"]
    assert store.publish({"ns/a": a, "ns/b": b}) == []  # nothing changed: nothing pushed
    assert store.publish({"ns/b": make_config("ns/b", realm="x")}) == ["ns/a", "ns/b"]
    assert sorted(store.configs) == ["ns/b"]


async def raw_watcher(address: str, path: str) -> socket.socket:
    """A WebSocket client that completes the handshake and then never reads again."""
    host, port = address.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n"
    )
    await loop.sock_sendall(sock, request.encode())
    response = b""
    while b"\r\n\r\n" not in response:
        response += await asyncio.wait_for(loop.sock_recv(sock, 1), STEP)
    assert response.startswith(b"HTTP/1.1 101"), response
    return sock


def test_a_watcher_that_stops_reading_is_dropped_and_the_others_keep_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        # The reader must get every frame well within the write timeout that the stuck watcher
        # spends blocked before it is dropped: nothing waits for the stuck one.
        async with cds_server(write_timeout=2.0, heartbeat=None) as (store, address):
            id = "ns1/gw-a"
            big = make_config(id, endpoints=5000)  # random endpoints: ~80 kB that do not compress
            store.set(id, big)
            stuck = await raw_watcher(address, f"/api/v1/configs/{id}?watch=true")
            ws_address = address.replace("http://", "ws://")
            try:
                async with connect(f"{ws_address}/api/v1/configs/{id}?watch=true") as reader:
                    await asyncio.wait_for(reader.recv(), STEP)
                    # Until the stuck watcher's socket buffers are full and its write times out:
                    # every update still reaches the reader, at once.
                    deadline = time.monotonic() + 10
                    version = 0
                    while not store.dropped_watchers and time.monotonic() < deadline:
                        version += 1
                        auth = big.auth.model_copy(update={"realm": f"v{version}"})
                        store.set(id, big.model_copy(update={"auth": auth}))
                        frame = await asyncio.wait_for(reader.recv(), 1.0)
                        assert json.loads(frame)["auth"]["realm"] == f"v{version}"
                        if version > 100:
                            await asyncio.sleep(0.05)
                    assert store.dropped_watchers == 1
                    assert len(store.watchers) == 1  # the reader stays
                    assert "dropping watcher 127.0.0.1 for ns1/gw-a: not reading" in caplog.text
                    store.set(id, make_config(id, realm="after"))
                    frame = await asyncio.wait_for(reader.recv(), 1.0)
                    assert json.loads(frame)["auth"]["realm"] == "after"
            finally:
                stuck.close()

    run(main)


def test_a_watcher_that_does_not_answer_pings_is_dropped() -> None:
    async def main() -> None:
        async with cds_server(heartbeat=0.2) as (store, address):
            stuck = await raw_watcher(address, "/api/v1/configs/ns1/gw-a?watch=true")
            try:
                await eventually(lambda: len(store.watchers) == 1, "the watcher")
                await eventually(lambda: not store.watchers, "the silent watcher dropped")
            finally:
                stuck.close()
            # stunnerd's client answers pings: it stays.
            watch = client(address, "ns1/gw-a").watch()
            async with contextlib.aclosing(watch):
                pending = asyncio.ensure_future(anext(watch))
                await eventually(lambda: len(store.watchers) == 1, "stunnerd's watcher")
                await asyncio.sleep(1.0)  # five heartbeats
                assert len(store.watchers) == 1
                store.set("ns1/gw-a", make_config("ns1/gw-a"))
                assert await asyncio.wait_for(pending, STEP) == make_config("ns1/gw-a")

    run(main)
