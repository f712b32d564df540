"""The auth service as `stunner auth-server` runs it (reconciler.auth.run) against the real CDS
server: it follows every change (a Gateway added, edited, deleted) through the shared CDS client
and answers GET /ice and GET / as the reconciler's auth endpoints do."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from reconciler import auth
from reconciler.auth import apply_frame, follow, run
from reconciler.cds.access import Access, Account, TokenVerifier
from reconciler.cds.server import cds_app, serve
from reconciler.cds.store import ConfigStore
from reconciler.kube.api import Api
from stunner_api.dataplane import StunnerConfig, validate_config
from stunner_api.vocabulary import CDS_TOKEN_AUDIENCE
from tests.support.fakeapi import FakeApiServer
from tests.support.ports import free_port
from tests.support.sockets import closed_by_server


def config(id: str, password: str) -> StunnerConfig:
    return validate_config(
        {
            "version": "v1",
            "admin": {"name": id},
            "auth": {"type": "static", "credentials": {"username": "u", "password": password}},
            "listeners": [
                {
                    "name": f"{id}/udp",
                    "protocol": "TURN-UDP",
                    "address": "10.0.0.1",
                    "public_address": "192.0.2.1",
                    "port": 3478,
                }
            ],
        }
    )


async def get(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.json(content_type=None)


async def eventually(check: Any) -> None:
    for _ in range(250):
        if await check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("timed out")


@contextlib.asynccontextmanager
async def auth_server(cds_store: ConfigStore) -> AsyncIterator[int]:
    """The real CDS over `cds_store`, and `stunner auth-server`'s `run` following it: its port."""
    async with serve(cds_app(cds_store)) as cds:
        port = free_port()
        server = asyncio.create_task(run(cds.address, "127.0.0.1", port, ""))
        try:
            yield port
        finally:
            server.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await server


def test_auth_server_follows_the_cds() -> None:
    async def main() -> None:
        cds_store = ConfigStore()
        cds_store.set("media/gw", config("media/gw", "first"))
        async with auth_server(cds_store) as port:
            ice = f"http://127.0.0.1:{port}/ice?service=turn"

            async def password_is(value: str) -> bool:
                with contextlib.suppress(aiohttp.ClientError):
                    status, body = await get(ice)
                    return status == 200 and body["iceServers"][0]["credential"] == value
                return False

            await eventually(lambda: password_is("first"))
            status, body = await get(ice)
            assert body["iceServers"][0]["urls"] == ["turn:192.0.2.1:3478?transport=udp"]
            cds_store.set("media/gw", config("media/gw", "second"))
            await eventually(lambda: password_is("second"))
            cds_store.delete("media/gw")

            async def gone() -> bool:
                return (await get(ice))[0] == 500  # no configs left

            await eventually(gone)
            status, body = await get(f"http://127.0.0.1:{port}/?service=ice")
            assert status == 400 and "turn" in body["message"]

    asyncio.run(asyncio.wait_for(main(), 20))


def test_a_cds_that_is_away_is_retried() -> None:
    async def main() -> None:
        store = ConfigStore()
        port = free_port()
        follower = asyncio.create_task(follow(store, f"http://127.0.0.1:{port}", retry=0.05))
        await asyncio.sleep(0.2)  # nothing listens yet: refused, retried
        cds_store = ConfigStore()
        cds_store.set("media/gw", config("media/gw", "late"))
        async with serve(cds_app(cds_store), port=port):

            async def arrived() -> bool:
                return "media/gw" in store.configs

            await eventually(arrived)
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower

    asyncio.run(asyncio.wait_for(main(), 20))


