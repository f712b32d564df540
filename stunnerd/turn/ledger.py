"""What the listeners of one stunnerd share across its processes: the allocation quota and the
relay ports reserved by EVEN-PORT.

Both live in the primary process. A UDP worker process holds a stand-in that asks the primary
over its control channel (`stunnerd.process.worker_process`): the quota holds for the whole
stunnerd, and
a RESERVATION-TOKEN is honoured whichever process the client's second Allocate reaches (the
kernel hashes each 5-tuple to one process, and an RTP/RTCP pair has two). The quota is the
`Quota` protocol: `LocalQuota` here (the primary's, or a stunnerd without workers), a worker's
`PrimaryQuota` asks it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping
from typing import Protocol

RESERVATION_LIFETIME = 30.0  # RFC 8656 §7.2: a reserved port is held for about 30 seconds


GRANTED = ""
OVER_QUOTA = "quota"  # admin.user_quota: 486
FULL = "full"  # --max-allocations: 508
DRAINING = "draining"  # SIGTERM received: 508, the client tries another server


class Quota(Protocol):
    """`admin.user_quota` and --max-allocations as an Allocate meets them."""

    async def acquire(self, user_id: str, quota: int) -> str:
        """Count one more allocation of `user_id`: GRANTED, or why not (OVER_QUOTA, FULL,
        DRAINING). A `quota` of 0 means none."""
        ...

    def release(self, user_id: str) -> None:
        """One allocation of `user_id` fewer."""
        ...


class LocalQuota:
    """The quota counted in this process: allocations per user id, for `admin.user_quota`, and
    in total, for --max-allocations; one per stunnerd (in its primary). While `draining`, no
    allocation is granted.

    Cluster-wide (stunnerd.process.usage): `others` holds, per user id, the allocations the other
    pods of the Gateway hold, as the CDS last said (empty while it is unreachable: then this pod
    counts its own only), and `on_change` is called whenever `counts` changes."""

    def __init__(self, max_total: int = 0) -> None:
        self.counts: dict[str, int] = {}
        self.max_total = max_total  # 0: no cap
        self.total = 0
        self.draining = False
        self.others: Mapping[str, int] = {}
        self.on_change: Callable[[], None] | None = None

    def try_acquire(self, user_id: str, quota: int) -> str:
        """Count one more allocation of `user_id`; GRANTED, or why not (OVER_QUOTA, FULL,
        DRAINING). A `quota` of 0 means none."""
        if self.draining:
            return DRAINING
        if self.max_total > 0 and self.total >= self.max_total:
            return FULL
        count = self.counts.get(user_id, 0)
        if quota > 0 and count + self.others.get(user_id, 0) >= quota:
            return OVER_QUOTA
        self.counts[user_id] = count + 1
        self.total += 1
        if self.on_change is not None:
            self.on_change()
        return GRANTED

    async def acquire(self, user_id: str, quota: int) -> str:
        return self.try_acquire(user_id, quota)

    def release(self, user_id: str) -> None:
        count = self.counts.get(user_id, 0)
        if count <= 0:
            return
        self.total -= 1
        if count > 1:
            self.counts[user_id] = count - 1
        else:
            del self.counts[user_id]
        if self.on_change is not None:
            self.on_change()


class Reservations:
    """Relay sockets held for a RESERVATION-TOKEN (RFC 8656 §14.9), each for 30 seconds.

    The socket stays bound while reserved, so no other allocation can take its port; a claim
    hands it over once, and an expired reservation closes it.
    """

    def __init__(self, lifetime: float = RESERVATION_LIFETIME) -> None:
        self.lifetime = lifetime
        self._held: dict[bytes, tuple[float, socket.socket]] = {}

    def __len__(self) -> int:
        return len(self._held)

    async def reserve(self, token: bytes, sock: socket.socket) -> None:
        """Hold `sock` under `token`; claimable in every process once this returns."""
        self.hold(token, sock)

    def hold(self, token: bytes, sock: socket.socket) -> None:
        self.sweep()
        old = self._held.pop(token, None)
        if old is not None:
            old[1].close()
        self._held[token] = (time.monotonic() + self.lifetime, sock)

    def take(self, token: bytes) -> socket.socket | None:
        """The socket reserved under `token`, once; None for an unknown or expired token."""
        self.sweep()
        entry = self._held.pop(token, None)
        return entry[1] if entry is not None else None

    async def claim(self, token: bytes) -> socket.socket | None:
        return self.take(token)

    def sweep(self) -> None:
        now = time.monotonic()
        for token in [t for t, (expiry, _) in self._held.items() if expiry <= now]:
            self._held.pop(token)[1].close()

    def close(self) -> None:
        for _, sock in self._held.values():
            sock.close()
        self._held.clear()
