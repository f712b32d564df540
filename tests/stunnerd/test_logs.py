"""Scoped log levels in Go STUNner's syntax, and the JSON log format."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

import stunnerd
from reconciler.store import Snapshot
from stunner_api.dataplane import validate_config
from stunner_api.rules import Request, Settings
from stunner_api.rules.gatewayconfig import gatewayconfig_log_level
from stunner_api.vocabulary import LogLevel, parse_log_spec, skipped_part_reason
from stunnerd.surface import logs


def gwconfig(log_level: str) -> dict[str, Any]:
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "GatewayConfig",
        "metadata": {"name": "c", "namespace": "stunner"},
        "spec": {"logLevel": log_level},
    }


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("all:INFO", {"all": logging.INFO}),
        ("all:DEBUG,turn:INFO", {"all": logging.DEBUG, "turn": logging.INFO}),
        ("all:warn, auth:trace", {"all": logging.WARNING, "auth": logs.TRACE}),
        ("DEBUG", {}),  # Go skips a bare level: not all:DEBUG
        ("all:WARNING,turn:DEBUG", {"turn": logging.DEBUG}),  # WARNING is not a Go level
        ("turn:DISABLE", {"turn": logs.LEVELS[LogLevel.DISABLE]}),
        ("", {}),
    ],
)
def test_parse_level_spec(spec: str, expected: dict[str, int]) -> None:
    assert logs.parse_level_spec(spec) == expected


def test_setup_warns_about_the_parts_go_skips() -> None:
    stream = io.StringIO()
    logs.setup("all:INFO,turn:LOUD,DEBUG", "text", stream)
    assert "skipping unknown level 'LOUD' in 'turn:LOUD'" in stream.getvalue()
    assert "skipping 'DEBUG' is not scope:LEVEL" in stream.getvalue()
    logs.setup("all:INFO", "text", io.StringIO())


@pytest.mark.parametrize(
    "spec", ["all:INFO", "all:debug, turn:TRACE", "DEBUG", "all:WARNING", "a:b:c", ":INFO", ""]
)
def test_stunnerd_and_the_webhook_read_log_specs_with_one_parser(spec: str) -> None:
    """What stunnerd acts on is exactly what the webhook admits; what it skips, it refuses."""
    parsed = parse_log_spec(spec)
    expected = {scope: logs.LEVELS[level] for scope, level in parsed.as_dict().items()}
    assert logs.parse_level_spec(spec) == expected
    problems = gatewayconfig_log_level(
        Request(gwconfig(spec), None, "CREATE", Snapshot.from_objects([]), Settings())
    )
    assert [p.message for p in problems] == [skipped_part_reason(part) for part in parsed.skipped]


def test_admin_loglevel_is_read_with_the_parser_at_load(caplog: pytest.LogCaptureFixture) -> None:
    """A config's loglevel is checked when the config is loaded, not first at apply."""
    config = {
        "version": "v1",
        "admin": {"loglevel": "all:INFO,turn:LOUD"},
        "auth": {"credentials": {"username": "u", "password": "p"}},
    }
    with caplog.at_level(logging.WARNING, logger="stunner.config"):
        loaded = validate_config(config)
    assert loaded.admin.loglevel == "all:INFO,turn:LOUD"  # Go loads it and skips the part
    assert [r.getMessage() for r in caplog.records] == [
        "admin.loglevel: skipping unknown level 'LOUD' in 'turn:LOUD': use one of DISABLE, "
        "ERROR, WARN, INFO, DEBUG, TRACE"
    ]


def test_scopes_inherit_all_and_reset_between_specs() -> None:
    logs.apply_level_spec("all:WARN,turn:DEBUG")
    assert logging.getLogger("stunner.turn").getEffectiveLevel() == logging.DEBUG
    assert logging.getLogger("stunner.auth").getEffectiveLevel() == logging.WARNING
    logs.apply_level_spec("all:ERROR")
    assert logging.getLogger("stunner.turn").getEffectiveLevel() == logging.ERROR
    logs.apply_level_spec(logs.DEFAULT_LEVEL_SPEC)


def test_own_scopes_are_the_scopes_stunnerds_modules_log_under() -> None:
    """What a hosted stunnerd sets (logs.OWN_SCOPES) is every scope its code logs under, read
    from the code: a new module's logger is not forgotten, nor a gone one kept."""
    root = Path(stunnerd.__file__).parent
    named = re.compile(r"""getLogger\(\s*["']stunner\.([\w-]+)["']""")
    scopes = {scope for path in root.rglob("*.py") for scope in named.findall(path.read_text())}
    assert scopes == set(logs.OWN_SCOPES)


def test_a_hosted_spec_sets_only_stunnerds_scopes_and_a_process_spec_the_tree() -> None:
    host, turn = logging.getLogger("stunner"), logging.getLogger("stunner.turn")
    host.setLevel(logging.WARNING)
    logs.apply_level_spec("all:DEBUG,turn:ERROR", logs.LevelControl.HOSTED)
    assert (host.level, turn.level) == (logging.WARNING, logging.ERROR)
    assert logging.getLogger("stunner.listener").level == logging.DEBUG
    logs.apply_level_spec("turn:DEBUG", logs.LevelControl.HOSTED)  # all: INFO, as inherited
    assert logging.getLogger("stunner.listener").level == logging.INFO
    logs.apply_level_spec("all:ERROR", logs.LevelControl.OVERRIDDEN)  # -l won: nothing moves
    assert (host.level, turn.level) == (logging.WARNING, logging.DEBUG)
    logs.apply_level_spec("all:ERROR")  # stunnerd's own process: the tree
    assert host.level == logging.ERROR
    assert turn.getEffectiveLevel() == logging.ERROR  # the hosted levels are reset
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
