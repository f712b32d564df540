"""stunnerd shows its pod's projected ServiceAccount token to the CDS (issue 20 #5).

The CDS here is the real server with cluster mode's access check (reconciler.cds.access), whose
TokenReviews go through the reconciler's own Kubernetes door to the fake API server; the tokens
are ones the fake issued, as the kubelet writes them into the projected volume.

We test: with STUNNER_CDS_TOKEN_FILE a one-shot load and a watch get the config; without it
(a stunnerd of the previous release) the CDS refuses with 401 and the error says so; the file is
read again at every reconnect (the kubelet rotates it); a real stunnerd whose watch is refused
keeps serving its running config, and takes the newer one once its token is good again (it
retried with back-off meanwhile); a stunnerd whose token is revoked (its pod or ServiceAccount
deleted, issue 28 #8) has its live watch closed by the CDS within the TTL and keeps relaying with
the config it has; the token is never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from reconciler.cds.access import MAX_TTL, Access, TokenVerifier
from reconciler.kube.api import Api
from stunner_api.vocabulary import CDS_TOKEN_AUDIENCE
from stunnerd.process.sources import CdsSource, SourceError
from tests.cds_server import CdsServer, run_cds_server
from tests.support.fakeapi import FakeApiServer
from tests.support.turnclient import HOST, free_port, make_config

from .conftest import StartStunnerd
from .test_cli_watch import NO_NODE_NAME, WATCH, allocates, wait_for

ID = "testns/gw"


@contextlib.asynccontextmanager
async def guarded_cds(fake: FakeApiServer, ttl: float = MAX_TTL) -> AsyncIterator[CdsServer]:
    """The CDS as cluster mode runs it: testns/gw's pods run as `default`, the others' as
    `elsewhere`; answers trusted `ttl` seconds."""
    api = Api(fake.api_client())
    access = Access(
        TokenVerifier(lambda token: api.review_token(token, (CDS_TOKEN_AUDIENCE,)), max_ttl=ttl),
        account_of=lambda id: "default" if id == ID else "elsewhere",
    )
    try:
        async with run_cds_server(access=access.middleware) as cds:
            yield cds
    finally:
        api.close()


def token_file(tmp_path: Path, token: str) -> Path:
    path = tmp_path / "token"
    path.write_text(token)
    return path


def test_cds_load_and_watch_with_the_token_file(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            async with guarded_cds(fake) as cds:
                port = free_port()
                cds.set_config(ID, make_config(port, [f"{HOST}/32"]))
                good = fake.issue_token("testns", "default", (CDS_TOKEN_AUDIENCE,))
                env = {"STUNNER_CDS_TOKEN_FILE": str(token_file(tmp_path, good))}
                source = CdsSource(cds.address, "testns", "gw", env=env)
                assert (await source.load()).listeners[0].port == port
                # A stunnerd of the previous release sends no token.
                with pytest.raises(SourceError, match="HTTP 401: a ServiceAccount token"):
                    await CdsSource(cds.address, "testns", "gw", env={}).load()
                # The token file is read at every request: rotated to one for the API server.
                token_file(tmp_path, fake.issue_token("testns", "default"))
                with pytest.raises(SourceError, match="HTTP 401"):
                    await source.load()
                # Another Gateway's config: 403.
                token_file(tmp_path, good)
                other = CdsSource(cds.address, "testns", "other", env=env)
                with pytest.raises(SourceError, match="HTTP 403"):
                    await other.load()
                watch = CdsSource(cds.address, "testns", "gw", env=env, retry_period=0.05)
                async with contextlib.aclosing(watch.watch()) as configs:
                    config = await asyncio.wait_for(anext(configs), 5)
                    assert config.listeners[0].port == port

    asyncio.run(main())


def test_a_refused_stunnerd_keeps_serving_and_recovers(
    tmp_path: Path, stunnerd: StartStunnerd
) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            async with guarded_cds(fake) as cds:
                port, new_port = free_port(), free_port()
                good = fake.issue_token("testns", "default", (CDS_TOKEN_AUDIENCE,))
                path = token_file(tmp_path, good)
                env = NO_NODE_NAME | {"STUNNER_CDS_TOKEN_FILE": str(path)}
                process = stunnerd(*WATCH, "-c", cds.address, "-i", ID, env=env)
                cds.set_config(ID, make_config(port, [f"{HOST}/32"]))
                await wait_for(lambda: allocates(port))
                # The token goes bad (an upgrade's old pod, a deleted account): the CDS refuses
                # the reconnect, and the config changes meanwhile.
                bad = fake.issue_token("testns", "default")  # the API server's audience
                path.write_text(bad)
                await cds.disconnect_all()
                await wait_for(_logged(process, "refused the watch of testns/gw: HTTP 401"))
                cds.set_config(ID, make_config(new_port, [f"{HOST}/32"]))
                await asyncio.sleep(1.5)
                assert await allocates(port)  # the running config keeps serving
                assert not await allocates(new_port)
                assert process.running()
                # A good token again (the kubelet's next rotation): the newer config arrives.
                path.write_text(good)
                await wait_for(lambda: allocates(new_port), timeout=25)
                log = await asyncio.to_thread(process.stop, at_once=True)
                assert good not in log and bad not in log
                assert log.count("refused the watch") == 1  # then quieter, while backing off

    asyncio.run(main())


def test_a_revoked_stunnerds_watch_is_closed_and_it_keeps_relaying(
    tmp_path: Path, stunnerd: StartStunnerd
) -> None:
    """The CDS closes the live watch of a token the API server no longer accepts (answers
    trusted 0.3 s here, 10 s by default) with 1008 and why; stunnerd logs it, its reconnects are
    refused, and it keeps serving its running config; a good token again (its replacement
    pod's) and it takes the newer one."""

    async def main() -> None:
        with FakeApiServer() as fake:
            async with guarded_cds(fake, ttl=0.3) as cds:
                port, new_port = free_port(), free_port()
                token = fake.issue_token("testns", "default", (CDS_TOKEN_AUDIENCE,))
                path = token_file(tmp_path, token)
                env = NO_NODE_NAME | {"STUNNER_CDS_TOKEN_FILE": str(path)}
                process = stunnerd(*WATCH, "-c", cds.address, "-i", ID, env=env)
                cds.set_config(ID, make_config(port, [f"{HOST}/32"]))
                await wait_for(lambda: allocates(port))
                fake.revoke_token(token)  # nobody disconnects it but the CDS
                # Closed with 1008 and the reason, which stunnerd logs; its reconnects are 401.
                await wait_for(_logged(process, "1008 (policy violation) the token of"))
                assert "ServiceAccount testns/default no longer authenticates" in process.stderr
                cds.set_config(ID, make_config(new_port, [f"{HOST}/32"]))
                assert await allocates(port)  # the running config keeps serving
                assert process.running()
                fresh = fake.issue_token("testns", "default", (CDS_TOKEN_AUDIENCE,))
                path.write_text(fresh)
                await wait_for(lambda: allocates(new_port), timeout=25)
                log = await asyncio.to_thread(process.stop, at_once=True)
                assert token not in log and fresh not in log

    asyncio.run(main())


def _logged(process, text: str):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return text in process.stderr

    return check
