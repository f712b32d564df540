"""Only a Gateway's own dataplane reads its config from the CDS (issue 20 #5).

Cluster mode against the fake API server, whose TokenReview answers as kube-apiserver does for
the tokens it issued (tests/support/fakeapi.py): a stunnerd's projected token (the ServiceAccount
rendered for its Gateway, `<gateway>-stunnerd`, the CDS's audience) reads that Gateway's config
and nothing else, over GET and over a watch; the namespace's `default` account reads nothing
(issue 28 #3); no token, a token of another audience or one the API server did not issue is 401;
another Gateway's id is 403; the reader accounts (--cds-readers) list everything; the lists hold
only what the caller may read; a Dataplane's serviceAccountName moves the right to its account;
TokenReviews are cached (one per token, not per request) for at most 10 s, and a revoked token
(its pod or ServiceAccount deleted) stops reading within that, its live watch closed too (issue
28 #8); a TokenReview that cannot be asked is 503; each refusal is counted and no token reaches a
log line.
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

from reconciler.cds.access import (
    MAX_TTL,
    Account,
    AuthMode,
    Lapse,
    ReviewUnavailable,
    TokenVerifier,
)
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


async def rendered(running: Running, fake: FakeApiServer, accounts: bool = True) -> None:
    """Both configs rendered, and (`accounts`) the accounts their pods run as created."""
    await k.eventually(
        lambda: {"stunner/gw", f"{OTHER}/gw2"} <= set(running.mode.store.configs),
        what="both configs rendered",
    )
    for namespace, name in ((k.NS, "gw-stunnerd"), (OTHER, "gw2-stunnerd")) if accounts else ():
        await k.eventually(
            lambda name=name, namespace=namespace: k.get(
                fake, "v1", "ServiceAccount", name, ns=namespace
            ),
            what=f"ServiceAccount {namespace}/{name}",
        )


def cds_token(fake: FakeApiServer, namespace: str, account: str) -> str:
    """What the kubelet writes into a stunnerd pod's projected volume."""
    return fake.issue_token(namespace, account, (CDS_TOKEN_AUDIENCE,))


def watch_url(running: Running, path: str = "/api/v1/configs") -> str:
    return running.cds_address.replace("http://", "ws://") + path + "?watch=true"


def test_a_dataplane_reads_its_own_gateways_config_and_nothing_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    async def main() -> None:
        with FakeApiServer() as fake:
            world(fake)
            async with k.reconciler(fake, tmp_path, cds_readers=frozenset({READER})) as running:
                await rendered(running, fake)
                cds = running.cds_address
                own = cds_token(fake, k.NS, "gw-stunnerd")
                answer = await get(cds, "/api/v1/configs/stunner/gw", own)
                assert answer.status == 200 and answer.body["admin"]["name"] == "stunner/gw"
                # The password is in it: that is what this guards.
                assert answer.body["auth"]["credentials"]["password"] == "pass-word"
                # Another Gateway's config: 403, and the same for one that does not exist.
                refused = await get(cds, f"/api/v1/configs/{OTHER}/gw2", own)
                assert refused.status == 403, refused.body
                message = "stunner/gw-stunnerd may not read config other/gw2"
                assert message in refused.body["message"]
                assert (await get(cds, f"/api/v1/configs/{OTHER}/nope", own)).status == 403
                assert (await get(cds, "/api/v1/configs/stunner/nope", own)).status == 403
                # A Gateway not rendered (yet): its own account's pods are told 404 (and a watch
                # waits for it), from the account's name alone.
                early = cds_token(fake, k.NS, "nope-stunnerd")
                assert (await get(cds, "/api/v1/configs/stunner/nope", early)).status == 404
                # The lists hold only what the caller may read.
                assert ids(await get(cds, "/api/v1/configs", own)) == ["stunner/gw"]
                assert ids(await get(cds, f"/api/v1/configs/{OTHER}", own)) == []
                theirs = cds_token(fake, OTHER, "gw2-stunnerd")
                assert ids(await get(cds, "/api/v1/configs", theirs)) == [f"{OTHER}/gw2"]
                # The reader account lists everything, in either header.
                reader = cds_token(fake, READER.namespace, READER.name)
                everything = ["other/gw2", "stunner/gw"]
                assert ids(await get(cds, "/api/v1/configs", reader)) == everything
                assert (
                    ids(await get(cds, "/api/v1/configs", reader, "X-Stunner-Authorization"))
                    == everything
                )
                # Any other account of the namespace is not the Gateway's: 403.
                stranger = cds_token(fake, k.NS, "app")
                assert (await get(cds, "/api/v1/configs/stunner/gw", stranger)).status == 403
                # No token, a token for the API server, a token nobody issued: 401.
                for token in (None, fake.issue_token(k.NS, "default"), own[:-4] + "AAAA"):
                    unauthenticated = await get(cds, "/api/v1/configs/stunner/gw", token)
                    assert unauthenticated.status == 401, token
                    assert unauthenticated.headers["WWW-Authenticate"].startswith("Bearer")
                    assert "password" not in json.dumps(unauthenticated.body)
                metrics = await running_metrics(running)
                assert 'stunner_reconciler_cds_refusals_total{reason="forbidden"} 4.0' in metrics
                assert (
                    'stunner_reconciler_cds_refusals_total{reason="unauthenticated"} 3.0' in metrics
                )
                tokens = (own, theirs, reader, stranger, early)
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


