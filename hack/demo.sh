#!/usr/bin/env bash
# Install, then run the reconciler in local mode on examples/local: YAML -> render -> CDS ->
# stunnerd, relaying through it with a real TURN client.
. "$(dirname "$0")/venv.sh" demo
exec .venv/bin/stunner-demo "$@"
