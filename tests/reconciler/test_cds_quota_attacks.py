"""Who may report usage of cluster-wide user quotas where the CDS checks tokens (issue 28 #2).

Cluster mode against the fake API server (whose TokenReview names the pod a bound token was
issued to, as kube-apiserver does), a GatewayConfig with `userQuota: 2`. The honest pods are
stunnerd's own CDS client and quota ledger (stunnerd.process.sources.CdsSource,
stunnerd.process.usage,
stunnerd.turn.ledger) over real sockets, each with the projected token of a Pod labelled as the
Gateway's dataplane (as render labels its Deployment's pods). The red team's four attacks come
from watchers whose tokens the CDS accepts for reading the config:

1. a watcher of the Gateway's own account, its token bound to no pod or to a pod that is not
   the Gateway's, reports `user-1: 5` (it made every pod refuse user-1);
2. two such report `zz: 2^31-1` (the sum froze the pods' sums);
3. such watchers report 1,200 made-up users at 2^31-1 (user-1 fell out of the cut);
4. a `--cds-readers` account reports (it was counted).

Each changes nothing: the honest pods' others, and what they admit, are what their own reports
make. And: a pod counts once however many watchers show its token (the latest holds its slot);
a pod not listed yet has its report counted once it is; a deleted pod's counts go.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import WSMsgType

from reconciler.cds.access import Account
from reconciler.cluster import Running
from reconciler.render.inputs import account_name
from stunner_api.cds import (
    MAX_USAGE_COUNT,
    USAGE_OTHERS_KEY,
    USAGE_REPORT_KEY,
    config_path,
    encode_usage,
    usage_key,
)
from stunner_api.vocabulary import (
    APP_LABEL,
    APP_VALUE,
    CDS_TOKEN_AUDIENCE,
    CDS_TOKEN_FILE_ENV,
    RELATED_GATEWAY_NAME,
    RELATED_GATEWAY_NAMESPACE,
)
from stunnerd.process.sources import CdsSource
from stunnerd.process.usage import UsageReporter
from stunnerd.turn.ledger import GRANTED, LocalQuota
from tests.reconciler import clusterkit as k
from tests.support.fakeapi import FakeApiServer

QUOTA = 2
STEP = 10.0
READER = Account("stunner-system", "stunner-config-reader")
ID = f"{k.NS}/gw"
GW_ACCOUNT = account_name("gw")  # the Gateway's dataplane account: the one that may read it


def pod(name: str, namespace: str = k.NS, dataplane: bool = True) -> dict[str, Any]:
    """A Pod as the Gateway's Deployment makes them (`dataplane`), else an unrelated one of the
    same account."""
    labels = (
        {APP_LABEL: APP_VALUE, RELATED_GATEWAY_NAME: "gw", RELATED_GATEWAY_NAMESPACE: k.NS}
        if dataplane
        else {"app": "web"}
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "serviceAccountName": GW_ACCOUNT,
            "nodeName": "node-1",
            "containers": [{"name": "main", "image": "l7mp/stunnerd"}],
        },
    }


def token(fake: FakeApiServer, pod: str = "", account: str = "", ns: str = k.NS) -> str:
    """What the kubelet writes into a pod's projected volume (`pod`: bound to it)."""
    return fake.issue_token(ns, account or GW_ACCOUNT, (CDS_TOKEN_AUDIENCE,), pod=pod)


@dataclass
class Pod:
    """An honest stunnerd's quota side: its ledger, fed by its CDS watch."""

    quota: LocalQuota
    reporter: UsageReporter


