"""Serve an aiohttp application with the connection discipline of stunnerd's TCP listeners.

- **Request deadline**: a connection has `request_deadline` seconds from its opening (and from
  the end of each answer) to deliver a complete request head, or it is closed: one that sends
  nothing, trickles a header line every few seconds, or idles after an answer. aiohttp's
  keep-alive timer does this: it is armed when a connection opens and after each answer, and no
  partial data moves it. A WebSocket, once upgraded, is no longer under it (its own heartbeat
  is).
- **Bounded requests**: a request line or header field of at most `max_line` bytes, at most
  `max_headers` fields; a malformed or oversized request gets 400, logged at DEBUG in one line.
- **Caps on concurrent connections** (`admission`): per server (`max_connections`), per source
  IP (`connections_per_source`, as stunnerd's TCP listeners), and for every server of the
  process together (the `nofile` soft limit less a reserve for everything else the process
  opens, one source IP holding at most half of it): a connection past any is closed at once
  and counted (`ConnectionStats.refused`). With `evict_unproven`, the oldest connection the
  application has not vouched for (`prove`) is closed instead to make room
  (`ConnectionStats.evicted`).
- **Our own accept loop.** It accepts every connection waiting in one turn of the event loop
  (each counted at once, its transport made in a task of its own), so a connect flood fills the
  listen queue (`backlog`) no faster than refusing a connection costs, and honest SYNs are not
  dropped behind it (red team finding B). asyncio's (CPython 3.11) logs `socket.accept() out
  of system resource` with a traceback on EMFILE and goes on accepting up to `backlog` times in
  the same tick, each failure scheduling another retry: hundreds of ERROR lines a second and a
  busy CPU. Here a resource error (EMFILE, ENFILE, ENOBUFS, ENOMEM) is counted, logged at most
  once per `log_period` seconds with the count since the last line, and accepting pauses
  `ACCEPT_PAUSE` seconds.
- **A client's fault is not our error**: a request aiohttp cannot parse, or a connection reset
  by the client, is one DEBUG line; anything else keeps its traceback at ERROR.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .admission import Admission, Holdings

log = logging.getLogger("stunner.http")

RESOURCE_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_PAUSE = 0.1  # seconds without accepting after a resource error
# Descriptors kept free for what is not a client connection (files, API-server connections,
# subprocess pipes, listening sockets): at most half of the `nofile` soft limit.
FD_RESERVE = 256
SHUTDOWN_TIMEOUT = 1.0


@dataclass(frozen=True)
class ServerLimits:
    """The bounds of one server. The defaults fit an admin endpoint (probes, a scrape)."""

    request_deadline: float = 10.0  # stunnerd's TCP listeners give a first message 10 s
    max_connections: int = 64
    connections_per_source: int = 16  # a kubelet's probes and a scraper from one node
    evict_unproven: bool = False  # the app proves its clients (`prove`): evict the others first
    max_line: int = 8190
    max_headers: int = 64
    backlog: int = 128
    log_period: float = 10.0  # at most one line per this many seconds per recurring event


@dataclass
class ConnectionStats:
    """What one server did with its connections."""

    accepted: int = 0
    refused: int = 0  # past a cap: closed at once
    evicted: int = 0  # unproven, closed to make room for a new connection
    accept_errors: int = 0  # EMFILE and the like
    open: int = 0


class RateLimitedLog:
    """One log line per `period` seconds for a recurring event, with the count since the last
    line (the first occurrence is logged at once)."""

    def __init__(
        self,
        logger: logging.Logger,
        period: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.period = period
        self.clock = clock
        self._count = 0
        self._last: float | None = None

    def event(self, level: int, message: str, *args: object) -> bool:
        """Count one occurrence; log it if the last line is `period` old. True if logged."""
        self._count += 1
        now = self.clock()
        if self._last is not None and now - self._last < self.period:
            return False
        self.logger.log(level, message + " [%d since the last such line]", *args, self._count)
        self._count = 0
        self._last = now
        return True


class _Process:
    """The client connections every server of this process holds together."""

    held = Holdings()

    @staticmethod
    def cap() -> int:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return 1 << 30
        return max(0, soft - min(FD_RESERVE, soft // 2))


class _ServerLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server log: a request it cannot parse, or a client that went away, is one
    DEBUG line; anything else keeps its traceback at ERROR."""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        error = kwargs.get("exc_info")
        if isinstance(error, HttpProcessingError):
            self.logger.debug(
                "bad request: %d %s", error.code, " ".join(str(error.message).split())[:120]
            )
            return
        if isinstance(error, ConnectionError):
            self.logger.debug("client went away: %s", error)
            return
        self.logger.log(level, msg, *args, **kwargs)


