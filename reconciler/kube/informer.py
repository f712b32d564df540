"""List+watch of one kind into the cache (`reconciler.store.Cache`), one thread per watched kind.

List, then watch from the list's resourceVersion with bookmarks (the official client's
`watch.Watch` helper), resuming from the last resourceVersion seen when a stream ends; a 410 Gone
relists; any other failure is retried with exponential back-off (`BACKOFF_INITIAL` doubling to
`BACKOFF_MAX`) and counted as a watch restart. A kind the API server does not serve (its CRD is
not installed, as Gateway API's experimental TCPRoute may not be) is cached as empty and looked for
again every `NOT_SERVED_RETRY` seconds (logged once, at the first look).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import Any

from stunner_api.vocabulary import api_version

from ..store import Cache, Watched, meta
from .api import Api, ApiException, Watch, describe

log = logging.getLogger("stunner.kube")

BACKOFF_INITIAL = 0.2  # seconds before the first retry of a failed list/watch
BACKOFF_MAX = 30.0
WATCH_TIMEOUT = 300  # seconds a watch request lasts (the client then resumes it)
NOT_SERVED_RETRY = 30.0  # seconds between looks for a kind the API server does not serve


class Informer:
    """List+watch of one kind into the cache, in its own thread, until `stop()`."""

    def __init__(
        self,
        api: Api,
        cache: Cache,
        watched: Watched,
        *,
        watch_timeout: int = WATCH_TIMEOUT,
        backoff_initial: float = BACKOFF_INITIAL,
        backoff_max: float = BACKOFF_MAX,
        on_restart: Callable[[str, str], None] = lambda kind, reason: None,
        not_served_retry: float = NOT_SERVED_RETRY,
        on_exit: Callable[[str, BaseException | None], None] = lambda name, exc: None,
    ) -> None:
        self.not_served_retry = not_served_retry
        self.on_exit = on_exit  # the thread ends other than by stop(): (its name, exception)
        self.api = api
        self.cache = cache
        self.watched = watched
        self.watch_timeout = watch_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.on_restart = on_restart
        self._stop = threading.Event()
        self._watcher: Any = None
        self._thread = threading.Thread(
            target=self._main, name=f"watch-{watched.name}", daemon=True
        )
        self.version = ""
        self._said_not_served = False  # "not served" is logged once, not at every look

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.stop()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _served_version(self) -> str:
        """The first of the kind's versions the API server lists (ApiException otherwise)."""
        error: ApiException | None = None
        for version in self.watched.versions:
            try:
                self._items, self._list_rv = self.api.list(self.watched, version)
                return version
            except ApiException as exc:
                if exc.status != 404:
                    raise
                error = exc
        assert error is not None
        raise error

    def _main(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.on_exit(self._thread.name, exc)
            raise
        if not self._stop.is_set():
            self.on_exit(self._thread.name, None)

    def _run(self) -> None:
        backoff = self.backoff_initial
        while not self._stop.is_set():
            try:
                version = self._served_version()
                if version != self.version:
                    log.info("watching %s %s", self.watched.name, version)
                    self.version = version
                self.cache.replace(self.watched, self._items, self._list_rv)
                backoff = self.backoff_initial
                self._watch(version, self._list_rv)
            except ApiException as exc:
                if exc.status == 410:
                    log.info("watch of %s expired (410 Gone): relisting", self.watched.name)
                    self.on_restart(self.watched.name, "expired")
                    continue
                if exc.status == 404 and not self.version:
                    # Not served (its CRD is not installed): none of them, and look again later.
                    log.log(
                        logging.DEBUG if self._said_not_served else logging.INFO,
                        "%s is not served (versions %s): none cached; looking again every %g s",
                        self.watched.name,
                        ", ".join(self.watched.versions),
                        self.not_served_retry,
                    )
                    self._said_not_served = True
                    self.cache.replace(self.watched, [], "")
                    self._stop.wait(self.not_served_retry)
                    continue
                backoff = self._failed(exc, backoff)
            except Exception as exc:  # the connection, a decode error: retried all the same
                if self._stop.is_set():
                    return
                backoff = self._failed(exc, backoff)

    def _failed(self, exc: BaseException, backoff: float) -> float:
        self.cache.failing(self.watched)
        self.on_restart(self.watched.name, "error")
        log.warning(
            "list/watch of %s failed (%s); retrying in %.1f s",
            self.watched.name,
            describe(exc),
            backoff,
        )
        self._stop.wait(backoff * random.uniform(0.8, 1.2))
        return min(backoff * 2, self.backoff_max)

    def _watch(self, version: str, resource_version: str) -> None:
        """Watch from resource_version until stopped; a stream that ends is resumed."""
        while not self._stop.is_set():
            self._watcher = Watch(return_type="object")
            for event in self.api.watch(
                self.watched, version, resource_version, self.watch_timeout, self._watcher
            ):
                kind, obj = event.get("type"), event.get("raw_object")
                if not isinstance(obj, dict):
                    continue
                resource_version = str(meta(obj).get("resourceVersion") or resource_version)
                self.cache.healthy(self.watched)
                if kind == "BOOKMARK":
                    continue
                obj.setdefault("apiVersion", api_version(self.watched.info.group, version))
                obj.setdefault("kind", self.watched.info.kind)
                if kind == "DELETED":
                    self.cache.remove(self.watched, obj)
                elif kind in ("ADDED", "MODIFIED"):
                    self.cache.put(self.watched, obj)
            self.cache.healthy(self.watched)
