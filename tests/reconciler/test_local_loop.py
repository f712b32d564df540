"""The render loop (reconciler.loop) with the real render and ConfigStore.

We test: a burst of updates makes one render of the newest objects, renders are a throttle window
apart, or as long apart as the last render took when that is longer; a Gateway that fails the
rules is skipped with its reason logged once, and the rest is published; a render that raises
publishes nothing and the published configs stay; the findings that go away are logged as
resolved.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.cds.store import ConfigStore
from reconciler.local import renderer
from reconciler.loop import Reconciler, Rendered
from reconciler.render import RenderSettings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "local"


def example_objects() -> list[dict[str, Any]]:
    return [
        obj
        for path in sorted(EXAMPLE.glob("*.yaml"))
        for obj in yaml.safe_load_all(path.read_text())
        if obj
    ]


def gateway(name: str, protocol: str = "TURN-UDP") -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": "stunner"},
        "spec": {
            "gatewayClassName": "stunner-gatewayclass",
            "listeners": [{"name": "l", "port": 3478, "protocol": protocol}],
        },
    }


def test_a_burst_of_updates_renders_once_and_renders_are_throttled() -> None:
    async def main() -> None:
        render = renderer(RenderSettings())
        seen: list[tuple[int, float]] = []  # (objects, when)

        def counting(objects: Sequence[Mapping[str, Any]]) -> Rendered:
            seen.append((len(objects), time.monotonic()))
            return render(objects)

        store = ConfigStore()
        loop = Reconciler(counting, store, throttle=0.3)

        async def renders(count: int) -> None:
            async with loop.rendered:
                await asyncio.wait_for(loop.rendered.wait_for(lambda: loop.renders >= count), 5)

        task = asyncio.create_task(loop.run())
        try:
            base = example_objects()
            start = time.monotonic()
            loop.update(base)
            await renders(1)
            assert seen[0][0] == len(base)
            assert seen[0][1] - start < 0.3  # the first change after a quiet period: at once
            for count in range(1, 11):
                loop.update([*base, *(gateway(f"gw-{i}") for i in range(count))])
                await asyncio.sleep(0.01)
            await renders(2)
            await asyncio.sleep(0.4)  # no further render is pending
            assert [objects for objects, _ in seen] == [len(base), len(base) + 10]
            assert seen[1][1] - seen[0][1] >= 0.3  # a throttle window apart
            assert len(store.configs) == 11
        finally:
            task.cancel()

    asyncio.run(asyncio.wait_for(main(), 10))


def test_a_gateway_that_fails_the_rules_is_skipped_and_the_rest_published(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = ConfigStore()
    loop = Reconciler(renderer(RenderSettings()), store)
    bad = gateway("bad-gateway", protocol="HTTP")
    loop.update([*example_objects(), bad])
    with caplog.at_level(logging.INFO, logger="stunner.reconciler"):
        loop.reconcile()
        loop.reconcile()
    assert sorted(store.configs) == ["stunner/bad-gateway", "stunner/local-gateway"]
    assert store.configs["stunner/bad-gateway"].listeners == []  # its listener is skipped
    assert len(store.configs["stunner/local-gateway"].listeners) == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # logged when it appears, not on every render
    assert "Gateway stunner/bad-gateway" in warnings[0] and "HTTP" in warnings[0]
    caplog.clear()
    loop.update(example_objects())
    with caplog.at_level(logging.INFO, logger="stunner.reconciler"):
        loop.reconcile()
    assert "resolved: Gateway stunner/bad-gateway" in caplog.text
    assert sorted(store.configs) == ["stunner/local-gateway"]


def test_a_render_that_raises_publishes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    store = ConfigStore()
    render = renderer(RenderSettings())
    loop = Reconciler(render, store)
    loop.update(example_objects())
    loop.reconcile()
    before = dict(store.configs)

    def broken(objects: Sequence[Mapping[str, Any]]) -> Rendered:
        raise RuntimeError("render bug")

    loop.render = broken
    loop.update([])
    assert loop.reconcile() is None
    assert dict(store.configs) == before
    assert "render failed; the published configs stay" in caplog.text


def test_after_a_slow_render_the_next_waits_as_long_as_it_took() -> None:
    """The throttle adapts to the render's cost: a render that took 100 s (on the loop's clock)
    holds the next one back for as long, not for the 10 ms throttle window."""

    async def main() -> None:
        render = renderer(RenderSettings())
        now = [0.0]

        def slow(objects: Sequence[Mapping[str, Any]]) -> Rendered:
            now[0] += 100.0  # the render took 100 s, as the loop's clock says
            return render(objects)

        loop = Reconciler(slow, ConfigStore(), throttle=0.01, clock=lambda: now[0])
        task = asyncio.create_task(loop.run())
        try:
            base = example_objects()
            loop.update(base)
            async with loop.rendered:
                await asyncio.wait_for(loop.rendered.wait_for(lambda: loop.renders >= 1), 5)
            assert loop.cost == 100.0
            loop.update([*base, gateway("gw-1")])
            await asyncio.sleep(0.5)  # a 10 ms window would have rendered long ago
            assert loop.renders == 1
        finally:
            task.cancel()

    asyncio.run(asyncio.wait_for(main(), 10))