class _Counted(asyncio.Protocol):
    """aiohttp's protocol for one connection, counted from its accept (`count`) until it is
    lost, evicted, or its transport could not be made."""

    __slots__ = ("inner", "site", "source", "transport", "_counted")

    def __init__(self, inner: asyncio.Protocol, site: GuardedSite, source: str) -> None:
        self.inner = inner
        self.site = site
        self.source = source
        self.transport: asyncio.Transport | None = None
        self._counted = False

    def count(self) -> None:
        """Held from the accept on: the next accept of the same batch sees it."""
        self._counted = True
        self.site.stats.open += 1
        self.site.admission.add(self, self.source)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.inner.connection_made(transport)
        if not self._counted:  # evicted between its accept and its transport
            self.transport.abort()

    def prove(self) -> None:
        self.site.admission.prove(self)

    def evict(self) -> None:
        """Closed to make room: uncounted now, its transport aborted (aiohttp sees it lost)."""
        self.uncount()
        if self.transport is not None:
            self.transport.abort()

    def uncount(self) -> None:
        if self._counted:
            self._counted = False
            self.site.stats.open -= 1
            self.site.admission.remove(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.uncount()
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


def _given(protocol: _Counted) -> Callable[[], _Counted]:
    return lambda: protocol


class _Listening:
    """What aiohttp's runner reads of a site's server: its sockets, and close()."""

    def __init__(self, sockets: list[socket.socket], tasks: list[asyncio.Task[None]]) -> None:
        self.sockets = sockets
        self.tasks = tasks

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        for sock in self.sockets:
            sock.close()

    async def wait_stopped(self) -> None:
        """Stop the accept loops and wait for them: their readers are off the selector before
        the sockets close (a closed socket's fd may be reused at once)."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def _listening_sockets(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for host:port (`""`: every interface, IPv4 and
    IPv6), as asyncio's create_server binds them."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    seen: set[tuple[Any, ...]] = set()
    try:
        for family, type_, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            try:
                sock = socket.socket(family, type_, proto)
            except OSError:
                continue  # a family this host does not have (no IPv6)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as e:
                if e.errno == errno.EADDRNOTAVAIL:  # the family is not enabled (bpo-30945)
                    sockets.pop().close()
                    continue
                raise
            sock.listen(backlog)
            sock.setblocking(False)
        if not sockets:
            raise OSError(errno.EADDRNOTAVAIL, f"no address to listen on for {host}:{port}")
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class GuardedSite(web.BaseSite):
    """A TCP site with our accept loop: the caps, counted refusals and evictions, rate-limited
    accept errors."""

    __slots__ = (
        "_host",
        "_port",
        "_limits",
        "_label",
        "stats",
        "admission",
        "_error_log",
        "_refused_log",
    )

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, limits: ServerLimits, label: str
    ) -> None:
        super().__init__(runner, backlog=limits.backlog)
        self._host = host
        self._port = port
        self._limits = limits
        self._label = label
        self.stats = ConnectionStats()
        self.admission: Admission[_Counted] = Admission(
            limits.max_connections,
            limits.connections_per_source,
            _Process.held,
            evict_unproven=limits.evict_unproven,
        )
        self._error_log = RateLimitedLog(log, limits.log_period)
        self._refused_log = RateLimitedLog(log, limits.log_period)

    @property
    def name(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{self._label} on {host}:{self._port}".lstrip()

    async def start(self) -> None:
        await super().start()
        sockets = _listening_sockets(self._host, self._port, self._limits.backlog)
        self._port = sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self._accept(sock)) for sock in sockets]
        self._server = _Listening(sockets, tasks)  # type: ignore[assignment]

    async def stop(self) -> None:
        if isinstance(self._server, _Listening):
            await self._server.wait_stopped()
        await super().stop()  # closes the sockets

    def _admit(self, source: str) -> bool:
        """Whether a connection from `source` is served: there is room, or an unproven
        connection is evicted to make it; else it is refused (counted, logged)."""
        process_cap = _Process.cap()
        why = self.admission.no_room(source, process_cap)
        if why is None:
            return True
        victim = self.admission.victim(source, process_cap)
        if victim is not None:
            self.stats.evicted += 1
            victim.evict()
            return True
        self.stats.refused += 1
        self._refused_log.event(
            logging.WARNING,
            "%s: connections refused (%s): %d open here (cap %d, %d per source), "
            "%d in the process (cap %d)",
            self.name,
            why,
            self.stats.open,
            self._limits.max_connections,
            self._limits.connections_per_source,
            _Process.held.open,
            process_cap,
        )
        return False

    async def _accept(self, sock: socket.socket) -> None:
        """Accept every connection waiting, then wait for more: one turn of the event loop
        drains the listen queue (a connect flood fills it no faster than refusing costs), and
        each admitted connection's transport is made in a task of its own (red team finding B:
        one accept per turn, each awaiting its transport, let a flood overflow the queue)."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, address = sock.accept()
            except (BlockingIOError, InterruptedError):
                try:
                    conn, address = await loop.sock_accept(sock)
                except OSError as exc:
                    await self._accept_failed(exc)
                    continue
            except OSError as exc:
                await self._accept_failed(exc)
                continue
            source = str(address[0])
            if not self._admit(source):
                conn.close()
                continue
            self.stats.accepted += 1
            conn.setblocking(False)
            factory = self._runner.server
            assert factory is not None
            protocol = _Counted(factory(), self, source)
            protocol.count()
            task = loop.create_task(loop.connect_accepted_socket(_given(protocol), conn))
            task.add_done_callback(partial(self._served, protocol, conn))

    async def _accept_failed(self, exc: OSError) -> None:
        if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EINTR):
            return  # the client gave up before we accepted
        self.stats.accept_errors += 1
        self._error_log.event(
            logging.ERROR,
            "%s: cannot accept a connection: %s (%d open here, %d in the process)",
            self.name,
            exc.strerror or exc,
            self.stats.open,
            _Process.held.open,
        )
        await asyncio.sleep(ACCEPT_PAUSE)

    def _served(self, protocol: _Counted, conn: socket.socket, task: asyncio.Task[Any]) -> None:
        """An accepted connection's transport is made, or it could not be (uncounted)."""
        if task.cancelled():
            protocol.uncount()
            conn.close()
            return
        exc = task.exception()
        if exc is None:
            return
        protocol.uncount()
        conn.close()
        if isinstance(exc, OSError):  # the client reset before its transport was made
            log.debug("%s: connection lost at accept: %s", self.name, exc)
        else:  # a bug: keep accepting, say so at a bounded rate
            self._error_log.event(
                logging.ERROR, "%s: cannot serve a connection: %r", self.name, exc
            )