@contextlib.asynccontextmanager
async def stunnerd(running: Running, shown: str, tmp_path: Path) -> AsyncIterator[Pod]:
    path = tmp_path / f"token-{id(shown)}"
    path.write_text(shown)
    quota = LocalQuota()
    reporter = UsageReporter(quota)
    reporter.set_enabled(True)  # its config has the quota
    env = {CDS_TOKEN_FILE_ENV: str(path), "STUNNER_ADDR": "127.0.0.1"}
    source = CdsSource(running.cds_address, k.NS, "gw", env=env, retry_period=0.1)
    source.reporter = reporter

    async def consume() -> None:
        async for _ in source.watch():
            pass

    task = asyncio.create_task(consume())
    try:
        yield Pod(quota, reporter)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def honest_world(
    tmp_path: Path, *extra: dict[str, Any]
) -> AsyncIterator[tuple[FakeApiServer, Running, Pod, Pod]]:
    """The reconciler, a Gateway with userQuota 2 and two of its pods: pod-1 holds user-1."""
    with FakeApiServer() as fake:
        for obj in (
            k.gateway_class(),
            k.gateway_config(userQuota=QUOTA),
            k.dataplane(),
            k.static_service(),
            k.gateway(),
            k.route(),
            pod("gw-pod-1"),
            pod("gw-pod-2"),
            *extra,
        ):
            fake.seed(obj)
        async with k.reconciler(fake, tmp_path, cds_readers=frozenset({READER})) as running:
            await k.eventually(lambda: ID in running.mode.store.configs, what="rendered")
            async with (
                stunnerd(running, token(fake, "gw-pod-1"), tmp_path) as one,
                stunnerd(running, token(fake, "gw-pod-2"), tmp_path) as two,
            ):
                assert one.quota.try_acquire("user-1", QUOTA) == GRANTED
                await k.eventually(lambda: two.quota.others == {"user-1": 1}, what="shared")
                yield fake, running, one, two


async def nothing_changed(one: Pod, two: Pod) -> None:
    """An honest change reaches pod 2 after the attack, and its others are the honest ones."""
    assert one.quota.try_acquire("user-2", QUOTA) == GRANTED
    await k.eventually(lambda: two.quota.others.get("user-2") == 1, STEP, what="user-2 shared")
    assert two.quota.others == {"user-1": 1, "user-2": 1}
    assert one.quota.others == {}
    assert two.reporter.shared is True
    assert two.quota.try_acquire("user-1", QUOTA) == GRANTED  # 1 on pod 1, 1 here: 2
    assert two.quota.try_acquire("user-1", QUOTA) != GRANTED  # ... and no third
    two.quota.release("user-1")
    one.quota.release("user-2")


class Attacker:
    """A watcher of the config that sends usage reports, and keeps its connection up (it
    answers the CDS's pings itself: autoping off, so that it sees the pongs of its own)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.handled = asyncio.Event()
        self.usage_frames = 0

    @classmethod
    @contextlib.asynccontextmanager
    async def of(cls, running: Running, shown: str) -> AsyncIterator[Attacker]:
        url = running.cds_address.replace("http://", "ws://") + config_path(k.NS, "gw")
        headers = {"Authorization": f"Bearer {shown}"}
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(url + "?watch=true", headers=headers, autoping=False) as ws,
        ):
            attacker = cls(ws)
            reader = asyncio.create_task(attacker._read())
            try:
                yield attacker
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader

    async def _read(self) -> None:
        async for message in self.ws:
            if message.type == WSMsgType.PING:
                await self.ws.pong(message.data)
            elif message.type == WSMsgType.PONG:
                self.handled.set()
            elif usage_key(message.data) == USAGE_OTHERS_KEY:
                self.usage_frames += 1

    async def report(self, counts: dict[str, int]) -> None:
        """Send a report and wait until the CDS has handled it (it answers a ping sent after it
        only once it has)."""
        self.handled.clear()
        await self.ws.send_str(encode_usage(USAGE_REPORT_KEY, counts)[0])
        await self.ws.ping()
        await asyncio.wait_for(self.handled.wait(), STEP)
        assert not self.ws.closed


def test_a_watcher_that_is_no_pod_of_the_gateway_cannot_make_every_pod_refuse_a_user(
    tmp_path: Path,
) -> None:
    """Attack 1: `user-1: 5` from the Gateway's own account, unbound and bound to another pod."""

    async def main() -> None:
        async with honest_world(tmp_path, pod("web-1", dataplane=False)) as (fake, r, one, two):
            for shown in (token(fake), token(fake, "web-1")):
                async with Attacker.of(r, shown) as attacker:
                    await attacker.report({"user-1": 5})
                    await nothing_changed(one, two)

    asyncio.run(main())


