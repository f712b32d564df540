"""Sessions across pods (issue 29): three real stunnerd processes, started as the chart starts
them (`stunnerd -w -c http://CDS`), watch one Gateway's config on one real CDS server
(reconciler.cds.server) with TURN REST (ephemeral) credentials, each pod on its own loopback
address, and real TURN clients (the raw client: it refreshes after the end) allocate over UDP
and TCP.

We test: GET /api/v1/sessions/NS/GW lists exactly the allocations made, on the pods they were
made on, with their user ids, relay addresses, peers, channels and (Python path) counters, and no
password nor full username appears; POST .../disconnect?user=U ends that user's allocations on
every pod within a second (measured loosely, around the request) and a Refresh on them is then
answered 437, while another user's allocation lives on; ?allocation=ID ends exactly that one;
the CDS logs who asked and what ended.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from reconciler.cds.access import Access, Account, TokenVerifier
from reconciler.kube.api import Api
from stunner_api.dataplane_load import load_config
from stunner_api.ice import ephemeral_password, ephemeral_username
from stunner_api.sessions import DISCONNECT_PATH, FIELDS, OPTIONAL_FIELDS, SESSIONS_PATH
from stunner_api.vocabulary import CDS_TOKEN_AUDIENCE
from stunner_cli.__main__ import main as stunner
from tests.cds_server import run_cds_server
from tests.support.fakeapi import FakeApiServer
from tests.support.objects import cds_service
from tests.support.turnclient import REALM, SECRET, RawClient, RawTcpClient, free_port, start_peer
from tests.support.turnclient import error_code as raw_error_code

from .conftest import StartStunnerd

ID = "testns/gw"
PODS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
CAP = 64_000_000  # bits per second each way, per allocation: shown by `sessions`, never reached


def config_text(port: int) -> str:
    listeners = [
        {
            "name": f"{ID}/{p.lower()}",
            "protocol": p,
            "address": "$STUNNER_ADDR",
            "port": port,
            "routes": ["testns/backend"],
        }
        for p in ("TURN-UDP", "TURN-TCP")
    ]
    text = {
        "version": "v1",
        "admin": {"name": ID, "loglevel": "all:INFO", "healthcheck_endpoint": ""},
        "auth": {
            "type": "ephemeral",
            "realm": REALM,
            "credentials": {"secret": SECRET},
            "allocation_bandwidth_limit": CAP,
        },
        "listeners": listeners,
        "clusters": [{"name": "testns/backend", "type": "STATIC", "endpoints": ["127.0.0.0/8"]}],
    }
    load_config(json.dumps(text))  # valid
    return json.dumps(text)


def credentials(user: str, ttl: int = 3600) -> dict[str, str]:
    username = ephemeral_username(int(time.time()) + ttl, user)
    return {"username": username, "password": ephemeral_password(SECRET, username)}


async def wait_for(
    predicate: Callable[[], Awaitable[bool]], timeout: float = 20.0, every: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(every)


async def _true(value: bool) -> bool:
    return value


async def sessions(address: str) -> dict[str, Any]:
    """The CDS's listing (asked again past its rate limit, 429)."""
    url = address + SESSIONS_PATH.format(namespace="testns", name="gw")
    while True:
        async with aiohttp.ClientSession() as http, http.get(url) as answer:
            if answer.status == 429:
                await asyncio.sleep(0.1)
                continue
            assert answer.status == 200, await answer.text()
            body: dict[str, Any] = await answer.json()
            return body


async def disconnect(address: str, **query: str) -> tuple[dict[str, Any], float]:
    """POST disconnect; its answer and how long it took."""
    url = address + DISCONNECT_PATH.format(namespace="testns", name="gw")
    url += "?" + urllib.parse.urlencode(query)
    while True:
        started = time.monotonic()
        async with aiohttp.ClientSession() as http, http.post(url) as answer:
            if answer.status == 429:
                await asyncio.sleep(0.1)
                continue
            assert answer.status == 200, await answer.text()
            body: dict[str, Any] = await answer.json()
        return body, time.monotonic() - started


