#!/usr/bin/env bash
# Install what the tests need, then lint, type-check and run the whole test suite.
. "$(dirname "$0")/venv.sh" test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# pytest exits non-zero when it collects no tests, so an empty run fails too.
exec .venv/bin/pytest "$@"
