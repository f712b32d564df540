"""The bounds stunnerd keeps under abuse (issue 15), and the per-source rate limiter.

Go STUNner's dataplane config has no key for any of these, so they are stunnerd flags (`cli.py`,
the README's flag table) and the config stays wire-compatible. Each default is far beyond what
a real WebRTC session reaches, and each says why: a browser's PeerConnection makes one
allocation per TURN URL and ICE restart, installs one permission per remote candidate address
(a few, rarely dozens), binds one channel per remote candidate pair, and keeps one or two
TURN-TCP/TLS connections, each sending its first Allocate within milliseconds.

Pure code: the clock is injected.
"""

from __future__ import annotations

import dataclasses
import resource
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from stunner_api.vocabulary import DEFAULT_MAX_ALLOCATIONS


@dataclass(frozen=True)
class Limits:
    # TCP/TLS: a connection has `stream_deadline` seconds to deliver its first complete
    # message, and each frame once begun; without an allocation it is closed after
    # `idle_timeout` seconds without a message (coturn's 60 s).
    stream_deadline: float = 10.0
    idle_timeout: float = 60.0
    # TCP/TLS connections from one source IP (a NAT with a hundred browsers fits) and in total
    # per process (further capped so that `fd_reserve` descriptors stay for relay sockets).
    connections_per_source: int = 256
    connections: int = 20000
    fd_reserve: int = 1024
    # DTLS handshakes in progress (cookie echoed, not finished), per source IP and in total.
    dtls_pending_per_source: int = 16
    dtls_pending: int = 1024
    # Bytes queued toward one TCP/TLS client before relayed packets to it are dropped (and
    # counted): ~1 s of a 4 Mbit/s video call.
    stream_high_water: int = 512 * 1024
    # TCP/TLS (issue 21): a relayed packet toward a client that cannot be handed to the kernel
    # within this many seconds of its arrival is dropped (counted as "latency"), and what the
    # kernel holds unsent is kept to about what the connection drains in that time: a real-time
    # packet that waits seconds is worse than a lost one (media tolerates ~150 ms one way). The
    # native path also drops what a client sent that waited longer than this in the socket's
    # receive queue. 0: no bound (only `stream_high_water`).
    stream_latency_bound: float = 0.1
    # STUN over UDP: bigger messages are dropped unparsed (a Send indication of a 1500-byte
    # datagram is ~1550 bytes); at most `max_attributes` attributes per message (a signed
    # ChannelBind has 6).
    max_udp_message: int = 4096
    max_attributes: int = 64
    # Per request, per allocation: XOR-PEER-ADDRESS attributes, permissions, channels.
    max_peers_per_request: int = 32
    max_permissions: int = 512
    max_channels: int = 512
    # RFC 6062 TCP allocations: TCP connections to peers per allocation, pending or bound (a
    # Connect past it gets 508, an inbound peer connection past it is closed), and how long a
    # Connect may take (447 after it) and a peer connection waits for its ConnectionBind
    # (closed after it): RFC 6062 §5.2/§5.3 say 30 s.
    max_peer_connections: int = 128
    peer_connection_timeout: float = 30.0
    # Allocations in the whole stunnerd (every process), and new allocations per second per
    # source IP (with a burst of twice that).
    max_allocations: int = DEFAULT_MAX_ALLOCATIONS
    allocation_rate: float = 50.0
    # Error answers (401, 400, ...) per second per client address and port (clients behind
    # one NAT share the IP), and in total per process; past them requests are dropped
    # unanswered (a 28-byte Allocate draws a 124-byte 401), and a UDP client over its limit
    # is not even parsed.
    error_rate: float = 100.0
    error_rate_total: float = 5000.0
    # STUN messages without MESSAGE-INTEGRITY from a client without an allocation, per second
    # per source IP (a burst of twice that), over UDP; past it they are dropped before they are
    # parsed (issue 20: one source's Allocate flood must not shut others out). A browser's
    # first Allocate and its srflx Binding requests are a handful per ICE gathering; 50/s with
    # a burst of 100 lets ~50 browsers behind one NAT start a call in the same second, and is
    # ~1/2000 of the flood that shut stunnerd out. Keyed by IP, not port: ports are free.
    unauthenticated_rate: float = 50.0
    # The same messages from every source together, per second in the whole stunnerd (a burst
    # of twice that), UDP (issue 28 #6: a flood from 200,000 spoofed sources passes every
    # per-source budget); each of the N processes (native engines) that read a UDP listener
    # keeps 1/N of it (`shared_by`: the kernel spreads a spoofed flood evenly over them), and a
    # DTLS listener the same share for its HelloVerifyRequests. Within it a stranger's unsigned
    # Allocate is answered with a stateless 401, in C on the native path (~2 us each, ~6 MB/s
    # of answers at the default, while any one source IP still gets at most
    # `unauthenticated_rate` of them); past it they are dropped unparsed.
    # A new client's first Allocate meets a flood above the budget with odds budget/flood per
    # try, so the default is above what this 2-CPU machine's flooder reaches (bench/README.md).
    unauthenticated_rate_total: float = 50000.0

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Limits:
        """From a worker's hello: unknown keys are ignored, missing ones keep the default."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def shared_by(self, readers: int) -> Limits:
        """The limits of one of `readers` processes (native engines) reading each UDP listener:
        `unauthenticated_rate_total` is the whole stunnerd's, each keeps an even share (red
        team finding C: per process, `-u N` multiplied it N times). What cli.py hands to the
        primary and to every UDP worker."""
        total = self.unauthenticated_rate_total
        if readers <= 1 or total <= 0:
            return self
        return dataclasses.replace(self, unauthenticated_rate_total=total / readers)

    def stream_connection_cap(self) -> int:
        """TCP/TLS connections one process may hold: `connections`, and never so many that
        fewer than `fd_reserve` descriptors (at most half the limit) stay for relay sockets."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.connections
        reserve = min(self.fd_reserve, soft // 2)
        return max(0, min(self.connections, soft - reserve))


class RateLimiter:
    """Token buckets: `rate` per second per key (bursts of twice that) and `total_rate` for
    all keys together. A rate of 0 means no limit. At most `max_keys` keys are tracked: when a
    new key finds the table full, the full buckets are forgotten (a new bucket starts full, so
    nothing is lost), and if every bucket is in use the table starts afresh (counted in
    `resets`): a spoofed flood cannot grow it. The native engine's strangers' buckets
    (relay.c, stranger_admitted) decide exactly the same."""

    def __init__(
        self,
        rate: float,
        total_rate: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 65536,
    ) -> None:
        self.rate = rate
        self.total_rate = total_rate
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: dict[Any, tuple[float, float]] = {}  # key -> (tokens, when)
        self._total = (2 * total_rate, clock())
        self.refused = 0
        self.resets = 0

    def allow(self, key: Any) -> bool:
        now = self._clock()
        if self.total_rate > 0:
            tokens, when = self._total
            tokens = min(2 * self.total_rate, tokens + (now - when) * self.total_rate)
            if tokens < 1:
                self._total = (tokens, now)
                self.refused += 1
                return False
            self._total = (tokens - 1, now)
        if self.rate <= 0:
            return True
        buckets = self._buckets
        entry = buckets.get(key)
        if entry is None:
            if len(buckets) >= self._max_keys:
                self._forget_full(now)
                buckets = self._buckets
            tokens = 2 * self.rate
        else:
            tokens = min(2 * self.rate, entry[0] + (now - entry[1]) * self.rate)
        if tokens < 1:
            buckets[key] = (tokens, now)
            self.refused += 1
            return False
        buckets[key] = (tokens - 1, now)
        return True

    def _forget_full(self, now: float) -> None:
        rate, full = self.rate, 2 * self.rate
        live = {k: v for k, v in self._buckets.items() if v[0] + (now - v[1]) * rate < full}
        if len(live) >= self._max_keys:
            live = {}
            self.resets += 1
        self._buckets = live

    def __len__(self) -> int:
        return len(self._buckets)

    def seconds_to_token(self, key: Any) -> float:
        """How long until `key` has a token again (0: it has one, or there is no limit)."""
        entry = self._buckets.get(key)
        if entry is None or self.rate <= 0:
            return 0.0
        tokens = entry[0] + (self._clock() - entry[1]) * self.rate
        return max(0.0, (1 - tokens) / self.rate)

    def exhausted(self, key: Any) -> bool:
        """Whether `key` has no token left now (nothing is consumed): a cheap test before
        any work is done for it."""
        entry = self._buckets.get(key)
        if entry is None:
            return False
        return entry[0] + (self._clock() - entry[1]) * self.rate < 1