async def allocated(client: RawClient) -> tuple[str, int]:
    response = await client.allocate()
    assert raw_error_code(response) is None, response.attributes
    relay: tuple[str, int] = response.attributes["XOR-RELAYED-ADDRESS"]
    return relay


def test_sessions_are_listed_and_ended_across_pods(
    stunnerd: StartStunnerd, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="stunner.cds-server")

    async def main() -> None:
        port = free_port()
        peer = await start_peer()
        alice, bob = credentials("alice"), credentials("bob")
        async with run_cds_server() as cds:
            cds.set_config(ID, config_text(port))
            pods = [
                stunnerd(
                    *("-w", "-c", cds.address, "-i", ID),
                    env={"STUNNER_ADDR": pod, "STUNNER_NODENAME": "", "HOSTNAME": f"pod-{i}"},
                )
                for i, pod in enumerate(PODS)
            ]
            await wait_for(lambda: _true(len(cds.store.answering(ID)) == 3))
            # alice on pods 0 (UDP) and 1 (TCP), bob on pod 2 (UDP)
            clients: list[RawClient] = [
                await RawClient.connect((PODS[0], port), **alice),
                await RawTcpClient.connect((PODS[1], port), **alice),
                await RawClient.connect((PODS[2], port), **bob),
            ]
            for client in clients:
                await wait_for(lambda c=client: _serving(c))  # type: ignore[misc]
            relays = [await allocated(c) for c in clients]
            first = clients[0]
            assert raw_error_code(await first.create_permission(("127.0.0.1", peer.port))) is None
            assert (
                raw_error_code(await first.channel_bind(0x4000, ("127.0.0.1", peer.port))) is None
            )
            for _ in range(3):
                first.send_indication(("127.0.0.1", peer.port), b"hello")
            await asyncio.wait_for(first.channel_data.get(), 5)  # the peer echoed (channel 0x4000)

            listed = await sessions(cds.address)
            assert listed["pods"] == ["pod-0", "pod-1", "pod-2"] and listed["silent"] == []
            got = sorted(
                (s["pod"], s["user"], s["transport"], s["relay"]) for s in listed["sessions"]
            )
            want = sorted(
                [
                    ("pod-0", "alice", "TURN-UDP", f"{relays[0][0]}:{relays[0][1]}"),
                    ("pod-1", "alice", "TURN-TCP", f"{relays[1][0]}:{relays[1][1]}"),
                    ("pod-2", "bob", "TURN-UDP", f"{relays[2][0]}:{relays[2][1]}"),
                ]
            )
            assert got == want
            for session in listed["sessions"]:
                assert list(session) == [*FIELDS, *OPTIONAL_FIELDS]
                assert session["bandwidthLimit"] == CAP
                assert 0 < session["lifetime"] <= 600
            (on_first,) = [s for s in listed["sessions"] if s["pod"] == "pod-0"]
            assert on_first["peers"] == ["127.0.0.1"]
            assert on_first["channels"] == {"16384": f"127.0.0.1:{peer.port}"}
            assert first.transport is not None
            client_port = first.transport.get_extra_info("sockname")[1]
            assert on_first["client"] == f"127.0.0.1:{client_port}"
            # what it relayed: 3 Send indications of 5 bytes, the echo of at least one back
            # (the native engine's count, or Python's: whichever relayed them)
            assert on_first["rxPackets"] == 3 and on_first["rxBytes"] == 15
            assert on_first["txPackets"] >= 1 and on_first["txBytes"] >= 5
            text = json.dumps(listed)
            for secret in (alice["password"], bob["password"], alice["username"], SECRET):
                assert secret not in text

            # disconnect alice: gone from both pods within a second, and 437 afterwards
            ended, took = await disconnect(cds.address, user="alice")
            assert took < 1.0, took
            assert sorted(s["pod"] for s in ended["sessions"]) == ["pod-0", "pod-1"]
            for client in clients[:2]:
                response = await client.refresh(600)
                assert raw_error_code(response) == 437, response.attributes
            listed = await sessions(cds.address)
            assert [(s["pod"], s["user"]) for s in listed["sessions"]] == [("pod-2", "bob")]
            assert any(
                "disconnect asked by" in r.message and "ended 2 allocation(s)" in r.message
                for r in caplog.records
            ), caplog.text

            # by allocation id: exactly that one
            (bobs,) = listed["sessions"]
            ended, took = await disconnect(cds.address, allocation=bobs["id"])
            assert [s["id"] for s in ended["sessions"]] == [bobs["id"]] and took < 1.0
            assert raw_error_code(await clients[2].refresh(600)) == 437
            assert (await sessions(cds.address))["sessions"] == []
            for client in clients:
                client.close()
            for process in pods:
                log = await asyncio.to_thread(process.stop, at_once=True)
                assert "ended: ended by the CDS" in log
                for secret in (alice["password"], bob["password"]):
                    assert secret not in log
        peer.close()

    asyncio.run(main())


