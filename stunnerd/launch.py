"""The `stunnerd` command's entry point: SIGTERM is handled before anything else is imported.

In a container stunnerd is PID 1, and the kernel drops every signal PID 1 has no handler for.
Python handles SIGINT from its start, SIGTERM only once `stunnerd.process.serving.serve` runs: a
SIGTERM in the second before (imports, the UDP worker processes starting) was lost, and the kubelet
then waited the pod's whole terminationGracePeriodSeconds (an hour, Go's default) before it killed
the container (found on the real node: a Gateway deleted just after its Deployment scaled up left
its new pods Terminating). Until `serve` takes the signal over, SIGTERM ends the process at once,
as its default action ends any process but PID 1: nothing is served yet, so there is nothing to
drain (UDP worker processes already started exit when their primary is gone; an exception would
wait on the cleanup of a config load in flight instead).
"""

from __future__ import annotations

import os
import signal
from types import FrameType

EXIT_ON_SIGTERM = 128 + signal.SIGTERM  # a shell's status for a process SIGTERM ended


def _exit_now(_signum: int, _frame: FrameType | None) -> None:
    os.write(2, b"stunnerd: SIGTERM before serving: exiting\n")
    os._exit(EXIT_ON_SIGTERM)


def main() -> int:
    signal.signal(signal.SIGTERM, _exit_now)
    from .process.cli import main as stunnerd

    return stunnerd()