def prove(request: web.BaseRequest) -> None:
    """The application vouches for the connection `request` came on (the CDS: its token is
    valid): with `evict_unproven`, it is never evicted to make room for another."""
    transport = request.transport
    protocol = transport.get_protocol() if transport is not None else None
    if isinstance(protocol, _Counted):
        protocol.prove()


@dataclass
class Served:
    """A running server: its base URL and counters."""

    host: str
    port: int
    stats: ConnectionStats = field(default_factory=ConnectionStats)

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


LIMITS_KEY = web.AppKey("stunner_http.limits", ServerLimits)
NAME_KEY = web.AppKey("stunner_http.name", str)  # what the server's log lines call it


def runner_for(app: web.Application, limits: ServerLimits) -> web.AppRunner:
    """An AppRunner with the deadline and the request bounds of `limits`."""
    return web.AppRunner(
        app,
        access_log=None,
        logger=_ServerLog(logging.getLogger("stunner.http")),
        handle_signals=False,
        shutdown_timeout=SHUTDOWN_TIMEOUT,
        keepalive_timeout=limits.request_deadline,
        max_line_size=limits.max_line,
        max_field_size=limits.max_line,
        max_headers=limits.max_headers,
    )


async def start(
    app: web.Application,
    host: str,
    port: int,
    name: str = "",
    limits: ServerLimits | None = None,
) -> tuple[web.AppRunner, GuardedSite]:
    """Start serving `app` on host:port (0: a free port; `""`: every interface); `name` labels
    its log lines; `limits` default to the app's own (`app[LIMITS_KEY]`), else ServerLimits().
    Stop with `runner.cleanup()`."""
    limits = limits or app.get(LIMITS_KEY) or ServerLimits()
    name = name or app.get(NAME_KEY, "")
    runner = runner_for(app, limits)
    await runner.setup()
    site = GuardedSite(runner, host, port, limits, name)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, site


@contextlib.asynccontextmanager
async def serve(
    app: web.Application,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    name: str = "",
    limits: ServerLimits | None = None,
) -> AsyncIterator[Served]:
    """Serve `app` on host:port until the block ends (see `start`)."""
    runner, site = await start(app, host, port, name, limits)
    try:
        bound = runner.addresses[0]
        yield Served(host, int(bound[1]), site.stats)
    finally:
        await runner.cleanup()
