"""Cluster mode's writes: the diff of a plan against the cache, sent by the leader, each refused
write retried with its own back-off (`write_backoff`), the Events their results are worth.

A pass is wanted (`want`) after a render's configs went out, when one of our written-only objects
changed, when this replica becomes the leader and when a refused write is due again; passes
coalesce (one wanted while one runs is one more pass, over the newest plan). The diff and the
sends run in a thread: the event loop keeps rendering and serving meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable, Sequence

from stunner_api.vocabulary import OWNED_BY_LABEL

from . import events
from .apply import Memo, Write, plan_writes
from .kube.writer import Writer, WriteResult
from .metrics import Metrics
from .render import Plan
from .store import Cache, labels_of
from .write_backoff import WriteBackoff

log = logging.getLogger("stunner.reconciler")

# Writes in flight at once: a write waits on the API server most of its time (its answer and
# the admission chain), so a few in flight keep it busy (bench/reconciler_bench.py: the first
# pass over 1,000 Gateways is 4,000 writes).
WRITERS = 4


class WriteQueue:
    """The leader's writes (see the module's docstring)."""

    def __init__(
        self,
        writer: Writer,
        cache: Cache,
        metrics: Metrics,
        recorder: events.Recorder,
        backoff: WriteBackoff,
        *,
        leading: Callable[[], bool],
        ours: Callable[[], frozenset[str]],
    ) -> None:
        self.writer = writer
        self.cache = cache
        self.metrics = metrics
        self.recorder = recorder
        self.backoff = backoff
        self.leading = leading  # whether this replica may write now
        self.ours = ours  # "namespace/name" of the Gateways we render
        self.memo: Memo = {}
        self.writes_sent = 0
        self.last_writes: list[Write] = []
        self.applying = False  # a pass of writes (and the Events it records) is under way
        self.wanted = asyncio.Event()
        self._retry_timer: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()

    def want(self) -> None:
        """Ask for a pass of writes (on the loop)."""
        self.wanted.set()

    @property
    def idle(self) -> bool:
        """No pass of writes wanted or running (a refused write waiting for its retry is not
        under way: it may be refused for good)."""
        return not self.applying and not self.wanted.is_set()

    def writes_for(self, plan: Plan) -> list[Write]:
        services = [s for s in self.cache.all_of("Service") if labels_of(s).get(OWNED_BY_LABEL)]
        return plan_writes(
            plan,
            self.cache.get,
            self.ours(),
            deployments=self.cache.all_of("Deployment"),
            services=services,
            memo=self.memo,
            daemonsets=self.cache.all_of("DaemonSet"),
            service_accounts=self.cache.all_of("ServiceAccount"),
        )

    def _diff_and_send(self, plan: Plan, now: float) -> list[WriteResult]:
        """In a thread: the writes the plan needs (those not backing off), sent while this
        replica may write."""
        writes = [w for w in self.writes_for(plan) if self.backoff.due(w, now)]
        self.last_writes = writes

        def send(write: Write) -> WriteResult | None:
            return self.writer.send(write) if self.leading() else None

        # The ServiceAccounts go first and are answered before the rest is sent: a Deployment
        # naming an account not yet made has its pods refused until the account exists.
        first = [w for w in writes if w.kind == "ServiceAccount"]
        answered: list[WriteResult | None] = []
        for phase in (first, [w for w in writes if w.kind != "ServiceAccount"]):
            if len(phase) <= 1:
                answered += [send(w) for w in phase]
                continue
            # each write is one object's: within a phase they go in any order, WRITERS at a time
            with concurrent.futures.ThreadPoolExecutor(WRITERS, "reconciler-writer") as pool:
                answered += pool.map(send, phase)
        return [result for result in answered if result is not None]

    def _send_until(self, writes: Sequence[Write], deadline: float) -> list[WriteResult]:
        """In a thread: the writes, one by one, while time is left."""
        return [self.writer.send(w) for w in writes if time.monotonic() < deadline]

    async def run(self, last_plan: Callable[[], object]) -> None:
        """The apply loop: a pass over the newest plan whenever one is wanted."""
        while True:
            await self.wanted.wait()
            self.wanted.clear()
            plan = last_plan()
            if not self.leading() or not isinstance(plan, Plan):
                continue
            self.applying = True
            try:
                results = await asyncio.to_thread(self._diff_and_send, plan, time.monotonic())
                worth = self._account(results)
                if worth and self.leading():
                    await asyncio.to_thread(self.recorder.record, worth)
            finally:
                self.applying = False

    async def send_final(self, plan: Plan, deadline: float) -> int:
        """On shutdown: the writes `plan` needs, sent (whoever leads) while time is left, and
        their Events if time is still left; how many were sent."""
        results = await asyncio.to_thread(self._send_until, self.writes_for(plan), deadline)
        worth = self._account(results)
        if worth and time.monotonic() < deadline:
            await asyncio.to_thread(self.recorder.record, worth)
        return len(results)

    def _account(self, results: Sequence[WriteResult]) -> list[events.EventSpec]:
        """Count the results, back off the refused writes; the events they are worth."""
        now = time.monotonic()
        worth: list[events.EventSpec] = []
        for result in results:
            if result.skipped:
                log.info("%s not sent: %s", result.write, result.skipped)
                continue
            self.writes_sent += 1
            label = "ok" if result.ok else str(result.code)
            self.metrics.api_writes.labels(str(result.write.verb), result.write.kind, label).inc()
            if result.ok:
                self.backoff.succeeded(result.write)
                worth += events.for_success(result.write, result.previous)
                continue
            refused = self.backoff.refused(result.write, result.code, now)
            log.warning(
                "%s refused (%s); retrying in %.1f s", result.write, result.error, refused.due - now
            )
            failures = refused.failures
            worth += events.for_failure(result.write, result.previous, failures, result.error)
        due = self.backoff.next_due()
        if due is not None:
            if self._retry_timer is not None:
                self._retry_timer.cancel()
            self._retry_timer = self._loop.call_later(
                max(0.0, due - time.monotonic()), self.wanted.set
            )
        return worth
