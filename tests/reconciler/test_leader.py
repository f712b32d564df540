"""High availability: two reconcilers on one fake API server with a coordination.k8s.io/v1 Lease.

Only the leader writes; both watch, render and serve CDS. When the leader dies (no release),
the other takes over within the lease duration and a stunnerd-like CDS watcher on it sees no
config change. On SIGTERM (`shutdown`) the Lease is released, so the other takes over at once,
and the stopping replica writes nothing more but keeps serving CDS.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from reconciler.cluster import Running
from reconciler.kube.api import Api
from reconciler.kube.lease import LeaseElector
from stunner_api.vocabulary import CDS_TOKEN_AUDIENCE
from tests.reconciler import clusterkit as k
from tests.support.fakeapi import FakeApiServer

LEASE = {"lease_duration": 1.5, "renew_deadline": 1.0, "retry_period": 0.2}


def lease(fake: FakeApiServer) -> dict[str, Any]:
    obj = fake.get_object("coordination.k8s.io/v1", "Lease", "stunner-system", "92062b70.l7mp.io")
    assert obj is not None
    return obj


@contextlib.asynccontextmanager
async def replica(fake: FakeApiServer, tmp_path: Path, name: str) -> AsyncIterator[Running]:
    async with k.reconciler(fake, tmp_path, leader_elect=True, identity=name, **LEASE) as r:
        yield r


class CdsWatcher:
    """What stunnerd does: one CDS watch, every frame kept."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.task: asyncio.Task[None] | None = None

    async def run(self, address: str, id: str, token: str) -> None:
        url = address.replace("http://", "ws://") + f"/api/v1/configs/{id}?watch=true"
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(url, headers=headers) as ws,
        ):
            async for message in ws:
                self.frames.append(json.loads(message.data))


