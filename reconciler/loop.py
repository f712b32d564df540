"""One coalescing, level-based loop: trigger -> snapshot -> render -> publish.

Any number of triggers (`update(objects)` with the whole current set of objects, or a bare
`trigger()`) between two renders make one render of the newest state: the loop never works
through a backlog of stale events. Renders are at least `throttle` seconds apart (Go's
`--throttle-timeout`, 250 ms): the first change after a quiet period renders at once, a burst of
changes renders once more when the window ends. The throttle adapts to the render's cost: after
a render that took longer than the window, the next one waits as long as that render took, so
rendering never takes more than half of the time, however large the cluster.

With `in_thread` (cluster mode) the render runs in a worker thread on the objects as they were
when it started (render is pure; the objects are never changed, only replaced), and its plan is
published back on the loop: the loop goes on serving the CDS watchers and the auth service
meanwhile. (The render holds the GIL while it computes; the loop thread gets it back at every
switch interval, 5 ms, so it is slowed, not stopped.)

Each render makes the published configs exactly the plan's (`ConfigStore.publish`): a changed
Gateway's watchers get its new config, a vanished Gateway's get the zero config. What render
skipped or degraded (a manifest that fails the rules) is logged with its reason once, when it
first appears, and the rest is published. A render that raises is logged and publishes nothing:
the running configs stay.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from stunner_api.dataplane import StunnerConfig

from .cds.store import ConfigStore

log = logging.getLogger("stunner.reconciler")

THROTTLE = 0.25  # seconds between two renders (Go's --throttle-timeout default)

Object = Mapping[str, Any]


class Rendered(Protocol):
    """What the loop needs of a render's plan: the configs by CDS id and the findings."""

    @property
    def configs(self) -> Mapping[str, StunnerConfig]: ...

    @property
    def findings(self) -> Sequence[object]: ...


Render = Callable[[Sequence[Object]], Rendered]


class Reconciler:
    """Renders the newest objects and publishes the configs to a `ConfigStore`."""

    def __init__(
        self,
        render: Render,
        store: ConfigStore,
        *,
        throttle: float = THROTTLE,
        clock: Callable[[], float] = time.monotonic,
        in_thread: bool = False,
    ) -> None:
        self.render = render
        self.store = store
        self.throttle = throttle
        self.clock = clock
        self.in_thread = in_thread
        self.cost = 0.0  # seconds the last render took
        # Called on the loop after each render's plan is published.
        self.published: Callable[[Rendered], None] = lambda plan: None
        self.objects: Sequence[Object] = ()
        self.renders = 0
        self.last_plan: Rendered | None = None
        self._wanted = asyncio.Event()
        self._rendering = False  # from the trigger's clearing to the plan's publishing
        self._last_render = -float("inf")
        self._findings: set[str] = set()
        self.rendered = asyncio.Condition()

    def update(self, objects: Sequence[Object]) -> None:
        """The whole current set of objects (level-based): render it soon."""
        self.objects = objects
        self.trigger()

    def trigger(self) -> None:
        self._wanted.set()

    @property
    def idle(self) -> bool:
        """No render wanted, and none under way or waiting to be published."""
        return not self._wanted.is_set() and not self._rendering

    def reconcile(self) -> Rendered | None:
        """Render the current objects once and publish the configs (the loop's body)."""
        return self._publish(self._render())

    def _render(self) -> Rendered | None:
        self.renders += 1
        try:
            return self.render(self.objects)
        except Exception:
            log.exception("render failed; the published configs stay as they were")
            return None

    def _publish(self, plan: Rendered | None) -> Rendered | None:
        if plan is None:
            return None
        self._log_findings(plan.findings)
        # The Nodes' public addresses first: the configs published next are patched with them.
        self.store.set_nodes(getattr(plan, "node_addresses", {}))
        self.store.node_local = dict(getattr(plan, "node_local", {}))
        changed = self.store.publish(plan.configs)
        log.info(
            "rendered %d objects: %d configs, %d changed, %d findings",
            len(self.objects),
            len(plan.configs),
            len(changed),
            len(plan.findings),
        )
        self.last_plan = plan
        self.published(plan)
        return plan

    def _log_findings(self, findings: Sequence[object]) -> None:
        current = {str(finding) for finding in findings}
        for finding in sorted(current - self._findings):
            log.warning("%s", finding)
        for finding in sorted(self._findings - current):
            log.info("resolved: %s", finding)
        self._findings = current

    async def run(self) -> None:
        """Render on every trigger, coalesced and throttled, until cancelled."""
        finished = -float("inf")
        while True:
            await self._wanted.wait()
            due = max(self._last_render + self.throttle, finished + self.cost)
            wait = due - self.clock()
            if wait > 0:
                await asyncio.sleep(wait)  # triggers meanwhile coalesce into this render
            self._wanted.clear()
            self._rendering = True
            try:
                self._last_render = self.clock()
                if self.in_thread:
                    plan = await asyncio.to_thread(self._render)
                else:
                    plan = self._render()
                finished = self.clock()
                self.cost = finished - self._last_render
                self._publish(plan)
            finally:
                self._rendering = False
            async with self.rendered:
                self.rendered.notify_all()
