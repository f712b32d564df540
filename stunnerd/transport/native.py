"""The native relay path of a TURN-UDP listener (issue 16) and of a TURN-TCP listener (issue 21):
a C engine carries the media, Python keeps the protocol.

`NativeRelay` wraps one `stunnerd._relay.Engine` (stunnerd/relaycore/: relay.c is the core,
stream.c its TURN-TCP streams, pymodule.c its bindings). The engine owns the packet path of one
TURN-UDP listener socket (or of one TURN-TCP listener's connections, below) and of its
allocations' relay sockets in its own thread, which never takes the GIL: epoll, batches of
`recvmmsg`/`sendmmsg`, and per packet a decision from tables Python fills.

- client -> peer: ChannelData on a bound channel, and Send indications of the plain shape
  (XOR-PEER-ADDRESS + DATA [+ FINGERPRINT, verified]), for a permitted peer; an empty payload
  goes out as a zero-length datagram, as coturn and pion/turn send it and the Python path does
  (issue 20 #14);
- peer -> client: ChannelData where a channel is bound, else a Data indication (fresh random
  transaction id, XOR-PEER-ADDRESS, DATA), for a peer with a live permission;
- the peer policy, both directions, from a verdict table: peer (IP, port) -> cluster id, or
  forbidden. On a miss the packet is handed up; Python's `Router` decides, `decide()` installs
  the verdict and `reinject()` sends the packet on. `clear_verdicts()` on every reconcile.
- a client datagram that cannot be a STUN message or ChannelData is dropped on its first bytes,
  before any copy, and counted as "invalid" (issue 15): shorter than a header, neither 00 nor 01
  as its first two bits, ChannelData longer than the datagram or from a client without an
  allocation, STUN without the magic cookie, with a length that is no multiple of 4, does not
  match the datagram, or is above `max_message` (`Limits.max_udp_message`). Python's path drops
  the same datagrams unanswered (`TurnServer.handle`, `stun.parse_message`).
- everything else (every STUN request, any other message shape, an expired channel) is handed
  up untouched through one of three bounded queues: what comes from a peer or from a client
  with an allocation in the engine goes to a priority queue, the rest (strangers) to another
  (and a third for strangers' requests whose nonce verifies, below), and
  `drain()` empties the priority queue first, so a flood of strangers' requests cannot starve
  established clients' Refresh, CreatePermission and ChannelBind. `fileno()` is readable while
  either holds packets (an eventfd for `loop.add_reader`), `drain()` returns them in batches.
  A full queue drops (counted as "queue_full"), so a flood costs the event loop a bounded
  amount of work. A stranger whose error answers Python rate-limits (--error-rate) is muted
  (`mute`) until its budget refills: its STUN is then dropped in the engine ("rate_limited"),
  as Python would drop it unparsed.
- strangers' unauthenticated STUN (issue 20): a STUN message without MESSAGE-INTEGRITY from a
  client without an allocation spends a token of its source IP's bucket (`stranger_rate` per
  second, a burst of twice that; the port is not part of the key: ports are free to vary)
  before it is handed up; past the budget it is dropped in the engine and counted as
  "unauthenticated_rate". The engine finds MESSAGE-INTEGRITY by walking the attribute headers
  (`relay_has_integrity`), without verifying it: a forged one only buys the flooder a trip to
  Python, whose error budget (--error-rate, the mute above) and the per-source share of the
  strangers' queue bound it. At most `stranger_ips` source IPs are tracked: when the table is
  full, full buckets are forgotten (nothing is lost), and if every one is in use the table
  starts afresh (`bucket_resets`). One source IP holds at most `per_source` places in the
  strangers' queue (dropped as "queue_full" past it), so one flooder cannot fill it. The
  pure-Python UDP path applies the same rule (`transports.UdpListenerProtocol`).
- strangers' unsigned STUN from everywhere (issue 28, relaycore/stateless.c): past its IP's
  bucket it spends a token of the engine's own (`unsigned_rate`; "unauthenticated_total" past
  it: a spoofed flood passes every per-source budget), and while the engine is behind (its
  listener socket full at `shed_after` reads of 32 in a row, until one empties it) it is
  dropped first ("shed"),
  as on the Python path: answers the CPU cannot afford do not delay established clients'
  packets queued behind them. With `answer_unsigned`, an unsigned
  Allocate is then answered in the engine with a 401 whose NONCE is `auth.NonceManager`'s, byte
  for byte (the same secret, lifetime and binding), and never handed up (`answered`); a
  stranger's request whose NONCE verifies goes up through a third queue, drained after the
  priority queue and before the strangers': a flood of unsigned or forged requests cannot
  starve a new client's signed Allocate. The pure-Python UDP path answers the same 401 within
  the same budgets (`stateless`).
- expiry is by monotonic timestamps (`time.monotonic()`), checked per packet: no timer per entry.
- counters (packets and bytes per listener and per cluster, both directions; drops by cause;
  packets handed up) are read under the engine's lock without stopping its thread.

TURN-TCP (`NativeRelay(None)`, an engine without a UDP listener; stream.c): Python accepts
each connection (admission, caps) and hands it over (`add_stream`: the engine keeps a
duplicate). The engine's thread reads it and frames it as `stun.stream_frame_length` does (STUN
by the header's length, ChannelData by its length padded to 4); it relays ChannelData and plain
Send indications of a client with an allocation (allocations are added with their `stream`, and
keyed by the connection's remote address as on the Python path), queues its peers' datagrams
toward it (ChannelData padded, or Data indications), and hands every other frame up whole
(SOURCE_STREAM, with the stream's handle); when the queue to Python is full, the stream is not
read until it drains (its TCP window pushes back) instead of dropping a request no TCP client
would resend. Python's answers go through the same queue (`stream_send`), so their order with
relayed frames is kept. A framing error, a frame longer
than the buffer (`transports.MAX_STREAM_BUFFER`), EOF or an error close the connection; every
close (also `close_stream`) is handed up as SOURCE_CLOSED after every frame handed up before it,
never dropped. `streams()` reports each stream's framing progress for Python's deadlines.
Bounded delay (`stream_limits`): each queued frame carries its arrival time; a relayed one not
yet begun that is older than the bound when the socket can take it is dropped ("latency"; one
partly written is always finished); TCP_NOTSENT_LOWAT keeps what the kernel holds unsent small;
the high-water mark bounds the queue ("backpressure"). Reading side: SO_TIMESTAMPNS gives the
arrival of the data read; media (ChannelData, Send indications) from a read that waited longer
than the bound is dropped ("latency"); STUN requests never are.

Safety: the C side parses only the ChannelData header, the plain Send indication, (for a
stranger's STUN) the attribute headers in search of MESSAGE-INTEGRITY, and over TCP the frame
headers, checks every length before reading it, and is fuzzed under ASan/UBSan by tests/stunnerd/
test_native_fuzz.py (relaycore/fuzz.c drives relay_process with random and mutated datagrams,
and the stream framing with random and mutated byte streams split at random boundaries).

How stunnerd uses it (`stunnerd/native_udp.py`, `NativeUdpTransport`): every TURN-UDP listener
(the primary's and each UDP worker's socket: one engine per process) runs on an engine when
`available()`; allocations are added with their relay socket (the engine keeps a duplicate,
Python closes its own), permissions and channels are mirrored through the allocation's
`AllocationMirror`, handed-up packets go through the Python path, verdicts come from the
router and are cleared whenever it drops its caches, and the engine's counters are added to
Python's once (`Listener.stats`, `DataplaneCore.cluster_counters`). Every TURN-TCP listener
runs on an engine of its own (`stunnerd/native_tcp.py`, `NativeTcpTransport`). TURN-TLS and
-DTLS stay in Python. `STUNNER_NATIVE=0` (or an install without a compiler) keeps the
pure-Python path.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..turn.counters import ClusterCounters, ListenerCounters

try:
    from .. import _relay
except ImportError as exc:  # built without a compiler, or not on Linux
    _relay = None  # type: ignore[assignment]
    _IMPORT_ERROR: str | None = str(exc)
else:
    _IMPORT_ERROR = None

SOURCE_CLIENT = 0  # from a client, on the listener socket
SOURCE_PEER = 1  # from a peer, on an allocation's relay socket
SOURCE_STREAM = 2  # one whole frame of a TURN-TCP stream (handle: the stream's)
SOURCE_CLOSED = 3  # a TURN-TCP stream closed (handle: the stream's; data: why)
RELAYED, DROPPED, UP = 0, 1, 2  # what reinject() did
FORBIDDEN = -1  # the verdict of a peer no routed cluster admits
DRAIN_BATCH = 256
MAX_CLUSTERS = 4096
MAX_ANSWER_REALM = 128  # bytes: the engine answers 401s with a realm up to this (relay.h)


def unavailable_reason() -> str | None:
    """Why the native path is off (STUNNER_NATIVE=0, or the extension did not build), or None."""
    if os.environ.get("STUNNER_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return "disabled by STUNNER_NATIVE=0"
    if _relay is None:
        return f"the extension stunnerd._relay is not built ({_IMPORT_ERROR})"
    return None


def available() -> bool:
    return unavailable_reason() is None


def stream_framing(data: bytes) -> tuple[int, str | None]:
    """How the engine frames a TCP stream that begins with `data`: the first frame's length (0
    until its header is there, -1 for garbage) and why it is garbage (None when it is not):
    stunner_api.stun.stream_frame_length's answer and words (tests/stunnerd's differential test)."""
    assert _relay is not None, unavailable_reason()
    return _relay.stream_framing(data)


class HandedUp(NamedTuple):
    """A packet the engine did not own, exactly as received."""

    source: int  # SOURCE_CLIENT, SOURCE_PEER, SOURCE_STREAM or SOURCE_CLOSED
    handle: int  # the allocation of a peer packet, the stream of a frame; 0 for a client packet
    address: tuple[Any, ...]  # its sender, as the socket module reports it
    data: bytes


class ClusterIds:
    """Cluster names <-> the small integers the engine counts by (stable for the process)."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._names: list[str] = []

    def id_of(self, name: str) -> int:
        found = self._ids.get(name)
        if found is not None:
            return found
        if len(self._names) >= MAX_CLUSTERS:
            raise ValueError(f"more than {MAX_CLUSTERS} cluster names")
        self._ids[name] = len(self._names)
        self._names.append(name)
        return self._ids[name]

    def name_of(self, cluster_id: int) -> str:
        return self._names[cluster_id]


