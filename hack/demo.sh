#!/usr/bin/env bash
# Install, then run stunnerd locally and relay through it with a real TURN client.
. "$(dirname "$0")/venv.sh" demo
exec .venv/bin/stunnerd-demo "$@"
