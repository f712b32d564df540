# Sourced by the hack/ scripts: a project virtualenv in .venv with the given extras installed.
# Usage: . hack/venv.sh EXTRAS   (e.g. "demo" or "test")
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[$1]"
