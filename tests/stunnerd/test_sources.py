"""Config sources: the polled file watch and the CDS client, against real files and a real CDS.

We test: one-shot loads and their errors; that a watch yields each new valid config once and
skips identical rewrites, truncated files, invalid configs and the CDS's zero config (deleted
Gateway); that it survives a deleted file, a dropped connection, a silent (pong-less) server and
a server that comes up late; how `source_for` reads the origin and the id.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import os
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.cds.server import cds_app, serve
from reconciler.cds.store import ConfigStore
from stunner_api.cds import OPEN_TIMEOUT, PONG_WAIT
from stunner_api.dataplane import ConfigError, StunnerConfig
from stunner_client.cds import RECONNECT_FIRST, reconnect_waits, retry_after
from stunnerd.process.sources import CdsSource, FileSource, SourceError, source_for
from tests.cds_server import run_cds_server
from tests.support.turnclient import free_port

FAST = {"retry_period": 0.1, "ping_period": 0.2, "pong_wait": 0.3}
ID = "stunner/udp-gateway"
STEP = 5.0  # seconds a single expected event may take


def config_text(realm: str, port: int = 3478) -> str:
    return json.dumps(
        {
            "version": "v1",
            "admin": {"name": ID},
            "auth": {
                "type": "static",
                "realm": realm,
                "credentials": {"username": "user", "password": "pass"},
            },
            "listeners": [{"name": "udp", "protocol": "TURN-UDP", "port": port, "routes": ["c"]}],
            "clusters": [{"name": "c", "endpoints": ["10.0.0.0/8"]}],
        }
    )


def run(coro: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(coro(), 18))


async def next_config(watch: AsyncGenerator[StunnerConfig, None]) -> StunnerConfig:
    return await asyncio.wait_for(anext(watch), STEP)


async def eventually(predicate: Callable[[], bool], what: str) -> None:
    for _ in range(int(STEP / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def count(self, text: str, level: int | None = None) -> int:
        return sum(
            1
            for record in self.records
            if text in record.getMessage() and (level is None or record.levelno == level)
        )


@pytest.fixture
def logs() -> Iterator[Records]:
    """Every record of the config source loggers, whatever the `stunner` logger's setup."""
    handler = Records()
    loggers = [logging.getLogger(n) for n in ("stunner.config-file-client", "stunner.cds-client")]
    saved = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    yield handler
    for logger, level in zip(loggers, saved, strict=True):
        logger.removeHandler(handler)
        logger.setLevel(level)


def write(path: Path, text: str) -> None:
    """Write as a ConfigMap sidecar would: truncate, then write."""
    path.write_text(text)


# --- FileSource -------------------------------------------------------------------------------


def test_file_load(tmp_path: Path) -> None:
    path = tmp_path / "stunnerd.conf"
    write(path, config_text("realm-a"))
    config = asyncio.run(FileSource(path).load())
    assert config.auth.realm == "realm-a"
    assert config.listeners[0].port == 3478


def test_file_load_invalid_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "stunnerd.conf"
    write(path, config_text("realm-a", port=70000))
    with pytest.raises(ConfigError, match=r"listeners\[0\]\.port"):
        asyncio.run(FileSource(path).load())


def test_file_load_missing_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="cannot read config file .*missing.conf"):
        asyncio.run(FileSource(tmp_path / "missing.conf").load())


def test_file_watch(tmp_path: Path, logs: Records) -> None:
    path = tmp_path / "stunnerd.conf"
    write(path, config_text("realm-a"))
    source = FileSource(path, poll_interval=0.02, retry_period=0.1)

    async def main() -> None:
        async with contextlib.aclosing(source.watch()) as watch:
            assert (await next_config(watch)).auth.realm == "realm-a"

            write(path, config_text("realm-b"))
            assert (await next_config(watch)).auth.realm == "realm-b"

            # The watch runs while someone waits on it: what it skips never reaches `pending`.
            pending = asyncio.ensure_future(next_config(watch))
            await asyncio.sleep(0.05)
            write(path, config_text("realm-b"))  # identical rewrite: read, not yielded
            await eventually(lambda: logs.count("config unchanged") == 1, "unchanged")

            write(path, "")  # truncated mid-write
            await eventually(lambda: logs.count("is empty") == 1, "empty file skipped")

            write(path, config_text("realm-c", port=70000))  # invalid: skipped, watch goes on
            await eventually(
                lambda: logs.count("ignoring invalid config", logging.WARNING) == 1, "invalid"
            )
            assert "listeners[0].port" in logs.records[-1].getMessage()
            assert not pending.done()

            write(path, config_text("realm-d"))
            assert (await pending).auth.realm == "realm-d"

            pending = asyncio.ensure_future(next_config(watch))
            path.unlink()
            await asyncio.sleep(0.5)  # several retry periods: one warning, not one per poll
            assert logs.count("is not available", logging.WARNING) == 1
            write(path, config_text("realm-e"))
            assert (await pending).auth.realm == "realm-e"
            assert logs.count("available again") == 1

    run(main)