def test_only_the_leader_writes_and_a_dead_leaders_successor_changes_no_config(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with contextlib.AsyncExitStack() as stack:
                a = await stack.enter_async_context(replica(fake, tmp_path, "a"))
                await k.eventually(lambda: a.mode.leading, what="a leads")
                b = await stack.enter_async_context(replica(fake, tmp_path, "b"))
                await k.settled(a, fake)
                await k.eventually(lambda: "stunner/gw" in b.mode.store.configs)
                # Only a writes: b sent nothing, so every write the fake saw is a's. (a may have
                # sent more: an attempt that got no answer, its connection reset on a loaded
                # machine, counts in writes_sent and is sent again.)
                assert not b.mode.leading and b.mode.writes_sent == 0
                assert a.mode.writes_sent >= len(k.object_writes(fake)) > 0
                assert lease(fake)["spec"]["holderIdentity"] == "a"
                watcher = CdsWatcher()
                token = fake.issue_token(k.NS, "gw-stunnerd", (CDS_TOKEN_AUDIENCE,))
                watcher.task = asyncio.create_task(watcher.run(b.cds_address, "stunner/gw", token))
                await k.eventually(lambda: watcher.frames, what="the first config")
                # The leader dies: its tasks stop, the Lease is not released.
                killed_at = time.monotonic()
                await _kill(a)
                await k.eventually(lambda: b.mode.leading, timeout=5, what="b takes over")
                took = time.monotonic() - killed_at
                await asyncio.sleep(0.3)
                assert len(watcher.frames) == 1  # the leader change itself changed nothing
                assert took <= LEASE["lease_duration"] + 2 * LEASE["retry_period"] + 0.5, took
                spec = lease(fake)["spec"]
                assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
                # b writes from now on: a Gateway edit reaches the cluster and the watcher.
                k.edit_gateway(
                    fake,
                    lambda g: g["spec"]["listeners"][0].update({"port": 3490}),
                )
                await k.eventually(lambda: len(watcher.frames) == 2, what="the new config")
                assert watcher.frames[1]["listeners"][0]["port"] == 3490
                await k.eventually(
                    lambda: k.get(fake, "v1", "Service", "gw")["spec"]["ports"][0]["port"] == 3490  # type: ignore[index]
                )
                await k.settled(b, fake)
                assert b.mode.writes_sent >= 2  # the Service and the Gateway's status
                watcher.task.cancel()
                await asyncio.gather(watcher.task, return_exceptions=True)

    asyncio.run(main())


async def _kill(running: Running) -> None:
    """Stop a replica as a crash would: no release, no more renewals, no more writes."""
    mode = running.mode
    mode.writing = False
    assert mode.elector is not None
    await mode.elector.stop(release=False)
    mode.stop_watching()


def test_sigterm_releases_the_lease_stops_writing_and_keeps_serving_cds(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            token = fake.issue_token(k.NS, "gw-stunnerd", (CDS_TOKEN_AUDIENCE,))
            async with replica(fake, tmp_path, "a") as a:
                await k.eventually(lambda: a.mode.leading, what="a leads")
                async with replica(fake, tmp_path, "b") as b:
                    await k.settled(a, fake)
                    sent = a.mode.writes_sent
                    await a.mode.shutdown()
                    assert lease(fake)["spec"]["holderIdentity"] in ("", "b")  # released
                    assert not a.mode.leading
                    released_at = time.monotonic()
                    await k.eventually(lambda: b.mode.leading, timeout=5)
                    assert time.monotonic() - released_at < LEASE["lease_duration"]
                    # a still serves its configs, and writes nothing even when asked to.
                    a.mode.reconciler.trigger()
                    k.set_peer(fake, "10.0.0.8/32")
                    await k.settled(b, fake)
                    assert a.mode.writes_sent == sent
                    async with (
                        aiohttp.ClientSession() as session,
                        session.get(
                            a.cds_address + "/api/v1/configs/stunner/gw",
                            headers={"Authorization": f"Bearer {token}"},
                        ) as response,
                    ):
                        assert response.status == 200
                        assert "10.0.0.8/32" in await response.text()

    asyncio.run(main())


def _deployment(uid_hint: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "stunner-reconciler", "namespace": "stunner-system"},
        "spec": {
            "selector": {"matchLabels": {"app": uid_hint}},
            "template": {
                "metadata": {"labels": {"app": uid_hint}},
                "spec": {"containers": [{"name": "reconciler", "image": "stunner"}]},
            },
        },
    }


def test_the_lease_is_owned_by_the_reconcilers_deployment(tmp_path: Path) -> None:
    """With ``--leader-election-owner`` (the chart names the reconciler's Deployment) the Lease
    carries an ownerReference to that Deployment, so that deleting it (``helm uninstall``)
    deletes the Lease. Found on a real cluster (tests/cluster): the replica cannot release the
    Lease on uninstall (its ServiceAccount goes at once), the Lease stayed behind, and the next
    install's reconciler led, and so created the Gateways' Deployments, only after a lease
    duration (15 s). A Lease left by an older install (its owner's uid gone) gets the new one."""

    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            deployment = fake.seed(_deployment("reconciler"))
            uid = deployment["metadata"]["uid"]
            fake.seed(
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {
                        "name": "92062b70.l7mp.io",
                        "namespace": "stunner-system",
                        "ownerReferences": [
                            {
                                "apiVersion": "apps/v1",
                                "kind": "Deployment",
                                "name": "stunner-reconciler",
                                "uid": "an-older-install",
                            }
                        ],
                    },
                    "spec": {"holderIdentity": ""},  # released
                }
            )
            async with k.reconciler(
                fake,
                tmp_path,
                leader_elect=True,
                identity="a",
                lease_owner="stunner-reconciler",
                **LEASE,
            ) as a:
                await k.eventually(lambda: a.mode.leading, what="a leads")
                assert lease(fake)["metadata"]["ownerReferences"] == [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": "stunner-reconciler",
                        "uid": uid,
                    }
                ]

    asyncio.run(main())


