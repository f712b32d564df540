"""Serving a configured Stunner until it is told to stop: the config watch (a refused config
leaves the running one in place; one refused for a busy port is retried), the signals (SIGTERM
and SIGINT drain, SIGHUP re-reads the config) and the drain. stunnerd.process.cli builds the
Stunner and
its config source from the command line and hands them here."""

from __future__ import annotations

import asyncio
import logging
import signal

from stunner_api.dataplane import ConfigError, StunnerConfig

from .daemon import BUSY_RETRY_FIRST, BUSY_RETRY_MAX, ApplyError, Stunner
from .sources import ConfigSource, SourceError

log = logging.getLogger("stunner.stunnerd")

DRAIN_POLL_INTERVAL = 1.0


async def watch_configs(
    stunner: Stunner,
    source: ConfigSource,
    retry_first: float = BUSY_RETRY_FIRST,
    retry_max: float = BUSY_RETRY_MAX,
) -> None:
    """Apply every config the source yields; a refused one leaves the running one in place.

    A config refused because a port is not free yet (`ApplyError.retryable`) is applied again,
    after `retry_first` seconds doubling up to `retry_max`, until it applies or a newer config
    comes: on the host network a DaemonSet's new stunnerd can start while the one it replaces
    still drains on the node's ports, and the CDS sends a config only when it changes, so
    without the retry the new pod would stay unready after the old one left.

    While draining the watch stays (the CDS keeps counting this pod's allocations toward the
    cluster-wide user quotas) but configs are no longer applied."""
    configs = source.watch()
    refused: StunnerConfig | None = None
    delay = retry_first
    upcoming: asyncio.Future[StunnerConfig] = asyncio.ensure_future(anext(configs))
    try:
        while True:
            try:
                if refused is None:
                    config = await upcoming
                else:
                    done, _ = await asyncio.wait({upcoming}, timeout=delay)
                    config = upcoming.result() if done else refused
            except StopAsyncIteration:  # a source that ends (the watch of a test)
                return
            if upcoming.done():
                upcoming = asyncio.ensure_future(anext(configs))
            if stunner.terminating:
                log.info("draining: not applying the new configuration")
                refused = None
                continue
            retry = config is refused
            try:
                await stunner.apply(config)
            except ApplyError as exc:
                if not retry:  # a retry failing again is not logged again
                    log.error(
                        "could not reconcile new configuration (running configuration "
                        "unchanged): %s%s",
                        exc,
                        "; retrying while the port is busy" if exc.retryable else "",
                    )
                refused = config if exc.retryable else None
                delay = min(delay * 2, retry_max) if retry else retry_first
                continue
            if retry:
                log.info("applied the configuration refused before: its ports are free now")
            refused = None
    finally:
        upcoming.cancel()
        await asyncio.wait({upcoming})  # the generator stopped before it is closed
        aclose = getattr(configs, "aclose", None)
        if aclose is not None:
            await aclose()


SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # what serve() handles


async def serve(
    stunner: Stunner,
    initial: StunnerConfig,
    source: ConfigSource | None = None,
    grace_period: float = 3600.0,
    origin: ConfigSource | None = None,
) -> int:
    """Serve `initial` (and, in watch mode, every config from `source`) until SIGTERM/SIGINT,
    then drain: not ready, apply no new config, keep serving, exit when the last allocation is
    gone or the grace period ends. A second signal exits at once. SIGHUP re-reads the config from
    `origin` (the file or CDS it came from) and applies it, as the file watch does. From its
    return on, until the process has exited, these signals are ignored (`_ignore_from_now_on`)."""
    signals = asyncio.Queue[int]()
    loop = asyncio.get_running_loop()
    for sig in SIGNALS:
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    try:
        try:
            await stunner.apply(initial)
        except ApplyError as exc:
            log.error("could not apply configuration: %s", exc)
            await stunner.close()
            return 1
        watcher = loop.create_task(watch_configs(stunner, source)) if source else None
        if watcher is not None:
            watcher.add_done_callback(_report_watch_end)
        log.info("stunnerd running with %d listener(s)", len(stunner.listeners))
        while (received := await signals.get()) == signal.SIGHUP:
            await reload(stunner, origin)
        stunner.terminating = True
        active = await stunner.current_allocation_count()
        log.info(
            "%s: draining %d allocation(s), at most %gs%s",
            signal.Signals(received).name,
            active,
            grace_period,
            " (send SIGTERM or press Ctrl-C again to exit now)" if active else "",
        )
        deadline = loop.time() + grace_period
        while active > 0 and loop.time() < deadline:
            try:
                received = await asyncio.wait_for(signals.get(), DRAIN_POLL_INTERVAL)
            except TimeoutError:
                active = await stunner.current_allocation_count()
                continue
            if received == signal.SIGHUP:
                log.info("SIGHUP while draining: not re-reading the config")
                continue
            log.info("%s again: exiting now", signal.Signals(received).name)
            break
        log.info("shutting down (%d active allocations)", stunner.allocation_count)
        if watcher is not None:
            watcher.cancel()
        await stunner.close()
        return 0
    finally:
        _ignore_from_now_on(loop)


def _ignore_from_now_on(loop: asyncio.AbstractEventLoop) -> None:
    """stunnerd is on its way out: a further SIGTERM, SIGINT or SIGHUP changes nothing (as in a
    Go daemon, whose signal.Notify channel nobody reads any more). Handed back to their
    defaults, they ended a process still closing (its workers, the loop) by the signal (-15,
    -1) or by a KeyboardInterrupt (-2): the SIGINT of a `SIGTERM; SIGINT` pair (the second
    signal ends a drain) that arrived once the SIGTERM's shutdown had begun. The kubelet's
    SIGKILL after the grace period still ends a shutdown that hangs."""
    for sig in SIGNALS:
        loop.remove_signal_handler(sig)
        signal.signal(sig, signal.SIG_IGN)


async def reload(stunner: Stunner, origin: ConfigSource | None) -> None:
    """SIGHUP: load the config again and apply it; a refused one changes nothing."""
    if origin is None:
        log.info("SIGHUP: the config came from the command line, nothing to re-read")
        return
    log.info("SIGHUP: re-reading the config from %s", origin)
    try:
        await stunner.apply(await origin.load())
    except (ConfigError, SourceError, ApplyError) as exc:
        log.error("SIGHUP: configuration not reloaded (running configuration unchanged): %s", exc)


def _report_watch_end(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("config watch stopped: %r (serving the last config)", task.exception())
