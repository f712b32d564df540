"""Named counters of the dataplane, and the one way they are added up.

A listener counts client-side traffic (`ListenerCounters`), a cluster counts traffic to and from
its peers (`ClusterCounters`). Each process counts its own; `/status` and the metrics add the
primary's and every UDP worker's reports with `merge`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self, TypeVar


@dataclass(slots=True)
class Counters:
    """Integer fields, added field by field."""

    def add(self, other: Self) -> None:
        for name in self.field_names():
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def to_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.field_names()}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Self:
        """From a worker's report: missing fields are 0, unknown ones are ignored."""
        return cls(**{name: int(values.get(name, 0)) for name in cls.field_names()})


@dataclass(slots=True)
class ListenerCounters(Counters):
    """Per listener: rx/tx are client-side packets and bytes (metrics and /status)."""

    rx_packets: int = 0
    rx_bytes: int = 0
    tx_packets: int = 0
    tx_bytes: int = 0
    dropped: int = 0
    forbidden_dropped: int = 0  # to or from a peer no route admits (now: a route changed)
    allocations_total: int = 0
    backpressure_dropped: int = 0  # sent to a stream client past its output high-water mark
    latency_dropped: int = 0  # relayed over a stream later than --stream-latency-bound
    framing_dropped: int = 0  # TCP/TLS streams closed on data that is not a frame (stun.py)
    rate_limited: int = 0  # error answers not sent past --error-rate
    stun_only: int = 0  # TURN messages a STUN-only listener refused (403, or dropped unanswered)
    bandwidth_dropped: int = (
        0  # relayed past its allocation's cap (auth.allocation_bandwidth_limit)
    )
    # Allocates refused, by reason (ALLOCATION_REFUSALS below): over admin.user_quota (486); 508
    # past --max-allocations, while draining, or past the source's --allocation-rate.
    refused_quota: int = 0
    refused_full: int = 0
    refused_draining: int = 0
    refused_rate: int = 0
    refused_revoked: int = 0  # a user id in auth.revoked_users (403; issue 29)
    # Of rx/tx above, what the kernel offload relayed (stunnerd.transport.offloaded; issue 30).
    offloaded_rx_packets: int = 0
    offloaded_rx_bytes: int = 0
    offloaded_tx_packets: int = 0
    offloaded_tx_bytes: int = 0

    def count_refusal(self, reason: str) -> None:
        """One more Allocate refused for `reason` (one of ALLOCATION_REFUSALS)."""
        field_name = f"refused_{reason}"
        setattr(self, field_name, getattr(self, field_name) + 1)

    def drops(self) -> dict[str, int]:
        """Packets dropped so far, by reason (every one of DROP_REASONS)."""
        return {reason: getattr(self, field) for reason, field in DROP_REASONS.items()}

    def refusals(self) -> dict[str, int]:
        """Allocates refused so far, by reason (every one of ALLOCATION_REFUSALS)."""
        return {reason: getattr(self, f"refused_{reason}") for reason in ALLOCATION_REFUSALS}


@dataclass(slots=True)
class ClusterCounters(Counters):
    """Per cluster: tx is towards its peers, rx is from them."""

    tx_packets: int = 0
    tx_bytes: int = 0
    rx_packets: int = 0
    rx_bytes: int = 0


# Why a packet was dropped, as the metric stunner_listener_dropped_packets labels it, and the
# ListenerCounters field that counts it.
DROP_REASONS = {
    "backpressure": "backpressure_dropped",
    "latency": "latency_dropped",
    "framing": "framing_dropped",
    "rate_limit": "rate_limited",
    "invalid": "dropped",
    "forbidden": "forbidden_dropped",
    "stun_only": "stun_only",
    "bandwidth": "bandwidth_dropped",  # past auth.allocation_bandwidth_limit (issue 29)
}

# Why an Allocate was refused, as ListenerCounters counts it (refused_<reason>) and the metric
# stunner_listener_allocations_refused labels it; the first three are stunnerd.turn.ledger's.
ALLOCATION_REFUSALS = ("quota", "full", "draining", "rate", "revoked")

C = TypeVar("C", bound=Counters)


def merge(into: dict[str, C], more: Mapping[str, C], new: type[C]) -> None:
    """Add every entry of `more` into `into` (a missing entry starts at zero)."""
    for name, counters in more.items():
        total = into.get(name)
        if total is None:
            into[name] = total = new()
        total.add(counters)
