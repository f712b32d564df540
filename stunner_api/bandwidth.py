"""Bandwidth caps (issue 29; coturn's `max-bps`): the bounds of a GatewayConfig's
`allocationBandwidthLimit` (bits per second, ours) and the token bucket every relay path applies
to an allocation, each direction on its own: stunnerd's Python path with `TokenBucket`, its
native engine with the same rule in C (relaycore/relay.c, `spend`), and the kernel offload not
at all: it leaves capped allocations to the engine (stunnerd.transport.offloaded).

The rule: a bucket holds at most `burst_bytes` tokens and refills at the cap's bytes per second;
a packet passes while the bucket is not empty and takes its size out of it (so the bucket may
go below zero: a packet larger than the burst still passes, and what passes over a long window
is the cap plus at most one packet). A packet meeting an empty bucket is dropped, counted as
`stunner_listener_dropped_packets{reason="bandwidth"}`. A byte stream (an RFC 6062 TCP
allocation's peer connection) is paced instead (`TokenBucket.pace`): never dropped, its reader
waits until the bucket refills.

Pure code: the clock is the caller's (seconds, monotonic).
"""

from __future__ import annotations

# The smallest cap (bits per second) a GatewayConfig may ask for: one narrowband audio stream
# (Opus at 6 kbit/s plus RTP/UDP/IP headers). 0 or unset: no cap.
MIN_BANDWIDTH_LIMIT = 8_000
# The largest: 100 Gbit/s, beyond any NIC a pod has; past it the cap is a typo.
MAX_BANDWIDTH_LIMIT = 100_000_000_000
# The burst a bucket holds: this many seconds of the cap (a video keyframe's packets pass).
BURST_SECONDS = 0.2


def bucket_rate(bits_per_second: int) -> tuple[float, float]:
    """(bytes per second, burst bytes) of a cap in bits per second."""
    rate = bits_per_second / 8.0
    return rate, rate * BURST_SECONDS


class TokenBucket:
    """One direction of one allocation's cap; `admit(size, now)` says whether a packet passes."""

    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, bits_per_second: int, now: float) -> None:
        self.rate, self.burst = bucket_rate(bits_per_second)
        self.tokens = self.burst  # a new allocation starts with a full bucket
        self.stamp = now

    def admit(self, size: int, now: float) -> bool:
        """Refill for the time since the last packet; pass (and spend `size`) unless empty."""
        if self.refilled(now) <= 0:
            return False
        self.tokens -= size
        return True

    def pace(self, size: int, now: float) -> float:
        """A byte stream's `size` bytes, which are never dropped (RFC 6062 TCP allocations):
        spend them (the bucket may go below zero) and return the seconds until the bucket is not
        empty again, 0.0 while it is not: its reader stops reading that long, and TCP's flow
        control holds the sender. Over a long window what passes is the cap, as with `admit`."""
        self.refilled(now)
        self.tokens -= size
        return 0.0 if self.tokens > 0 else -self.tokens / self.rate

    def refilled(self, now: float) -> float:
        """The tokens held at `now`, the time since the last refill added (at most the burst)."""
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
        return self.tokens


class AllocationCap:
    """An allocation's two buckets: from its client to its peers, and from its peers to it."""

    __slots__ = ("bits_per_second", "to_peers", "to_client")

    def __init__(self, bits_per_second: int, now: float) -> None:
        self.bits_per_second = bits_per_second
        self.to_peers = TokenBucket(bits_per_second, now)
        self.to_client = TokenBucket(bits_per_second, now)
