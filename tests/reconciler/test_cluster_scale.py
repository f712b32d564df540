"""Cluster mode under a large or slow render (issue 20): the probes and the CDS are never held
up by it, and a change renders only what it touches.

- /healthz, /readyz and /metrics answer while the reconciler's event loop is blocked (as a
  render on it would block it): they are served from a thread of their own; /healthz still
  fails once the loop has not turned for `loop_stall` seconds (a wedged loop).
- A render runs in another thread than the event loop's, and while one is held mid-render the
  loop still serves the CDS and the probes answer.
- After the first pass, the echoes of the reconciler's own writes leave nothing to render
  again, and an edit of one Gateway's backend renders that Gateway's part only.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from reconciler.render import Plan
from reconciler.store import Snapshot
from stunner_api.vocabulary import CDS_TOKEN_AUDIENCE
from tests.reconciler import clusterkit as k
from tests.support.fakeapi import FakeApiServer

PATIENCE = 20.0  # seconds a probe may take before it counts as not answered (no timing test)


def _get(url: str, token: str = "") -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=PATIENCE) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def test_the_probes_answer_while_the_event_loop_is_blocked(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                assert running.health_address and running.metrics_address
                urls = [
                    running.health_address + "/healthz",
                    running.health_address + "/readyz",
                    running.metrics_address + "/metrics",
                ]
                answers: list[tuple[int, str]] = []
                blocked, released = threading.Event(), threading.Event()

                def probe() -> None:  # in a thread: the loop is blocked meanwhile
                    blocked.wait(PATIENCE)
                    answers.extend(_get(url) for url in urls)
                    released.set()

                def block_the_loop() -> None:  # what a render on the loop would do
                    blocked.set()
                    released.wait(3 * PATIENCE)

                prober = threading.Thread(target=probe)
                prober.start()
                asyncio.get_running_loop().call_soon(block_the_loop)
                await asyncio.sleep(0)  # the loop runs block_the_loop until the probes end
                await asyncio.to_thread(prober.join)
                assert released.is_set()
                assert [code for code, _ in answers] == [200, 200, 200], answers
                assert answers[0][1] == "ok\n"
                assert "stunner_reconciler_renders_total" in answers[2][1]

    asyncio.run(main())


def test_healthz_fails_while_the_event_loop_is_wedged_and_recovers(tmp_path: Path) -> None:
    """Served from its own thread, /healthz still tells a wedged loop: once the loop has not
    turned for `loop_stall` seconds it answers 503 with the reason (the kubelet restarts the
    reconciler); when the loop turns again, 200."""

    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path, loop_stall=0.5) as running:
                await k.settled(running, fake)
                assert running.health_address
                url = running.health_address + "/healthz"
                seen: list[tuple[int, str]] = []
                blocked, released = threading.Event(), threading.Event()

                def probe() -> None:  # polls until the wedge shows, then lets the loop go
                    blocked.wait(PATIENCE)
                    deadline = time.monotonic() + PATIENCE
                    while time.monotonic() < deadline:
                        seen.append(_get(url))
                        if seen[-1][0] != 200:
                            break
                        time.sleep(0.1)
                    released.set()

                def wedge() -> None:
                    blocked.set()
                    released.wait(3 * PATIENCE)

                prober = threading.Thread(target=probe)
                prober.start()
                asyncio.get_running_loop().call_soon(wedge)
                await asyncio.sleep(0)
                await asyncio.to_thread(prober.join)
                code, why = seen[-1]
                assert code == 503 and why.startswith("event loop stalled for"), seen[-1]
                await k.eventually(lambda: _get(url)[0] == 200, what="healthz back to 200")

    asyncio.run(main())


def test_a_render_runs_off_the_loop_which_serves_the_cds_meanwhile(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                assert running.health_address
                renderer = running.mode.renderer
                original: Callable[[Snapshot, datetime], Plan] = renderer.render
                started, release = threading.Event(), threading.Event()
                threads: list[int] = []

                def held(snapshot: Snapshot, now: datetime) -> Plan:
                    threads.append(threading.get_ident())
                    started.set()
                    release.wait(3 * PATIENCE)
                    return original(snapshot, now)

                renderer.render = held  # type: ignore[method-assign]
                renders = running.mode.reconciler.renders
                running.mode.reconciler.trigger()
                assert await asyncio.to_thread(started.wait, PATIENCE)
                try:
                    # Held mid-render: the loop answers a CDS request, the probes answer.
                    cds = f"{running.cds_address}/api/v1/configs/{k.NS}/gw"
                    # as the Gateway's stunnerd asks: with its pod's projected token
                    token = fake.issue_token(k.NS, "gw-stunnerd", (CDS_TOKEN_AUDIENCE,))
                    assert (await asyncio.to_thread(_get, cds, token))[0] == 200
                    assert (await asyncio.to_thread(_get, running.health_address + "/healthz"))[
                        0
                    ] == 200
                finally:
                    release.set()
                await running.rendered(renders + 1)
                assert threads and threading.get_ident() not in threads

    asyncio.run(main())


def _parts(running: Any) -> tuple[int, int]:
    renderer = running.mode.renderer
    return renderer.rendered_parts, renderer.kept_parts


def test_own_writes_render_nothing_again_and_an_edit_renders_its_part(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            other = k.gateway(name="gw2")
            peer2 = {"group": "stunner.l7mp.io", "kind": "StaticService", "name": "peer2"}
            k.world(
                fake,
                other,
                k.static_service("peer2", ("10.2.0.0/16",)),
                k.route(peer2, name="route2", parents=("gw2",)),
            )
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                # Every status, Service and Deployment is written and its echo is cached: a
                # render now finds nothing it read changed.
                renders = running.mode.reconciler.renders
                running.mode.reconciler.trigger()
                await running.rendered(renders + 1)
                assert _parts(running) == (0, 2)
                # One backend edited: its Gateway's part renders, the other's is kept.
                static = k.get(fake, "stunner.l7mp.io/v1", "StaticService", "peer2")
                assert static is not None
                static["spec"]["prefixes"] = ["10.99.0.0/16"]
                rt = fake.resource_type("stunner.l7mp.io/v1", "StaticService")
                renders = running.mode.reconciler.renders
                fake.replace(rt, k.NS, "peer2", static)
                await k.eventually(
                    lambda: "10.99.0.0/16" in str(running.mode.store.configs[f"{k.NS}/gw2"]),
                    what="the edit in gw2's config",
                )
                assert running.mode.reconciler.renders > renders
                assert _parts(running) == (1, 1)

    asyncio.run(main())
