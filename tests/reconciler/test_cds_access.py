"""Only a Gateway's own dataplane reads its config from the CDS (issue 20 #5).

Cluster mode against the fake API server, whose TokenReview answers as kube-apiserver does for
the tokens it issued (tests/support/fakeapi.py): a stunnerd's projected token (the ServiceAccount
of its Gateway's Deployment, the CDS's audience) reads that Gateway's config and nothing else,
over GET and over a watch; no token, a token of another audience or one the API server did not
issue is 401; another Gateway's id is 403; the reader accounts (--cds-readers) list everything;
the lists hold only what the caller may read; a Dataplane's serviceAccountName moves the right to
its account; TokenReviews are cached (one per token, not per request); a TokenReview that cannot
be asked is 503; each refusal is counted and no token reaches a log line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from reconciler.cds_access import Account, AuthMode, TokenVerifier
from reconciler.cluster import Running
from reconciler.kube.api import Api
from stunner_api.vocabulary import CDS_TOKEN_AUDIENCE
from tests.reconciler import clusterkit as k
from tests.support.fakeapi import API_AUDIENCE, FakeApiServer

OTHER = "other"  # a second namespace, with a Gateway of its own
READER = Account("stunner-system", "stunner-config-reader")


@dataclass
class Answer:
    status: int
    body: Any
    headers: dict[str, str]


async def get(address: str, path: str, token: str | None = None, header: str = "") -> Answer:
    headers = {header or "Authorization": f"Bearer {token}"} if token is not None else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(address + path, headers=headers) as r,
    ):
        text = await r.text()
        return Answer(r.status, json.loads(text), dict(r.headers))


def ids(answer: Answer) -> list[str]:
    assert answer.status == 200, answer.body
    return [item["admin"]["name"] for item in answer.body["items"]]


def world(fake: FakeApiServer) -> None:
    k.world(fake, k.gateway(name="gw2", namespace=OTHER))


async def rendered(running: Running) -> None:
    await k.eventually(
        lambda: {"stunner/gw", f"{OTHER}/gw2"} <= set(running.mode.store.configs),
        what="both configs rendered",
    )


def cds_token(fake: FakeApiServer, namespace: str, account: str) -> str:
    """What the kubelet writes into a stunnerd pod's projected volume."""
    return fake.issue_token(namespace, account, (CDS_TOKEN_AUDIENCE,))


def test_a_dataplane_reads_its_own_gateways_config_and_nothing_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    async def main() -> None:
        with FakeApiServer() as fake:
            world(fake)
            async with k.reconciler(fake, tmp_path, cds_readers=frozenset({READER})) as running:
                await rendered(running)
                cds = running.cds_address
                own = cds_token(fake, k.NS, "default")
                answer = await get(cds, "/api/v1/configs/stunner/gw", own)
                assert answer.status == 200 and answer.body["admin"]["name"] == "stunner/gw"
                # The password is in it: that is what this guards.
                assert answer.body["auth"]["credentials"]["password"] == "pass-word"
                # Another Gateway's config: 403, and the same for one that does not exist.
                refused = await get(cds, f"/api/v1/configs/{OTHER}/gw2", own)
                assert refused.status == 403, refused.body
                assert "stunner/default may not read config other/gw2" in refused.body["message"]
                assert (await get(cds, f"/api/v1/configs/{OTHER}/nope", own)).status == 403
                assert (await get(cds, "/api/v1/configs/stunner/nope", own)).status == 404
                # The lists hold only what the caller may read.
                assert ids(await get(cds, "/api/v1/configs", own)) == ["stunner/gw"]
                assert ids(await get(cds, f"/api/v1/configs/{OTHER}", own)) == []
                theirs = cds_token(fake, OTHER, "default")
                assert ids(await get(cds, "/api/v1/configs", theirs)) == [f"{OTHER}/gw2"]
                # The reader account lists everything, in either header.
                reader = cds_token(fake, READER.namespace, READER.name)
                everything = ["other/gw2", "stunner/gw"]
                assert ids(await get(cds, "/api/v1/configs", reader)) == everything
                assert (
                    ids(await get(cds, "/api/v1/configs", reader, "X-Stunner-Authorization"))
                    == everything
                )
                # Any other account of the namespace is not the Deployment's: 403.
                stranger = cds_token(fake, k.NS, "app")
                assert (await get(cds, "/api/v1/configs/stunner/gw", stranger)).status == 403
                # No token, a token for the API server, a token nobody issued: 401.
                for token in (None, fake.issue_token(k.NS, "default"), own[:-4] + "AAAA"):
                    unauthenticated = await get(cds, "/api/v1/configs/stunner/gw", token)
                    assert unauthenticated.status == 401, token
                    assert unauthenticated.headers["WWW-Authenticate"].startswith("Bearer")
                    assert "password" not in json.dumps(unauthenticated.body)
                metrics = await running_metrics(running)
                assert 'stunner_reconciler_cds_refusals_total{reason="forbidden"} 3.0' in metrics
                assert (
                    'stunner_reconciler_cds_refusals_total{reason="unauthenticated"} 3.0' in metrics
                )
                tokens = (own, theirs, reader, stranger)
        assert all(t not in r.getMessage() for t in tokens for r in caplog.records)
        assert any("refused (forbidden)" in r.getMessage() for r in caplog.records)

    asyncio.run(main())


