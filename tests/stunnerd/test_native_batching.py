"""The engine's syscalls per wakeup (issue 30): what every ready socket gave in one wakeup leaves
in one sendmmsg per outgoing socket.

At WebRTC's voice rates (many calls, 50 packets/s each) a wakeup finds one datagram on each of
several relay sockets; their packets all go to clients through the one listener socket, so
they are sent together, and a client's packets to its peer leave together even when other
clients' packets came between them. Real sockets on loopback; the engine's thread is started
only once everything is queued in the kernel, so its first wakeup sees all of it at once.
"""

from __future__ import annotations

import functools
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from stunner_api import stun
from stunnerd.transport import native

pytestmark = pytest.mark.skipif(
    not native.available(), reason=f"native relay: {native.unavailable_reason()}"
)

HOST = "127.0.0.1"
TIMEOUT = 5.0
CLUSTER = "ns/peers"
CHANNEL = 0x4000


def udp() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((HOST, 0))
    sock.settimeout(TIMEOUT)
    return sock


class Calls:
    """`count` clients of one listener's engine (not started), each with its relay socket, a
    permission, a channel to the one peer, and the peer admitted."""

    def __init__(self, count: int) -> None:
        self.listener = udp()
        self.server = self.listener.getsockname()
        self.peer = udp()
        self.engine = native.NativeRelay(self.listener)
        self.engine.decide(self.peer.getsockname(), CLUSTER)
        self.clients = [udp() for _ in range(count)]
        self.relays = [udp() for _ in range(count)]
        expires = time.monotonic() + 60
        for client, relay in zip(self.clients, self.relays, strict=True):
            handle = self.engine.add_allocation(client.getsockname(), relay, expires)
            self.engine.set_permission(handle, HOST, expires)
            self.engine.bind_channel(handle, CHANNEL, self.peer.getsockname(), expires)

    def calls(self) -> tuple[int, int, int]:
        counted = self.engine.counters()
        return counted.wakeups, counted.recv_calls, counted.send_calls

    def close(self) -> None:
        self.engine.close()
        for sock in (self.listener, self.peer, *self.clients, *self.relays):
            sock.close()


@pytest.fixture
def calls() -> Iterator[Calls]:
    rig = Calls(8)
    yield rig
    rig.close()


def test_peer_packets_of_every_ready_relay_socket_leave_in_one_sendmmsg(calls: Calls) -> None:
    for i, relay in enumerate(calls.relays):
        calls.peer.sendto(b"voice %d" % i, relay.getsockname())
    for relay in calls.relays:
        wait_for(functools.partial(queued_memory, relay), "a peer datagram queued")
    calls.engine.start()
    for i, client in enumerate(calls.clients):
        data, source = client.recvfrom(2048)
        assert source == calls.server
        assert data == stun.pack_channel_data(CHANNEL, b"voice %d" % i)
    # Counted once sent: a moment after the clients may have them.
    wait_for(lambda: calls.engine.counters().tx_packets == 8, "the packets counted")
    # One wakeup, one read per relay socket, and one sendmmsg on the listener socket for all
    # eight (before: one per relay socket).
    assert calls.calls() == (1, 8, 1)


def test_a_client_s_packets_leave_together_and_in_order_between_others(calls: Calls) -> None:
    first, second = calls.clients[:2]
    frames = [
        stun.pack_channel_data(CHANNEL, b"%s %d" % (who, n))
        for n in range(3)
        for who in (b"one", b"two")
    ]
    for i, frame in enumerate(frames):  # interleaved: first, second, first, second, ...
        (first, second)[i % 2].sendto(frame, calls.server)
    # All six in the listener socket's queue before the thread runs: its memory is six
    # times what one such datagram takes (measured on a socket of its own).
    with udp() as scratch:
        first.sendto(frames[0], scratch.getsockname())
        one = wait_for(lambda: queued_memory(scratch), "the scratch datagram")
    wait_for(lambda: queued_memory(calls.listener) == 6 * one, "six datagrams queued")
    calls.engine.start()
    got: dict[int, list[bytes]] = {0: [], 1: []}
    relays = {relay.getsockname(): i for i, relay in enumerate(calls.relays[:2])}
    for _ in range(6):
        data, source = calls.peer.recvfrom(2048)
        got[relays[source]].append(data)
    assert got == {0: [b"one %d" % n for n in range(3)], 1: [b"two %d" % n for n in range(3)]}
    wait_for(
        lambda: calls.engine.counters().clusters.get(CLUSTER, [0])[0] == 6, "the packets counted"
    )
    # One read of the six, then one sendmmsg per relay socket (before: one per run of a
    # client's packets, six here).
    assert calls.calls() == (1, 1, 2)


def queued_memory(sock: socket.socket) -> int:
    """The receive queue's memory of a UDP socket (rx_queue in /proc/net/udp), 0 if none."""
    port = sock.getsockname()[1]
    with open("/proc/net/udp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if int(fields[1].split(":")[1], 16) == port:
                return int(fields[4].split(":")[1], 16)
    return 0


def wait_for(read: Callable[[], int], what: str) -> int:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        value = read()
        if value:
            return value
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")
