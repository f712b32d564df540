#!/usr/bin/env bash
# Install what the tests need, then run the whole suite (it includes ruff and mypy --strict).
. "$(dirname "$0")/venv.sh" test
# helm 3 and helm 4 for the chart and plugin tests (.tools/, cached after the first run).
bash hack/helm.sh
# Two workers (pytest-xdist), a test file's tests on one worker (its module fixtures are shared);
# PYTEST_WORKERS=0 runs them in this process. pytest exits non-zero when it collects no tests, so
# an empty run fails too.
exec .venv/bin/pytest -n "${PYTEST_WORKERS:-2}" --dist loadfile "$@"
