"""Sessions, stunnerd's side: answer the CDS's requests on the config watch with this pod's live
allocations, and end the ones it names (stunner_api.sessions; README "Sessions: list and end
allocations"; the CDS side is reconciler.cds.sessions).

`SessionDesk` reads the listeners of this process (`listeners()`: name -> Listener) on demand:
nothing is kept or sent until the CDS asks. `WatchLink` is what the CDS watch carries for this
stunnerd (stunner_client.cds.Reporter): the usage reports of cluster-wide user quotas
(stunnerd.process.usage) and the sessions answers, one stream of frames, and the CDS's frames of
both kinds dispatched to their owner.

A session's user is its user id (the part of an ephemeral username after its timestamp), never
the username's password or the key. Packets and bytes (payload) each way count what Python, the
native engine and the kernel offload relayed for it. The allocations the UDP worker processes of
the Python path hold (--udp-thread-num > 1 without the native engine) are theirs: not listed
here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from stunner_api.cds import USAGE_OTHERS_KEY, usage_key
from stunner_api.sessions import (
    END_KEY,
    HELLO,
    REQUEST_KEY,
    SessionsError,
    frame_key,
    parse_end,
    parse_request,
    report_frame,
    session_record,
)

from ..transport.listener import Listener
from ..transport.native_glue import NativeAllocation
from ..turn.allocation import Allocation
from .usage import UsageReporter

log = logging.getLogger("stunner.sessions")

POD_NAME_ENV = "HOSTNAME"  # a pod's hostname is its name (the kubelet sets HOSTNAME too)
ANSWERS_QUEUED = 16  # answers not sent yet; past it the oldest request goes unanswered


def pod_name(env: Mapping[str, str] | None = None) -> str:
    return (os.environ if env is None else env).get(POD_NAME_ENV) or socket.gethostname()


def address_text(address: tuple[Any, ...]) -> str:
    ip, port = str(address[0]), int(address[1])
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def record_of(listener: Listener, allocation: Allocation, now: float, pod: str) -> dict[str, Any]:
    """One allocation as the CDS is told (stunner_api.sessions.session_record)."""
    a = allocation
    # Python's own relaying and the kernel offload's (stunnerd.transport.offloaded) are on the
    # allocation; the native engine's in the engine (payload bytes each).
    counters: tuple[int, ...] = (a.rx_packets, a.rx_bytes, a.tx_packets, a.tx_bytes)
    if isinstance(a.mirror, NativeAllocation):
        counters = tuple(x + y for x, y in zip(counters, a.mirror.traffic(), strict=True))
    return session_record(
        id=allocation.id,
        pod=pod,
        listener=listener.name,
        transport=str(listener.config.protocol),
        client=address_text(allocation.downstream.address),
        user=allocation.user_id,
        relay=address_text(allocation.relayed_address),
        peers=allocation.permissions,
        channels={n: address_text(peer) for n, (peer, _) in allocation.channels.items()},
        age=now - allocation.created,
        lifetime=allocation.expires_at - now,
        counters=counters,
        bandwidth_limit=a.cap.bits_per_second if a.cap is not None else None,
    )


class SessionDesk:
    """This process's allocations for the CDS (see the module's docstring)."""

    def __init__(self, listeners: Callable[[], Mapping[str, Listener]], pod: str = "") -> None:
        self.listeners = listeners
        self.pod = pod or pod_name()
        self._answers: asyncio.Queue[str] = asyncio.Queue(ANSWERS_QUEUED)
        self.ended = 0

    def sessions(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [
            record_of(listener, allocation, now, self.pod)
            for listener in self.listeners().values()
            for allocation in list(listener.server.allocations.values())
        ]

    def end(self, users: frozenset[str], ids: frozenset[str], why: str) -> list[dict[str, Any]]:
        """End the allocations of `users` and those of `ids`, now: what ended."""
        now = time.monotonic()
        ended = []
        for listener in self.listeners().values():
            for allocation in list(listener.server.allocations.values()):
                if allocation.user_id in users or allocation.id in ids:
                    ended.append(record_of(listener, allocation, now, self.pod))
                    listener.server.end(allocation, why)
        self.ended += len(ended)
        return ended

    def received(self, frame: str | bytes) -> None:
        """A sessions frame from the CDS: answered on the watch."""
        key = frame_key(frame)
        try:
            if key == REQUEST_KEY:
                request = parse_request(frame)
                self._answer(report_frame(request, self.pod, self.sessions()))
            elif key == END_KEY:
                request, users, ids = parse_end(frame)
                ended = self.end(users, ids, "ended by the CDS (stunner disconnect)")
                self._answer(report_frame(request, self.pod, ended))
        except SessionsError as exc:
            log.warning("ignoring a sessions frame from the CDS: %s", exc)

    def _answer(self, text: str) -> None:
        if self._answers.full():
            self._answers.get_nowait()
        self._answers.put_nowait(text)

    async def frames(self) -> AsyncIterator[str]:
        """The answers of one CDS connection (those of an earlier one are stale: dropped)."""
        while not self._answers.empty():
            self._answers.get_nowait()
        yield report_frame(HELLO, self.pod, [])
        while True:
            yield await self._answers.get()


class WatchLink:
    """What this stunnerd's CDS watch carries besides configs: usage reports and sessions."""

    def __init__(self, usage: UsageReporter, sessions: SessionDesk) -> None:
        self.usage = usage
        self.sessions = sessions

    async def frames(self) -> AsyncIterator[str]:
        out: asyncio.Queue[str] = asyncio.Queue(1)

        async def pump(frames: AsyncIterator[str]) -> None:
            async for frame in frames:
                await out.put(frame)

        pumps = [
            asyncio.create_task(pump(self.usage.frames())),
            asyncio.create_task(pump(self.sessions.frames())),
        ]
        try:
            while True:
                yield await out.get()
        finally:
            for task in pumps:
                task.cancel()
            for task in pumps:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def takes(self, frame: str | bytes) -> bool:
        """Whether `frame` is one of ours (not a config)."""
        return usage_key(frame) == USAGE_OTHERS_KEY or frame_key(frame) in (REQUEST_KEY, END_KEY)

    def received(self, frame: str | bytes) -> None:
        if usage_key(frame) == USAGE_OTHERS_KEY:
            self.usage.received(frame)
        else:
            self.sessions.received(frame)

    def disconnected(self) -> None:
        self.usage.disconnected()