async def running_metrics(running: Running) -> str:
    assert running.metrics_address is not None
    async with (
        aiohttp.ClientSession() as session,
        session.get(running.metrics_address + "/metrics") as r,
    ):
        return await r.text()


def test_the_dataplanes_service_account_is_the_one_that_reads(tmp_path: Path) -> None:
    """Dataplane.spec.serviceAccountName: the pods run as it, and the namespace's default
    account (every other pod's) no longer reads the config; a watcher of the default account
    gets no config from then on."""

    async def main() -> None:
        with FakeApiServer() as fake:
            world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await rendered(running)
                cds = running.cds_address
                default = cds_token(fake, k.NS, "default")
                assert (await get(cds, "/api/v1/configs/stunner/gw", default)).status == 200
                frames: list[str] = []
                url = cds.replace("http://", "ws://") + "/api/v1/configs?watch=true"
                headers = {"Authorization": f"Bearer {default}"}
                async with (
                    aiohttp.ClientSession() as session,
                    session.ws_connect(url, headers=headers) as ws,
                ):
                    first = await asyncio.wait_for(ws.receive(), 5)
                    frames.append(json.loads(first.data)["admin"]["name"])
                    k.update(
                        fake,
                        "stunner.l7mp.io/v1",
                        "Dataplane",
                        "default",
                        lambda dp: dp["spec"].__setitem__("serviceAccountName", "stunnerd"),
                        ns="",
                    )
                    deployment = await k.eventually(
                        lambda: (
                            (d := k.get(fake, "apps/v1", "Deployment", "gw"))
                            and d["spec"]["template"]["spec"].get("serviceAccountName")
                        ),
                        what="the Deployment runs as stunnerd",
                    )
                    assert deployment == "stunnerd"
                    # The other namespace's Gateway changes: no frame for this watcher either.
                    k.update(
                        fake,
                        k.GW,
                        "Gateway",
                        "gw2",
                        lambda gw: gw["spec"]["listeners"][0].__setitem__("port", 3479),
                        ns=OTHER,
                    )
                    with pytest.raises(TimeoutError):
                        extra = await asyncio.wait_for(ws.receive(), 1.0)
                        frames.append(str(extra.data))
                assert frames == ["stunner/gw"]
                assert (await get(cds, "/api/v1/configs/stunner/gw", default)).status == 403
                own = cds_token(fake, k.NS, "stunnerd")
                assert (await get(cds, "/api/v1/configs/stunner/gw", own)).status == 200

    asyncio.run(main())