def test_without_an_owner_deployment_the_lease_is_still_taken(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(
                fake, tmp_path, leader_elect=True, identity="a", lease_owner="missing", **LEASE
            ) as a:
                await k.eventually(lambda: a.mode.leading, what="a leads")
                assert not lease(fake)["metadata"].get("ownerReferences")

    asyncio.run(main())


class RenewalMeetsRelease(Api):
    """An Api on which, once `hold` is set, the next round's renewal writes the Lease only after
    another read of it (the release's), or after a second: the order in which a SIGTERM during a
    renewal round (CI, on a loaded machine) made the release conflict (409) and left the Lease
    held."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.hold = False
        self.reads = 0
        self.round_read = threading.Event()
        self.release_read = threading.Event()

    def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:  # type: ignore[override]
        if not (self.hold and "/leases/" in path):
            return super().request(method, path, body, **kw)
        if method == "GET":
            answer = super().request(method, path, body, **kw)
            self.reads += 1
            (self.round_read if self.reads == 1 else self.release_read).set()
            return answer
        if body["spec"]["holderIdentity"]:  # the renewal
            self.release_read.wait(1.0)
        return super().request(method, path, body, **kw)


def test_a_stop_during_a_renewal_round_still_releases_the_lease() -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            api = RenewalMeetsRelease(fake.api_client())
            elector = LeaseElector(
                api,
                "stunner-system",
                identity="a",
                lease_duration=LEASE["lease_duration"],
                renew_deadline=LEASE["renew_deadline"],
                retry_period=LEASE["retry_period"],
            )
            running = asyncio.create_task(elector.run())
            await k.eventually(lambda: elector.leading, what="a leads")
            api.hold = True
            await asyncio.to_thread(api.round_read.wait, 5)  # a round has read the Lease
            await elector.stop()
            await asyncio.wait_for(running, 5)
            assert lease(fake)["spec"]["holderIdentity"] == ""

    asyncio.run(main())


def test_a_leader_only_replica_that_stops_leading_hands_its_watches_over(tmp_path: Path) -> None:
    """--cds-leader-only: the standby is not ready and answers the CDS 503 with Retry-After
    (before any token check); on SIGTERM the leader releases the Lease, closes its watches at
    once (for stunnerd to reconnect to the next leader) and answers 503 from then on, while the
    other replica becomes ready and serves."""

    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            token = fake.issue_token(k.NS, "gw-stunnerd", (CDS_TOKEN_AUDIENCE,))
            only = {"cds_leader_only": True, **LEASE}
            async with (
                k.reconciler(fake, tmp_path, leader_elect=True, identity="a", **only) as a,
            ):
                await k.eventually(lambda: a.mode.leading and a.mode.ready()[0], what="a ready")
                async with k.reconciler(
                    fake, tmp_path, leader_elect=True, identity="b", **only
                ) as b:
                    await k.eventually(lambda: b.mode.rendered_once, what="b rendered")
                    ready, why = b.mode.ready()
                    assert not ready and why.startswith("standing by")
                    async with (
                        aiohttp.ClientSession() as session,
                        session.get(b.cds_address + "/api/v1/configs/stunner/gw") as refused,
                    ):
                        assert refused.status == 503  # no token asked for: nothing read here
                        assert refused.headers["Retry-After"] == "1"
                    watcher = CdsWatcher()
                    watcher.task = asyncio.create_task(
                        watcher.run(a.cds_address, "stunner/gw", token)
                    )
                    await k.eventually(lambda: watcher.frames, what="the first config")
                    await a.mode.shutdown()
                    await asyncio.wait_for(watcher.task, 2)  # closed by a, not by the test
                    assert not a.mode.store.watchers
                    await k.eventually(lambda: b.mode.ready()[0], timeout=5, what="b ready")
                    for address, status in ((a.cds_address, 503), (b.cds_address, 200)):
                        async with (
                            aiohttp.ClientSession() as session,
                            session.get(
                                address + "/api/v1/configs/stunner/gw",
                                headers={"Authorization": f"Bearer {token}"},
                            ) as response,
                        ):
                            assert response.status == status, address

    asyncio.run(main())
