"""Scoped log levels in Go STUNner's syntax, and the JSON log format."""

from __future__ import annotations

import io
import json
import logging

import pytest

from stunnerd import logs


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("all:INFO", {"all": logging.INFO}),
        ("all:DEBUG,turn:INFO", {"all": logging.DEBUG, "turn": logging.INFO}),
        ("all:warn, auth:trace", {"all": logging.WARNING, "auth": logs.TRACE}),
        ("DEBUG", {"all": logging.DEBUG}),
        ("turn:DISABLE", {"turn": logs.LEVELS["DISABLE"]}),
        ("", {}),
    ],
)
def test_parse_level_spec(spec: str, expected: dict[str, int]) -> None:
    assert logs.parse_level_spec(spec) == expected


def test_parse_level_spec_names_the_bad_part() -> None:
    with pytest.raises(ValueError, match=r"invalid log level 'LOUD' in 'turn:LOUD'"):
        logs.parse_level_spec("all:INFO,turn:LOUD")


def test_scopes_inherit_all_and_reset_between_specs() -> None:
    logs.apply_level_spec("all:WARN,turn:DEBUG")
    assert logging.getLogger("stunner.turn").getEffectiveLevel() == logging.DEBUG
    assert logging.getLogger("stunner.auth").getEffectiveLevel() == logging.WARNING
    logs.apply_level_spec("all:ERROR")
    assert logging.getLogger("stunner.turn").getEffectiveLevel() == logging.ERROR
    logs.apply_level_spec(logs.DEFAULT_LEVEL_SPEC)


def test_json_format_one_object_per_line() -> None:
    stream = io.StringIO()
    logs.setup("all:INFO", "json", stream)
    logging.getLogger("stunner.turn").info("allocation created for %s", "1.2.3.4:5")
    logging.getLogger("stunner.turn").debug("not shown")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry["level"] == "INFO" and entry["logger"] == "turn"
    assert entry["msg"] == "allocation created for 1.2.3.4:5"
    logs.setup("all:INFO", "text", io.StringIO())
