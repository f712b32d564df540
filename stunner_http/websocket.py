"""A server WebSocket for clients that only keep alive (the CDS watch).

Such a client sends nothing but its keepalive: a pong for each of our pings, a ping of its own
every few seconds, a close at the end. `KeepaliveWebSocket` checks every frame header of the
client's byte stream before aiohttp parses it:

- a frame that is not masked closes the connection with 1002 (RFC 6455 §5.1: "a server MUST
  close the connection upon receiving a frame that is not masked"); aiohttp's reader does not
  check, and has no option to;
- a client sending more than `FrameBudget` allows (a burst, then a rate a few times its
  keepalive's) is closed with 1008 (policy violation), before aiohttp answers its pings: a ping
  flood costs one connection's worth of parsing, not a pong per ping written on the event loop
  every watcher shares.

Both are counted in `WebSocketGuard` and logged at most once per `log_period` seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import WSCloseCode, web
from aiohttp import __version__ as _version
from aiohttp.http_websocket import WebSocketError

from .server import RateLimitedLog

log = logging.getLogger("stunner.http.websocket")
_UNGUARDED = RateLimitedLog(log, 3600.0)


@dataclass(frozen=True)
class FrameBudget:
    """Frames a client may send: `burst` at once, then `rate` a second on average."""

    burst: int = 8
    rate: float = 1.0
    log_period: float = 10.0


class WebSocketGuard:
    """One server's budget, counters and log lines: `response()` makes its WebSockets."""

    def __init__(self, budget: FrameBudget | None = None) -> None:
        self.budget = budget or FrameBudget()
        self.flooding = 0  # closed with 1008: more frames than the budget
        self.unmasked = 0  # closed with 1002: an unmasked frame
        self._logs = {
            code: RateLimitedLog(log, self.budget.log_period)
            for code in (WSCloseCode.PROTOCOL_ERROR, WSCloseCode.POLICY_VIOLATION)
        }

    def response(self, **kwargs: Any) -> KeepaliveWebSocket:
        """A `KeepaliveWebSocket` (kwargs: `web.WebSocketResponse`'s)."""
        return KeepaliveWebSocket(self, **kwargs)

    def refused(self, code: WSCloseCode, peer: str, why: str) -> None:
        if code == WSCloseCode.PROTOCOL_ERROR:
            self.unmasked += 1
        else:
            self.flooding += 1
        self._logs[code].event(logging.WARNING, "WebSocket client %s closed: %s", peer, why)


class _FrameGuard:
    """Sits before aiohttp's WebSocket reader: follows the frame boundaries of the client's
    byte stream, checks each header's mask bit and charges each frame to the budget."""

    def __init__(
        self,
        parser: Any,
        ws: KeepaliveWebSocket,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.parser = parser
        self.ws = ws
        self.clock = clock
        self.head = bytearray()  # the header of the frame being read, so far
        self.skip = 0  # payload bytes of the current frame still to pass
        self.budget = ws.guard.budget
        self.tokens = float(self.budget.burst)
        self.refilled = clock()
        self.failed = False

    def feed_eof(self) -> None:
        self.parser.feed_eof()

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        if self.failed:
            return True, b""
        problem = self._scan(data)
        if problem is None:
            result: tuple[bool, bytes] = self.parser.feed_data(data)
            return result
        self.failed = True
        self.ws.refuse(*problem)
        return True, b""

    def _scan(self, data: bytes) -> tuple[WSCloseCode, str] | None:
        pos, end = 0, len(data)
        head = self.head
        while pos < end:
            if self.skip:
                step = min(self.skip, end - pos)
                self.skip -= step
                pos += step
                continue
            if len(head) < 2:
                head.append(data[pos])
                pos += 1
                if len(head) < 2:
                    continue
                if not head[1] & 0x80:
                    return WSCloseCode.PROTOCOL_ERROR, "unmasked frame"
                if not self._charge():
                    return WSCloseCode.POLICY_VIOLATION, "too many frames"
            length7 = head[1] & 0x7F
            need = 2 + (2 if length7 == 126 else 8 if length7 == 127 else 0) + 4
            step = min(need - len(head), end - pos)
            head += data[pos : pos + step]
            pos += step
            if len(head) < need:
                continue
            if length7 < 126:
                self.skip = length7
            else:
                self.skip = int.from_bytes(head[2 : need - 4], "big")
            head.clear()
        return None

    def _charge(self) -> bool:
        now = self.clock()
        budget = self.budget
        self.tokens = min(budget.burst, self.tokens + (now - self.refilled) * budget.rate)
        self.refilled = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class KeepaliveWebSocket(web.WebSocketResponse):
    """`web.WebSocketResponse` whose client may send masked keepalive frames only (see the
    module); made by `WebSocketGuard.response`."""

    def __init__(self, guard: WebSocketGuard, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.guard = guard
        self.peer = "?"

    def _post_start(self, request: web.BaseRequest, protocol: str | None, writer: Any) -> None:
        # Bytes that came with the upgrade request are fed to the reader when it is set: keep
        # them for the guard.
        handler = request.protocol
        self.peer = request.remote or "?"
        if not all(hasattr(handler, a) for a in ("_message_tail", "_payload_parser")):
            # An aiohttp whose internals moved (tests/reconciler/test_cds_hostile.py fails):
            # serve without the guard rather than not at all.
            _UNGUARDED.event(logging.ERROR, "aiohttp %s: WebSocket frames unguarded", _version)
            super()._post_start(request, protocol, writer)
            return
        tail, handler._message_tail = handler._message_tail, b""
        super()._post_start(request, protocol, writer)
        guard = _FrameGuard(handler._payload_parser, self)
        handler._payload_parser = guard
        if tail:
            eof, _ = guard.feed_data(tail)
            if eof:
                handler.close()

    def refuse(self, code: WSCloseCode, why: str) -> None:
        """Close with `code`: the reader hands the error to `receive()`, which sends the close
        frame."""
        self.guard.refused(code, self.peer, why)
        reader = self._reader
        if reader is not None:
            reader.set_exception(WebSocketError(code, why))