async def _serving(client: RawClient) -> bool:
    """The pod answers a Binding (it runs its config)."""
    from stunner_api.stun import Class, Message, Method

    try:
        await client.request(Message(Method.BINDING, Class.REQUEST), sign=False, timeout=0.5)
    except TimeoutError:
        return False
    return True


SYSTEM = "stunner-system"
READER = "stunner-config-reader"


def test_the_cli_lists_and_ends_sessions_through_the_api_servers_proxy(
    stunnerd: StartStunnerd,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`stunner sessions` and `stunner disconnect` as the chart's reader account, through the
    (fake) API server's service proxy to a CDS that checks tokens; two stunnerd pods show their
    pods' bound tokens, so the CDS names each pod by its token (not its HOSTNAME); a pod's own
    token may not list sessions (403)."""
    caplog.set_level(logging.INFO, logger="stunner.cds-server")

    async def main() -> None:
        port = free_port()
        alice = credentials("alice")
        with FakeApiServer() as fake:
            api = Api(fake.api_client())
            access = Access(
                TokenVerifier(lambda token: api.review_token(token, (CDS_TOKEN_AUDIENCE,))),
                readers={Account(SYSTEM, READER)},
                account_of=lambda id: "default",
            )
            for obj in (
                cds_service(SYSTEM),
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": READER}},
            ):
                obj["metadata"]["namespace"] = SYSTEM  # type: ignore[index]
                fake.seed(obj)
            fake.seed(
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": "default", "namespace": "testns"},
                }
            )
            for pod in ("gw-a", "gw-b"):
                fake.seed(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {"name": pod, "namespace": "testns"},
                    }
                )
            kube = ["--kubeconfig", str(fake.write_kubeconfig(tmp_path / "kubeconfig"))]
            async with run_cds_server(access=access.middleware) as cds:
                host, _, cds_port = cds.address.removeprefix("http://").rpartition(":")
                fake.proxy(
                    SYSTEM, "services", "stunner-config-discovery", 13478, (host, int(cds_port))
                )
                cds.set_config(ID, config_text(port))
                pods = []
                for name, address in (("gw-a", PODS[0]), ("gw-b", PODS[1])):
                    token = tmp_path / f"{name}.token"
                    token.write_text(
                        fake.issue_token("testns", "default", (CDS_TOKEN_AUDIENCE,), pod=name)
                    )
                    pods.append(
                        stunnerd(
                            *("-w", "-c", cds.address, "-i", ID),
                            env={
                                "STUNNER_ADDR": address,
                                "STUNNER_NODENAME": "",
                                "HOSTNAME": "liar",
                                "STUNNER_CDS_TOKEN_FILE": str(token),
                            },
                        )
                    )
                await wait_for(lambda: _true(len(cds.store.answering(ID)) == 2))
                clients = [
                    await RawClient.connect((PODS[0], port), **alice),
                    await RawTcpClient.connect((PODS[1], port), **alice),
                ]
                for client in clients:
                    await wait_for(lambda c=client: _serving(c))  # type: ignore[misc]
                    await allocated(client)
                # TURN-TCP (relayed by Python: counted per allocation) with a peer and a channel
                peer = await start_peer()
                tcp = clients[1]
                assert (
                    raw_error_code(await tcp.channel_bind(0x4000, ("127.0.0.1", peer.port))) is None
                )
                tcp.send_channel_data(0x4000, b"ping")
                await asyncio.wait_for(tcp.channel_data.get(), 5)  # echoed

                def cli(*args: str) -> tuple[int, str, str]:
                    code = stunner([*args, *kube])
                    captured = capsys.readouterr()
                    return code, captured.out, captured.err

                code, shown, _ = await asyncio.to_thread(cli, "sessions", "testns/gw", "-o", "json")
                assert code == 0, shown
                (answer,) = json.loads(shown)
                assert sorted(s["pod"] for s in answer["sessions"]) == ["gw-a", "gw-b"]
                (over_tcp,) = [s for s in answer["sessions"] if s["transport"] == "TURN-TCP"]
                assert over_tcp["rxPackets"] == 1 and over_tcp["rxBytes"] == 4
                assert over_tcp["txPackets"] == 1 and over_tcp["txBytes"] == 4
                assert over_tcp["channels"] == {"16384": f"127.0.0.1:{peer.port}"}
                assert over_tcp["bandwidthLimit"] == CAP
                assert alice["password"] not in shown and alice["username"] not in shown
                code, table, _ = await asyncio.to_thread(cli, "sessions", "--user", "alice")
                assert code == 0 and table.count(" alice ") == 2, table
                assert table.splitlines()[0].split()[-2:] == ["CAP", "ID"], table
                assert table.count("  64Mbps  ") == 2, table
                print("\n" + table, file=sys.__stderr__)  # the README's example
                code, table, _ = await asyncio.to_thread(cli, "sessions", "--user", "bob")
                assert code == 0 and table.strip() == "no allocations", table

                # A pod's own token reads its config, but not the sessions.
                url = cds.address + SESSIONS_PATH.format(namespace="testns", name="gw")
                own = (tmp_path / "gw-a.token").read_text()
                async with (
                    aiohttp.ClientSession() as http,
                    http.get(url, headers={"Authorization": f"Bearer {own}"}) as refused,
                ):
                    assert refused.status == 403, await refused.text()

                started = time.monotonic()
                code, ended, error = await asyncio.to_thread(
                    cli, "disconnect", "testns/gw", "--user", "alice"
                )
                assert code == 0, error
                assert "2 allocation(s) ended on 2 pod(s)" in ended, ended
                print("\n" + ended, file=sys.__stderr__)  # the README's example
                for client in clients:
                    assert raw_error_code(await client.refresh(600)) == 437
                assert time.monotonic() - started < 10  # the CLI's own start-up included
                assert any(
                    f"disconnect asked by {SYSTEM}/{READER} for {ID}" in r.message
                    for r in caplog.records
                ), caplog.text
                code, _, error = await asyncio.to_thread(cli, "disconnect", "testns")
                assert code != 0
                for client in clients:
                    client.close()
                peer.close()
                for process in pods:
                    log = await asyncio.to_thread(process.stop, at_once=True)
                    assert alice["password"] not in log
            api.close()

    asyncio.run(main())


def test_revoked_users_and_strict_expiry_end_allocations_on_every_pod(
    stunnerd: StartStunnerd,
) -> None:
    """auth.revoked_users (the GatewayConfig's revokedUsers): a config naming alice ends her
    allocations on every pod within about a second of its publication, and her new Allocates
    get 403 everywhere, while bob's allocation lives on. auth.strict_expiry: an allocation of a
    credential that expires in a few seconds is gone within about a second of its expiry, even
    though the client asked for, and was granted, a longer lifetime first."""

    async def main() -> None:
        port = free_port()
        alice, bob = credentials("alice"), credentials("bob")
        async with run_cds_server() as cds:
            text = json.loads(config_text(port))
            cds.set_config(ID, json.dumps(text))
            pods = [
                stunnerd(
                    *("-w", "-c", cds.address, "-i", ID),
                    env={"STUNNER_ADDR": pod, "STUNNER_NODENAME": "", "HOSTNAME": f"pod-{i}"},
                )
                for i, pod in enumerate(PODS)
            ]
            await wait_for(lambda: _true(len(cds.store.answering(ID)) == 3))
            clients = [
                await RawClient.connect((PODS[0], port), **alice),
                await RawTcpClient.connect((PODS[1], port), **alice),
                await RawClient.connect((PODS[2], port), **bob),
            ]
            for client in clients:
                await wait_for(lambda c=client: _serving(c))  # type: ignore[misc]
                await allocated(client)

            text["auth"]["revoked_users"] = ["alice"]
            cds.set_config(ID, json.dumps(text))
            published = time.monotonic()

            async def alices_gone() -> bool:
                listed = await sessions(cds.address)
                return [s["user"] for s in listed["sessions"]] == ["bob"]

            await wait_for(alices_gone)
            took = time.monotonic() - published
            assert took < 1.5, took  # within a second, loosely (a busy machine)
            for client in clients[:2]:
                assert raw_error_code(await client.refresh(600)) == 437
            for pod in PODS:
                again = await RawClient.connect((pod, port), **credentials("alice"))
                response = await again.allocate()
                assert raw_error_code(response) == 403, response.attributes
                again.close()
            assert raw_error_code(await clients[2].refresh(600)) is None  # bob's lives on

            # Strict expiry: a credential with a few seconds left.
            text["auth"]["strict_expiry"] = True
            cds.set_config(ID, json.dumps(text))
            expiring = credentials("carol", ttl=4)
            expiry = float(expiring["username"].partition(":")[0])
            carol = await RawClient.connect((PODS[0], port), **expiring)
            await wait_for(lambda: _strict(cds.address))
            response = await carol.allocate(LIFETIME=3600)
            assert raw_error_code(response) is None, response.attributes
            assert response.attributes["LIFETIME"] <= 4
            refreshed = await carol.refresh(3600)  # granted no longer than the credential
            assert raw_error_code(refreshed) is None and refreshed.attributes["LIFETIME"] <= 4

            async def carols_gone() -> bool:
                listed = await sessions(cds.address)
                users = [s["user"] for s in listed["sessions"]]
                return len(listed["pods"]) == 3 and "carol" not in users

            await wait_for(carols_gone)
            late = time.time() - expiry
            assert late < 2.0, late  # within about a second of its timestamp, loosely
            # Its allocation is gone (437) while the credential still authenticates (through
            # its timestamp's second, as Go's), then a Refresh with it is refused (401).
            while time.time() < expiry + 1:
                assert raw_error_code(await carol.refresh(600)) == 437
                await asyncio.sleep(0.2)
            assert raw_error_code(await carol.refresh(600)) == 401
            for client in [*clients, carol]:
                client.close()
            for process in pods:
                log = await asyncio.to_thread(process.stop, at_once=True)
                if process is not pods[2]:
                    assert "ended: its user is revoked (auth.revoked_users)" in log

    asyncio.run(main())


async def _strict(address: str) -> bool:
    """Every pod runs the config with strict_expiry (the sessions answer: all three pods)."""
    listed = await sessions(address)
    return len(listed["pods"]) == 3
