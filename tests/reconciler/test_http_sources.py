"""One client cannot shut the others out of our HTTP servers (issue 28 #5): the per-source caps
of stunner_http, and the CDS's room for connections that present a valid token.

Over real loopback sockets, the attacker from 127.0.0.1 (or 127.0.0.3), the honest clients from
127.0.0.2 (the whole of 127/8 is loopback): we test, with the auth service's own limits, that
1,100 idle connections from one source leave every honest GET from another answered; in the real
local-mode process at `nofile` 300, that idle connections to its auth service leave every honest
CDS GET answered; and, with the CDS's token check on, that a client with a valid token is served
when idle connections without one fill the server (its own source's too), that its watch is never
evicted for newcomers, and that a request refused as unauthenticated has its connection closed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import resource
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp

from reconciler.auth import auth_app
from reconciler.cds.access import Access, TokenVerifier
from reconciler.cds.server import CDS_LIMITS, cds_app, serve
from reconciler.cds.store import ConfigStore
from reconciler.demo_example import prepare
from stunner_api.vocabulary import CDS_TOKEN_AUDIENCE
from stunner_http.admission import Admission, Holdings, source_share
from stunner_http.server import LIMITS_KEY, Served
from tests.reconciler.test_cds import STEP, eventually, make_config, run
from tests.reconciler.test_local_hostile import GATEWAY_ID, reconciler, until
from tests.support.ports import free_port
from tests.support.sockets import closed_by_server

ATTACKER, HONEST, OTHER_ATTACKER = "127.0.0.1", "127.0.0.2", "127.0.0.3"
ID = "ns1/gw-a"

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def idle(port: int, count: int, source: str = ATTACKER) -> list[Connection]:
    """`count` connections from `source` that send nothing."""
    return [
        await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        for _ in range(count)
    ]


def close_all(connections: list[Connection]) -> None:
    for _, writer in connections:
        writer.close()


async def honest_gets(url: str, count: int, token: str | None = None) -> int:
    """How many of `count` GETs from HONEST, each on a new connection, are answered 200."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answered = 0
    connector = aiohttp.TCPConnector(local_addr=(HONEST, 0), force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(count):
            try:
                async with session.get(url, headers=headers) as response:
                    answered += response.status == 200
            except aiohttp.ClientError:
                pass
    return answered


def test_idle_connections_from_one_source_leave_the_auth_service_to_the_others() -> None:
    async def main() -> None:
        store = ConfigStore()
        store.set(ID, make_config(ID))
        async with serve(auth_app(store)) as served:
            held = await idle(served.port, 1100)
            await eventually(
                lambda: served.stats.accepted + served.stats.refused >= 1100, "every one judged"
            )
            answered = await honest_gets(f"{served.address}/ice?service=turn", 20)
            assert answered == 20, f"honest GETs answered: {answered}/20"
            assert served.stats.refused >= 1100 - 256  # one source holds at most its cap
            close_all(held)

    run(main)


def test_at_nofile_300_idle_auth_connections_leave_the_cds_to_the_others(tmp_path: Path) -> None:
    """The real local-mode process (CDS and auth service in one), its descriptor limit lowered
    from outside to 300: what the process may hold for clients is 150, one source at most 75."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    prepare(manifests, free_port(), 9)
    cds_port, auth_port = free_port(), free_port()
    log = tmp_path / "reconciler.log"
    with reconciler(manifests, log, cds_port, auth_port) as proc:
        cds = f"http://127.0.0.1:{cds_port}/api/v1/configs/{GATEWAY_ID}"
        until(lambda: asyncio.run(honest_gets(cds, 1)) == 1, proc, "first config")
        limits = resource.prlimit(proc.pid, resource.RLIMIT_NOFILE)
        resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (300, limits[1]))

        async def main() -> int:
            held = await idle(auth_port, 1100)
            # The first ones are taken (and closed at the 10 s request deadline), those past a
            # cap closed at once: 950 of them at least (1,100 less the process's 150).
            closing = [asyncio.ensure_future(closed_by_server(r, 8.0)) for r, _ in held]
            await eventually(lambda: sum(t.done() for t in closing) >= 950, "the refusals")
            answered = await honest_gets(cds, 20)
            close_all(held)
            await asyncio.gather(*closing)
            return answered

        try:
            answered = asyncio.run(main())
        finally:
            resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, limits)
        assert answered == 20, f"honest CDS GETs answered: {answered}/20"
        assert proc.poll() is None


# --- the CDS with its token check -------------------------------------------------------------


def jwt(claims: Mapping[str, Any]) -> str:
    """A JWT-shaped token (unsigned: the review below decides)."""
    part = base64.urlsafe_b64encode(json.dumps(dict(claims)).encode()).decode().rstrip("=")
    return f"e30.{part}.sig"


VALID = jwt({"aud": [CDS_TOKEN_AUDIENCE], "exp": time.time() + 3600, "sub": "valid"})
FORGED = jwt({"aud": [CDS_TOKEN_AUDIENCE], "exp": time.time() + 3600, "sub": "forged"})


def review(token: str) -> Mapping[str, Any]:
    """The API server's TokenReview: VALID is ns1's default ServiceAccount, nothing else is."""
    if token != VALID:
        return {"authenticated": False}
    return {
        "authenticated": True,
        "audiences": [CDS_TOKEN_AUDIENCE],
        "user": {"username": "system:serviceaccount:ns1:default"},
    }


@contextlib.asynccontextmanager
async def guarded_cds(**limits: Any) -> AsyncIterator[tuple[ConfigStore, Served]]:
    store = ConfigStore()
    store.set(ID, make_config(ID))
    access = Access(TokenVerifier(review), account_of=lambda id: "default")
    app = cds_app(store, access=access.middleware)
    app[LIMITS_KEY] = dataclasses.replace(app[LIMITS_KEY], **limits)
    async with serve(app) as served:
        yield store, served


@contextlib.asynccontextmanager
async def watch(served: Served, token: str) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    connector = aiohttp.TCPConnector(local_addr=(HONEST, 0))
    url = f"{served.address}/api/v1/configs/{ID}?watch=true"
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.ws_connect(url, headers={"Authorization": f"Bearer {token}"}) as ws,
    ):
        yield ws


def test_a_valid_token_is_served_when_connections_without_one_fill_the_cds() -> None:
    async def main() -> None:
        async with guarded_cds(max_connections=8) as (store, served):
            config = f"{served.address}/api/v1/configs/{ID}"
            # Idle connections fill the server: a newcomer evicts the oldest of them.
            held = await idle(served.port, 4) + await idle(served.port, 4, OTHER_ATTACKER)
            await eventually(lambda: served.stats.open == 8, "the CDS full")
            assert await honest_gets(config, 5, VALID) == 5
            assert served.stats.evicted == 1  # one place made, freed again after each answer
            # Its watch is proven: newcomers without a token evict each other, never it.
            async with watch(served, VALID) as ws:
                first = json.loads((await ws.receive(STEP)).data)
                assert first["admin"]["name"] == ID
                evicted = served.stats.evicted
                held += await idle(served.port, 4) + await idle(served.port, 4, OTHER_ATTACKER)
                await eventually(lambda: served.stats.evicted == evicted + 8, "newcomers evicting")
                store.set(ID, make_config(ID, realm="after.example"))
                update = json.loads((await ws.receive(STEP)).data)
                assert update["auth"]["realm"] == "after.example"
            # A request refused as unauthenticated: answered 401, its connection closed.
            reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
            writer.write(
                f"GET /api/v1/configs/{ID} HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {FORGED}\r\n\r\n".encode()
            )
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 401")
            assert await closed_by_server(reader, STEP)  # not kept alive for its deadline
            writer.close()
            close_all(held)

    run(main)


def test_a_valid_token_is_served_when_its_own_source_is_at_its_cap() -> None:
    """A node's address shared by host-network pods: the honest one evicts the oldest
    unproven connection of that source."""

    async def main() -> None:
        async with guarded_cds(connections_per_source=4) as (_, served):
            held = await idle(served.port, 4, HONEST)
            await eventually(lambda: served.stats.open == 4, "the source at its cap")
            config = f"{served.address}/api/v1/configs/{ID}"
            assert await honest_gets(config, 3, VALID) == 3
            assert (served.stats.evicted, served.stats.refused) == (1, 0)
            held += await idle(served.port, 1, OTHER_ATTACKER)  # another source: room
            await eventually(lambda: served.stats.accepted == 4 + 3 + 1, "it accepted")
            assert served.stats.evicted == 1
            close_all(held)

    run(main)


def test_without_the_token_check_the_cds_evicts_nothing() -> None:
    async def main() -> None:
        store = ConfigStore()
        app = cds_app(store)
        app[LIMITS_KEY] = dataclasses.replace(CDS_LIMITS, max_connections=4)
        async with serve(app) as served:
            held = await idle(served.port, 4)
            await eventually(lambda: served.stats.open == 4, "the CDS full")
            assert await honest_gets(f"{served.address}/api/v1/configs", 1) == 0
            assert served.stats.evicted == 0 and served.stats.refused >= 1
            close_all(held)

    run(main)


# --- the pure core ----------------------------------------------------------------------------


def test_admission_evicts_the_oldest_unproven_of_the_source_at_its_cap() -> None:
    process = Holdings()
    admission: Admission[str] = Admission(4, 2, process, evict_unproven=True)
    for name, source in (("a1", "A"), ("b1", "B"), ("a2", "A")):
        assert admission.no_room(source, 100) is None
        admission.add(name, source)
    assert admission.no_room("A", 100) == "its source is at its cap"
    assert admission.victim("A", 100) == "a1"
    admission.prove("a1")
    assert admission.victim("A", 100) == "a2"
    admission.prove("a2")
    assert admission.victim("A", 100) is None  # a proven connection is never evicted
    admission.add("b2", "B")
    assert admission.no_room("C", 100) == "the server is at its cap"
    assert admission.victim("C", 100) == "b1"  # the oldest unproven of any source
    admission.remove("b1")
    admission.remove("b1")  # idempotent
    assert (admission.held.open, process.open, process.by_source) == (3, 3, {"A": 2, "B": 1})
    # The process: one source holds at most half of its cap, whichever servers it talks to.
    other: Admission[str] = Admission(100, 100, process)
    assert other.no_room("A", 4) == "its source is at its cap"
    assert other.no_room("C", 3) == "the process is at its cap"
    assert other.victim("C", 3) is None  # no eviction where the app proves nobody
    assert source_share(300 - 150) == 75
