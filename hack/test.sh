#!/usr/bin/env bash
# Install what the tests need, then run the whole suite (it includes ruff and mypy --strict).
. "$(dirname "$0")/venv.sh" test
# pytest exits non-zero when it collects no tests, so an empty run fails too.
exec .venv/bin/pytest "$@"
