"""The per-object back-off of refused writes: pure, the clock passed in.

A write the API server refuses waits `initial` seconds before it is sent again, doubling with
every refusal in a row up to `maximum`; it never holds up another object's writes (each object
and verb has a back-off of its own). A conflict (409: the writer re-read the object already) is
tried again at once the first time, then backs off. A write that goes through forgets its
object's back-off. What is sent again is whatever the next diff wants then (the level-based
loop coalesces: the newest wanted state of an object wins, never a stale queued copy).
"""

from __future__ import annotations

from dataclasses import dataclass

from .apply import Write

CONFLICT = 409

# (kind, namespace, name, verb): one back-off per object and verb
WriteKey = tuple[str, str, str, str]


def write_key(write: Write) -> WriteKey:
    return (write.kind, write.namespace, write.name, str(write.verb))


@dataclass(frozen=True)
class Backoff:
    delay: float  # the base the next refusal doubles
    due: float  # when the write may be sent again
    failures: int = 1  # refusals in a row


class WriteBackoff:
    """The refused writes waiting for their retry (see the module's docstring)."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial = initial
        self.maximum = maximum
        self.pending: dict[WriteKey, Backoff] = {}

    def due(self, write: Write, now: float) -> bool:
        """Whether `write` may be sent at `now` (never refused, or its wait is over)."""
        backoff = self.pending.get(write_key(write))
        return backoff is None or backoff.due <= now

    def succeeded(self, write: Write) -> None:
        self.pending.pop(write_key(write), None)

    def refused(self, write: Write, code: int, now: float) -> Backoff:
        """Record a refusal (HTTP status `code`, 0 for no answer) at `now`: the back-off."""
        key = write_key(write)
        previous = self.pending.get(key)
        delay = min(previous.delay * 2, self.maximum) if previous else self.initial
        if code == CONFLICT and previous is None:
            delay = 0.0  # re-read already: try again at once, then back off
        failures = previous.failures + 1 if previous else 1
        backoff = Backoff(delay or self.initial, now + delay, failures)
        self.pending[key] = backoff
        return backoff

    def next_due(self) -> float | None:
        """When the first waiting write is due; None when none waits."""
        return min((b.due for b in self.pending.values()), default=None)
