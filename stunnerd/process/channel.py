"""A message channel between stunnerd processes: JSON frames, optionally carrying one socket.

Frames travel over a Unix stream socket: an 8-byte header (body length, number of attached
file descriptors, 0 or 1) and a JSON body. An attached descriptor rides as SCM_RIGHTS with the
frame's first bytes, so it arrives no later than its frame; the receiver wraps it in a
`socket.socket`. `post` never blocks: frames are queued and written in order by one task.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import socket
import struct
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("stunner.stunnerd")

HEADER = struct.Struct("!II")  # body length, attached descriptors
MAX_BODY = 64 << 20
READ_SIZE = 1 << 16
MAX_FDS_PER_READ = 16


class ChannelError(Exception):
    """The peer broke the framing; the channel is closed."""


@dataclass
class Received:
    body: dict[str, Any]
    sock: socket.socket | None = None


class Channel:
    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._buffer = bytearray()
        self._fds: collections.deque[int] = collections.deque()
        self._inbox: asyncio.Queue[Received | None] = asyncio.Queue()
        # frame, attached socket, whether the socket is closed once sent (handed over)
        self._outbox: collections.deque[tuple[bytes, socket.socket | None, bool]]
        self._outbox = collections.deque()
        self._wakeup = asyncio.Event()
        self._closed = False
        self._loop.add_reader(sock.fileno(), self._readable)
        self._writer = self._loop.create_task(self._write_loop())

    @property
    def closed(self) -> bool:
        return self._closed

    # --- receiving ------------------------------------------------------------------------

    async def receive(self) -> Received | None:
        """The next frame, or None once the peer has closed the channel."""
        if self._closed and self._inbox.empty():
            return None
        return await self._inbox.get()

    def _readable(self) -> None:
        while not self._closed:
            try:
                data, fds, _flags, _addr = socket.recv_fds(self._sock, READ_SIZE, MAX_FDS_PER_READ)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, fds = b"", []
            self._fds.extend(fds)
            if not data:
                self.close()
                return
            self._buffer += data
            try:
                self._parse()
            except ChannelError as exc:
                log.error("control channel: %s", exc)
                self.close()

    def _parse(self) -> None:
        while len(self._buffer) >= HEADER.size:
            length, fd_count = HEADER.unpack_from(self._buffer)
            if length > MAX_BODY or fd_count > 1:
                raise ChannelError(f"bad frame header ({length} bytes, {fd_count} fds)")
            end = HEADER.size + length
            if len(self._buffer) < end:
                return
            if len(self._fds) < fd_count:
                raise ChannelError("a frame's descriptor is missing")
            try:
                body = json.loads(self._buffer[HEADER.size : end])
            except ValueError as exc:
                raise ChannelError(f"bad frame body: {exc}") from None
            del self._buffer[:end]
            sock = socket.socket(fileno=self._fds.popleft()) if fd_count else None
            if not isinstance(body, dict):
                raise ChannelError("a frame body must be a JSON object")
            self._inbox.put_nowait(Received(body, sock))

    # --- sending --------------------------------------------------------------------------

    def post(
        self, body: dict[str, Any], sock: socket.socket | None = None, hand_over: bool = False
    ) -> None:
        """Queue a frame (with a duplicate of `sock`'s descriptor, if given); frames go in order.
        With `hand_over`, our `sock` is closed once sent (or once the channel closes)."""
        if self._closed:
            if sock is not None and hand_over:
                sock.close()
            return
        data = json.dumps(body, separators=(",", ":")).encode()
        self._outbox.append((HEADER.pack(len(data), 1 if sock else 0) + data, sock, hand_over))
        self._wakeup.set()

    async def flush(self) -> None:
        """Wait until every posted frame has been written (or the channel closed)."""
        while self._outbox and not self._closed:
            await asyncio.sleep(0.005)

    async def _write_loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._outbox:
                frame, sock, hand_over = self._outbox[0]
                try:
                    if sock is not None:
                        sent = await self._send_with_descriptor(frame, sock)
                        frame = frame[sent:]
                    if frame:
                        await self._loop.sock_sendall(self._sock, frame)
                except OSError:
                    self.close()
                    return
                self._outbox.popleft()
                if sock is not None and hand_over:
                    sock.close()

    async def _send_with_descriptor(self, frame: bytes, sock: socket.socket) -> int:
        while True:
            try:
                return socket.send_fds(self._sock, [frame], [sock.fileno()])
            except (BlockingIOError, InterruptedError):
                writable = self._loop.create_future()
                self._loop.add_writer(self._sock.fileno(), _resolve, writable)
                try:
                    await writable
                finally:
                    self._loop.remove_writer(self._sock.fileno())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._sock.fileno())
        self._writer.cancel()
        self._sock.close()
        while self._fds:
            socket.close(self._fds.popleft())
        for _, sock, hand_over in self._outbox:
            if sock is not None and hand_over:
                sock.close()
        self._outbox.clear()
        self._inbox.put_nowait(None)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