def test_the_namespaces_default_account_reads_no_config(tmp_path: Path) -> None:
    """Issue 28 #3: every pod of a namespace runs as its `default` account unless told
    otherwise, and the dataplanes used to as well, so any pod there read every Gateway's
    passwords and keys. The dataplanes run as their Gateway's own account now: `default`
    reads neither config, and its lists are empty."""

    async def main() -> None:
        with FakeApiServer() as fake:
            world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await rendered(running, fake, accounts=False)
                cds = running.cds_address
                for namespace in (k.NS, OTHER):
                    default = cds_token(fake, namespace, "default")
                    for gw in ("stunner/gw", f"{OTHER}/gw2"):
                        answer = await get(cds, f"/api/v1/configs/{gw}", default)
                        assert answer.status == 403, (namespace, gw, answer.body)
                        assert "pass-word" not in json.dumps(answer.body)
                    assert ids(await get(cds, "/api/v1/configs", default)) == []
                    assert ids(await get(cds, f"/api/v1/configs/{namespace}", default)) == []
                await rendered(running, fake)
                own = cds_token(fake, k.NS, "gw-stunnerd")
                assert ids(await get(cds, "/api/v1/configs", own)) == ["stunner/gw"]

    asyncio.run(main())


def test_the_dataplanes_service_account_is_the_one_that_reads(tmp_path: Path) -> None:
    """Dataplane.spec.serviceAccountName: the pods run as it and it reads the config; the account
    rendered before is deleted, so its token no longer authenticates and its live watch is
    closed. A watcher whose account still authenticates but may no longer read gets no config
    from then on."""

    async def main() -> None:
        with FakeApiServer() as fake:
            world(fake)
            async with k.reconciler(fake, tmp_path, cds_token_ttl=0.2) as running:
                await rendered(running, fake)
                cds = running.cds_address
                rendered_token = cds_token(fake, k.NS, "gw-stunnerd")
                headers = {"Authorization": f"Bearer {rendered_token}"}
                async with (
                    aiohttp.ClientSession() as session,
                    session.ws_connect(watch_url(running), headers=headers) as ws,
                ):
                    first = await asyncio.wait_for(ws.receive(), 5)
                    assert json.loads(first.data)["admin"]["name"] == "stunner/gw"
                    name_account(fake, "stunnerd")
                    await k.eventually(
                        lambda: runs_as(fake, "gw") == "stunnerd",
                        what="the Deployment runs as stunnerd",
                    )
                    await k.eventually(
                        lambda: k.get(fake, "v1", "ServiceAccount", "gw-stunnerd") is None,
                        what="the rendered account deleted",
                    )
                    closed = await asyncio.wait_for(ws.receive(), 10)
                    assert closed.type == aiohttp.WSMsgType.CLOSE, closed
                    assert closed.data == 1008 and "no longer authenticates" in closed.extra
                answer = await get(cds, "/api/v1/configs/stunner/gw", rendered_token)
                assert answer.status == 401
                assert (
                    await get(cds, "/api/v1/configs/stunner/gw", default_token(fake))
                ).status == 403
                named = cds_token(fake, k.NS, "stunnerd")
                assert (await get(cds, "/api/v1/configs/stunner/gw", named)).status == 200
                # The Dataplane names none again: `stunnerd` still authenticates, may no
                # longer read, and its watch gets nothing more.
                frames: list[str] = []
                headers = {"Authorization": f"Bearer {named}"}
                async with (
                    aiohttp.ClientSession() as session,
                    session.ws_connect(watch_url(running), headers=headers) as ws,
                ):
                    first = await asyncio.wait_for(ws.receive(), 5)
                    frames.append(json.loads(first.data)["admin"]["name"])
                    name_account(fake, None)
                    await k.eventually(
                        lambda: k.get(fake, "v1", "ServiceAccount", "gw-stunnerd"),
                        what="the account rendered again",
                    )
                    k.edit_gateway(fake, lambda gw: gw["spec"]["listeners"][0].update(port=3479))
                    with pytest.raises(TimeoutError):
                        extra = await asyncio.wait_for(ws.receive(), 1.0)
                        frames.append(str(extra.data))
                assert frames == ["stunner/gw"]

    asyncio.run(main())


