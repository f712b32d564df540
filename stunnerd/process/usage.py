"""Cluster-wide user quotas, stunnerd's side: report this pod's allocation counts per user to
the CDS on the config watch, and count what the CDS says the other pods hold (README
"Cluster-wide user quotas"; the frames are stunner_api.cds's, the CDS side reconciler.cds.quota).

`UsageReporter` is the primary process's, over its `LocalQuota` (which the UDP workers ask too):

- while the running config has `admin.user_quota` > 0 (`set_enabled`), `frames()` yields, on
  each CDS connection, the whole table at once and again whenever it changes, at most every
  `interval` seconds (the levels, not the changes: a lost report is made good by the next);
  with no quota nothing is sent, so a stunnerd without one speaks the CDS exactly as Go's does;
- `received(frame)` sets the quota's `others`: an Allocate is admitted while this pod's own
  count plus the other pods' is below the quota. A frame it refuses (malformed, a count past
  MAX_USAGE_COUNT) clears `others`: the pod counts its own allocations only, `shared` says so
  (`stunner_user_quota_shared` 0), until the CDS sends a frame it takes;
- `disconnected()` clears `others`: while the CDS is unreachable, each pod counts its own
  allocations only (it can admit up to the quota on its own), until it reconnects and reports.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from stunner_api.cds import (
    REPORT_INTERVAL,
    USAGE_OTHERS_KEY,
    USAGE_REPORT_KEY,
    UsageError,
    encode_usage,
    parse_usage,
    usage_key,
)

from ..turn.ledger import LocalQuota

log = logging.getLogger("stunner.quota")


class UsageReporter:
    """This pod's usage reports and the other pods' counts, over the primary's `LocalQuota`."""

    def __init__(self, quota: LocalQuota, interval: float = REPORT_INTERVAL) -> None:
        self.quota = quota
        self.interval = interval
        self.enabled = False
        self.reports_sent = 0
        self._changed = asyncio.Event()
        self._connected = False
        self._refused = False  # the CDS's last usage frame was refused
        self._omitted = 0
        quota.on_change = self._changed.set

    @property
    def shared(self) -> bool | None:
        """With a quota: whether the other pods' counts are known (the CDS connected, and its
        last usage frame taken)."""
        return self._connected and not self._refused if self.enabled else None

    def set_enabled(self, enabled: bool) -> None:
        """Report (or stop: one empty report says so) as the running config has a user quota."""
        if enabled == self.enabled:
            return
        self.enabled = enabled
        if not enabled:
            self.quota.others = {}
        self._changed.set()

    def report(self) -> str:
        """The report of the counts now (empty while not enabled)."""
        text, omitted = encode_usage(USAGE_REPORT_KEY, self.quota.counts if self.enabled else {})
        if omitted and not self._omitted:
            log.warning(
                "user quota: %d user(s) with the fewest allocations left out of the report to "
                "the CDS (bounded size): the other pods do not see their allocations",
                omitted,
            )
        self._omitted = omitted
        return text

    async def frames(self) -> AsyncIterator[str]:
        """The reports of one CDS connection: the table at once, then each change, spaced by at
        least `interval` seconds. Nothing until a quota is configured."""
        self._connected = True
        self._refused = False
        last: str | None = None
        while True:
            self._changed.clear()
            if self.enabled or last is not None:
                text = self.report()
                if text != last:
                    yield text
                    last = text
                    self.reports_sent += 1
                    await asyncio.sleep(self.interval)
                    continue  # changes made meanwhile are in the next report
            await self._changed.wait()

    def takes(self, frame: str | bytes) -> bool:
        """Whether `frame` is a usage frame (else a config, or not ours)."""
        return usage_key(frame) == USAGE_OTHERS_KEY

    def received(self, frame: str | bytes) -> None:
        """A usage frame from the CDS: the other pods' counts per user."""
        try:
            others = parse_usage(frame, USAGE_OTHERS_KEY)
        except UsageError as exc:
            if not self._refused:
                log.warning(
                    "user quota: refused a usage frame from the CDS (%s); counting this pod's "
                    "allocations only until it sends one this pod takes",
                    exc,
                )
            self._refused = True
            self.quota.others = {}
            return
        if self._refused:
            log.info("user quota: the CDS's usage frames are taken again")
        self._refused = False
        if self.enabled:
            self.quota.others = others

    def disconnected(self) -> None:
        """The CDS connection ended or failed: count this pod's allocations only."""
        if self._connected and self.enabled:
            log.warning(
                "user quota: the CDS is unreachable; counting this pod's allocations only until "
                "it reconnects"
            )
        self._connected = False
        self.quota.others = {}
