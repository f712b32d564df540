# Sourced by the hack/ scripts: a project virtualenv in .venv with the given extras installed.
# Usage: . hack/venv.sh EXTRAS   (e.g. "demo" or "test")
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# clang's BPF target compiles the kernel offload during the install (setup.py); without it the
# install goes on and stunnerd relays without the offload. Debian's clang when it is missing
# and this shell may install it (CI: root with apt).
if ! command -v clang >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends clang >/dev/null
fi
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[$1]"
