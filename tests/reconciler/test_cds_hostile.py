"""The CDS server under a hostile client (issue 20): the connection discipline of
stunner_http, over real sockets against the real CDS application.

We test: a connection that sends nothing, and one that trickles header lines, is closed at the
request deadline; past the connection cap a new connection is closed at once and counted, and
one is served again once a slot frees; a watcher that floods pings is closed with 1008 and
counted while an honest watcher still gets its update; an unmasked client frame is closed with
1002, also when it comes with the upgrade request or after a byte-by-byte frame with a 16-bit
length; watchers that ping and hang up, or are torn down while a config is being written to
them, leave no ERROR and no traceback in the log, and connections come and go at DEBUG only;
many watchers dropped for not reading make one WARNING line, not one each (issue 28 #9);
when the process is out of
file descriptors the accept error is logged once, not once per try, and the server accepts
again once descriptors are free.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import struct
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp
import pytest

from reconciler.cds.server import CDS_LIMITS, HANDLERS_KEY, cds_app, serve
from reconciler.cds.store import ConfigStore
from stunner_http.server import LIMITS_KEY, Served, ServerLimits
from tests.reconciler.test_cds import STEP, eventually, make_config, run
from tests.support.sockets import closed_by_server

ID = "ns1/gw-a"
WATCH = f"/api/v1/configs/{ID}?watch=true"


@contextlib.asynccontextmanager
async def cds(
    limits: ServerLimits = CDS_LIMITS, **kwargs: Any
) -> AsyncGenerator[tuple[ConfigStore, Served, Any], None]:
    store = ConfigStore()
    app = cds_app(store, **kwargs)
    app[LIMITS_KEY] = limits
    async with serve(app) as served:
        yield store, served, app


async def open_raw(served: Served) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", served.port)


async def upgraded(served: Served, path: str = WATCH) -> tuple[Any, Any]:
    reader, writer = await open_raw(served)
    writer.write(
        (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), STEP)
    assert head.startswith(b"HTTP/1.1 101"), head
    return reader, writer


def frame(opcode: int, payload: bytes = b"", masked: bool = True) -> bytes:
    assert len(payload) < 126
    if not masked:
        return bytes([0x80 | opcode, len(payload)]) + payload
    mask = os.urandom(4)
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + body


async def close_code(reader: asyncio.StreamReader) -> int:
    """Read server frames until the close frame; its status code."""
    while True:
        first, second = await asyncio.wait_for(reader.readexactly(2), STEP)
        length = second & 0x7F
        if length == 126:
            length = struct.unpack("!H", await reader.readexactly(2))[0]
        elif length == 127:
            length = struct.unpack("!Q", await reader.readexactly(8))[0]
        payload = await reader.readexactly(length)
        if first & 0x0F == 0x8:
            return int(struct.unpack("!H", payload[:2])[0])


def short(deadline: float = 0.5, **kwargs: Any) -> ServerLimits:
    return dataclasses.replace(CDS_LIMITS, request_deadline=deadline, **kwargs)


def test_the_cds_default_deadline_is_stunnerds() -> None:
    assert CDS_LIMITS.request_deadline == 10.0  # stunnerd's TCP listeners' stream_deadline


def test_a_silent_connection_and_a_trickling_one_are_closed_at_the_deadline() -> None:
    async def main() -> None:
        async with cds(short(0.5)) as (_, served, _app):
            silent_reader, silent = await open_raw(served)
            trickle_reader, trickler = await open_raw(served)
            trickler.write(b"GET /api/v1/configs HTTP/1.1\r\n")

            async def trickle() -> None:
                for i in range(100):  # a header line every 0.1 s: 10 s if never cut
                    await asyncio.sleep(0.1)
                    if trickler.is_closing():
                        return
                    trickler.write(b"X-Slow-%d: y\r\n" % i)

            task = asyncio.create_task(trickle())
            # Far less than the 10 s the trickler would take, far more than the deadline.
            assert await closed_by_server(silent_reader, 4.0)
            assert await closed_by_server(trickle_reader, 4.0)
            task.cancel()
            silent.close()
            trickler.close()
            # A kept-alive connection idle after its answer is closed too.
            reader, writer = await open_raw(served)
            writer.write(b"GET /api/v1/configs HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            assert await closed_by_server(reader, 4.0)
            writer.close()

    run(main)


def test_past_the_cap_a_connection_is_closed_at_once_and_counted() -> None:
    async def main() -> None:
        async with cds(short(30.0, max_connections=3)) as (store, served, _app):
            store.set(ID, make_config(ID))
            held = [await open_raw(served) for _ in range(3)]
            await eventually(lambda: served.stats.open == 3, "three open connections")
            reader, writer = await open_raw(served)
            assert await closed_by_server(reader, STEP)  # not the 30 s deadline
            writer.close()
            assert served.stats.refused == 1
            # One of the three goes: the next client is served.
            held.pop()[1].close()
            await eventually(lambda: served.stats.open == 2, "a free slot")
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{served.address}/api/v1/configs/{ID}") as response:
                    assert response.status == 200
            for _, w in held:
                w.close()

    run(main)


def test_a_ping_flooding_watcher_is_closed_and_an_honest_one_still_gets_its_update(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        async with cds() as (store, served, app):
            store.set(ID, make_config(ID, realm="v0"))
            ws_url = served.address.replace("http://", "ws://") + WATCH
            async with aiohttp.ClientSession() as session, session.ws_connect(ws_url) as honest:
                assert "v0" in (await honest.receive_str(timeout=STEP))
                floods = [await upgraded(served) for _ in range(8)]
                pings = frame(0x9, b"x") * 2000
                for _, writer in floods:
                    writer.write(pings)
                codes = await asyncio.gather(*(close_code(r) for r, _ in floods))
                assert codes == [1008] * 8
                store.set(ID, make_config(ID, realm="v1"))
                assert "v1" in (await honest.receive_str(timeout=STEP))
                assert app[HANDLERS_KEY].guard.flooding == 8
                for _, writer in floods:
                    writer.close()
                # The honest watcher, answering pings and sending its own, stays.
                assert len(store.watchers) == 1

    with caplog.at_level(logging.DEBUG):
        run(main)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    # Logged at a bounded rate: one line for the eight, not one each.
    flood_lines = [r for r in caplog.records if "too many frames" in r.getMessage()]
    assert len(flood_lines) == 1, [r.getMessage() for r in flood_lines]


def test_an_unmasked_client_frame_is_closed_with_1002() -> None:
    async def main() -> None:
        async with cds() as (store, served, app):
            store.set(ID, make_config(ID))
            reader, writer = await upgraded(served)
            writer.write(frame(0x9, b"ping", masked=False))
            assert await close_code(reader) == 1002
            assert app[HANDLERS_KEY].guard.unmasked == 1
            writer.close()
            # The same frame masked is a ping like any other: answered, not closed.
            reader, writer = await upgraded(served)
            writer.write(frame(0x9, b"ping"))
            await eventually(lambda: len(store.watchers) == 1, "the watcher")
            writer.write(frame(0x8, struct.pack("!H", 1000)))
            assert await close_code(reader) == 1000
            writer.close()

    run(main)


def test_an_unmasked_frame_sent_with_the_upgrade_request_is_caught_too() -> None:
    async def main() -> None:
        async with cds() as (_, served, app):
            reader, writer = await open_raw(served)
            writer.write(
                (
                    f"GET {WATCH} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                    "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                    "Sec-WebSocket-Version: 13\r\n\r\n"
                ).encode()
                + frame(0x9, b"ping", masked=False)
            )
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), STEP)
            assert head.startswith(b"HTTP/1.1 101")
            assert await close_code(reader) == 1002
            assert app[HANDLERS_KEY].guard.unmasked == 1
            writer.close()

    run(main)


def test_watchers_torn_down_mid_write_log_no_error_and_come_and_go_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        async with cds(write_timeout=2.0) as (store, served, _app):
            big = make_config(ID, endpoints=20000)  # ~300 kB: many writes per frame
            store.set(ID, big)
            for version in range(10):
                reader, writer = await upgraded(served)
                await reader.readexactly(1000)  # the config is being written
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()  # RST mid-frame
                store.set(
                    ID,
                    big.model_copy(
                        update={"auth": big.auth.model_copy(update={"realm": f"v{version}"})}
                    ),
                )
            await eventually(lambda: not store.watchers, "every watcher gone")
            await eventually(lambda: served.stats.open == 0, "every connection gone")

    with caplog.at_level(logging.DEBUG):
        run(main)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], [
        r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info
    ]
    # Connecting and going away are DEBUG: anyone may do it, so nothing at INFO per watcher.
    assert not [
        r for r in caplog.records if r.levelno == logging.INFO and "watcher" in r.getMessage()
    ]


def test_many_watchers_dropped_for_not_reading_make_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 28 #9: 300 watchers dropped in one run were 300 WARNING lines. Lines about one
    watcher come at most once per 10 s, with the count since the last."""
    stuck = 12

    async def main() -> None:
        async with cds(write_timeout=0.5, heartbeat=None) as (store, served, _app):
            big = make_config(ID, endpoints=5000)  # ~80 kB that do not compress
            store.set(ID, big)
            sockets = [await upgraded(served) for _ in range(stuck)]  # never read
            version = 0
            while store.dropped_watchers < stuck:
                version += 1
                auth = big.auth.model_copy(update={"realm": f"v{version}"})
                store.set(ID, big.model_copy(update={"auth": auth}))
                await asyncio.sleep(0.05)  # a config a watcher cannot take, every 50 ms
                assert version < 2000, store.dropped_watchers
            for _, writer in sockets:
                writer.close()

    with caplog.at_level(logging.INFO):
        run(main)
    dropped = [r.getMessage() for r in caplog.records if "dropping watcher" in r.getMessage()]
    assert dropped and len(dropped) < stuck, dropped
    assert "[1 since the last such line]" in dropped[0]