def test_file_watch_starts_before_the_file_exists(tmp_path: Path) -> None:
    path = tmp_path / "late.conf"
    source = FileSource(path, poll_interval=0.02, retry_period=0.05)

    async def main() -> None:
        async with contextlib.aclosing(source.watch()) as watch:
            pending = asyncio.ensure_future(next_config(watch))
            await asyncio.sleep(0.2)
            assert not pending.done()
            write(path, config_text("late"))
            assert (await pending).auth.realm == "late"

    run(main)


# --- CdsSource --------------------------------------------------------------------------------


def cds_source(address: str, **kwargs: Any) -> CdsSource:
    return CdsSource(address, "stunner", "udp-gateway", **(FAST | kwargs))


def test_cds_load() -> None:
    async def main() -> None:
        async with run_cds_server() as cds:
            cds.set_config(ID, config_text("cds-a"))
            source = cds_source(cds.address, node="node-1")
            config = await source.load()
            assert config.auth.realm == "cds-a"
            assert cds.requests == ["/api/v1/configs/stunner/udp-gateway?node=node-1"]

    run(main)


def test_cds_load_not_found_carries_the_server_message() -> None:
    async def main() -> None:
        async with run_cds_server() as cds:
            with pytest.raises(SourceError, match="HTTP 404: config stunner/udp-gateway not found"):
                await cds_source(cds.address).load()

    run(main)


def test_cds_load_server_down() -> None:
    port = free_port()
    with pytest.raises(SourceError, match=f"cannot reach CDS server http://127.0.0.1:{port}"):
        asyncio.run(cds_source(f"127.0.0.1:{port}").load())


def test_cds_load_invalid_config_is_a_config_error() -> None:
    async def main() -> None:
        async with run_cds_server() as cds:
            cds.set_config(ID, config_text("bad", port=70000))
            with pytest.raises(ConfigError, match=r"listeners\[0\]\.port"):
                await cds_source(cds.address).load()

    run(main)


def test_cds_watch_updates_delete_and_reconnect(logs: Records) -> None:
    async def main() -> None:
        async with run_cds_server() as cds:
            cds.set_config(ID, config_text("cds-a"))
            source = cds_source(cds.address)
            async with contextlib.aclosing(source.watch()) as watch:
                assert (await next_config(watch)).auth.realm == "cds-a"
                assert cds.requests == ["/api/v1/configs/stunner/udp-gateway?watch=true"]
                assert cds.origins == [cds.address]

                cds.set_config(ID, config_text("cds-b"))
                assert (await next_config(watch)).auth.realm == "cds-b"

                pending = asyncio.ensure_future(next_config(watch))
                cds.set_config(ID, config_text("cds-c", port=70000))  # invalid: skipped
                await eventually(lambda: logs.count("ignoring invalid config") == 1, "invalid")

                cds.delete(ID)  # the zero config: not yielded, the pod keeps serving
                await eventually(lambda: logs.count("deleted on the CDS server") == 1, "delete")
                assert not pending.done()
                cds.set_config(ID, config_text("cds-d"))
                assert (await pending).auth.realm == "cds-d"

                pending = asyncio.ensure_future(next_config(watch))
                await cds.disconnect_all()
                await eventually(lambda: len(cds.origins) == 2, "reconnect")
                # The reconnect brought cds-d again: identical, not yielded.
                await eventually(lambda: logs.count("config unchanged") == 1, "unchanged")
                assert not pending.done()
                await eventually(lambda: cds.watcher_count == 1, "reconnected watcher")
                cds.set_config(ID, config_text("cds-e"))
                assert (await pending).auth.realm == "cds-e"

    run(main)


def test_cds_watch_reconnects_soon_when_its_server_goes_away_and_comes_back() -> None:
    """A reconciler rollout: the CDS closes every watch, is gone a moment, and a new one serves
    on the same address. With a retry period of a minute the watch is back within seconds (quick
    retries after a connection that was up), and a config published on the new server arrives:
    a route deleted during a rollout reaches stunnerd as soon as the CDS is there again."""
    port = free_port()

    async def main() -> None:
        source = cds_source(f"http://127.0.0.1:{port}", retry_period=60.0)
        async with contextlib.aclosing(source.watch()) as watch:
            async with run_cds_server(port=port) as cds:
                cds.set_config(ID, config_text("old"))
                assert (await next_config(watch)).auth.realm == "old"
                await cds.disconnect_all()
            pending = asyncio.ensure_future(next_config(watch))
            await asyncio.sleep(0.3)  # gone: the first quick retries are refused
            async with run_cds_server(port=port) as cds:
                cds.set_config(ID, config_text("new"))
                assert (await pending).auth.realm == "new"
                await watch.aclose()

    run(main)