def runs_as(fake: FakeApiServer, gw: str) -> str | None:
    """The account a Gateway's Deployment's pods run as (None: no Deployment)."""
    deployment = k.get(fake, "apps/v1", "Deployment", gw)
    return deployment["spec"]["template"]["spec"].get("serviceAccountName") if deployment else None


def name_account(fake: FakeApiServer, account: str | None) -> None:
    """Set (or, None, remove) the default Dataplane's serviceAccountName."""

    def change(dataplane: dict[str, Any]) -> None:
        if account is None:
            dataplane["spec"].pop("serviceAccountName", None)
        else:
            dataplane["spec"]["serviceAccountName"] = account

    k.update(fake, "stunner.l7mp.io/v1", "Dataplane", "default", change, ns="")


def default_token(fake: FakeApiServer) -> str:
    return cds_token(fake, k.NS, "default")


def test_a_revoked_tokens_watch_is_closed_and_it_reads_no_more(tmp_path: Path) -> None:
    """Issue 28 #8: a token whose pod is deleted stops authenticating at the API server; the
    CDS trusted its answer for 300 s, and a live watch was never asked about again. Now a watch
    is asked about each time the answer runs out (here every 0.2 s; 10 s by default): it stays
    open while the token is good and is closed (1008) once it is revoked, and the token reads
    nothing more; one whose token expires is closed with 1000. Each closing is counted."""

    async def main() -> None:
        with FakeApiServer() as fake:
            world(fake)
            async with k.reconciler(fake, tmp_path, cds_token_ttl=0.2) as running:
                await rendered(running, fake)
                token = cds_token(fake, k.NS, "gw-stunnerd")
                headers = {"Authorization": f"Bearer {token}"}
                url = watch_url(running, "/api/v1/configs/stunner/gw")
                async with (
                    aiohttp.ClientSession() as session,
                    session.ws_connect(url, headers=headers) as ws,
                ):
                    first = await asyncio.wait_for(ws.receive(), 5)
                    assert json.loads(first.data)["admin"]["name"] == "stunner/gw"
                    # Asked about again and again while good: the watch stays open.
                    before = fake.token_reviews
                    await k.eventually(lambda: fake.token_reviews >= before + 3, what="re-checks")
                    assert not ws.closed
                    fake.revoke_token(token)  # its pod is gone
                    closed = await asyncio.wait_for(ws.receive(), 10)
                    assert closed.type == aiohttp.WSMsgType.CLOSE, closed
                    assert closed.data == 1008
                    assert closed.extra == (
                        "the token of ServiceAccount stunner/gw-stunnerd no longer authenticates"
                    )
                answer = await get(running.cds_address, "/api/v1/configs/stunner/gw", token)
                assert answer.status == 401
                # A token that expires (the kubelet has rotated the pod's file by then): its
                # watch ends normally (1000), for stunnerd to reconnect at once with the new one.
                brief = fake.issue_token(k.NS, "gw-stunnerd", (CDS_TOKEN_AUDIENCE,), seconds=2)
                headers = {"Authorization": f"Bearer {brief}"}
                async with (
                    aiohttp.ClientSession() as session,
                    session.ws_connect(url, headers=headers) as ws,
                ):
                    await asyncio.wait_for(ws.receive(), 5)
                    closed = await asyncio.wait_for(ws.receive(), 10)
                    assert (closed.type, closed.data) == (aiohttp.WSMsgType.CLOSE, 1000)
                    assert closed.extra.endswith("stunner/gw-stunnerd expired")
                metrics = await running_metrics(running)
                assert 'stunner_reconciler_cds_refusals_total{reason="revoked"} 1.0' in metrics
                assert 'stunner_reconciler_cds_refusals_total{reason="expired"} 1.0' in metrics

    asyncio.run(main())


