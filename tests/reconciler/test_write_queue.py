"""The leader's write queue (reconciler.write_queue) on its own, against the fake API server
(real REST): a refused write is retried with back-off on its own timer and never ends the
loop, the other writes go through meanwhile, and what is finally written is the newest
plan's version of the object, not the one first refused."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

from reconciler import events
from reconciler.kube.api import Api, load_client, refusal
from reconciler.kube.writer import Writer
from reconciler.metrics import Metrics
from reconciler.relevance import References
from reconciler.render import Plan, Renderer, RenderSettings
from reconciler.store import Cache, Snapshot
from reconciler.write_backoff import WriteBackoff
from reconciler.write_queue import WriteQueue
from tests.reconciler import clusterkit as k
from tests.support.fakeapi import FakeApiServer


def render(cache: Cache) -> tuple[Plan, frozenset[str]]:
    """The plan of the cache as it is, and the Gateways it renders ("namespace/name")."""
    snapshot = Snapshot.from_objects(cache.rendered_objects())
    plan = Renderer(RenderSettings()).render(snapshot, datetime.now(UTC))
    references = References.of(snapshot, k.CONTROLLER)
    return plan, frozenset(f"{ns}/{name}" for ns, name in references.gateways)


def deployment_posts(fake: FakeApiServer) -> int:
    return sum(1 for m, p in fake.writes() if m == "POST" and p.endswith("/deployments"))


def test_a_refused_write_is_retried_with_back_off_and_the_newest_version_is_written(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            api = Api(load_client(str(fake.write_kubeconfig(tmp_path / "kubeconfig"))))
            cache = Cache()
            k.relist(api, cache)
            plan, ours = render(cache)
            current = {"plan": plan}
            metrics = Metrics()
            queue = WriteQueue(
                Writer(api, cache),
                cache,
                metrics,
                events.Recorder(api, k.CONTROLLER, "test", refusal),
                WriteBackoff(0.05, 0.2),
                leading=lambda: True,
                ours=lambda: ours,
            )
            fake.refuse("POST", "deployments", 422)
            loop = asyncio.create_task(queue.run(lambda: current["plan"]))
            queue.want()  # one pass asked for: the retries come from the back-off's timer
            try:
                await k.eventually(lambda: k.get(fake, "v1", "Service", "gw"), what="Service")
                await k.eventually(lambda: deployment_posts(fake) >= 3, what="retries")
                assert not loop.done()  # refusals end nothing
                (refused,) = queue.backoff.pending.values()
                assert refused.failures >= 2
                assert k.get(fake, "apps/v1", "Deployment", "gw") is None

                # The user scales the dataplane while the create is refused: the next render's
                # Deployment is the one that goes out once the API server accepts it.
                k.scale_dataplane(fake, 3)
                k.relist(api, cache)
                current["plan"], ours = render(cache)
                fake.refuse("POST", "deployments", None)
                made = await k.eventually(
                    lambda: k.get(fake, "apps/v1", "Deployment", "gw"), what="the Deployment"
                )
                assert made["spec"]["replicas"] == 3
                await k.eventually(lambda: not queue.backoff.pending, what="back-off forgotten")
                assert not loop.done()
                exposition = metrics.exposition().decode()
                assert 'kind="Deployment",result="422",verb="create"' in exposition
                assert 'kind="Deployment",result="ok",verb="create"' in exposition
            finally:
                loop.cancel()
                api.close()

    asyncio.run(main())
