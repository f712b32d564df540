#!/usr/bin/env bash
# Install what the tests need, then run the whole suite (it includes ruff and mypy --strict).
. "$(dirname "$0")/venv.sh" test
# helm 3 and helm 4 for the chart and plugin tests (.tools/, cached after the first run).
bash hack/helm.sh
# pytest exits non-zero when it collects no tests, so an empty run fails too.
exec .venv/bin/pytest "$@"