def test_token_reviews_are_cached_and_a_failed_review_is_503(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await rendered(running, fake)
                cds = running.cds_address
                own = cds_token(fake, k.NS, "gw-stunnerd")
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
                fresh = cds_token(fake, k.NS, "gw-stunnerd")
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
                await rendered(running, fake)
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


class HandClock:
    """The verifier's clocks, moved by hand: monotonic from 1000, and the wall clock with it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.wall_start = time.time()
        self.slept: list[float] = []
        self.on_sleep: Any = None  # called with the time slept to, after moving

    def wall(self) -> float:
        return self.wall_start + self.now - 1000.0

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(self.now)
        await asyncio.sleep(0)

    def verifier(self, fake: FakeApiServer, api: Api) -> TokenVerifier:
        def review(token: str) -> Any:
            try:
                return api.review_token(token, (CDS_TOKEN_AUDIENCE,))
            except Exception as exc:
                raise ReviewUnavailable(str(exc)) from None

        return TokenVerifier(review, clock=lambda: self.now, wall_clock=self.wall, sleep=self.sleep)


def test_a_cached_answer_lives_until_the_tokens_expiry_or_ten_seconds() -> None:
    """The cache's clock is the verifier's own (here a hand-moved one): a verified token is
    asked again after min(its exp, 10 s), a refused one after 10 s, an expired one not at all;
    a revoked token (its pod deleted) is thus refused at the latest 10 s later (issue 28 #8: it
    was 300 s)."""

    async def main() -> None:
        with FakeApiServer() as fake:
            api = Api(fake.api_client())
            clock = HandClock()
            verifier = TokenVerifier(
                lambda t: api.review_token(t, (CDS_TOKEN_AUDIENCE,)),
                clock=lambda: clock.now,
                wall_clock=clock.wall,
            )
            assert verifier.max_ttl == MAX_TTL <= 10.0
            long = fake.issue_token(k.NS, "gw-stunnerd", (CDS_TOKEN_AUDIENCE,), seconds=3600)
            short = fake.issue_token(k.NS, "gw-stunnerd", (CDS_TOKEN_AUDIENCE,), seconds=15)
            bogus = long[:-4] + "AAAA"
            for t in (long, short, bogus):
                await verifier.account(t)
            assert verifier.reviews == 3
            clock.now += 9.5
            for t in (long, short, bogus):
                await verifier.account(t)
            assert verifier.reviews == 3  # all three cached
            fake.revoke_token(long)  # its pod is gone
            clock.now += 0.5  # 10 s: every answer is stale, the revoked token refused
            assert await verifier.account(long) is None and verifier.reviews == 4
            assert await verifier.account(bogus) is None and verifier.reviews == 5
            assert await verifier.account(short) == Account(k.NS, "gw-stunnerd")
            assert verifier.reviews == 6
            # Asked at 10 s, 15 s from its end: trusted until its exp, then refused unasked.
            assert verifier.cached_for(short) <= 5.0
            clock.now += 6
            assert await verifier.account(short) is None and verifier.reviews == 6
            api.close()

    asyncio.run(main())


def test_a_watching_token_is_asked_about_once_per_ttl_and_lapses_within_it() -> None:
    """`until_lapsed`, what a watch awaits, on the hand clock: it asks again each time the
    cached answer runs out, one TokenReview per 10 s (the load a watcher puts on the API server),
    keeps the watch while the API server cannot answer, and returns at most 10 s after the token
    is revoked, or when it expires."""

    async def main() -> None:
        with FakeApiServer() as fake:
            api = Api(fake.api_client())
            clock = HandClock()
            verifier = clock.verifier(fake, api)
            account = Account(k.NS, "gw-stunnerd")
            token = fake.issue_token(k.NS, "gw-stunnerd", (CDS_TOKEN_AUDIENCE,))
            assert await verifier.account(token) == account  # the request that opened it
            start, revoked_at = clock.now, clock.now + 45.0

            def world_moves(now: float) -> None:
                if 20 <= now - start < 30:  # the API server refuses the reviews a while
                    fake.forbid("authentication.k8s.io", "tokenreviews")
                else:
                    fake.forbidden.clear()
                if now >= revoked_at:
                    fake.revoke_token(token)

            clock.on_sleep = world_moves
            assert await verifier.until_lapsed(token, account) == Lapse.REVOKED
            assert revoked_at <= clock.now <= revoked_at + MAX_TTL
            assert clock.slept == [MAX_TTL] * 5  # asked at 10, 20 (refused: kept), 30, 40, 50
            assert verifier.reviews == 1 + 5  # the open's, then one each 10 s
            assert fake.token_reviews == 1 + 4  # the API server's answers (not at 20 s)
            # A token that expires: trusted up to its exp, then the watch ends.
            short = fake.issue_token(k.NS, "gw-stunnerd", (CDS_TOKEN_AUDIENCE,), seconds=25)
            clock = HandClock()
            verifier = clock.verifier(fake, api)
            assert await verifier.account(short) == account
            start = clock.now
            assert await verifier.until_lapsed(short, account) == Lapse.EXPIRED
            assert 24.0 <= clock.now - start <= 25.0
            api.close()

    asyncio.run(main())


def test_local_mode_refuses_cds_auth_required(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from reconciler.__main__ import main

    assert main(["--manifests", str(tmp_path), "--cds-auth=required"]) == 2
    assert "needs cluster mode" in capsys.readouterr().err
