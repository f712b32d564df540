"""The sessions frames' codec (stunner_api.sessions): a pod's report is taken with the fields
of its release, and only those."""

from __future__ import annotations

import json

import pytest

from stunner_api.sessions import (
    FIELDS,
    OPTIONAL_FIELDS,
    SessionsError,
    parse_report,
    report_frame,
    session_record,
)


def _session(bandwidth_limit: int | None) -> dict[str, object]:
    return session_record(
        id="a1",
        listener="ns/gw/udp",
        transport="TURN-UDP",
        client="10.0.0.1:4000",
        user="alice",
        relay="10.0.0.2:50000",
        peers=["10.0.0.3"],
        channels={0x4000: "10.0.0.3:9000"},
        age=1.0,
        lifetime=599.0,
        counters=None,
        bandwidth_limit=bandwidth_limit,
    )


def test_a_session_carries_its_cap_and_null_without_one() -> None:
    (capped,) = parse_report(report_frame("r", "pod-0", [_session(64_000)]))[2]
    assert list(capped) == [*FIELDS, *OPTIONAL_FIELDS] and capped["bandwidthLimit"] == 64_000
    (free,) = parse_report(report_frame("r", "pod-0", [_session(None)]))[2]
    assert free["bandwidthLimit"] is None


def test_a_report_of_an_earlier_release_without_the_cap_is_taken_with_null() -> None:
    """A stunnerd still draining during an upgrade reports without `bandwidthLimit`."""
    old = {k: v for k, v in _session(None).items() if k not in OPTIONAL_FIELDS}
    (session,) = parse_report(report_frame("r", "pod-0", [old]))[2]
    assert session["bandwidthLimit"] is None and set(session) == {*FIELDS, *OPTIONAL_FIELDS}


@pytest.mark.parametrize("change", ["missing", "unknown"])
def test_a_session_with_a_field_missing_or_unknown_is_refused(change: str) -> None:
    session = _session(None)
    if change == "missing":
        del session["user"]
    else:
        session["password"] = "secret"
    frame = json.dumps({"sessionsReport": {"request": "r", "pod": "p", "sessions": [session]}})
    with pytest.raises(SessionsError, match="known fields"):
        parse_report(frame)


@pytest.mark.parametrize("limit", ["64000", 64000.5, True, 0, -1])
def test_a_cap_that_is_not_a_positive_integer_is_refused(limit: object) -> None:
    """What the CLI formats as a rate must be one: a pod's report is refused otherwise."""
    session = _session(None)
    session["bandwidthLimit"] = limit
    frame = json.dumps({"sessionsReport": {"request": "r", "pod": "p", "sessions": [session]}})
    with pytest.raises(SessionsError, match="bandwidthLimit"):
        parse_report(frame)