def test_cds_reconnect_waits_start_small_and_settle_at_the_retry_period() -> None:
    waits = reconnect_waits(1.0)
    assert waits[0] == RECONNECT_FIRST
    assert waits == sorted(waits) and waits[-1] < 1.0 <= waits[-1] * 2
    assert reconnect_waits(RECONNECT_FIRST) == []


def test_cds_watch_waits_for_a_late_server(logs: Records) -> None:
    port = free_port()

    async def main() -> None:
        source = cds_source(f"http://127.0.0.1:{port}")
        async with contextlib.aclosing(source.watch()) as watch:
            pending = asyncio.ensure_future(next_config(watch))
            await asyncio.sleep(0.5)  # ~5 failed attempts
            assert not pending.done()
            assert logs.count("failed", logging.WARNING) == 1
            assert logs.count("failed", logging.DEBUG) >= 2
            async with run_cds_server(port=port) as cds:
                cds.set_config(ID, config_text("late"))
                assert (await pending).auth.realm == "late"
                await watch.aclose()

    run(main)


async def accept_and_send_a_config(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, realm: str
) -> None:
    """A WebSocket handshake answered by hand, then one text frame: a config of `realm`."""
    head = await reader.readuntil(b"\r\n\r\n")
    key = next(
        line.split(b":", 1)[1].strip()
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"sec-websocket-key:")
    )
    magic = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
    accept = base64.b64encode(hashlib.sha1(key + magic).digest())
    writer.write(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n"
    )
    payload = config_text(realm).encode()
    assert 126 <= len(payload) < 65536
    writer.write(b"\x81\x7e" + len(payload).to_bytes(2, "big") + payload)


@contextlib.asynccontextmanager
async def scripted_server(
    script: Callable[[int, asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]],
) -> AsyncIterator[tuple[int, list[asyncio.StreamWriter]]]:
    """A raw TCP server on loopback running `script(n, reader, writer)` for its n-th connection
    (from 1), then reading whatever else comes and never answering; (port, connections)."""
    connections: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        try:
            await script(len(connections), reader, writer)
            while await reader.read(4096):
                pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], connections
    finally:
        server.close()
        await server.wait_closed()