@dataclass
class NativeCounters:
    """What the engine consumed: client-side packets, per-cluster peer-side payloads, drops."""

    rx_packets: int = 0
    rx_bytes: int = 0
    tx_packets: int = 0
    tx_bytes: int = 0
    # cluster name -> [tx packets, tx bytes, rx packets, rx bytes] (ServerContext's layout)
    clusters: dict[str, list[int]] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=dict)
    handed_up: int = 0
    stranger_ips: int = 0  # source IPs whose unauthenticated-STUN bucket is tracked
    bucket_resets: int = 0  # times that table was full of live buckets and started afresh
    answered: int = 0  # strangers' unsigned Allocates the engine answered with 401 itself
    # the engine thread's syscalls (bench/README.md: packets per wakeup and per call): epoll
    # returns with events, recvmmsg calls, sendmmsg calls
    wakeups: int = 0
    recv_calls: int = 0
    send_calls: int = 0

    def listener(self) -> ListenerCounters:
        """As the listener's counters (Python's path counts the same events in these fields)."""
        drops = self.drops
        return ListenerCounters(
            rx_packets=self.rx_packets,
            rx_bytes=self.rx_bytes,
            tx_packets=self.tx_packets,
            tx_bytes=self.tx_bytes,
            dropped=sum(n for cause, n in drops.items() if cause not in _NOT_INVALID),
            forbidden_dropped=drops.get("forbidden", 0),
            rate_limited=sum(drops.get(cause, 0) for cause in _RATE_LIMITS),
            latency_dropped=drops.get("latency", 0),
            backpressure_dropped=drops.get("backpressure", 0),
            bandwidth_dropped=drops.get("bandwidth", 0),
        )

    def cluster_counters(self) -> dict[str, ClusterCounters]:
        return {name: ClusterCounters(*values) for name, values in self.clusters.items()}

    @classmethod
    def total(cls, each: list[NativeCounters]) -> NativeCounters:
        """The sum of several engines' counters (a TURN-TCP listener runs one per CPU)."""
        if len(each) == 1:
            return each[0]
        total = cls()
        for counted in each:
            for name in ("rx_packets", "rx_bytes", "tx_packets", "tx_bytes", "handed_up",
                         "stranger_ips", "bucket_resets", "answered", "wakeups",
                         "recv_calls", "send_calls"):  # fmt: skip
                setattr(total, name, getattr(total, name) + getattr(counted, name))
            for cluster, values in counted.clusters.items():
                mine = total.clusters.setdefault(cluster, [0] * len(values))
                total.clusters[cluster] = [a + b for a, b in zip(mine, values, strict=True)]
            for cause, n in counted.drops.items():
                total.drops[cause] = total.drops.get(cause, 0) + n
        return total