def test_reports_at_the_largest_count_cannot_freeze_the_sums(tmp_path: Path) -> None:
    """Attack 2: two watchers report `zz: 2^31-1` (their sum is past what stunnerd takes)."""

    async def main() -> None:
        async with honest_world(tmp_path, pod("web-1", dataplane=False)) as (fake, r, one, two):
            async with (
                Attacker.of(r, token(fake)) as first,
                Attacker.of(r, token(fake, "web-1")) as second,
            ):
                for attacker in (first, second):
                    await attacker.report({"zz": MAX_USAGE_COUNT})
                await nothing_changed(one, two)
            await nothing_changed(one, two)  # and after they left

    asyncio.run(main())


def test_made_up_users_cannot_push_a_held_user_out_of_the_cut(tmp_path: Path) -> None:
    """Attack 3: 1,200 made-up users at 2^31-1, from two watchers (1,024 users a report)."""

    async def main() -> None:
        async with honest_world(tmp_path, pod("web-1", dataplane=False)) as (fake, r, one, two):
            async with (
                Attacker.of(r, token(fake)) as first,
                Attacker.of(r, token(fake, "web-1")) as second,
            ):
                for n, attacker in enumerate((first, second)):
                    made_up = {f"made-up-{n}-{i:03d}": MAX_USAGE_COUNT for i in range(600)}
                    await attacker.report(made_up)
                await nothing_changed(one, two)

    asyncio.run(main())


def test_a_reader_accounts_report_counts_nothing(tmp_path: Path) -> None:
    """Attack 4: a `--cds-readers` account (its token bound to its own pod) reports."""
    reader_pod = pod("stunner-auth-1", namespace=READER.namespace, dataplane=False)

    async def main() -> None:
        async with honest_world(tmp_path, reader_pod) as (fake, running, one, two):
            shown = token(fake, "stunner-auth-1", READER.name, READER.namespace)
            async with Attacker.of(running, shown) as reader:
                await reader.report({"user-1": 5})
                await nothing_changed(one, two)

    asyncio.run(main())


def test_a_pod_counts_once_and_only_while_it_is_the_gateways(tmp_path: Path) -> None:
    """One report per pod: a second watcher showing pod 1's token takes its slot over (it is
    not counted twice); a pod not listed yet counts once it is; a deleted pod no longer does."""

    async def main() -> None:
        async with honest_world(tmp_path) as (fake, running, one, two):
            async with Attacker.of(running, token(fake, "gw-pod-1")) as again:
                await again.report({"user-1": 1})  # the same pod, again: still 1
                assert one.quota.try_acquire("user-3", QUOTA) == GRANTED  # a change to see
                await k.eventually(lambda: two.quota.others.get("user-3") == 1, what="user-3")
                assert two.quota.others == {"user-1": 1, "user-3": 1}
                one.quota.release("user-3")
            # A pod not known as the Gateway's yet (as before a restarted reconciler lists the
            # pods) reports: held, counting nothing, until it is; then deleted: gone.
            fake.seed(pod("gw-pod-3", dataplane=False))
            async with Attacker.of(running, token(fake, "gw-pod-3")) as late:
                await late.report({"user-4": 1})
                await nothing_changed(one, two)
                labels = pod("gw-pod-3")["metadata"]["labels"]
                k.update(
                    fake, "v1", "Pod", "gw-pod-3", lambda p: p["metadata"].update(labels=labels)
                )
                await k.eventually(lambda: two.quota.others.get("user-4") == 1, what="pod 3")
                k.delete(fake, "v1", "Pod", "gw-pod-3")  # its watcher is still connected
                await k.eventually(lambda: "user-4" not in two.quota.others, what="pod 3 gone")

    asyncio.run(main())
