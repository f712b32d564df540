"""Sessions, the CDS's side: ask a Gateway's stunnerd pods, on their config watches, for their
live allocations or to end some, and gather the answers (stunner_api.sessions; README
"Sessions: list and end allocations"; stunnerd's side is stunnerd.process.sessions).

A stunnerd that speaks sessions says so on each connection with an empty report (request
`stunner_api.sessions.HELLO`), naming its pod; only such watchers are asked (a Go stunnerd, or a
CLI's watch, never answers and is never waited for). Where tokens are checked, only a watcher
whose token is bound to a pod may answer, and its pod is the token's, not the name it gives.

`SessionBoard.ask(watchers, frame_of)` offers each watcher its frame and waits, at most
ANSWER_TIMEOUT seconds, for every answer: what they said, and which pods stayed silent.

Each request costs every pod of the Gateway a frame on its watch, which the CDS budgets
(reconciler.cds.server.WATCH_BUDGET: a watcher past it is closed): `admit(id)` lets at most
ASKS_PER_SECOND requests a second reach one Gateway's pods (the CDS answers the others 429).
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from stunner_api.sessions import ANSWER_TIMEOUT

ASKS_PER_SECOND = 2  # per Gateway: a pod answers each within its watch's frame budget
SESSIONS_FRAME = "\x00sessions"  # a watcher's pending sessions frame (config ids never start so)


class Answering(Protocol):
    """What the board needs of a watcher (reconciler.cds.store.Watcher)."""

    sessions_pod: str

    def offer(self, id: str, text: str) -> None: ...


@dataclass
class Gathered:
    """The answers to one request: the sessions, the pods that answered and those that did
    not in time, and how many sessions the pods left out of their reports (bounded size)."""

    sessions: list[dict[str, Any]] = field(default_factory=list)
    pods: list[str] = field(default_factory=list)
    silent: list[str] = field(default_factory=list)
    omitted: int = 0

    def as_json(self, id: str) -> dict[str, Any]:
        return {
            "version": "v1",
            "gateway": id,
            "pods": sorted(self.pods),
            "silent": sorted(self.silent),
            "omitted": self.omitted,
            "sessions": sorted(self.sessions, key=lambda s: (s["pod"], s["listener"], s["id"])),
        }


@dataclass
class _Pending:
    waiting: dict[Any, str]  # watcher -> its pod
    gathered: Gathered
    done: asyncio.Event = field(default_factory=asyncio.Event)


class SessionBoard:
    """The requests in flight, by id (see the module's docstring)."""

    def __init__(self, timeout: float = ANSWER_TIMEOUT) -> None:
        self.timeout = timeout
        self._pending: dict[str, _Pending] = {}
        self._ids = itertools.count(1)
        self._salt = secrets.token_hex(4)
        self._asked: dict[str, deque[float]] = {}

    def admit(self, id: str) -> bool:
        """Whether one more request may reach config `id`'s pods now (ASKS_PER_SECOND)."""
        now = time.monotonic()
        asked = self._asked.setdefault(id, deque())
        while asked and asked[0] <= now - 1.0:
            asked.popleft()
        if len(asked) >= ASKS_PER_SECOND:
            return False
        asked.append(now)
        if len(self._asked) > 4096:  # ids asked about once, long ago
            self._asked = {k: v for k, v in self._asked.items() if v}
        return True

    async def ask(self, watchers: Iterable[Answering], frame_of: Callable[[str], str]) -> Gathered:
        """Offer each watcher `frame_of(request id)`; their answers, once all have answered or
        `timeout` seconds have passed."""
        request = f"{self._salt}-{next(self._ids)}"
        waiting = {w: w.sessions_pod for w in watchers}
        pending = _Pending(waiting, Gathered())
        if not waiting:
            return pending.gathered
        self._pending[request] = pending
        text = frame_of(request)
        for watcher in waiting:  # one pending frame per request: none replaces another
            watcher.offer(SESSIONS_FRAME + request, text)
        deadline = time.monotonic() + self.timeout
        try:
            await asyncio.wait_for(pending.done.wait(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            pass
        finally:
            del self._pending[request]
        pending.gathered.silent = sorted(set(pending.waiting.values()))
        return pending.gathered

    def answered(
        self,
        watcher: Answering,
        request: str,
        sessions: list[dict[str, Any]],
        omitted: int,
    ) -> None:
        """`watcher`'s report for `request` (one not asked for, or from a watcher not asked, is
        ignored)."""
        pending = self._pending.get(request)
        if pending is None or watcher not in pending.waiting:
            return
        pod = pending.waiting.pop(watcher)
        gathered = pending.gathered
        gathered.pods.append(pod)
        gathered.omitted += omitted
        for session in sessions:
            session["pod"] = pod
            gathered.sessions.append(session)
        if not pending.waiting:
            pending.done.set()

    def forget(self, watcher: Answering) -> None:
        """`watcher` is gone: no request waits for it any longer."""
        for pending in self._pending.values():
            pod = pending.waiting.pop(watcher, None)
            if pod is not None:
                pending.gathered.silent.append(pod)
                if not pending.waiting:
                    pending.done.set()