def test_token_reviews_are_cached_and_a_failed_review_is_503(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await rendered(running)
                cds = running.cds_address
                own = cds_token(fake, k.NS, "default")
                before = fake.token_reviews
                answers = await asyncio.gather(
                    *(get(cds, "/api/v1/configs/stunner/gw", own) for _ in range(20))
                )
                assert {a.status for a in answers} == {200}
                assert fake.token_reviews - before == 1  # one review for 20 requests
                # A refused token is remembered too (for a while): no review per retry.
                bogus = own[:-4] + "AAAA"
                for _ in range(5):
                    assert (await get(cds, "/api/v1/configs/stunner/gw", bogus)).status == 401
                assert fake.token_reviews - before == 2
                # Not a JWT, or a JWT for the API server: refused without asking at all.
                for unasked in ("garbage", fake.issue_token(k.NS, "default")):
                    assert (await get(cds, "/api/v1/configs/stunner/gw", unasked)).status == 401
                assert fake.token_reviews - before == 2
                # The API server refuses the review (RBAC): 503, nothing cached.
                fake.forbid("authentication.k8s.io", "tokenreviews")
                fresh = cds_token(fake, k.NS, "default")
                unavailable = await get(cds, "/api/v1/configs/stunner/gw", fresh)
                assert unavailable.status == 503
                assert "cannot verify the token now: 403" in unavailable.body["message"]
                fake.forbidden.clear()
                assert (await get(cds, "/api/v1/configs/stunner/gw", fresh)).status == 200

    asyncio.run(main())


def test_cds_auth_off_serves_everyone(tmp_path: Path) -> None:
    """--cds-auth=off: Go's behaviour, for a cluster that has not rolled its dataplanes yet."""

    async def main() -> None:
        with FakeApiServer() as fake:
            world(fake)
            async with k.reconciler(fake, tmp_path, cds_auth=AuthMode.OFF) as running:
                await rendered(running)
                assert ids(await get(running.cds_address, "/api/v1/configs")) == [
                    "other/gw2",
                    "stunner/gw",
                ]
                assert fake.token_reviews == 0

    asyncio.run(main())


def test_the_fake_api_servers_tokens_are_audience_bound() -> None:
    """The fake's TokenReview answers as kube-apiserver does: a token authenticates only for an
    audience it was issued for (none asked: the API server's own)."""
    with FakeApiServer() as fake:
        ours = cds_token(fake, k.NS, "default")
        assert fake.review_token({"spec": {"token": ours, "audiences": [CDS_TOKEN_AUDIENCE]}})[
            "status"
        ]["audiences"] == [CDS_TOKEN_AUDIENCE]
        assert "authenticated" not in fake.review_token({"spec": {"token": ours}})["status"]
        api = fake.issue_token(k.NS, "default")
        review = fake.review_token({"spec": {"token": api, "audiences": [API_AUDIENCE]}})
        assert review["status"]["user"]["username"] == "system:serviceaccount:stunner:default"


def test_a_cached_answer_lives_until_the_tokens_expiry_or_five_minutes() -> None:
    """The cache's clock is the verifier's own (here a hand-moved one): a verified token is
    asked again after min(its exp, 5 min), a refused one after 10 s, an expired one not at all;
    a revoked token (its pod deleted) is thus refused at the latest 5 min later."""

    async def main() -> None:
        with FakeApiServer() as fake:
            api = Api(fake.api_client())
            now = [1000.0]
            wall = time.time()
            verifier = TokenVerifier(
                lambda t: api.review_token(t, (CDS_TOKEN_AUDIENCE,)),
                clock=lambda: now[0],
                wall_clock=lambda: wall + now[0] - 1000.0,
            )
            long = fake.issue_token(k.NS, "default", (CDS_TOKEN_AUDIENCE,), seconds=3600)
            short = fake.issue_token(k.NS, "default", (CDS_TOKEN_AUDIENCE,), seconds=60)
            bogus = long[:-4] + "AAAA"
            for t in (long, short, bogus):
                await verifier.account(t)
            assert verifier.reviews == 3
            now[0] += 9
            for t in (long, short, bogus):
                await verifier.account(t)
            assert verifier.reviews == 3  # all three cached
            now[0] += 2  # 11 s: the refused one is asked again
            assert await verifier.account(bogus) is None and verifier.reviews == 4
            now[0] += 50  # 61 s: past the short token's exp
            assert await verifier.account(long) == Account(k.NS, "default")
            assert verifier.reviews == 4
            # Expired by its own claim: refused without asking.
            assert await verifier.account(short) is None and verifier.reviews == 4
            fake.revoke_token(long)
            now[0] += 240  # 301 s: the long token's answer is stale
            assert await verifier.account(long) is None and verifier.reviews == 5
            api.close()

    asyncio.run(main())


def test_local_mode_refuses_cds_auth_required(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from reconciler.__main__ import main

    assert main(["--manifests", str(tmp_path), "--cds-auth=required"]) == 2
    assert "needs cluster mode" in capsys.readouterr().err
