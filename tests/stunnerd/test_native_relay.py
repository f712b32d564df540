"""The native relay engine (stunnerd.transport.native, stunnerd/relaycore/) on loopback.

A client socket sends through the engine's listener socket to a peer socket and back; the test
plays the TURN server's part by mirroring allocations, permissions, channels and verdicts.
"""

from __future__ import annotations

import asyncio
import select
import shutil
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from stunner_api import stun
from stunner_api.stun import Class, Message, Method
from stunnerd.transport import native
from stunnerd.turn.limits import Limits

pytestmark = pytest.mark.skipif(
    not native.available(), reason=f"native relay: {native.unavailable_reason()}"
)

HOST = "127.0.0.1"
CLUSTER = "testns/backend"
CHANNEL = 0x4001
TIMEOUT = 2.0
QUIET = 0.15  # how long "nothing arrives" is watched for


def test_the_extension_is_built_where_a_compiler_is(monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler on this machine")
    assert native._relay is not None, native.unavailable_reason()
    monkeypatch.setenv("STUNNER_NATIVE", "0")
    assert not native.available()
    assert native.unavailable_reason() == "disabled by STUNNER_NATIVE=0"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        with pytest.raises(RuntimeError, match="STUNNER_NATIVE=0"):
            native.NativeRelay(sock)


def udp(family: socket.AddressFamily = socket.AF_INET, host: str = HOST) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.bind((host, 0))
    sock.settimeout(TIMEOUT)
    return sock


class Rig:
    """A dual-stack listener socket with its engine, one client, one relay socket, one peer."""

    def __init__(
        self, queue_limit: int = 4096, relay_ports: bytearray | None = None, **engine: Any
    ) -> None:
        self.listener = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        self.listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        self.listener.bind(("::", 0))
        self.server = (HOST, self.listener.getsockname()[1])
        self.client = udp()
        self.peer = udp()
        self.relay = udp()
        self.relay_address = self.relay.getsockname()
        self.engine = native.NativeRelay(self.listener, queue_limit=queue_limit, **engine)
        if relay_ports is not None:
            self.engine.watch_relay_ports(relay_ports)
        self.engine.start()
        self.handle = self.engine.add_allocation(
            self.client.getsockname(), self.relay, time.monotonic() + 60
        )

    @property
    def peer_address(self) -> tuple[str, int]:
        address: tuple[str, int] = self.peer.getsockname()
        return address

    def permit(self, lifetime: float = 60.0) -> None:
        self.engine.set_permission(self.handle, HOST, time.monotonic() + lifetime)

    def bind(self, lifetime: float = 60.0) -> None:
        self.permit(lifetime)
        self.engine.bind_channel(self.handle, CHANNEL, self.peer_address, time.monotonic() + 60)

    def admit(self) -> None:
        self.engine.decide(self.peer_address, CLUSTER)

    def send(self, data: bytes) -> None:
        self.client.sendto(data, self.server)

    def echo(self) -> bytes:
        """What the peer got (it must come from the relay address); sent back to the relay."""
        data, source = self.peer.recvfrom(65536)
        assert source == self.relay_address
        self.peer.sendto(data, source)
        return data

    def received(self) -> bytes:
        data, source = self.client.recvfrom(65536)
        assert source == self.server
        return data

    def handed_up(self, count: int = 1) -> list[native.HandedUp]:
        packets: list[native.HandedUp] = []
        deadline = time.monotonic() + TIMEOUT
        while len(packets) < count and time.monotonic() < deadline:
            select.select([self.engine.fileno()], [], [], 0.05)
            packets += self.engine.drain()
        assert len(packets) == count, packets
        return packets

    def close(self) -> None:
        self.engine.close()
        for sock in (self.listener, self.client, self.peer, self.relay):
            sock.close()


@pytest.fixture
def rig() -> Iterator[Rig]:
    rig = Rig()
    yield rig
    rig.close()


def nothing_arrives(sock: socket.socket) -> None:
    sock.settimeout(QUIET)
    with pytest.raises(TimeoutError):
        sock.recvfrom(65536)
    sock.settimeout(TIMEOUT)


def send_indication(peer: tuple[str, int], payload: bytes, fingerprint: bool = False) -> bytes:
    message = Message(Method.SEND, Class.INDICATION)
    message.attributes["XOR-PEER-ADDRESS"] = peer
    message.attributes["DATA"] = payload
    return message.encode(fingerprint=fingerprint)


def drops(rig: Rig, **expected: int) -> None:
    """Wait until the drop counters read `expected` (the others 0): packets are dropped by
    the engine's thread, maybe a moment after the test stopped watching for them."""
    want = {cause: expected.get(cause, 0) for cause in rig.engine.counters().drops}
    wait_for(lambda: rig.engine.counters().drops == want, f"drops {expected}")


def wait_for(condition: object, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


# --- relaying ---------------------------------------------------------------------------------


def test_channel_data_goes_to_the_peer_and_comes_back(rig: Rig) -> None:
    rig.bind()
    rig.admit()
    for payload in (b"", b"x", b"hello peer", bytes(range(256)) * 5):
        rig.send(stun.pack_channel_data(CHANNEL, payload))
        assert rig.echo() == payload
        assert rig.received() == stun.pack_channel_data(CHANNEL, payload)


def test_udp_padding_after_channel_data_is_not_relayed(rig: Rig) -> None:
    rig.bind()
    rig.admit()
    rig.send(stun.pack_channel_data(CHANNEL, b"abcde", pad=True))
    assert rig.echo() == b"abcde"


@pytest.mark.parametrize("fingerprint", [False, True], ids=["plain", "fingerprinted"])
def test_send_indication_out_data_indication_back(rig: Rig, fingerprint: bool) -> None:
    rig.permit()
    rig.admit()
    ids = set()
    for payload in (b"abc", b"four", b"\x00" * 1000):
        rig.send(send_indication(rig.peer_address, payload, fingerprint))
        assert rig.echo() == payload
        back = stun.parse_message(rig.received())
        assert (back.method, back.message_class) == (Method.DATA, Class.INDICATION)
        assert back.attributes == {"XOR-PEER-ADDRESS": rig.peer_address, "DATA": payload}
        ids.add(back.transaction_id)
    assert len(ids) == 3  # a fresh transaction id each time


def test_a_bound_channel_answers_with_channel_data_even_to_send_indications(rig: Rig) -> None:
    rig.bind()
    rig.admit()
    rig.send(send_indication(rig.peer_address, b"via send"))
    assert rig.echo() == b"via send"
    assert rig.received() == stun.pack_channel_data(CHANNEL, b"via send")


def test_an_ipv6_peer_gets_data_indications_with_its_address(rig: Rig) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        peer = udp(socket.AF_INET6, "::1")
        relay = udp(socket.AF_INET6, "::1")
    except OSError:
        pytest.skip("no IPv6 loopback")
    client = udp()
    try:
        handle = rig.engine.add_allocation(client.getsockname(), relay, time.monotonic() + 60)
        rig.engine.set_permission(handle, "::1", time.monotonic() + 60)
        peer_address = peer.getsockname()[:2]
        rig.engine.decide(peer_address, CLUSTER)
        client.sendto(send_indication(peer_address, b"six"), rig.server)
        data, source = peer.recvfrom(100)
        assert data == b"six" and source[:2] == relay.getsockname()[:2]
        peer.sendto(b"back", source)
        back = stun.parse_message(client.recvfrom(200)[0])
        assert back.attributes == {"XOR-PEER-ADDRESS": peer_address, "DATA": b"back"}
    finally:
        for sock in (peer, relay, client):
            sock.close()


# --- permissions, channels, allocations --------------------------------------------------------


def test_permission_expiry_stops_packets_both_ways(rig: Rig) -> None:
    rig.engine.set_permission(rig.handle, HOST, time.monotonic() + 0.3)
    rig.engine.bind_channel(rig.handle, CHANNEL, rig.peer_address, time.monotonic() + 60)
    rig.admit()
    rig.send(stun.pack_channel_data(CHANNEL, b"in time"))
    assert rig.echo() == b"in time"
    assert rig.received() == stun.pack_channel_data(CHANNEL, b"in time")
    time.sleep(0.35)  # no timer: the engine compares the expiry with the clock per packet
    rig.send(stun.pack_channel_data(CHANNEL, b"too late"))
    nothing_arrives(rig.peer)
    rig.peer.sendto(b"too late", rig.relay_address)
    nothing_arrives(rig.client)
    drops(rig, no_permission=2)
    rig.permit()  # a refresh brings it back
    rig.send(stun.pack_channel_data(CHANNEL, b"refreshed"))
    assert rig.echo() == b"refreshed"


def test_a_removed_permission_drops_and_another_ip_was_never_permitted(rig: Rig) -> None:
    rig.engine.set_permission(rig.handle, "127.0.0.2", time.monotonic() + 60)
    rig.admit()
    rig.send(send_indication(rig.peer_address, b"not permitted"))
    nothing_arrives(rig.peer)
    rig.permit()
    rig.engine.remove_permission(rig.handle, HOST)
    rig.send(send_indication(rig.peer_address, b"removed"))
    nothing_arrives(rig.peer)
    drops(rig, no_permission=2)
    assert rig.engine.drain() == []


def test_an_expired_channel_is_handed_up_and_answers_fall_back_to_data_indications(
    rig: Rig,
) -> None:
    rig.permit()
    rig.admit()
    rig.engine.bind_channel(rig.handle, CHANNEL, rig.peer_address, time.monotonic() - 1)
    packet = stun.pack_channel_data(CHANNEL, b"stale")
    rig.send(packet)
    (up,) = rig.handed_up()
    assert up.data == packet and up.source == native.SOURCE_CLIENT
    rig.peer.sendto(b"back", rig.relay_address)
    back = stun.parse_message(rig.received())
    assert back.attributes["DATA"] == b"back"


def test_rebinding_a_channel_number_moves_it_to_the_new_peer(rig: Rig) -> None:
    rig.bind()
    rig.admit()
    other = udp()
    try:
        rig.engine.decide(other.getsockname(), CLUSTER)
        rig.engine.bind_channel(rig.handle, CHANNEL, other.getsockname(), time.monotonic() + 60)
        rig.send(stun.pack_channel_data(CHANNEL, b"moved"))
        assert other.recvfrom(100)[0] == b"moved"
        rig.peer.sendto(b"old peer", rig.relay_address)  # no channel now: a Data indication
        assert stun.parse_message(rig.received()).attributes["DATA"] == b"old peer"
    finally:
        other.close()


def test_an_expired_allocation_drops_peer_packets_and_hands_client_packets_up(rig: Rig) -> None:
    rig.bind()
    rig.admit()
    rig.engine.refresh_allocation(rig.handle, time.monotonic() - 1)
    rig.peer.sendto(b"late", rig.relay_address)
    nothing_arrives(rig.client)
    drops(rig, expired=1)
    packet = stun.pack_channel_data(CHANNEL, b"late")
    rig.send(packet)
    assert rig.handed_up()[0].data == packet


def test_a_removed_allocation_makes_its_client_a_stranger_and_lets_the_relay_port_go(
    rig: Rig,
) -> None:
    rig.bind()
    rig.admit()
    rig.engine.remove_allocation(rig.handle)
    port = rig.relay_address[1]
    rig.relay.close()

    def port_is_free() -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                return False
            return True

    wait_for(port_is_free, "the engine to close its copy of the relay socket")
    rig.send(stun.pack_channel_data(CHANNEL, b"gone"))  # Python has no allocation for it either
    drops(rig, invalid=1)
    request = Message(Method.BINDING, Class.REQUEST).encode()
    rig.send(request)
    (up,) = rig.handed_up()
    assert (up.source, up.handle, up.data) == (native.SOURCE_CLIENT, 0, request)
    with pytest.raises(KeyError):
        rig.engine.refresh_allocation(rig.handle, time.monotonic() + 60)


def test_bad_calls_are_refused_with_clear_errors(rig: Rig) -> None:
    with pytest.raises(ValueError, match="already has an allocation"):
        rig.engine.add_allocation(rig.client.getsockname(), rig.relay, time.monotonic())
    with pytest.raises(ValueError, match="not an IP address"):
        rig.engine.set_permission(rig.handle, "peer.example", time.monotonic())
    with pytest.raises(ValueError, match="out of range"):
        rig.engine.bind_channel(rig.handle, 0x3FFF, rig.peer_address, time.monotonic())
    with pytest.raises(KeyError):
        rig.engine.set_permission(rig.handle + 1, HOST, time.monotonic())
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as unix, pytest.raises(OSError):
        rig.engine.add_allocation(("127.0.0.9", 9), unix, time.monotonic())


# --- the peer policy ---------------------------------------------------------------------------


def test_a_verdict_miss_is_handed_up_then_decided_and_reinjected(rig: Rig) -> None:
    rig.bind()
    packet = stun.pack_channel_data(CHANNEL, b"first")
    rig.send(packet)
    (up,) = rig.handed_up()
    assert up == native.HandedUp(
        native.SOURCE_CLIENT, 0, ("::ffff:127.0.0.1", rig.client.getsockname()[1], 0, 0), packet
    )
    nothing_arrives(rig.peer)
    rig.engine.decide(rig.peer_address, CLUSTER)
    assert rig.engine.reinject(up) == native.RELAYED
    assert rig.echo() == b"first"  # the echo comes back through the engine: verdict cached
    assert rig.received() == stun.pack_channel_data(CHANNEL, b"first")
    rig.engine.clear_verdicts()
    rig.peer.sendto(b"after reconcile", rig.relay_address)
    (up,) = rig.handed_up()
    assert up == native.HandedUp(
        native.SOURCE_PEER, rig.handle, rig.peer_address, b"after reconcile"
    )
    rig.engine.decide(rig.peer_address, CLUSTER)
    assert rig.engine.reinject(up) == native.RELAYED
    assert rig.received() == stun.pack_channel_data(CHANNEL, b"after reconcile")


def test_a_cleared_verdict_table_stops_a_forbidden_peer_at_once(rig: Rig) -> None:
    rig.bind()
    rig.admit()
    rig.send(stun.pack_channel_data(CHANNEL, b"allowed"))
    assert rig.echo() == b"allowed"
    rig.received()
    # A reconcile removes the route: the next packet asks the router, which forbids the peer.
    rig.engine.clear_verdicts()
    rig.send(stun.pack_channel_data(CHANNEL, b"forbidden now"))
    (up,) = rig.handed_up()
    nothing_arrives(rig.peer)
    rig.engine.decide(rig.peer_address, None)
    assert rig.engine.reinject(up) == native.DROPPED
    for _ in range(3):
        rig.send(stun.pack_channel_data(CHANNEL, b"still forbidden"))
        rig.peer.sendto(b"from a forbidden peer", rig.relay_address)
    nothing_arrives(rig.peer)
    nothing_arrives(rig.client)
    drops(rig, forbidden=7)
    assert rig.engine.drain() == []


def test_a_verdict_is_per_peer_port(rig: Rig) -> None:
    rig.permit()
    rig.admit()
    other = udp()
    try:
        rig.engine.decide(other.getsockname(), None)  # same IP, a port outside the range
        rig.send(send_indication(other.getsockname(), b"wrong port"))
        nothing_arrives(other)
        rig.send(send_indication(rig.peer_address, b"right port"))
        assert rig.echo() == b"right port"
    finally:
        other.close()


# --- counters ----------------------------------------------------------------------------------


def test_counters_are_exact(rig: Rig) -> None:
    rig.bind()
    rig.admit()
    sizes = [0, 1, 3, 100, 1200]
    sent = received = 0
    for size in sizes:
        payload = b"p" * size
        datagram = stun.pack_channel_data(CHANNEL, payload)
        rig.send(datagram)
        sent += len(datagram)
        rig.echo()
        received += len(rig.received())
    indication = send_indication(rig.peer_address, b"12345", fingerprint=True)
    rig.engine.remove_channel(rig.handle, CHANNEL)
    rig.send(indication)
    rig.echo()
    data_indication = rig.received()
    # A packet is counted once sent: its counters may trail its arrival by a moment.
    wait_for(lambda: rig.engine.counters().tx_packets == 6, "the last packet's counters")
    counters = rig.engine.counters()
    payload_bytes = sum(sizes) + 5
    assert (counters.rx_packets, counters.rx_bytes) == (6, sent + len(indication))
    assert (counters.tx_packets, counters.tx_bytes) == (6, received + len(data_indication))
    assert len(data_indication) == 20 + 12 + 4 + 8  # header, XOR-PEER-ADDRESS, DATA padded
    assert counters.clusters == {CLUSTER: [6, payload_bytes, 6, payload_bytes]}
    assert set(counters.drops.values()) == {0}
    assert counters.handed_up == 0


def test_counters_are_per_cluster(rig: Rig) -> None:
    rig.permit()
    other = udp()
    try:
        rig.engine.decide(rig.peer_address, "ns/one")
        rig.engine.decide(other.getsockname(), "ns/two")
        rig.send(send_indication(rig.peer_address, b"a"))
        rig.send(send_indication(other.getsockname(), b"bb"))
        rig.send(send_indication(other.getsockname(), b"ccc"))
        rig.peer.recvfrom(10)
        other.recvfrom(10)
        other.recvfrom(10)
        expected = {"ns/one": [1, 1, 0, 0], "ns/two": [2, 5, 0, 0]}
        wait_for(lambda: rig.engine.counters().clusters == expected, "the counters")
        assert rig.engine.counters().rx_packets == 3
    finally:
        other.close()


# --- what the engine does not own ----------------------------------------------------------------

BINDING = Message(Method.BINDING, Class.REQUEST).encode()  # with a FINGERPRINT: 28 bytes
HEADER = BINDING[:2], BINDING[4:20]  # a Binding request's type, and its cookie and id
# What cannot be a STUN message or ChannelData: dropped on its first bytes (issue 15).
INVALID = [
    b"",
    b"\x40",
    b"\x40\x01\x00",
    b"\x40\x01\x00\x09short",  # ChannelData longer than the datagram
    b"\xc0\x00\x00\x00garbage",  # first two bits 11
    b"\x80" + BINDING[1:],  # first two bits 10
    b"\x00\x16",  # a Send indication's first bytes only
    BINDING[:19],  # a header cut short
    BINDING[:4] + b"\x21\x12\xa4\x43" + BINDING[8:],  # no magic cookie
    b"\x00\x16\x00\x08\x21\x12\xa4\x42" + b"t" * 12 + b"\x00\x12\x00\x08\x00\x01",  # cut short
    HEADER[0] + b"\x00\x02" + HEADER[1] + b"\0\0",  # a length no multiple of 4
    BINDING + b"\0\0\0\0",  # a length that does not match the datagram
    HEADER[0] + b"\x0f\xf0" + HEADER[1] + bytes(4080),  # above max_udp_message (4096)
]
# Well-formed on their first bytes, but not what the engine relays: handed up untouched.
MALFORMED = [
    b"\x7f\xff\x00\x00",  # an unbound channel
    b"\x00\x16\x00\x04\x21\x12\xa4\x42" + b"t" * 12 + b"\x00\x13\x00\x00",  # no peer
    b"\x00\x16\x00\x0c\x21\x12\xa4\x42" + b"t" * 12 + b"\x00\x12\x00\x08\x00\x03\x00\x00\0\0\0\0",
    HEADER[0] + b"\x0f\xec" + HEADER[1] + bytes(4076),  # 4096 bytes: at the bound
]


def test_malformed_datagrams_are_handed_up_untouched(rig: Rig) -> None:
    rig.bind()
    rig.admit()
    fingerprinted = send_indication(rig.peer_address, b"x", fingerprint=True)
    bad_crc = fingerprinted[:-1] + bytes([fingerprinted[-1] ^ 1])
    extra = Message(Method.SEND, Class.INDICATION)
    extra.attributes.update({"XOR-PEER-ADDRESS": rig.peer_address, "DATA": b"x", "LIFETIME": 1})
    datagrams = [*MALFORMED, bad_crc, extra.encode(fingerprint=False), BINDING]
    for datagram in datagrams:
        rig.send(datagram)
    assert [up.data for up in rig.handed_up(len(datagrams))] == datagrams
    nothing_arrives(rig.peer)
    rig.send(stun.pack_channel_data(CHANNEL, b"still alive"))
    assert rig.echo() == b"still alive"


@pytest.mark.parametrize("sender", ["client", "stranger"])
def test_garbage_is_dropped_on_its_first_bytes_and_counted(rig: Rig, sender: str) -> None:
    """Nothing that cannot be STUN or ChannelData reaches Python, from a client with an
    allocation or from a stranger; each is counted as "invalid". Python drops every one of
    them unanswered too (the engine drops nothing Python would answer): ChannelData that does
    not fit, STUN above max_udp_message (TurnServer.handle), or what stun.parse_message
    refuses."""
    rig.bind()
    rig.admit()
    for datagram in INVALID:
        if datagram[:1] == b"\x40":
            assert len(datagram) < 4 or len(datagram) < 4 + int.from_bytes(datagram[2:4], "big")
        elif len(datagram) <= Limits().max_udp_message:
            with pytest.raises(stun.StunError):
                stun.parse_message(datagram)
    stranger = udp()
    source = rig.client if sender == "client" else stranger
    try:
        for datagram in INVALID:
            source.sendto(datagram, rig.server)
        drops(rig, invalid=len(INVALID))
        source.sendto(BINDING, rig.server)  # what is left of the path still works
        (up,) = rig.handed_up()
        assert up.data == BINDING
        assert rig.engine.counters().handed_up == 1
    finally:
        stranger.close()


def test_a_client_s_requests_go_ahead_of_a_strangers_flood() -> None:
    """A flood of strangers' well-formed requests fills its own queue (then is dropped and
    counted); what a client with an allocation sends meanwhile waits in the priority queue,
    which drain() empties first."""
    rig = Rig(queue_limit=64)
    stranger = udp()
    try:
        flood = 200
        for i in range(flood):
            stranger.sendto(Message(Method.BINDING, Class.REQUEST).encode(), rig.server)
            if i % 50 == 49:  # in bursts: the listener's buffer never overflows
                wait_for(
                    lambda seen=i + 1: (
                        rig.engine.counters().handed_up + rig.engine.counters().drops["queue_full"]
                        == seen
                    ),
                    "the engine to see the flood",
                )
        requests = [Message(Method.REFRESH, Class.REQUEST).encode() for _ in range(3)]
        for request in requests:
            rig.send(request)
        wait_for(lambda: rig.engine.counters().handed_up == 64 + 3, "the client's requests")
        drops(rig, queue_full=flood - 64)
        queued = rig.engine.drain(1000)
        assert [up.data for up in queued[:3]] == requests
        stranger_port = stranger.getsockname()[1]
        assert [up.address[1] for up in queued[3:]] == [stranger_port] * 64
    finally:
        stranger.close()
        rig.close()


def test_a_send_indication_python_parses_goes_out_through_the_engine(rig: Rig) -> None:
    """One of another shape (here with SOFTWARE) is handed up; Python parses it and has the
    engine send the payload, decided and counted like the engine's own packets."""
    rig.permit()
    message = Message(Method.SEND, Class.INDICATION)
    message.attributes.update(
        {"XOR-PEER-ADDRESS": rig.peer_address, "DATA": b"parsed", "SOFTWARE": "test"}
    )
    datagram = message.encode(fingerprint=False)
    rig.send(datagram)
    (up,) = rig.handed_up()
    parsed = stun.parse_message(up.data)
    peer, payload = parsed.attributes["XOR-PEER-ADDRESS"], parsed.attributes["DATA"]
    send = rig.engine.send_to_peer
    assert send(rig.handle, peer, payload, len(datagram)) == native.UP  # no verdict yet
    rig.engine.decide(peer, CLUSTER)
    assert send(rig.handle, peer, payload, len(datagram)) == native.RELAYED
    assert rig.echo() == b"parsed"
    rig.received()  # the echo is relayed back before the verdict changes (else it is dropped)
    counters = rig.engine.counters()
    assert (counters.rx_packets, counters.rx_bytes) == (1, len(datagram))
    assert counters.clusters[CLUSTER][:2] == [1, len(b"parsed")]
    rig.engine.decide(peer, None)
    assert send(rig.handle, peer, payload, len(datagram)) == native.DROPPED
    rig.engine.remove_permission(rig.handle, HOST)
    rig.engine.decide(peer, CLUSTER)
    assert send(rig.handle, peer, payload, len(datagram)) == native.DROPPED
    nothing_arrives(rig.peer)
    assert rig.engine.counters().drops == {**counters.drops, "forbidden": 1, "no_permission": 1}
    with pytest.raises(ValueError, match="shorter than its payload"):
        send(rig.handle, peer, payload, 1)


def test_a_muted_stranger_s_stun_is_dropped_until_its_time_is_up(rig: Rig) -> None:
    """`mute`: Python spent a stranger's error budget; the engine drops its STUN meanwhile.
    A client with an allocation is never muted (Python does not rate-limit it unparsed)."""
    stranger = udp()
    try:
        address = ("::ffff:127.0.0.1", stranger.getsockname()[1])
        rig.engine.mute(address, time.monotonic() + 60)
        rig.engine.mute(("127.0.0.1", rig.client.getsockname()[1]), time.monotonic() + 60)
        stranger.sendto(BINDING, rig.server)
        drops(rig, rate_limited=1)
        rig.send(BINDING)
        assert rig.handed_up()[0].data == BINDING
        rig.engine.mute(address, time.monotonic() - 1)  # its budget refilled
        stranger.sendto(BINDING, rig.server)
        (up,) = rig.handed_up()
        assert up.address[1] == address[1]
        drops(rig, rate_limited=1)
    finally:
        stranger.close()


def test_unknown_clients_requests_are_handed_up_and_their_channel_data_dropped(
    rig: Rig,
) -> None:
    stranger = udp()
    try:
        stranger.sendto(stun.pack_channel_data(CHANNEL, b"who am i"), rig.server)
        drops(rig, invalid=1)
        stranger.sendto(BINDING, rig.server)
        (up,) = rig.handed_up()
        assert up.address[:2] == ("::ffff:127.0.0.1", stranger.getsockname()[1])
        assert up.data == BINDING
    finally:
        stranger.close()


def test_a_flood_of_handed_up_packets_is_bounded_and_counted() -> None:
    rig = Rig(queue_limit=64)
    try:
        flood, burst = 2000, 100
        sent = [Message(Method.BINDING, Class.REQUEST).encode() for _ in range(flood)]
        for start in range(0, flood, burst):  # in bursts: the listener's buffer never overflows
            for i in range(start, start + burst):
                rig.send(sent[i])

            def seen(count: int = start + burst) -> bool:
                counters = rig.engine.counters()
                return counters.handed_up + counters.drops["queue_full"] == count

            wait_for(seen, "the engine to see the flood")
        counters = rig.engine.counters()
        assert counters.handed_up == 64
        assert counters.drops["queue_full"] == flood - 64
        queued = rig.engine.drain(1000)
        assert len(queued) == 64
        assert [up.data for up in queued] == sent[:64]
        assert rig.engine.drain() == []
        rig.send(BINDING)
        assert rig.handed_up()[0].data == BINDING
    finally:
        rig.close()


def test_the_event_loop_gets_handed_up_packets_through_attach(rig: Rig) -> None:
    async def main() -> list[native.HandedUp]:
        got: asyncio.Queue[list[native.HandedUp]] = asyncio.Queue()
        rig.engine.attach(asyncio.get_running_loop(), got.put_nowait)
        rig.send(BINDING)
        try:
            return await asyncio.wait_for(got.get(), TIMEOUT)
        finally:
            rig.engine.close()

    (up,) = asyncio.run(main())
    assert up.data == BINDING


def test_closing_is_idempotent_and_the_engine_refuses_use_after(rig: Rig) -> None:
    rig.engine.close()
    rig.engine.close()
    with pytest.raises(ValueError, match="closed"):
        rig.engine.drain()


def test_an_own_address_verdict_holds_only_while_its_port_is_no_relay_port() -> None:
    """A peer on stunnerd's own address (`decide(..., own=True)`) is checked against the shared
    relay-port map per packet: a port that became a relay socket is refused at once."""
    relay_ports = bytearray(65536)
    rig = Rig(relay_ports=relay_ports)
    try:
        rig.bind()
        rig.engine.decide(rig.peer_address, CLUSTER, own=True)
        rig.send(stun.pack_channel_data(CHANNEL, b"while free"))
        assert rig.echo() == b"while free"
        assert rig.received() == stun.pack_channel_data(CHANNEL, b"while free")
        relay_ports[rig.peer_address[1]] = 1  # another allocation's relay socket now
        rig.send(stun.pack_channel_data(CHANNEL, b"to a relay socket"))
        rig.peer.sendto(b"from a relay socket", rig.relay_address)
        nothing_arrives(rig.peer)
        nothing_arrives(rig.client)
        drops(rig, forbidden=2)
        relay_ports[rig.peer_address[1]] = 0
        rig.send(stun.pack_channel_data(CHANNEL, b"free again"))
        assert rig.echo() == b"free again"
    finally:
        rig.close()
