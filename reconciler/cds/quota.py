"""Cluster-wide user quotas on the CDS: who may report, the running sums of the reports, and
what each reporting pod is told (README "Cluster-wide user quotas"; the frames are
stunner_api.cds's, the I/O around the board reconciler.cds.store's).

Who reports (issue 28): where the CDS checks tokens, a Gateway's own dataplane pods, one report
per pod. A bound (projected) token names its pod (`PodClaim`, from the TokenReview), and a pod is
the Gateway's when the cache holds a Pod of that name and uid labelled as its dataplane
(`dataplane_pod`: the labels render gives the pods of the Gateway's Deployment, in the Gateway's
namespace). Where the CDS checks no tokens (local mode, `--cds-auth=off`) every watcher of the
config reports for itself, as it did before.

`UsageBoard` is pure (no I/O, no asyncio, no clock). Its reporters are keys (a pod, or a
watcher), each with the watcher it reports on (the latest one: a pod that reconnects takes its
slot over, it is not counted twice):

- `set_quota(id, quota)`: the config's `admin.user_quota`; a config without one takes no report
  (`report` answers False) and forgets those it had;
- `report(id, reporter, watcher, counts)`: the reporter's latest counts, each clamped to the
  quota, folded into the config's running totals: the work is the report's size, whatever the
  number of reporters, and a report that changes no total marks nothing;
- `remove(reporter)`, `drop(watcher)`: a pod that is gone, a watcher that went away;
- `flush(id)`: the frames to send now, one per reporter of `id` whose others changed since it was
  last told: per user, the sum of every OTHER reporter's counts, at most the quota (so a frame
  never holds a count stunnerd refuses), the users the reporter itself holds first (so the cut
  to MAX_USAGE_USERS never leaves out a user the pod may admit again), then the largest. The
  caller flushes a config at most once per REPORT_INTERVAL: the fan-out is once per interval,
  not once per report.

Why "others" and not the total: the pod admits when `own count + others < quota`, with its own
count always live; a total would carry the pod's own count as it was one report ago, and the pod
would have to subtract a number it no longer knows.

The sums hold per CDS server (per reconciler replica): README says what that means with several.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from itertools import accumulate, chain
from typing import Any, Generic, TypeVar

from stunner_api.cds import (
    MAX_USAGE_COUNT,
    USAGE_OTHERS_KEY,
    config_id,
    usage_entry,
    usage_fits,
    usage_frame,
    usage_text,
)
from stunner_api.vocabulary import (
    APP_LABEL,
    APP_VALUE,
    RELATED_GATEWAY_NAME,
    RELATED_GATEWAY_NAMESPACE,
)

from ..store import labels_of, meta, name_of, namespace_of

K = TypeVar("K", bound=Hashable)
W = TypeVar("W", bound=Hashable)

# A bound ServiceAccount token's pod, as the TokenReview's status.user.extra names it.
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
NO_OTHERS = usage_frame(USAGE_OTHERS_KEY, ())[0]  # what a reporter knows before it is told


@dataclass(frozen=True)
class PodClaim:
    """The pod (of the account's namespace) a bound token was issued to, by the TokenReview."""

    name: str
    uid: str

    @classmethod
    def of_user(cls, user: Mapping[str, Any]) -> PodClaim | None:
        """The pod claims of a TokenReview's `status.user` (each extra a list of one), else
        None (a token bound to no pod: a TokenRequest's, a legacy Secret's)."""
        extra = user.get("extra")
        if not isinstance(extra, Mapping):
            return None
        name, uid = extra.get(POD_NAME_EXTRA), extra.get(POD_UID_EXTRA)
        if not (isinstance(name, list) and isinstance(uid, list) and len(name) == len(uid) == 1):
            return None
        if not (isinstance(name[0], str) and name[0] and isinstance(uid[0], str) and uid[0]):
            return None
        return cls(name[0], uid[0])


def dataplane_pod(pod: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(config id, pod name, pod uid) of a Pod labelled as a Gateway's dataplane pod (app=stunner
    and the related Gateway's name and namespace, which is the pod's own), else None."""
    labels = labels_of(pod)
    namespace, gateway = namespace_of(pod), labels.get(RELATED_GATEWAY_NAME)
    if labels.get(APP_LABEL) != APP_VALUE or not gateway:
        return None
    if labels.get(RELATED_GATEWAY_NAMESPACE) != namespace:
        return None
    uid = meta(pod).get("uid")
    if not isinstance(uid, str) or not uid or not name_of(pod):
        return None
    return config_id(namespace, gateway), name_of(pod), uid


def others_of(reports: Mapping[K, Mapping[str, int]], me: K) -> dict[str, int]:
    """Per user id, the sum of every report but `me`'s (users at zero left out)."""
    total: Counter[str] = Counter()
    for reporter, counts in reports.items():
        if reporter != me:
            total.update(counts)
    return {u: n for u, n in sorted(total.items()) if n > 0}


class UsageBoard(Generic[K, W]):
    """The reports of the reporting pods, by config id, their running sums, and what each
    reporter was told last (see the module's docstring)."""

    def __init__(self) -> None:
        self._quota: dict[str, int] = {}  # config id -> its user quota (> 0)
        self._reports: dict[str, dict[K, dict[str, int]]] = {}  # as reported (> 0 only)
        self._totals: dict[str, Counter[str]] = {}  # per user, the sum of the clamped counts
        self._id_of: dict[K, str] = {}
        self._holder: dict[K, W] = {}  # the watcher a reporter reports on (and is told on)
        self._reporter_of: dict[W, K] = {}
        self._told: dict[K, str] = {}
        self.dirty: set[str] = set()  # the configs whose reporters may have news

    def __contains__(self, watcher: W) -> bool:
        reporter = self._reporter_of.get(watcher)
        return reporter is not None and self._holder.get(reporter) == watcher

    def quota(self, id: str) -> int:
        return self._quota.get(id, 0)

    def reporters(self, id: str) -> int:
        return len(self._reports.get(id, {}))

    def total(self, id: str) -> dict[str, int]:
        """Per user, the allocations the reporting pods of `id` hold, each pod's counted up to
        the quota (for the log and tests)."""
        return {u: n for u, n in sorted(self._totals.get(id, Counter()).items()) if n > 0}

    def set_quota(self, id: str, quota: int) -> None:
        """The user quota of config `id` (0: none, and its reports are forgotten); one past what
        a frame may hold counts as that much (no sum sent ever passes it)."""
        quota = min(quota, MAX_USAGE_COUNT)
        if quota == self._quota.get(id, 0):
            return
        if quota <= 0:
            for reporter in list(self._reports.get(id, ())):
                self.remove(reporter)
            del self._quota[id]
            self.dirty.discard(id)
            return
        self._quota[id] = quota
        reports = self._reports.get(id)
        if reports:
            totals: Counter[str] = Counter()
            for counts in reports.values():
                totals.update({u: min(n, quota) for u, n in counts.items()})
            self._totals[id] = totals
            self.dirty.add(id)

    def report(self, id: str, reporter: K, watcher: W, counts: Mapping[str, int]) -> bool:
        """Record `reporter`'s counts for `id`, told on `watcher`; False (nothing recorded) when
        `id` has no quota."""
        quota = self._quota.get(id, 0)
        if quota <= 0:
            return False
        if self._id_of.setdefault(reporter, id) != id:
            before = self._id_of[reporter]
            raise ValueError(f"{reporter} reported for {id}, and before for {before}")
        reports = self._reports.setdefault(id, {})
        new = {u: n for u, n in counts.items() if n > 0}
        changed = self._fold(id, reports.get(reporter, {}), new, quota)
        reports[reporter] = new
        if self._holder.get(reporter) != watcher:
            self._holder[reporter] = watcher
            self._reporter_of[watcher] = reporter
            self._told.pop(reporter, None)  # a new connection knows nothing yet
            changed = True
        if changed:
            self.dirty.add(id)
        return True

    def remove(self, reporter: K) -> None:
        """Forget `reporter` (a pod that is gone, or may no longer report)."""
        id = self._id_of.pop(reporter, None)
        if id is None:
            return
        reports = self._reports[id]
        self._fold(id, reports.pop(reporter), {}, self._quota[id])
        if not reports:
            del self._reports[id]
            self._totals.pop(id, None)
        watcher = self._holder.pop(reporter)
        if self._reporter_of.get(watcher) == reporter:
            del self._reporter_of[watcher]
        self._told.pop(reporter, None)
        self.dirty.add(id)

    def drop(self, watcher: W) -> None:
        """`watcher` went away: the counts it reported no longer count (unless its reporter
        reports on another watcher by now)."""
        reporter = self._reporter_of.pop(watcher, None)
        if reporter is not None and self._holder.get(reporter) == watcher:
            self.remove(reporter)

    def flush(self, id: str) -> list[tuple[W, str]]:
        """(watcher, frame) for each reporter of `id` whose others changed since it was told."""
        self.dirty.discard(id)
        reports = self._reports.get(id)
        if not reports:
            return []
        quota, totals = self._quota[id], self._totals.get(id, Counter())
        ranked = sorted(((min(n, quota), u) for u, n in totals.items() if n > 0), key=_rank)
        everyone = _Entries([u for _, u in ranked], [usage_entry(u, n) for n, u in ranked])
        frames = []
        for reporter, own in reports.items():
            held = sorted(
                ((min(totals[u] - min(n, quota), quota), u) for u, n in own.items()), key=_rank
            )
            text = everyone.frame([usage_entry(u, n) for n, u in held if n > 0], own)
            if self._told.get(reporter, NO_OTHERS) != text:
                self._told[reporter] = text
                frames.append((self._holder[reporter], text))
        return frames

    def _fold(self, id: str, old: Mapping[str, int], new: Mapping[str, int], quota: int) -> bool:
        """Move the totals of `id` from `old` counts to `new` ones; whether a total changed."""
        if old == new:
            return False
        totals = self._totals.setdefault(id, Counter())
        changed = False
        for user in old.keys() | new.keys():
            delta = min(new.get(user, 0), quota) - min(old.get(user, 0), quota)
            if delta:
                changed = True
                totals[user] += delta
                if totals[user] <= 0:
                    del totals[user]
        return changed


def _rank(entry: tuple[int, str]) -> tuple[int, str]:
    return -entry[0], entry[1]


class _Entries:
    """Every reporter's sums of one flush, ranked, joined once: a reporter's frame is this body
    with its own users' entries cut out and put first (as `held`), a few slices of one string
    rather than a join of every user per reporter; past the bounds, entry by entry."""

    def __init__(self, users: list[str], entries: list[str]) -> None:
        self.users, self.entries = users, entries
        self.position = {u: i for i, u in enumerate(users)}
        self.body = ",".join(entries)
        self.starts = [0, *accumulate(len(e) + 1 for e in entries)]  # entry i's offset
        self.fits = usage_fits(USAGE_OTHERS_KEY, len(entries), self.body)

    def frame(self, held: list[str], own: Mapping[str, int]) -> str:
        if not self.fits:  # cut to the bounds: held first, then the rest as ranked
            rest = (e for u, e in zip(self.users, self.entries, strict=True) if u not in own)
            return usage_frame(USAGE_OTHERS_KEY, chain(held, rest))[0]
        pieces, start = held, 0
        for i in sorted(self.position[u] for u in own if u in self.position):
            pieces.append(self.body[start : max(start, self.starts[i] - 1)])
            start = self.starts[i + 1]
        pieces.append(self.body[start:])
        return usage_text(USAGE_OTHERS_KEY, ",".join(p for p in pieces if p))
