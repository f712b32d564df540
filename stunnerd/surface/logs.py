"""Scoped log levels in Go STUNner's syntax (`all:INFO,turn:DEBUG`) and text/JSON output.

Every scope is a child of the `stunner` logger: scope `turn` is `logging.getLogger("stunner.turn")`.
In stunnerd's own process (its command: `LevelControl.PROCESS`) `all` sets the `stunner` logger
itself, so every scope without its own level inherits it. A stunnerd hosted in another program's
process (`LevelControl.HOSTED`: a `Stunner` made by that program) sets only the levels of its own
scopes (`OWN_SCOPES`): the `stunner` logger and the host's loggers under it keep the host's.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from enum import Enum
from typing import TextIO

from stunner_api.vocabulary import (
    DEFAULT_LOG_LEVEL,
    LogLevel,
    parse_log_spec,
    skipped_part_reason,
)

ROOT = "stunner"
TRACE = 5
logging.addLevelName(TRACE, "TRACE")

# Go's level names (the one grammar of stunner_api.vocabulary) -> Python logging levels.
LEVELS: dict[LogLevel, int] = {
    LogLevel.DISABLE: logging.CRITICAL + 10,
    LogLevel.ERROR: logging.ERROR,
    LogLevel.WARN: logging.WARNING,
    LogLevel.INFO: logging.INFO,
    LogLevel.DEBUG: logging.DEBUG,
    LogLevel.TRACE: TRACE,
}
DEFAULT_LEVEL_SPEC = DEFAULT_LOG_LEVEL


def parse_level_spec(spec: str) -> dict[str, int]:
    """Parse `all:INFO,turn:DEBUG` into {scope: level} with Go STUNner's grammar
    (`stunner_api.vocabulary.parse_log_spec`): the parts Go skips are left out. A config's
    `admin.loglevel` is warned about at load (stunner_api.dataplane), a CLI spec by `setup`."""
    return {scope: LEVELS[level] for scope, level in parse_log_spec(spec).as_dict().items()}


def warn_skipped_parts(spec: str, what: str) -> None:
    """Log a warning naming each part of `spec` that Go STUNner skips."""
    for part in parse_log_spec(spec).skipped:
        logging.getLogger(ROOT).warning("%s: skipping %s", what, skipped_part_reason(part))


def logger_name(scope: str) -> str:
    return ROOT if scope == "all" else f"{ROOT}.{scope}"


# The scopes stunnerd's own modules log under (tests/stunnerd/test_logs.py holds the code to
# this list). Two are names other programs' loggers share: `auth` (the reconciler's auth
# service) and `cds-client` (stunner_client's CDS client).
OWN_SCOPES = (
    "admin",
    "auth",
    "cds-client",
    "config-file-client",
    "listener",
    "offload",
    "quota",
    "relay-discovery",
    "router",
    "sessions",
    "stunnerd",
    "turn",
)


class LevelControl(Enum):
    """What a config's `admin.loglevel` sets in this process."""

    PROCESS = "process"  # stunnerd's own process (its command): the whole `stunner` tree
    HOSTED = "hosted"  # a stunnerd in another program's process: its own scopes only
    OVERRIDDEN = "overridden"  # -l/-v on the command line win: nothing


_applied_scopes: set[str] = set()


def apply_level_spec(spec: str, control: LevelControl = LevelControl.PROCESS) -> None:
    """Set the levels of `spec` as `control` says; scopes named by an earlier spec but not this
    one are reset. HOSTED: each of OWN_SCOPES gets its level in `spec`, else `all`'s, else
    INFO (what it would inherit in stunnerd's own process); no other logger is touched."""
    if control is LevelControl.OVERRIDDEN:
        return
    levels = parse_level_spec(spec)
    if control is LevelControl.HOSTED:
        every = levels.get("all", logging.INFO)
        levels = {scope: levels.get(scope, every) for scope in OWN_SCOPES}
    else:
        logging.getLogger(ROOT).setLevel(logging.INFO)
    for scope in _applied_scopes - set(levels) - {"all"}:
        logging.getLogger(logger_name(scope)).setLevel(logging.NOTSET)
    for scope, level in levels.items():
        logging.getLogger(logger_name(scope)).setLevel(level)
    _applied_scopes.clear()
    _applied_scopes.update(levels)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger (scope), msg."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": _scope_of(record.name),
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s.%(msecs)03d %(scope)s %(levelname)s: %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        record.scope = _scope_of(record.name)
        return super().format(record)


def _scope_of(name: str) -> str:
    return name[len(ROOT) + 1 :] if name.startswith(ROOT + ".") else name


def setup(spec: str = DEFAULT_LEVEL_SPEC, fmt: str = "text", stream: TextIO | None = None) -> None:
    """Install one handler on the `stunner` logger and apply `spec`."""
    if fmt not in ("text", "json"):
        raise ValueError(f"invalid log format {fmt!r}: use text or json")
    root = logging.getLogger(ROOT)
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root.addHandler(handler)
    root.propagate = False
    apply_level_spec(spec)
    warn_skipped_parts(spec, "log level")
