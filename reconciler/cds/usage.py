"""Cluster-wide user quotas, the CDS's side around the pure board (reconciler.cds.quota, which
says who reports and what each is told): which watcher's report counts, the pods known to be
the Gateways', and when the reporters are told (README "Cluster-wide user quotas").

`UsageDesk`, one per ConfigStore, on the event loop:

- `refusal(watcher)` before a report is parsed: a watcher whose token is bound to no pod (or a
  reader's: `Reporting.may_report`) or a config published without a quota counts nothing
  (`refuse`: counted in `refused`, logged at a bounded rate), and costs no parse;
- `report(watcher, counts)`: where tokens are checked, a watcher's report counts only once its
  pod is known to be one of the Gateway's (`pod_seen`/`pod_gone`: cluster mode's watch of the
  dataplane pods), and only on a config published with a quota (`set_quota`, `config_gone`);
  until both are known the reporter's latest report is held, counting nothing (a reconciler
  that restarts hears the pods' tables, which they send again only when they change, before it
  has listed the pods and rendered);
- a config's reporters are told their new others at most once per `interval` (REPORT_INTERVAL):
  at once after a quiet spell, else when the interval since the last time is over. A report
  costs its parse and its own diff; the sums go out once per interval, however many reports.

Per-watcher log lines are rate-limited (stunner_http.server.RateLimitedLog): anyone who may
connect can make many watchers. Logs name watchers, pods and ids, never user ids.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Hashable, Mapping
from typing import Protocol

from stunner_api.cds import REPORT_INTERVAL
from stunner_http.server import RateLimitedLog

from .quota import PodClaim, UsageBoard

log = logging.getLogger("stunner.cds-server")

LOG_PERIOD = 10.0  # seconds between two lines of one kind about watchers
USAGE_FRAME = ""  # a watcher's pending frame of usage (config ids are never empty)
# Why a usage report counts nothing (`UsageDesk.refusal`, counted in `UsageDesk.refused`).
NOT_A_POD = "not a pod of the Gateway"
NO_QUOTA = "no user quota"


class Reporting(Protocol):
    """What the desk needs of a watcher (reconciler.cds.store.Watcher)."""

    peer: str
    pod: PodClaim | None

    def __hash__(self) -> int: ...

    @property
    def may_report(self) -> bool: ...

    @property
    def config(self) -> str: ...

    def reporter(self) -> Hashable: ...

    def offer(self, id: str, text: str) -> None: ...


class UsageDesk:
    """The usage reports of one CDS (see the module's docstring)."""

    def __init__(self, interval: float = REPORT_INTERVAL) -> None:
        self.board: UsageBoard[Hashable, Reporting] = UsageBoard()
        self.interval = interval
        self.refused: Counter[str] = Counter()  # reports that counted nothing, by reason
        self._held: dict[Hashable, tuple[Reporting, dict[str, int]]] = {}  # pods not known yet
        self._pods: dict[str, dict[str, str]] = {}  # config id -> pod name -> uid
        self._configs: set[str] = set()  # the ids of the configs published
        self._flushed: dict[str, float] = {}
        self._flushing: dict[str, asyncio.TimerHandle] = {}
        self._logs = {
            what: RateLimitedLog(log, LOG_PERIOD) for what in ("reporting", "refused", "held")
        }

    def total(self, id: str) -> dict[str, int]:
        return self.board.total(id)

    @property
    def held(self) -> int:
        """Reports held until their pod or their config is known."""
        return len(self._held)

    def reporters(self, id: str) -> int:
        return self.board.reporters(id)

    def set_quota(self, id: str, quota: int) -> None:
        """Config `id` is published with this user quota (0: none; its reports, held ones too,
        are forgotten; > 0: the reports held for it are taken)."""
        self._configs.add(id)
        self.board.set_quota(id, quota)
        held = [r for r, (w, _) in self._held.items() if w.config == id]
        if quota <= 0:
            for reporter in held:
                del self._held[reporter]
            self._flushed.pop(id, None)
        else:
            for reporter in held:
                self.report(*self._held.pop(reporter))
        self._schedule()

    def config_gone(self, id: str) -> None:
        """Config `id` is no longer published: its reports are forgotten."""
        self.set_quota(id, 0)
        self._configs.discard(id)

    def refusal(self, watcher: Reporting) -> str | None:
        """Why a report of `watcher` would count nothing (None: it may count)."""
        if not watcher.may_report:
            return NOT_A_POD
        if watcher.config in self._configs and self.board.quota(watcher.config) <= 0:
            return NO_QUOTA
        return None

    def refuse(self, watcher: Reporting, reason: str) -> None:
        """A report of `watcher` counts nothing (`refusal`)."""
        self.refused[reason] += 1
        self._withdraw(watcher)
        self._logs["refused"].event(
            logging.INFO if reason == NO_QUOTA else logging.WARNING,
            "usage report of watcher %s for %s ignored: %s",
            watcher.peer,
            watcher.config,
            reason,
        )

    def report(self, watcher: Reporting, counts: Mapping[str, int]) -> None:
        """`watcher`'s allocation counts per user of the one config it watches."""
        reason = self.refusal(watcher)
        if reason is not None:
            self.refuse(watcher, reason)
            return
        id, reporter, pod = watcher.config, watcher.reporter(), watcher.pod
        unknown_pod = pod is not None and self._pods.get(id, {}).get(pod.name) != pod.uid
        if unknown_pod or id not in self._configs:
            self.board.drop(watcher)
            self._held[reporter] = (watcher, dict(counts))
            self._logs["held"].event(
                logging.INFO,
                "watcher %s reports for %s as %s, not (yet) %s: its report counts once it is",
                watcher.peer,
                id,
                f"pod {pod.name}" if pod is not None else "itself",
                "a known pod of the Gateway" if unknown_pod else "a published config",
            )
            self._schedule()
            return
        self._held.pop(reporter, None)
        first = watcher not in self.board
        self.board.report(id, reporter, watcher, counts)
        if first:
            self._logs["reporting"].event(
                logging.INFO,
                "watcher %s reports its user quota usage for %s (%d reporting)",
                watcher.peer,
                id,
                self.board.reporters(id),
            )
        self._schedule()

    def pod_seen(self, id: str, name: str, uid: str) -> None:
        """A dataplane pod of config `id` (a report it made while not known now counts)."""
        self._pods.setdefault(id, {})[name] = uid
        held = self._held.pop((id, name, uid), None)
        if held is not None:
            self.report(*held)

    def pod_gone(self, id: str, name: str, uid: str) -> None:
        """A dataplane pod of config `id` is no more: its counts no longer count."""
        pods = self._pods.get(id, {})
        if pods.get(name) == uid:
            del pods[name]
            if not pods:
                del self._pods[id]
        self._held.pop((id, name, uid), None)
        self.board.remove((id, name, uid))
        self._schedule()

    def forget(self, watcher: Reporting) -> None:
        """`watcher` is gone: its counts no longer count."""
        self._withdraw(watcher)

    def _withdraw(self, watcher: Reporting) -> None:
        reporter = watcher.reporter()
        held = self._held.get(reporter)
        if held is not None and held[0] is watcher:
            del self._held[reporter]
        self.board.drop(watcher)
        self._schedule()

    def _schedule(self) -> None:
        """Flush each config with news at once if its last flush is `interval` old, else when
        it is."""
        due = self.board.dirty - self._flushing.keys()
        if not due:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a store used on its own): at once
            for id in due:
                self._flush(id)
            return
        now = time.monotonic()
        for id in due:
            wait = self._flushed.get(id, now - self.interval) + self.interval - now
            self._flushing[id] = loop.call_later(max(0.0, wait), self._flush, id)

    def _flush(self, id: str) -> None:
        self._flushing.pop(id, None)
        if self.board.quota(id) > 0:
            self._flushed[id] = time.monotonic()
        for watcher, text in self.board.flush(id):
            watcher.offer(USAGE_FRAME, text)
