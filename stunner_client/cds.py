"""The one client of the config discovery service (CDS): stunnerd's config source
(stunnerd.process.sources.CdsSource, one config) and the auth service (reconciler.auth, every
config) both speak the CDS through `CdsClient`.

- `client.get(path, query)`: one `GET` (blocking: run it in a thread), the body, or `CdsError`
  whose message says what failed (the server's `{code, message}` when it sent one).
- `async for frame in client.watch(path, query, what)`: the text frames of `?watch=true` over a
  WebSocket, forever. The client pings every `ping_period` seconds and drops a connection whose
  ping is unanswered for `pong_wait` seconds (Go's pkg/config/client timings). When a connection
  that was up ends (the reconciler rolled, or its pod moved), it reconnects soon: after
  RECONNECT_FIRST seconds (jittered, so a thousand pods don't arrive at once), doubling up to
  `retry_period`; a config change published meanwhile waits only as long as the CDS is really
  gone (Go retries every second: a route deleted during a reconciler rollout took up to 1.5 s
  to reach stunnerd on the real cluster). A server that cannot be reached is retried every
  `retry_period` seconds, and a refusal (401, 403) with back-off, doubling up to
  `REFUSED_BACKOFF_MAX` seconds; a 503 with `Retry-After` (a standby reconciler in leader-only
  mode) after that many seconds, at most `retry_period`. What the frames mean (a config, the
  zero config of a deleted Gateway, a usage frame) is the caller's to decide. With `reporter`,
  what `reporter.frames()` yields is sent on each connection (stunnerd's usage reports of
  cluster-wide user quotas, started anew on every connect), and `reporter.disconnected()` is
  called whenever a connection ends or fails.

With STUNNER_CDS_TOKEN_FILE set in `env` (default: the process's environment), the token file is
read at every request and (re)connect, since the kubelet rotates it, and sent as
`Authorization: Bearer <token>`; without it, or with no file there, no header is sent. The token
is never logged.

websockets, not aiohttp, is the WebSocket client: it has Go's two keepalive timings (aiohttp's
client waits `heartbeat / 2` for a pong) and keeps a refused handshake's body (the CDS's reason,
logged), and it is imported by a watch only: a stunnerd reading a config file loads none of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from stunner_api.cds import (
    OPEN_TIMEOUT,
    PING_PERIOD,
    PONG_WAIT,
    RETRY_PERIOD,
    WATCH_PARAM,
    bearer_headers,
    token_file,
)

log = logging.getLogger("stunner.cds-client")

HTTP_TIMEOUT = 5.0
REFUSED_BACKOFF_MAX = 15.0  # seconds between retries of a watch the CDS refuses (401, 403)
RECONNECT_FIRST = 0.05  # seconds before the first retry after a connection that was up ended


def reconnect_waits(retry_period: float) -> list[float]:
    """The waits before each retry after a connection that was up ended, before they settle at
    `retry_period`: RECONNECT_FIRST, doubling."""
    waits = []
    wait = RECONNECT_FIRST
    while wait < retry_period:
        waits.append(wait)
        wait *= 2
    return waits


class Reporter(Protocol):
    """What a watch sends besides its keepalive (`CdsClient.watch`)."""

    def frames(self) -> AsyncIterator[str]:
        """The frames to send on one connection, from its start; ends with it."""
        ...

    def disconnected(self) -> None:
        """The connection ended or could not be made."""
        ...


class CdsError(Exception):
    """A CDS address that cannot be used, or a GET that failed; the message says which."""


class CdsClient:
    """One CDS server, at `address`: `http(s)://host:port`, `ws(s)://host:port`, `host:port`
    or `:port` (an empty host is localhost); `CdsError` for any other form."""

    def __init__(
        self,
        address: str,
        *,
        env: Mapping[str, str] | None = None,
        retry_period: float = RETRY_PERIOD,
        ping_period: float = PING_PERIOD,
        pong_wait: float = PONG_WAIT,
        logger: logging.Logger = log,
    ) -> None:
        scheme, netloc = split_address(address)
        self.secure = scheme in ("https", "wss")
        self.netloc = netloc
        self.origin = f"{'https' if self.secure else 'http'}://{netloc}"
        self.retry_period = retry_period
        self.ping_period = ping_period
        self.pong_wait = pong_wait
        self.log = logger
        self.token_file: Path | None = token_file(env)
        self._token_unreadable = False

    def __repr__(self) -> str:
        return f"CdsClient({self.origin!r})"

    def url(self, path: str, query: Mapping[str, str] | None = None) -> str:
        """The HTTP URL of `path` with `query`."""
        encoded = urllib.parse.urlencode(query or {})
        return self.origin + path + (f"?{encoded}" if encoded else "")

    def ws_url(self, path: str, query: Mapping[str, str] | None = None) -> str:
        """The WebSocket URL that watches `path` (`watch=true` first, then `query`)."""
        encoded = urllib.parse.urlencode({WATCH_PARAM: "true"} | dict(query or {}))
        return f"{'wss' if self.secure else 'ws'}://{self.netloc}{path}?{encoded}"

    def auth_headers(self) -> dict[str, str]:
        """`Authorization: Bearer` with the token file's current content; {} without one (an
        unreadable file is logged once, until it is readable again)."""
        if self.token_file is None:
            return {}
        try:
            headers = bearer_headers(self.token_file)
        except (OSError, UnicodeDecodeError) as exc:
            if not self._token_unreadable:
                self.log.warning(
                    "cannot read the CDS token file %s (%s): connecting without a token",
                    self.token_file,
                    exc.strerror if isinstance(exc, OSError) else "not text",
                )
                self._token_unreadable = True
            return {}
        self._token_unreadable = False
        return headers

    def get(
        self,
        path: str,
        query: Mapping[str, str] | None = None,
        *,
        what: str = "",
        timeout: float = HTTP_TIMEOUT,
    ) -> bytes:
        """`GET path?query`: the body, or `CdsError` (`what` names the object in its message)."""
        # No proxies: the CDS is in-cluster, and a stray http_proxy must not capture it.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        headers = {"Accept": "application/json"} | self.auth_headers()
        request = urllib.request.Request(self.url(path, query), headers=headers)
        try:
            with opener.open(request, timeout=timeout) as response:
                body: bytes = response.read()
                return body
        except urllib.error.HTTPError as exc:
            with exc:
                message = error_message(exc.read()) or exc.reason
            about = f"{what}: " if what else ""
            raise CdsError(f"CDS server {self.origin}: {about}HTTP {exc.code}: {message}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise CdsError(f"cannot reach CDS server {self.origin}: {reason}") from None

    async def watch(
        self,
        path: str,
        query: Mapping[str, str] | None = None,
        *,
        what: str = "",
        reporter: Reporter | None = None,
    ) -> AsyncGenerator[str | bytes, None]:
        """Every frame the CDS sends on the watch of `path`, across reconnects, forever (cancel
        the consumer to stop). `what` names the watched object in the log; `reporter`'s frames
        are sent on each connection."""
        # websockets is loaded by a CDS watch only: a config file needs none of it.
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidStatus, WebSocketException
        from websockets.typing import Origin

        ws_url = self.ws_url(path, query)
        failing = False
        delay = self.retry_period
        soon: list[float] = []  # the quick retries left after a connection that was up ended
        while True:
            try:
                async with connect(
                    ws_url,
                    origin=Origin(self.origin),
                    additional_headers=self.auth_headers(),
                    ping_interval=self.ping_period,
                    ping_timeout=self.pong_wait,
                    open_timeout=min(max(self.pong_wait, 1.0), OPEN_TIMEOUT),
                    close_timeout=min(1.0, self.pong_wait),
                    proxy=None,
                ) as ws:
                    self.log.info("connected to CDS server %s", ws_url)
                    failing = False
                    delay = self.retry_period
                    soon = reconnect_waits(self.retry_period)
                    async with _reporting(ws, reporter):
                        async for message in ws:
                            yield message
                self.log.info("CDS server %s closed the connection; reconnecting", ws_url)
            except InvalidStatus as exc:
                status = exc.response.status_code
                if status == 503 and "Retry-After" in exc.response.headers:
                    # A standby reconciler (leader-only CDS): through the Service again, soon.
                    wait = retry_after(exc.response.headers["Retry-After"], self.retry_period)
                    self.log.info(
                        "CDS server %s stands by (HTTP 503 %s); retrying in %gs",
                        ws_url,
                        error_message(bytes(exc.response.body or b"")) or "",
                        wait,
                    )
                    await asyncio.sleep(wait)
                    continue
                level = logging.DEBUG if failing else logging.WARNING
                self.log.log(
                    level,
                    "CDS server %s refused the watch of %s: HTTP %d %s%s; keeping the running "
                    "config, retrying with back-off",
                    ws_url,
                    what or path,
                    status,
                    error_message(bytes(exc.response.body or b"")) or exc.response.reason_phrase,
                    " (no token: is STUNNER_CDS_TOKEN_FILE set?)"
                    if status == 401 and not self.auth_headers()
                    else "",
                )
                failing = True
                if status in (401, 403):
                    soon = []
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, max(REFUSED_BACKOFF_MAX, self.retry_period))
                    continue
            except (OSError, TimeoutError, WebSocketException) as exc:
                level = logging.DEBUG if failing else logging.WARNING
                self.log.log(
                    level,
                    "connection to CDS server %s failed: %s; retrying every %gs",
                    ws_url,
                    str(exc) or type(exc).__name__,
                    self.retry_period,
                )
                failing = True
            except (GeneratorExit, asyncio.CancelledError):
                reporter = None  # the watch is stopped, not disconnected
                raise
            finally:
                if reporter is not None:
                    reporter.disconnected()
            if soon:
                wait = soon.pop(0)
                await asyncio.sleep(random.uniform(wait / 2, wait))
            else:
                await asyncio.sleep(self.retry_period)


def retry_after(header: str, retry_period: float) -> float:
    """Seconds to wait on a 503's `Retry-After` (delta-seconds; an HTTP date or garbage counts
    as `retry_period`), never more than `retry_period` nor less than RECONNECT_FIRST."""
    try:
        wait = float(header)
    except ValueError:
        wait = retry_period
    return min(max(wait, RECONNECT_FIRST), retry_period)


@contextlib.asynccontextmanager
async def _reporting(ws: Any, reporter: Reporter | None) -> AsyncIterator[None]:
    """Send `reporter`'s frames on `ws` while the block runs (a send that fails ends them: the
    connection is going, and the reader sees it)."""
    if reporter is None:
        yield
        return

    from websockets.exceptions import ConnectionClosed

    async def send() -> None:
        with contextlib.suppress(ConnectionClosed):
            async for frame in reporter.frames():
                await ws.send(frame)

    task = asyncio.create_task(send())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def error_message(body: bytes) -> str:
    """The `message` of a CDS error body `{code, message}`, else the body's text."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return text
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return str(data["message"])
    return text


def split_address(address: str) -> tuple[str, str]:
    """(scheme, host:port) of a CDS address; an empty host is localhost."""
    if "://" not in address:
        address = "http://" + address
    parts = urllib.parse.urlsplit(address)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https", "ws", "wss"):
        raise CdsError(f"invalid CDS address {address!r}: unsupported scheme {scheme!r}")
    try:
        port = parts.port
    except ValueError as exc:
        raise CdsError(f"invalid CDS address {address!r}: {exc}") from None
    host = parts.hostname or "localhost"
    if ":" in host:
        host = f"[{host}]"
    return scheme, host if port is None else f"{host}:{port}"
