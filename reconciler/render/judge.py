"""The rule table, as render asks it: every Problem of an object, with its condition reason.

Render judges with exactly the rules the webhook uses (`stunner_api.rules`), answering their
lookups from the snapshot. What render does with a Problem depends on where it points: a
problem of one listener keeps that listener out, a problem of one backend that backend, and any
other error keeps the whole object out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stunner_api import rules
from stunner_api.rules import Problem

from ..store import Snapshot


def judge(obj: Mapping[str, Any], snapshot: Snapshot, settings: rules.Settings) -> list[Problem]:
    """Every Problem the rule table finds in obj, judged as created (no old object)."""
    return rules.validate(dict(obj), None, "CREATE", snapshot, settings).problems


def under(path: str, prefix: str) -> bool:
    """Whether a problem's path is prefix or below it (prefix "spec.listeners[1]")."""
    return path == prefix or path.startswith((prefix + ".", prefix + "["))