def test_out_of_file_descriptors_the_accept_error_is_logged_once_and_accepting_resumes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        async with cds() as (store, served, _app):
            store.set(ID, make_config(ID))
            clients = [socket.socket() for _ in range(5)]
            filler: list[int] = []
            try:
                with contextlib.suppress(OSError):  # EMFILE: the process has no fd left
                    while True:
                        filler.append(os.open(os.devnull, os.O_RDONLY))
                for client in clients:
                    client.setblocking(False)
                    with contextlib.suppress(BlockingIOError):
                        client.connect(("127.0.0.1", served.port))
                await eventually(lambda: served.stats.accept_errors > 0, "an accept error")
                await asyncio.sleep(1.0)  # asyncio's own loop logs ~128 lines a tick here
            finally:
                for fd in filler:
                    os.close(fd)
            # Descriptors are free again: the waiting clients are accepted and served.
            await eventually(lambda: served.stats.accepted >= 5, "the clients accepted")
            loop = asyncio.get_running_loop()
            client = clients[0]
            await loop.sock_sendall(
                client, f"GET /api/v1/configs/{ID} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            )
            answer = await asyncio.wait_for(loop.sock_recv(client, 100), STEP)
            assert answer.startswith(b"HTTP/1.1 200"), answer
            for client in clients:
                client.close()

    with caplog.at_level(logging.DEBUG):
        run(main)
    lines = [r for r in caplog.records if "cannot accept" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "Too many open files" in lines[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info]


def test_a_watcher_that_pings_and_hangs_up_leaves_no_error_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The red team's traceback: pings answered after the client closed its side raised
    "Cannot write to closing transport" out of the handler, one ERROR each."""

    async def main() -> None:
        async with cds() as (store, served, app):
            store.set(ID, make_config(ID))
            clients = [await upgraded(served) for _ in range(8)]
            for _, writer in clients:
                writer.write(frame(0x9, b"x") * 10)  # within the budget
                writer.close()
            await eventually(lambda: served.stats.open == 0, "every connection gone")
            assert app[HANDLERS_KEY].guard.flooding == 0

    with caplog.at_level(logging.DEBUG):
        run(main)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], [
        r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info
    ]


def test_frame_boundaries_are_followed_across_segments_and_extended_lengths() -> None:
    """The guard reads frame headers from the byte stream: a masked 300-byte frame (16-bit
    length) sent a byte at a time passes, and the unmasked frame after it is still caught."""

    async def main() -> None:
        async with cds() as (store, served, app):
            store.set(ID, make_config(ID))
            reader, writer = await upgraded(served)
            mask = os.urandom(4)
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(b"x" * 300))
            long_frame = bytes([0x81, 0x80 | 126]) + struct.pack("!H", 300) + mask + payload
            for i in range(len(long_frame)):
                writer.write(long_frame[i : i + 1])
                await writer.drain()
                if i % 50 == 0:
                    await asyncio.sleep(0.001)
            await eventually(lambda: len(store.watchers) == 1, "the watcher")
            assert app[HANDLERS_KEY].guard.unmasked == 0
            writer.write(frame(0x9, b"ping", masked=False))
            assert await close_code(reader) == 1002
            assert app[HANDLERS_KEY].guard.unmasked == 1
            writer.close()

    run(main)
