"""The supervision of the reconciler's core tasks (reconciler.supervise), with real asyncio tasks
and threads, and run_local's tasks under it.

We test: a core task that raises, returns or is cancelled from elsewhere sets `failed`, is
logged once as one line with the exception's type and place but never its message, and makes
`until` return the exit code 1; a one-shot task may return; a thread reporting its end does the
same; a stop (signal) returns 0 and the ends that follow are expected; local mode's watcher and
render loop are such core tasks.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

import pytest

from reconciler.local import LocalSettings, run_local
from reconciler.supervise import EXIT_CORE_TASK_ENDED, Supervisor

SECRET = "s3cret-value-from-a-file"


async def forever() -> None:
    await asyncio.Event().wait()


async def boom() -> None:
    await asyncio.sleep(0)
    raise RuntimeError(SECRET)


async def done() -> None:
    await asyncio.sleep(0)


def test_a_core_task_that_raises_ends_the_process(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> int:
        supervisor = Supervisor()
        calm = supervisor.spawn("calm", forever())
        supervisor.spawn("boom", boom())
        code = await supervisor.until(asyncio.Event())
        assert not calm.done()  # the others run until the process stops them
        await supervisor.stop()
        assert calm.cancelled()
        assert supervisor.failure is not None and supervisor.failure.startswith("core task boom")
        return code

    with caplog.at_level(logging.DEBUG, logger="stunner.reconciler"):
        assert asyncio.run(main()) == EXIT_CORE_TASK_ENDED
    [line] = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    raised = boom.__code__.co_firstlineno + 2
    assert line.getMessage() == (
        f"core task boom raised RuntimeError at test_supervise.py:{raised} in boom; exiting so "
        "that the process is restarted"
    )
    assert "raise RuntimeError(SECRET)" in caplog.text  # the traceback, at DEBUG
    assert SECRET not in caplog.text
    assert "calm" not in caplog.text  # cancelled by the stop: expected


@pytest.mark.parametrize(
    ("how", "oneshot", "ended"),
    [("returned", False, True), ("returned", True, False), ("was cancelled", False, True)],
)
def test_a_core_task_that_returns_or_is_cancelled(
    caplog: pytest.LogCaptureFixture, how: str, oneshot: bool, ended: bool
) -> None:
    async def main() -> int:
        supervisor = Supervisor()
        task = supervisor.spawn("task", done() if how == "returned" else forever(), oneshot=oneshot)
        if how == "was cancelled":
            await asyncio.sleep(0)
            task.cancel()  # by someone other than the supervisor
        await asyncio.wait([task])
        await asyncio.sleep(0)  # the done callback
        stop = asyncio.Event()
        if not ended:
            stop.set()
        return await supervisor.until(stop)

    with caplog.at_level(logging.INFO, logger="stunner.reconciler"):
        assert asyncio.run(main()) == (EXIT_CORE_TASK_ENDED if ended else 0)
    assert (f"core task task {how}" in caplog.text) is ended


def test_a_core_thread_that_ends(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> int:
        supervisor = Supervisor()

        def watch() -> None:
            try:
                raise OSError(24, "Too many open files")
            except OSError as exc:
                supervisor.thread_ended("watch-Gateway", exc)

        thread = threading.Thread(target=watch)
        thread.start()
        code = await supervisor.until(asyncio.Event())
        thread.join()
        return code

    with caplog.at_level(logging.INFO, logger="stunner.reconciler"):
        assert asyncio.run(main()) == EXIT_CORE_TASK_ENDED
    assert (
        "core task watch-Gateway raised OSError: [Errno 24] Too many open files; exiting"
        in caplog.text
    )


def test_a_stop_is_not_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> int:
        supervisor = Supervisor()
        supervisor.spawn("calm", forever())
        stop = asyncio.Event()
        stop.set()
        code = await supervisor.until(stop)
        supervisor.spawn("late", boom())  # ends after the stop: expected
        await asyncio.sleep(0.01)
        await supervisor.stop()
        assert not supervisor.failed.is_set()
        return code

    with caplog.at_level(logging.INFO, logger="stunner.reconciler"):
        assert asyncio.run(main()) == 0
    assert "core task" not in caplog.text


@pytest.mark.parametrize("task", ["manifest watcher", "render loop"])
def test_local_modes_core_tasks_are_supervised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, task: str
) -> None:
    async def main() -> int:
        settings = LocalSettings(tmp_path, cds_port=0, auth_port=0)
        async with run_local(settings) as local:
            local.supervisor.tasks[task].cancel()  # it ends, as a bug would end it
            return await local.supervisor.until(asyncio.Event())

    with caplog.at_level(logging.INFO, logger="stunner.reconciler"):
        assert asyncio.run(main()) == EXIT_CORE_TASK_ENDED
    assert f"core task {task} was cancelled; exiting" in caplog.text
