"""The ServiceAccount each Gateway's dataplane runs as (issue 28 #3), in cluster mode against the
fake API server: created before the Deployment whose pods run as it, owned by the Gateway and
collected with it (its tokens then stop authenticating, as kube-apiserver's do), deleted by the
reconciler when the Gateway no longer has one, written back when edited or deleted; a user's
account of the same name is never taken over (and reads nothing); the previous release's
Deployments, which ran as `default`, are rolled onto their accounts on upgrade.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.reconciler import clusterkit as k
from tests.reconciler.test_cds_access import cds_token, get, runs_as, watch_url
from tests.support.fakeapi import FakeApiServer

ACCOUNT = "gw-stunnerd"
GW_PATH = "/api/v1/configs/stunner/gw"


def account(fake: FakeApiServer, name: str = ACCOUNT) -> dict[str, Any] | None:
    return k.get(fake, "v1", "ServiceAccount", name)


def gateway_uid(fake: FakeApiServer) -> str:
    gateway = k.get(fake, k.GW, "Gateway", "gw")
    assert gateway is not None
    return str(gateway["metadata"]["uid"])


def test_the_account_comes_before_its_pods_and_goes_with_its_gateway(tmp_path: Path) -> None:
    """Created before the Deployment (the API server admits no pod whose account is missing),
    owned by the Gateway; the Gateway deleted, the garbage collector takes the account with the
    Deployment and Service, its token stops authenticating and a watch of it is closed."""

    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path, cds_token_ttl=0.2) as running:
                await k.settled(running, fake)
                created = account(fake)
                assert created is not None
                assert created["automountServiceAccountToken"] is False
                (owner,) = created["metadata"]["ownerReferences"]
                assert (owner["kind"], owner["uid"]) == ("Gateway", gateway_uid(fake))
                assert runs_as(fake, "gw") == ACCOUNT
                creates = [path for method, path in fake.writes() if method == "POST"]
                assert creates.index("/api/v1/namespaces/stunner/serviceaccounts") < creates.index(
                    "/apis/apps/v1/namespaces/stunner/deployments"
                )
                token = cds_token(fake, k.NS, ACCOUNT)
                assert (await get(running.cds_address, GW_PATH, token)).status == 200
                headers = {"Authorization": f"Bearer {token}"}
                async with (
                    aiohttp.ClientSession() as session,
                    session.ws_connect(watch_url(running, GW_PATH), headers=headers) as ws,
                ):
                    first = await asyncio.wait_for(ws.receive(), 5)
                    assert json.loads(first.data)["admin"]["name"] == "stunner/gw"
                    k.delete(fake, k.GW, "Gateway", "gw")
                    assert account(fake) is None  # the fake collects at once
                    assert k.get(fake, "apps/v1", "Deployment", "gw") is None
                    # What the watch gets now: the deleted config's zero config, then the close.
                    while (message := await asyncio.wait_for(ws.receive(), 10)).type == (
                        aiohttp.WSMsgType.TEXT
                    ):
                        pass
                    assert message.type == aiohttp.WSMsgType.CLOSE and message.data == 1008
                assert (await get(running.cds_address, GW_PATH, token)).status == 401
                await k.settled(running, fake)
                assert account(fake) is None  # and nothing wrote it back

    asyncio.run(main())


def test_the_reconciler_keeps_the_account_as_rendered_and_deletes_it_when_unwanted(
    tmp_path: Path,
) -> None:
    """An account edited or deleted by someone is written back (it is what the CDS serves the
    config to); a Gateway that no longer renders (its GatewayConfig gone) loses it."""

    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                k.update(
                    fake,
                    "v1",
                    "ServiceAccount",
                    ACCOUNT,
                    lambda sa: sa.update(automountServiceAccountToken=True),
                )
                await k.eventually(
                    lambda: (sa := account(fake)) and sa["automountServiceAccountToken"] is False,
                    what="the account written back",
                )
                k.delete(fake, "v1", "ServiceAccount", ACCOUNT)
                await k.eventually(lambda: account(fake), what="the account created again")
                k.delete(fake, "stunner.l7mp.io/v1", "GatewayConfig", "config")
                await k.eventually(lambda: account(fake) is None, what="the account deleted")
                assert k.get(fake, k.GW, "Gateway", "gw") is not None  # not the collector's

    asyncio.run(main())


def test_a_users_account_of_that_name_is_never_taken_over(tmp_path: Path) -> None:
    """An account named like the one the Gateway would get, but not the Gateway's: left as it is
    (its create refused, 409, retried with back-off), and the CDS serves the config to no pod
    of it (the user's other pods may run as it). Once it is gone, the Gateway's is created and
    reads."""

    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            users = fake.seed(
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": ACCOUNT, "namespace": k.NS, "labels": {"app": "mine"}},
                }
            )
            async with k.reconciler(fake, tmp_path, cds_token_ttl=0.2) as running:
                await k.eventually(lambda: runs_as(fake, "gw") == ACCOUNT, what="Deployment")
                refused = ("POST", "/api/v1/namespaces/stunner/serviceaccounts")
                await k.eventually(
                    lambda: fake.writes().count(refused) >= 2, what="the create retried"
                )
                held = account(fake)
                assert held == users  # not a field changed: not even our labels
                assert not [w for w in fake.writes() if w[0] == "PUT" and "serviceaccounts" in w[1]]
                theirs = cds_token(fake, k.NS, ACCOUNT)
                answer = await get(running.cds_address, GW_PATH, theirs)
                assert answer.status == 403, answer.body
                k.delete(fake, "v1", "ServiceAccount", ACCOUNT)
                ours = await k.eventually(
                    lambda: (sa := account(fake)) and sa["metadata"].get("ownerReferences"),
                    what="the Gateway's own account",
                )
                assert ours[0]["uid"] == gateway_uid(fake)
                fresh = cds_token(fake, k.NS, ACCOUNT)
                assert (await get(running.cds_address, GW_PATH, fresh)).status == 200
                # The user's token names the same account but not the same object: the API
                # server refuses it now, and the CDS within the TTL (here 0.2 s).
                await answered(running.cds_address, theirs, 401)

    asyncio.run(main())


def test_an_upgrade_rolls_the_previous_releases_deployments_onto_their_accounts(
    tmp_path: Path,
) -> None:
    """The previous release rendered no account: its Deployments run as `default`. The new
    reconciler creates the Gateway's account and updates the Deployment to run as it (a change
    of the pod template: the Deployment rolls), and `default` no longer reads the config. (The
    old pods keep relaying with the config they have until they are replaced:
    tests/stunnerd/test_cds_token.py.)"""

    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
            # What the previous release left: no account, the Deployment running as `default`.
            k.delete(fake, "v1", "ServiceAccount", ACCOUNT)
            k.update(fake, "apps/v1", "Deployment", "gw", _runs_as_default)
            old_template = _template(fake)
            mark = len(fake.writes())
            async with k.reconciler(fake, tmp_path) as running:
                await k.eventually(lambda: runs_as(fake, "gw") == ACCOUNT, what="re-rendered")
                writes = fake.writes()[mark:]
                assert writes.index(("POST", "/api/v1/namespaces/stunner/serviceaccounts")) < (
                    writes.index(("PUT", "/apis/apps/v1/namespaces/stunner/deployments/gw"))
                )
                assert _template(fake) != old_template  # the pod template changed: a rollout
                default = cds_token(fake, k.NS, "default")
                assert (await get(running.cds_address, GW_PATH, default)).status == 403
                own = cds_token(fake, k.NS, ACCOUNT)
                assert (await get(running.cds_address, GW_PATH, own)).status == 200

    asyncio.run(main())


async def answered(cds: str, token: str, status: int, timeout: float = 10.0) -> None:
    """Wait until a GET of stunner/gw with `token` is answered `status`."""
    deadline = time.monotonic() + timeout
    while (answer := await get(cds, GW_PATH, token)).status != status:
        assert time.monotonic() < deadline, answer
        await asyncio.sleep(0.05)


def _runs_as_default(deployment: dict[str, Any]) -> None:
    del deployment["spec"]["template"]["spec"]["serviceAccountName"]


def _template(fake: FakeApiServer) -> Any:
    deployment = k.get(fake, "apps/v1", "Deployment", "gw")
    assert deployment is not None
    return copy.deepcopy(deployment["spec"]["template"])