def test_cds_watch_gives_up_on_an_unanswered_handshake_within_the_open_timeout(
    logs: Records,
) -> None:
    """An endpoint that takes the connection and never answers the handshake (a reconciler pod
    going away during a rollout) costs OPEN_TIMEOUT, not the keepalive's PONG_WAIT: the next
    attempt reaches one that answers."""

    async def first_mute(n: int, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if n > 1:  # the first takes the request and answers nothing
            await accept_and_send_a_config(reader, w, "answered")

    async def main() -> None:
        async with scripted_server(first_mute) as (port, connections):
            source = cds_source(f"ws://127.0.0.1:{port}", pong_wait=PONG_WAIT)
            async with contextlib.aclosing(source.watch()) as watch:
                config = await asyncio.wait_for(anext(watch), PONG_WAIT - 1)
                assert config.auth.realm == "answered"
                assert len(connections) == 2
                assert logs.count("timed out during opening handshake") == 1

    assert OPEN_TIMEOUT + FAST["retry_period"] < PONG_WAIT - 1
    run(main)


def test_cds_watch_drops_a_silent_server_and_reconnects(logs: Records) -> None:
    """A server that completes the handshake, sends a config and then never answers a ping."""

    async def silent(n: int, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await accept_and_send_a_config(reader, w, f"silent-{n}")  # then read pings, never answer

    async def main() -> None:
        async with scripted_server(silent) as (port, _):
            source = cds_source(f"ws://127.0.0.1:{port}", pong_wait=0.2)
            async with contextlib.aclosing(source.watch()) as watch:
                assert (await next_config(watch)).auth.realm == "silent-1"
                # ping after 0.2 s, no pong for 0.2 s: dead; reconnect after 0.1 s.
                assert (await next_config(watch)).auth.realm == "silent-2"
                assert logs.count("ping timeout") >= 1

    run(main)


# --- source_for -------------------------------------------------------------------------------


def test_source_for_files() -> None:
    for origin, path in [
        ("/etc/stunnerd/stunnerd.conf", "/etc/stunnerd/stunnerd.conf"),
        ("file:///etc/stunnerd/stunnerd.conf", "/etc/stunnerd/stunnerd.conf"),
        ("stunnerd.conf", "stunnerd.conf"),
        ("file://conf/stunnerd.yaml", "conf/stunnerd.yaml"),
    ]:
        source = source_for(origin, env={})
        assert isinstance(source, FileSource), origin
        assert source.path == Path(path)


def test_source_for_cds_addresses() -> None:
    env = {"STUNNER_NAMESPACE": "ns", "STUNNER_NAME": "gw"}
    cases = [
        ("http://10.0.0.1:13478", "http://10.0.0.1:13478", "ws://10.0.0.1:13478"),
        ("ws://cds.stunner-system:13478", "http://cds.stunner-system:13478", "ws://"),
        ("https://cds:443", "https://cds:443", "wss://cds:443"),
        ("10.0.0.1:13478", "http://10.0.0.1:13478", "ws://10.0.0.1:13478"),
        (":13478", "http://localhost:13478", "ws://localhost:13478"),
        ("", "http://localhost:13478", "ws://localhost:13478"),
        ("[fd00::1]:13478", "http://[fd00::1]:13478", "ws://[fd00::1]:13478"),
    ]
    for origin, http_origin, ws_prefix in cases:
        source = source_for(origin, env=env)
        assert isinstance(source, CdsSource), origin
        assert source.origin == http_origin
        assert source.url == f"{http_origin}/api/v1/configs/ns/gw"
        assert source.ws_url.startswith(ws_prefix)
        assert source.ws_url.endswith("/api/v1/configs/ns/gw?watch=true")


def test_source_for_ids() -> None:
    explicit = source_for(":13478", "stunner/udp-gateway", env={"STUNNER_NAMESPACE": "x"})
    assert isinstance(explicit, CdsSource)
    assert (explicit.namespace, explicit.name) == ("stunner", "udp-gateway")

    only_one = source_for(":13478", env={"STUNNER_NAMESPACE": "ns"})
    default = source_for(":13478", env={})
    for source in (only_one, default):
        assert isinstance(source, CdsSource)
        assert (source.namespace, source.name) == ("default", f"stunnerd-{socket.gethostname()}")

    with_node = source_for(
        ":13478", "a/b", env={"STUNNER_NODENAME": "node-1"}, retry_period=0.5, ping_period=2
    )
    assert isinstance(with_node, CdsSource)
    assert with_node.url.endswith("/api/v1/configs/a/b?node=node-1")
    assert with_node.ws_url.endswith("/api/v1/configs/a/b?watch=true&node=node-1")
    assert (with_node.retry_period, with_node.ping_period) == (0.5, 2)

    with pytest.raises(SourceError, match="invalid id 'nameonly'"):
        source_for(":13478", "nameonly", env={})


def test_source_for_k8s_is_not_supported() -> None:
    with pytest.raises(SourceError, match="not supported"):
        source_for("k8s", env={})


def test_source_for_defaults_env_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STUNNER_NAMESPACE", "envns")
    monkeypatch.setenv("STUNNER_NAME", "envname")
    source = source_for("127.0.0.1:1")
    assert isinstance(source, CdsSource)
    assert (source.namespace, source.name) == ("envns", "envname")
    assert os.environ["STUNNER_NAME"] == "envname"


def test_cds_watch_refused_by_a_standby_comes_back_after_retry_after(logs: Records) -> None:
    """A standby reconciler (leader-only CDS) answers 503 with `Retry-After: 1`: the watch tries
    again after that second, not after its retry period (a minute here), and says so at INFO,
    not as a failure."""

    async def main() -> None:
        store = ConfigStore()
        standing_by: list[str] = ["standing by: the CDS is served by the leader only"]
        app = cds_app(store, standby=lambda: standing_by[0] if standing_by else None)
        async with serve(app) as served:
            store.set_json(ID, config_text("leader"))
            source = cds_source(served.address, retry_period=60.0)
            async with contextlib.aclosing(source.watch()) as watch:
                pending = asyncio.ensure_future(anext(watch))
                await eventually(lambda: logs.count("stands by", logging.INFO) == 1, "refused")
                assert logs.count("stands by (HTTP 503 standing by: the CDS is served") == 1
                assert not logs.count("refused the watch") and not logs.count("failed")
                standing_by.clear()  # it leads now
                assert (await asyncio.wait_for(pending, STEP)).auth.realm == "leader"

    run(main)


def test_cds_retry_after_is_bounded_by_the_retry_period() -> None:
    assert retry_after("1", 60.0) == 1.0
    assert retry_after("120", 5.0) == 5.0
    assert retry_after("0", 5.0) == RECONNECT_FIRST
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 5.0) == 5.0
