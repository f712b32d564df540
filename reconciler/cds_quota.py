"""Cluster-wide user quotas on the CDS: the latest usage report of every reporting watcher, and
what each of them is told (README "Cluster-wide user quotas", stunner_api.cds for the frames).

`UsageBoard` is pure (no I/O, no asyncio): `report(id, watcher, counts)` records a watcher's
allocation counts per user id for the config `id` and returns the watchers of that id whose
"others" changed, each with its new others: the sum, per user, of every OTHER reporting
watcher's counts of the same id. `drop(watcher)` forgets a watcher that went away (closed,
ping timeout, dropped for not reading) and returns the same. Only watchers that have reported
appear: a watcher that never reports (Go's stunnerd) is never told anything.

Why "others" and not the total: the pod admits when `own count + others < quota`, with its own
count always live; a total would carry the pod's own count as it was one report ago, and the pod
would have to subtract a number it no longer knows.

The sum holds per CDS server (per reconciler replica): README says what that means with several.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping
from typing import Generic, TypeVar

W = TypeVar("W", bound=Hashable)


def others_of(reports: Mapping[W, Mapping[str, int]], me: W) -> dict[str, int]:
    """Per user id, the sum of every report but `me`'s (users at zero left out)."""
    return _minus(_sum(reports), reports.get(me, {}))


def _sum(reports: Mapping[W, Mapping[str, int]]) -> Counter[str]:
    total: Counter[str] = Counter()
    for counts in reports.values():
        total.update(counts)
    return total


def _minus(total: Counter[str], own: Mapping[str, int]) -> dict[str, int]:
    return {u: n - own.get(u, 0) for u, n in sorted(total.items()) if n - own.get(u, 0) > 0}


class UsageBoard(Generic[W]):
    """The reports of the reporting watchers, by config id, and what each was told last."""

    def __init__(self) -> None:
        self._reports: dict[str, dict[W, dict[str, int]]] = {}
        self._ids: dict[W, str] = {}
        self._told: dict[W, dict[str, int]] = {}

    def __contains__(self, watcher: W) -> bool:
        return watcher in self._ids

    def reporters(self, id: str) -> int:
        return len(self._reports.get(id, {}))

    def total(self, id: str) -> dict[str, int]:
        """Per user, the allocations every reporting pod of `id` holds (for the log and tests)."""
        return _minus(_sum(self._reports.get(id, {})), {})

    def report(
        self, id: str, watcher: W, counts: Mapping[str, int]
    ) -> list[tuple[W, dict[str, int]]]:
        """Record `watcher`'s counts for `id`; the watchers to tell their new others."""
        if self._ids.setdefault(watcher, id) != id:
            raise ValueError(f"watcher reported for {id}, and before for {self._ids[watcher]}")
        self._reports.setdefault(id, {})[watcher] = {u: n for u, n in counts.items() if n > 0}
        return self._tell(id)

    def drop(self, watcher: W) -> list[tuple[W, dict[str, int]]]:
        """Forget `watcher` (gone); the watchers to tell their new others."""
        id = self._ids.pop(watcher, None)
        self._told.pop(watcher, None)
        if id is None:
            return []
        reports = self._reports[id]
        del reports[watcher]
        if not reports:
            del self._reports[id]
            return []
        return self._tell(id)

    def _tell(self, id: str) -> list[tuple[W, dict[str, int]]]:
        reports = self._reports[id]
        total = _sum(reports)
        changed = []
        for watcher, own in reports.items():
            others = _minus(total, own)
            if self._told.get(watcher, {}) != others:
                self._told[watcher] = others
                changed.append((watcher, others))
        return changed