# The engine's drop causes counted as rate_limited (the metric's reason="rate_limit"); with the
# stream ones, forbidden and bandwidth, those not counted as dropped (reason="invalid").
_RATE_LIMITS = ("rate_limited", "unauthenticated_rate", "unauthenticated_total", "shed")
_NOT_INVALID = (*_RATE_LIMITS, "latency", "backpressure", "forbidden", "bandwidth")


class StreamProgress(NamedTuple):
    """Where a TURN-TCP stream's framing is, for the deadlines Python keeps (times are
    `time.monotonic()`; frame_started 0: no frame begun)."""

    handle: int
    opened: float
    first_done: bool  # a whole frame came
    buffered: int  # bytes of a frame begun
    frame_started: float
    last_frame: float
    queued: int  # bytes queued toward the client, not yet written


class NativeRelay:
    """The native engine of one TURN-UDP listener socket, or (`listener` None) of the streams of
    one TURN-TCP listener (see the module docstring)."""

    def __init__(
        self,
        listener: socket.socket | None,
        clusters: ClusterIds | None = None,
        queue_limit: int = 4096,
        queue_bytes: int = 8 << 20,
        max_message: int = 4096,
        stranger_rate: float = 0.0,
        stranger_ips: int = 65536,
        per_source: int = 0,
        unsigned_rate: float = 0.0,
        max_attributes: int = 64,
        shed_after: int = 32,
    ) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"the native relay is not available: {reason}")
        assert _relay is not None
        self.clusters = clusters or ClusterIds()
        self._engine = _relay.Engine(
            listener.fileno() if listener is not None else -1,
            queue_limit,
            queue_bytes,
            max_message,
            stranger_rate=stranger_rate,
            stranger_ips=stranger_ips,
            per_source=per_source,
            unsigned_rate=unsigned_rate,
            max_attributes=max_attributes,
            shed_after=shed_after,
        )
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._engine.start()

    def attach(
        self, loop: asyncio.AbstractEventLoop, on_packets: Callable[[list[HandedUp]], None]
    ) -> None:
        """Call `on_packets` from `loop` with every batch of handed-up packets."""

        def readable() -> None:
            batch = self.drain()
            if batch:
                on_packets(batch)

        loop.add_reader(self._engine.fileno(), readable)
        self._loop = loop

    def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._engine.fileno())
            self._loop = None
        self._engine.close()

    def fileno(self) -> int:
        return self._engine.fileno()

    def drain(self, limit: int = DRAIN_BATCH) -> list[HandedUp]:
        return [HandedUp(*item) for item in self._engine.drain(limit)]

    def thread_cpu(self) -> float:
        """CPU seconds the relay thread has used."""
        return self._engine.thread_cpu()

    # --- state Python decides ---------------------------------------------------------------

    def add_allocation(
        self, client: tuple[Any, ...], relay: socket.socket, expires_at: float, stream: int = 0
    ) -> int:
        """Mirror a new allocation; the engine reads (a duplicate of) `relay` from now on.
        `stream`: the TURN-TCP stream of its client (its peers' packets go there)."""
        return self._engine.add_allocation(client, relay.fileno(), expires_at, stream)

    # --- TURN-TCP streams -------------------------------------------------------------------

    def stream_limits(self, latency_bound: float, high_water: int, buffer: int) -> None:
        """The bounds of every stream: the delay of a relayed frame (0: none), the bytes queued
        toward one client, the longest frame (a longer one closes its connection)."""
        self._engine.stream_limits(latency_bound, high_water, buffer)

    def add_stream(self, connection: socket.socket) -> int:
        """Take over (a duplicate of) an accepted connection; the caller closes its own."""
        return self._engine.add_stream(connection.fileno())

    def stream_send(self, handle: int, data: bytes) -> bool:
        """Queue `data` to the stream's client, in order with relayed frames; False when it is
        closed or its queue is past the high-water mark (counted as "backpressure")."""
        return self._engine.stream_send(handle, data)

    def close_stream(self, handle: int) -> bool:
        """Close a stream (what is queued is tried once more); a SOURCE_CLOSED packet follows.
        False if it is closed already."""
        return self._engine.close_stream(handle)

    def streams(self) -> list[StreamProgress]:
        return [
            StreamProgress(h, o, bool(f), b, s, last, q)
            for h, o, f, b, s, last, q in self._engine.streams()
        ]

    def refresh_allocation(self, handle: int, expires_at: float) -> None:
        self._engine.refresh_allocation(handle, expires_at)

    def allocation_traffic(self, handle: int) -> tuple[int, int, int, int]:
        """What the engine relayed for one allocation: rx packets, rx bytes (from the client),
        tx packets, tx bytes (to it). KeyError/ValueError once it is gone."""
        return self._engine.allocation_traffic(handle)

    def set_bandwidth(self, handle: int, rate: float, burst: float) -> None:
        """Cap an allocation at `rate` bytes per second each way, `burst` bytes (0: no cap)."""
        self._engine.set_bandwidth(handle, rate, burst)

    def remove_allocation(self, handle: int) -> None:
        self._engine.remove_allocation(handle)

    def set_permission(self, handle: int, peer_ip: str, expires_at: float) -> None:
        self._engine.set_permission(handle, peer_ip, expires_at)

    def remove_permission(self, handle: int, peer_ip: str) -> None:
        self._engine.remove_permission(handle, peer_ip)

    def bind_channel(
        self, handle: int, number: int, peer: tuple[str, int], expires_at: float
    ) -> None:
        self._engine.bind_channel(handle, number, peer, expires_at)

    def remove_channel(self, handle: int, number: int) -> None:
        self._engine.remove_channel(handle, number)

    def decide(self, peer: tuple[str, int], cluster: str | None, own: bool = False) -> None:
        """Install the router's verdict for `peer`: admitted by `cluster`, or None: forbidden.
        `own`: the peer's IP is stunnerd's, so it stays admitted only while its port is not a
        relay port (`watch_relay_ports`), checked per packet."""
        verdict = FORBIDDEN if cluster is None else self.clusters.id_of(cluster)
        if own and _relay is not None and verdict >= 0:
            verdict |= _relay.VERDICT_OWN
        self._engine.set_verdict(peer, verdict)

    def watch_relay_ports(self, relay_ports: Any) -> None:
        """The relay-port map (`router.relay_port_map`: a byte per port, shared by every
        process), before `start`."""
        self._engine.watch_relay_ports(relay_ports)

    def clear_verdicts(self) -> None:
        self._engine.clear_verdicts()

    def answer_unsigned(self, secret: bytes, lifetime: float, name: str, realm: str) -> None:
        """Answer strangers' unsigned Allocates in the engine with a stateless 401 (issue 28):
        REALM `realm` and a nonce of `auth.NonceManager`'s (its `secret` and `lifetime`) bound
        to listener `name` and the client's address; and hand a stranger's request whose
        NONCE verifies up through the signed queue. ValueError for a realm above 128 bytes."""
        self._engine.answering(True, secret, lifetime, name.encode(), realm.encode())

    def stop_answering(self) -> None:
        """Hand strangers' unsigned Allocates up to Python again (STUN-only mode)."""
        self._engine.answering(False)

    def mute(self, client: tuple[Any, ...], until: float) -> None:
        """Drop the STUN messages of `client`, a stranger (no allocation in the engine), until
        `until` (`time.monotonic()`), counted as "rate_limited": its error-answer budget is
        spent, so Python would drop them unparsed (`TurnServer.handle`)."""
        self._engine.mute(client, until)

    def reinject(self, packet: HandedUp) -> int:
        """Decide a handed-up packet again (after `decide`): RELAYED, DROPPED, or UP when the
        engine still does not own it (the caller handles it in Python)."""
        return self._engine.inject(packet.source, packet.handle, packet.address, packet.data)

    def send_to_peer(
        self, handle: int, peer: tuple[str, int], payload: bytes, datagram_len: int
    ) -> int:
        """Relay a payload Python parsed from a client's datagram of `datagram_len` bytes (a Send
        indication of another shape) on the allocation's relay socket, decided and counted as
        the engine's own packets: RELAYED, DROPPED, or UP (no verdict for the peer yet)."""
        return self._engine.send_to_peer(handle, peer, payload, datagram_len)

    def send(self, handle: int, peer: tuple[str, int], payload: bytes) -> bool:
        """Send a payload Python decided and counted itself (the Python relay path of a native
        allocation) on the allocation's relay socket; False when the datagram was lost."""
        return self._engine.send(handle, peer, payload)

    # --- counters ---------------------------------------------------------------------------

    def counters(self) -> NativeCounters:
        raw = self._engine.counters()
        rx_packets, rx_bytes, tx_packets, tx_bytes = raw["listener"]
        return NativeCounters(
            rx_packets=rx_packets,
            rx_bytes=rx_bytes,
            tx_packets=tx_packets,
            tx_bytes=tx_bytes,
            clusters={self.clusters.name_of(i): list(v) for i, v in raw["clusters"].items()},
            drops=dict(raw["drops"]),
            handed_up=raw["handed_up"],
            stranger_ips=raw["stranger_ips"],
            bucket_resets=raw["bucket_resets"],
            answered=raw["answered"],
            wakeups=raw["wakeups"],
            recv_calls=raw["recv_calls"],
            send_calls=raw["send_calls"],
        )
