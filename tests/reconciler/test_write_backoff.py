"""The per-object back-off of refused writes (reconciler.write_backoff): pure, the clock passed
in, so every case is a table of refusals and the times they leave."""

from __future__ import annotations

import pytest

from reconciler.apply import Verb, Write
from reconciler.write_backoff import WriteBackoff, write_key

INITIAL, MAXIMUM = 0.5, 4.0


def write(
    name: str = "gw", verb: Verb = Verb.CREATE, replicas: int = 1, kind: str = "Deployment"
) -> Write:
    body = {"metadata": {"name": name}, "spec": {"replicas": replicas}}
    return Write(verb, "apps/v1", kind, "stunner", name, body)


@pytest.mark.parametrize(
    ("codes", "waits"),
    [
        ([422], [0.5]),
        ([422, 422, 422], [0.5, 1.0, 2.0]),
        ([500] * 6, [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]),  # doubling, capped at the maximum
        ([0, 403], [0.5, 1.0]),  # no answer at all backs off as a refusal does
        ([409], [0.0]),  # a conflict was re-read already: at once the first time
        ([409, 409, 409], [0.0, 1.0, 2.0]),  # then backs off (from the initial delay)
        ([422, 409], [0.5, 1.0]),  # a conflict after a refusal waits as any refusal does
    ],
)
def test_refusals_in_a_row_double_the_wait_up_to_the_maximum(
    codes: list[int], waits: list[float]
) -> None:
    backoff = WriteBackoff(INITIAL, MAXIMUM)
    now = 100.0
    seen = []
    for failures, code in enumerate(codes, start=1):
        refused = backoff.refused(write(), code, now)
        assert refused.failures == failures
        seen.append(refused.due - now)
        assert not backoff.due(write(), now + seen[-1] - 0.01) or seen[-1] == 0.0
        assert backoff.due(write(), now + seen[-1])
        now = refused.due
    assert seen == pytest.approx(waits)


def test_a_refused_write_is_held_back_until_due_and_then_sent_again() -> None:
    backoff = WriteBackoff(INITIAL, MAXIMUM)
    assert backoff.due(write(), 0.0) and backoff.next_due() is None
    backoff.refused(write(), 422, 10.0)
    assert not backoff.due(write(), 10.0)
    assert not backoff.due(write(), 10.49)
    assert backoff.due(write(), 10.5)
    assert backoff.next_due() == 10.5


def test_a_write_that_goes_through_forgets_the_back_off() -> None:
    backoff = WriteBackoff(INITIAL, MAXIMUM)
    for _ in range(4):
        backoff.refused(write(), 422, 0.0)
    backoff.succeeded(write())
    assert backoff.due(write(), 0.0) and backoff.next_due() is None and not backoff.pending
    # the next refusal starts over from the initial wait
    assert backoff.refused(write(), 422, 0.0).due == INITIAL
    backoff.succeeded(write("never-refused"))  # nothing to forget: no error
    assert backoff.next_due() == INITIAL


def test_one_objects_refusals_hold_up_no_other_write() -> None:
    backoff = WriteBackoff(INITIAL, MAXIMUM)
    backoff.refused(write("a"), 422, 0.0)
    backoff.refused(write("a"), 422, 0.5)  # a waits until 1.5
    assert not backoff.due(write("a"), 1.0)
    assert backoff.due(write("b"), 1.0)  # another object
    assert backoff.due(write("a", verb=Verb.STATUS), 1.0)  # the same object's status
    assert backoff.due(write("a", kind="DaemonSet"), 1.0)  # a namesake of another kind
    backoff.refused(write("b"), 500, 1.0)
    assert backoff.next_due() == 1.5  # the first of the two
    backoff.succeeded(write("a"))
    assert backoff.next_due() == 1.5  # b's
    assert backoff.due(write("a"), 1.0)


def test_the_newest_write_of_an_object_inherits_its_back_off() -> None:
    """What is sent again is the newest wanted state, never a queued stale copy: the back-off
    belongs to the object and verb, not to one body, so a newer write of a refused object
    waits out the same back-off (and its refusal doubles it); once due it is the one sent."""
    backoff = WriteBackoff(INITIAL, MAXIMUM)
    old, new = write(replicas=1), write(replicas=3)
    assert write_key(old) == write_key(new)
    backoff.refused(old, 422, 0.0)
    assert not backoff.due(new, 0.1)
    assert backoff.refused(new, 422, 0.5).due == 0.5 + 2 * INITIAL
    assert len(backoff.pending) == 1  # one entry per object and verb, not per body
    backoff.succeeded(new)
    assert backoff.due(old, 0.0) and not backoff.pending