def test_a_malformed_cds_frame_is_logged_without_its_credentials(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A frame whose sections are the wrong shape is ignored and logged; the password, the
    shared secret and the key it holds are not (the secrets audit)."""
    store = ConfigStore()
    good = config("ns/gw", "old-password").to_dict()
    for broken in (
        good | {"auth": ["frame-s3cr3t"]},
        good | {"listeners": {"udp": {"key": "frame-s3cr3t"}}},
        good | {"listeners": ["frame-s3cr3t"]},
    ):
        with caplog.at_level(logging.DEBUG):
            apply_frame(store, json.dumps(broken))
    assert store.configs == {}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3 and all("not a config" in w for w in warnings), warnings
    assert not any("frame-s3cr3t" in r.getMessage() for r in caplog.records)


def test_the_auth_service_shows_the_cds_its_projected_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With cdsAuth required the auth service runs as the reader account: it reads every
    config with its token (STUNNER_CDS_TOKEN_FILE, read at each connect); without one the CDS
    refuses it and it keeps retrying, with the CDS client stunnerd uses: one WARNING with the
    CDS's reason and what to check, the retries at DEBUG, the token never logged."""
    caplog.set_level(logging.DEBUG, logger="stunner.auth")

    async def main() -> None:
        with FakeApiServer() as fake:
            api = Api(fake.api_client())
            access = Access(
                TokenVerifier(lambda token: api.review_token(token, (CDS_TOKEN_AUDIENCE,))),
                readers={Account("stunner-system", "stunner-config-reader")},
                account_of=lambda id: "default",
            )
            cds_store = ConfigStore()
            for id in ("a/gw", "b/gw"):
                cds_store.set(id, config(id, "secret-" + id[0]))
            token = tmp_path / "token"
            async with serve(cds_app(cds_store, access=access.middleware)) as cds:
                store = ConfigStore()
                follower = asyncio.create_task(
                    follow(store, cds.address, retry=0.05, token_file=token)
                )
                await asyncio.sleep(0.3)  # no token file yet: refused, retried
                assert not store.configs
                refusals = [r for r in caplog.records if "refused the watch" in r.getMessage()]
                assert len(refusals) >= 2 and refusals[0].name == "stunner.auth"
                assert [r.levelno for r in refusals[1:]] == [logging.DEBUG] * len(refusals[1:])
                first = refusals[0]
                assert first.levelno == logging.WARNING
                assert "of every config: HTTP 401" in first.getMessage()
                assert "no token: is STUNNER_CDS_TOKEN_FILE set?" in first.getMessage()
                secret = fake.issue_token(
                    "stunner-system", "stunner-config-reader", (CDS_TOKEN_AUDIENCE,)
                )
                token.write_text(secret)

                async def arrived() -> bool:
                    return set(store.configs) == {"a/gw", "b/gw"}

                await eventually(arrived)
                follower.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await follower
                assert not any(secret in r.getMessage() for r in caplog.records)
            api.close()


def test_the_auth_server_closes_silent_connections_and_caps_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 20 #2: `stunner auth-server` with the auth service's limits (a shorter deadline and
    a cap of 3 here): a connection that sends nothing is closed at the deadline, a fourth one
    at once, and a query is answered again once one goes; a bad ttl is refused without being
    echoed."""
    limits = dataclasses.replace(auth.AUTH_LIMITS, request_deadline=1.0, max_connections=3)
    monkeypatch.setattr(auth, "AUTH_LIMITS", limits)

    async def main() -> None:
        cds_store = ConfigStore()
        cds_store.set("media/gw", config("media/gw", "first"))
        async with auth_server(cds_store) as port:
            ice = f"http://127.0.0.1:{port}/ice?service=turn"

            async def up() -> bool:
                with contextlib.suppress(aiohttp.ClientError):
                    return (await get(ice))[0] == 200
                return False

            await eventually(up)
            silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
            extra, extra_writer = await asyncio.open_connection("127.0.0.1", port)
            assert await closed_by_server(extra, 0.5)  # past the cap: at once
            extra_writer.close()
            for reader, writer in silent:  # at the 1 s deadline, not never
                assert await closed_by_server(reader, 5.0)
                writer.close()
            assert await up()
            status, body = await get(ice + "&ttl=" + "9" * 4000)
            assert status == 400 and "9999" not in body["message"]

    asyncio.run(asyncio.wait_for(main(), 20))
