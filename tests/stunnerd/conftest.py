"""The repeated bring-up of stunnerd's tests: a real `stunnerd` process, always taken down.

`stunnerd(*args)` starts `python -m stunnerd ARGS` with its stderr in a file (a pipe nobody
reads could fill and stall it); `stop()` sends a signal and returns the log; whatever a test
leaves running is killed at teardown, so a failing assertion never leaks a process holding a
port.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator

import pytest

from stunnerd.transport import native

STUNNERD = [sys.executable, "-m", "stunnerd"]


class StunnerdProcess:
    def __init__(self, args: tuple[str, ...], env: dict[str, str] | None) -> None:
        self._log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            [*STUNNERD, *args],
            stderr=self._log,
            text=True,
            env={**os.environ, **(env or {})},
        )

    @property
    def stderr(self) -> str:
        """The log so far."""
        self._log.seek(0)
        return self._log.read()

    def send(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10, at_once: bool = False) -> str:
        """Send `sig` (if still running; `at_once`: and a second signal, which ends the drain),
        wait for the exit and return the whole log."""
        if self.running():
            self.proc.send_signal(sig)
            if at_once:
                self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout)
        return self.stderr

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def kill(self) -> None:
        if self.running():
            self.proc.kill()
        self.proc.wait(10)
        self._log.close()


StartStunnerd = Callable[..., StunnerdProcess]


@pytest.fixture
def stunnerd() -> Iterator[StartStunnerd]:
    started: list[StunnerdProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> StunnerdProcess:
        process = StunnerdProcess(args, env)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


@pytest.fixture(params=["python", "native"])
def relay_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test on both relay paths of TURN-UDP and TURN-TCP: STUNNER_NATIVE=0 (pure Python)
    and =1 (the native engine; skipped where the extension is not built). The variable is read
    when a listener starts, in this process and in the UDP workers and stunnerd processes it
    starts."""
    if request.param == "native":
        reason = native.unavailable_reason()
        if reason is not None and "STUNNER_NATIVE" not in reason:
            pytest.skip(f"native relay: {reason}")
        monkeypatch.setenv("STUNNER_NATIVE", "1")
    else:
        monkeypatch.setenv("STUNNER_NATIVE", "0")
    return str(request.param)
