"""Cluster mode when the API server misbehaves: refused writes (422, 403, 409), a conflict that
re-reads, an API server away and back (nothing lost, one render converges), a watch history
compacted (410 Gone: relist), readiness while the cache is stale, metrics and health."""

from __future__ import annotations

import asyncio
import logging
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

from reconciler.apply import Write, plan_writes
from reconciler.kube.api import Api, load_client
from reconciler.kube.writer import Writer
from reconciler.render import RenderSettings, render
from reconciler.store import Cache, Snapshot
from tests.reconciler import clusterkit as k
from tests.support.fakeapi import FakeApiServer

GW = "gateway.networking.k8s.io/v1"


def _http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def http_get(url: str) -> tuple[int, str]:
    """GET from a thread (the server answering runs on this event loop)."""
    return await asyncio.to_thread(_http_get, url)


def listed(fake: FakeApiServer, tmp_path: Path) -> tuple[Api, Cache]:
    """An API client of `fake` and a cache holding every watched kind as listed now (none of a
    kind the fake does not serve, as the informer caches it: Gateway API's TCPRoute)."""
    cache = Cache()
    api = Api(load_client(str(fake.write_kubeconfig(tmp_path / "kubeconfig"))))
    k.relist(api, cache)
    return api, cache


@pytest.mark.parametrize("code", [422, 403, 409])
def test_a_refused_write_is_logged_retried_and_blocks_nothing_else(
    tmp_path: Path, code: int, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            fake.refuse("POST", "deployments", code)
            with caplog.at_level(logging.WARNING, "stunner.reconciler"):
                async with k.reconciler(fake, tmp_path) as running:
                    # Everything else is written meanwhile.
                    await k.eventually(lambda: k.get(fake, "v1", "Service", "gw") is not None)
                    await k.eventually(
                        lambda: (k.get(fake, GW, "Gateway", "gw") or {}).get("status")
                    )
                    # The refused create is retried with back-off.
                    posts = lambda: [  # noqa: E731
                        p for m, p in fake.writes() if m == "POST" and "deployments" in p
                    ]
                    await k.eventually(lambda: len(posts()) >= 3, what="retries")
                    assert "create Deployment stunner/gw refused" in caplog.text
                    assert f"{code}" in caplog.text
                    fake.refuse("POST", "deployments", None)
                    await k.eventually(
                        lambda: k.get(fake, "apps/v1", "Deployment", "gw") is not None
                    )
                    text = running.mode.metrics.exposition().decode()
                    assert (
                        'stunner_reconciler_api_writes_total{kind="Deployment",result="'
                        f'{code}",verb="create"}}'
                    ) in text

    asyncio.run(main())


def test_a_conflict_rereads_the_object_and_the_next_write_succeeds(tmp_path: Path) -> None:
    with FakeApiServer() as fake:
        k.world(fake)
        api, cache = listed(fake, tmp_path)
        try:
            writer = Writer(api, cache)
            settings = RenderSettings()

            def writes() -> list[Write]:
                snapshot = Snapshot.from_objects(cache.rendered_objects())
                plan = render(snapshot, settings, datetime.now(UTC))
                return plan_writes(plan, cache.get, {"stunner/gw"})

            for write in writes():
                assert writer.send(write).ok
            # Someone else labels the Service; our cache still has the old version. The
            # Gateway gets a second listener (and the cache sees that).
            k.update(fake, "v1", "Service", "gw", lambda s: s["metadata"]["labels"].update(t="x"))
            gateway = k.edit_gateway(
                fake,
                lambda g: g["spec"]["listeners"].append(k.listener("b", 3479)),
            )
            cache.put(None, gateway)
            (update,) = [w for w in writes() if w.kind == "Service"]
            result = writer.send(update)
            assert (result.ok, result.code) == (False, 409)
            fresh = cache.get("v1", "Service", k.NS, "gw")
            assert fresh is not None and fresh["metadata"]["labels"]["t"] == "x"  # re-read
            (retry,) = [w for w in writes() if w.kind == "Service"]
            assert writer.send(retry).ok
            stored = k.get(fake, "v1", "Service", "gw")
            assert stored is not None and len(stored["spec"]["ports"]) == 2
            assert stored["metadata"]["labels"]["t"] == "x"
        finally:
            api.close()


def test_a_create_for_a_gateway_the_api_server_no_longer_has_is_not_sent(
    tmp_path: Path,
) -> None:
    """The cache still holds the Gateway (its watch has not delivered the deletion yet, while the
    collector's deletions of what it owned came first): its Service and Deployment are not
    created again; nor for a Gateway deleted and created again under the same name (a new
    uid), whose own render makes its own objects."""
    with FakeApiServer() as fake:
        k.world(fake)
        api, cache = listed(fake, tmp_path)
        try:
            writer = Writer(api, cache)
            snapshot = Snapshot.from_objects(cache.rendered_objects())
            plan = render(snapshot, RenderSettings(), datetime.now(UTC))
            creates = [
                w for w in plan_writes(plan, cache.get, {"stunner/gw"}) if w.verb == "create"
            ]
            assert {w.kind for w in creates} >= {"Service", "Deployment"}
            before = len(fake.writes())
            k.delete(fake, GW, "Gateway", "gw")
            results = [writer.send(w) for w in creates]
            assert all(r.ok and "is gone" in r.skipped for r in results), results
            assert [m for m, _ in fake.writes()[before:] if m == "POST"] == []
            assert k.get(fake, "v1", "Service", "gw") is None
            fake.seed(k.gateway())  # the same name again, another uid
            again = [writer.send(w) for w in creates]
            assert all("another one" in r.skipped for r in again), again
            assert k.get(fake, "apps/v1", "Deployment", "gw") is None
        finally:
            api.close()


def test_the_api_server_away_and_back_loses_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                assert (await http_get(running.health_address + "/readyz"))[0] == 200
                fake.stop()
                # While it is away: a route edit, the Deployment deleted, the history compacted.
                k.set_peer(fake, "10.0.0.2/32")
                fake.garbage_collection = False
                k.delete(fake, "apps/v1", "Deployment", "gw")
                fake.compact()
                # Stale after `stale_after` (2 s here): not ready, CDS still serving.
                await k.eventually(
                    lambda: not running.mode.ready()[0],
                    timeout=8,
                )
                status, why = await http_get(running.health_address + "/readyz")
                assert status == 503 and "watch failing" in why
                assert "stunner/gw" in running.mode.store.configs
                renders = running.mode.reconciler.renders
                fake.start()
                await k.eventually(
                    lambda: k.get(fake, "apps/v1", "Deployment", "gw") is not None, timeout=10
                )
                await k.eventually(
                    lambda: (
                        "10.0.0.2/32"
                        in running.mode.store.configs["stunner/gw"].clusters[0].endpoints
                    )
                )
                await k.settled(running, fake)
                assert (await http_get(running.health_address + "/readyz"))[0] == 200
                # The relists coalesce: a render or two, not one per kind.
                assert running.mode.reconciler.renders - renders <= 3
                metrics = (await http_get(running.metrics_address + "/metrics"))[1]
                assert 'stunner_reconciler_watch_restarts_total{kind="Gateway' in metrics

    asyncio.run(main())


def test_health_metrics_and_readiness(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                assert await http_get(running.health_address + "/healthz") == (200, "ok\n")
                assert (await http_get(running.health_address + "/readyz"))[0] == 200
                _, text = await http_get(running.metrics_address + "/metrics")
                for name in (
                    "stunner_reconciler_renders_total",
                    "stunner_reconciler_render_duration_seconds_bucket",
                    'stunner_reconciler_api_writes_total{kind="Service",result="ok",verb="create"}',
                    "stunner_reconciler_cds_clients 0.0",
                    # The CDS's connection discipline (stunner_http; issue 20).
                    'stunner_reconciler_http_refused_total{server="cds"} 0.0',
                    'stunner_reconciler_http_accept_errors_total{server="cds"} 0.0',
                    'stunner_reconciler_websocket_closed_total{reason="flooding",server="cds"} 0.0',
                    "stunner_reconciler_leader 1.0",
                    "stunner_reconciler_cache_fresh 1.0",
                ):
                    assert name in text, name

    asyncio.run(main())


def test_a_watch_resumes_with_bookmarks_and_relists_after_410(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            fake.bookmark_interval = 0.2
            k.world(fake)
            async with k.reconciler(fake, tmp_path, watch_timeout=1) as running:
                await k.settled(running, fake)
                await asyncio.sleep(1.5)  # every watch ended once and resumed
                fake.stop()
                k.set_peer(fake, "10.0.0.3/32")
                fake.compact()  # resuming from before the edit is now 410 Gone
                fake.start()
                await k.eventually(
                    lambda: (
                        "10.0.0.3/32"
                        in running.mode.store.configs["stunner/gw"].clusters[0].endpoints
                    )
                )
                text = running.mode.metrics.exposition().decode()
                assert 'reason="expired"' in text

    asyncio.run(main())


def test_a_kind_not_served_is_none_and_is_looked_for_again(tmp_path: Path) -> None:
    """A cluster without the ReferenceGrant CRD or the Gateway API UDPRoute: the rest renders;
    a CRD installed later is found."""
    from tests.support.fakeapi import CORE_TYPES, GATEWAY_TYPES

    missing = [t for t in GATEWAY_TYPES if t.kind in ("ReferenceGrant",) or (
        t.kind == "UDPRoute" and t.group == "gateway.networking.k8s.io")]  # fmt: skip

    async def main() -> None:
        types = tuple(t for t in CORE_TYPES + GATEWAY_TYPES if t not in missing)
        with FakeApiServer(types) as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path, not_served_retry=0.3) as running:
                await k.settled(running, fake)
                assert k.get(fake, "apps/v1", "Deployment", "gw") is not None
                assert running.mode.ready()[0]
                for rt in missing:
                    fake.register(rt)
                masking = k.route(name="route") | {"apiVersion": "gateway.networking.k8s.io/v1"}
                fake.seed(masking)
                await k.eventually(
                    lambda: (k.get(fake, GW, "UDPRoute", "route") or {}).get("status"),
                    what="the Gateway API UDPRoute found and judged",
                )

    asyncio.run(main())
