"""The reconciler's core tasks, supervised: one that ends unexpectedly ends the process.

A core task is one the reconciler cannot do without: the manifest watcher and the render loop
(local mode), the render, apply and leader-election loops and the informers' watch threads
(cluster mode). Each is started through one `Supervisor`; when one ends while the supervisor is
not stopping it (an exception, a return, a cancellation from elsewhere), the supervisor logs one
line (the task, the exception's type and where it was raised: never its message, which may
carry what a file or the API server said) and sets `failed`. `until(stop)` then returns 1, the
command exits with it, and whatever supervises the process (the kubelet, systemd) restarts it:
a reconciler with a dead watcher or render loop would otherwise go on serving stale configs
with nothing to say so. The traceback (its frames, without the message) is logged at DEBUG.

The CDS and auth servers are not tasks: aiohttp serves them from callbacks of the event loop,
which retries an accept that fails for lack of descriptors; a handler that raises fails its own
request (500). They end only with the loop, that is with the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import traceback
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

log = logging.getLogger("stunner.reconciler")

EXIT_CORE_TASK_ENDED = 1


def what_failed(exc: BaseException) -> str:
    """An exception in one line without its message: its type and where it was raised (an
    OSError keeps its errno text and file name, which name no content)."""
    if isinstance(exc, OSError) and exc.strerror:
        filename = f": {exc.filename}" if exc.filename is not None else ""
        return f"{type(exc).__name__}: [Errno {exc.errno}] {exc.strerror}{filename}"
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return type(exc).__name__
    last = frames[-1]
    return f"{type(exc).__name__} at {Path(last.filename).name}:{last.lineno} in {last.name}"


class Supervisor:
    """Starts the core tasks and notices one ending (see the module's docstring)."""

    def __init__(self) -> None:
        self.failed = asyncio.Event()
        self.failure: str | None = None  # the first core task that ended, and how
        self.tasks: dict[str, asyncio.Task[Any]] = {}
        self._oneshot: set[str] = set()
        self._stopping = False
        self._loop = asyncio.get_running_loop()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def spawn(
        self, name: str, coro: Coroutine[Any, Any, Any], *, oneshot: bool = False
    ) -> asyncio.Task[Any]:
        """Run `coro` as the core task `name`. A `oneshot` task may return (once its job is
        done); any other core task runs until the supervisor stops it."""
        if name in self.tasks:
            coro.close()
            raise ValueError(f"core task {name} is already running")
        task = self._loop.create_task(coro, name=name)
        self.tasks[name] = task
        if oneshot:
            self._oneshot.add(name)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        name = task.get_name()
        if self._stopping:
            return
        if task.cancelled():
            self.ended(name, None, "was cancelled")
            return
        exc = task.exception()
        if exc is None and name in self._oneshot:
            return
        self.ended(name, exc)

    def thread_ended(self, name: str, exc: BaseException | None) -> None:
        """From a core thread (an informer's watch) that is ending: `exc`, or None for a
        return. Thread-safe."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: the process is ending
            self._loop.call_soon_threadsafe(self.ended, name, exc)

    def ended(self, name: str, exc: BaseException | None, how: str = "") -> None:
        """Core task `name` ended (by `exc`, or returned): log it once and set `failed`."""
        if self._stopping:
            return
        how = how or (f"raised {what_failed(exc)}" if exc is not None else "returned")
        failure = f"core task {name} {how}"
        if self.failure is None:
            self.failure = failure
        log.critical("%s; exiting so that the process is restarted", failure)
        if exc is not None and log.isEnabledFor(logging.DEBUG):
            frames = "".join(traceback.format_tb(exc.__traceback__)).rstrip()
            log.debug("core task %s ended by %s in:\n%s", name, type(exc).__name__, frames)
        self.failed.set()

    async def until(self, stop: asyncio.Event) -> int:
        """Wait for `stop` (a signal) or a core task's end; the process's exit code (0, or
        EXIT_CORE_TASK_ENDED). From here on the core tasks' ends are expected."""
        stopped = asyncio.ensure_future(stop.wait())
        failed = asyncio.ensure_future(self.failed.wait())
        try:
            await asyncio.wait((stopped, failed), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            failed.cancel()
        self._stopping = True
        return EXIT_CORE_TASK_ENDED if self.failed.is_set() else 0

    def wind_down(self) -> None:
        """The core tasks' ends are expected from now on (a shutdown has begun)."""
        self._stopping = True

    async def stop(self) -> None:
        """Cancel every core task and wait for them (their ends are expected now)."""
        self._stopping = True
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
