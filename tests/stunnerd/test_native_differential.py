"""The native engine parses exactly what the Python path parses (stunner_api.stun, turn.py).

A stranger's STUN past its budget (issue 20): the engine drops as unauthenticated exactly
what the Python path (`transports.has_integrity`) rate-limits; and it answers a stranger's
unsigned Allocate itself exactly when the Python path answers it without state (issue 28,
`stateless.unsigned_allocate`). Zero-length payloads are relayed
by both paths (tests/stunnerd/test_abuse_strangers.py runs both on them).

Mutated Send indications and ChannelData are decided by the engine (`reinject`, synchronous)
and by the Python codec; the engine must relay exactly the datagrams Python would relay, with
the same payload to the same peer, drop what cannot be STUN or ChannelData on its first bytes
(which Python drops unanswered too), and hand up the rest. A TCP stream's start is framed the
same by both, and refused with the same words (an unpadded ChannelData message among them).
"""

from __future__ import annotations

import binascii
import struct
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stunner_api import stun
from stunner_api.stun import Class, Message, Method
from stunnerd.transport import native
from stunnerd.transport.transports import has_integrity
from stunnerd.turn.limits import Limits

from .test_native_relay import CHANNEL, CLUSTER, Rig

pytestmark = pytest.mark.skipif(
    not native.available(), reason=f"native relay: {native.unavailable_reason()}"
)


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    rig = Rig()
    rig.bind()
    rig.admit()
    rig.peer.setblocking(False)
    yield rig
    rig.close()


def _invalid(data: bytes) -> bool:
    """Cannot be a STUN message or ChannelData, on its first bytes (issue 15); and then the
    Python path drops it unanswered as well."""
    if len(data) >= 4 and data[0] & 0xC0 == 0x40:
        invalid = len(data) < 4 + int.from_bytes(data[2:4], "big")
    else:
        length = int.from_bytes(data[2:4], "big")
        invalid = (
            len(data) < 20
            or data[0] & 0xC0 != 0
            or data[4:8] != stun.COOKIE_BYTES
            or length % 4 != 0
            or len(data) != 20 + length
            or len(data) > Limits().max_udp_message
        )
        if invalid and len(data) <= Limits().max_udp_message:
            with pytest.raises(stun.StunError):
                stun.parse_message(data)
    return invalid


def _decide(rig: Rig, data: bytes) -> tuple[int, bytes | None]:
    """The engine's outcome for `data` from the client, and what the peer got (if anything)."""
    client = ("::ffff:127.0.0.1", rig.client.getsockname()[1], 0, 0)
    outcome = rig.engine.reinject(native.HandedUp(native.SOURCE_CLIENT, 0, client, data))
    if outcome != native.RELAYED:
        return outcome, None
    rig.peer.settimeout(2.0)
    got, _ = rig.peer.recvfrom(65536)
    return outcome, got


def _mutations() -> st.SearchStrategy[list[tuple[int, int]]]:
    return st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=4)


def _apply(data: bytes, mutations: list[tuple[int, int]], cut: int | None) -> bytes:
    buffer = bytearray(data)
    for position, value in mutations:
        if buffer:
            buffer[position % len(buffer)] = value
    return bytes(buffer if cut is None else buffer[:cut])


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    payload=st.binary(max_size=40),
    fingerprint=st.booleans(),
    mutations=_mutations(),
    cut=st.none() | st.integers(0, 100),
)
def test_send_indications_like_the_python_parser(
    rig: Rig, payload: bytes, fingerprint: bool, mutations: list[tuple[int, int]], cut: int | None
) -> None:
    message = Message(Method.SEND, Class.INDICATION)
    message.attributes["XOR-PEER-ADDRESS"] = rig.peer_address
    message.attributes["DATA"] = payload
    data = _apply(message.encode(fingerprint=fingerprint), mutations, cut)
    parsed = stun.parse_send_indication(data)
    outcome, got = _decide(rig, data)
    if parsed is None:
        assert outcome == (native.DROPPED if _invalid(data) else native.UP)
    elif parsed[0] == rig.peer_address:
        assert (outcome, got) == (native.RELAYED, parsed[1])
    else:  # another peer: not permitted (dropped) or no verdict yet (handed up)
        assert outcome in (native.DROPPED, native.UP)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    payload=st.binary(max_size=40),
    mutations=_mutations(),
    cut=st.none() | st.integers(0, 50),
    padding=st.binary(max_size=5),
)
def test_channel_data_like_the_python_path(
    rig: Rig, payload: bytes, mutations: list[tuple[int, int]], cut: int | None, padding: bytes
) -> None:
    data = _apply(stun.pack_channel_data(CHANNEL, payload) + padding, mutations, cut)
    outcome, got = _decide(rig, data)
    # turn.Allocation.relay_channel_data: a bound channel and a length that fits are relayed.
    relayed = len(data) >= 4 and data[0] & 0xC0 == 0x40
    if relayed:
        channel, length = struct.unpack_from("!HH", data)
        relayed = channel == CHANNEL and len(data) >= 4 + length
    if relayed:
        assert (outcome, got) == (native.RELAYED, data[4 : 4 + length])
    else:
        assert outcome == (native.DROPPED if _invalid(data) else native.UP)


def _stream_starts() -> st.SearchStrategy[bytes]:
    """What a TCP stream may begin with: anything; a STUN header with or without the cookie;
    ChannelData, padded or not, followed by a Binding request (out of step when not)."""
    header = st.builds(
        lambda first, length, cookie, rest: struct.pack("!BBH", first, 1, length) + cookie + rest,
        st.integers(0, 255),
        st.integers(0, 0xFFFF),
        st.sampled_from([stun.COOKIE_BYTES, b"\x21\x12\xa4\x43", b""]),
        st.binary(max_size=16),
    )
    channel_data = st.builds(
        lambda payload, pad: (
            stun.pack_channel_data(CHANNEL, payload, pad=pad)
            + Message(Method.BINDING, Class.REQUEST).encode()
        ),
        st.binary(max_size=9),
        st.booleans(),
    )
    return st.one_of(st.binary(max_size=24), header, channel_data)


@settings(max_examples=500, deadline=None)
@given(data=_stream_starts())
def test_streams_are_framed_like_the_python_path(data: bytes) -> None:
    """Issue 28 #11: what the engine (stream.c) and the Python path (stun.stream_frame_length)
    make of the start of a TCP stream, at every length it is buffered to: the same frame
    length (0 until a header is there), the same garbage, closed with the same words."""
    for cut in range(len(data) + 1):
        buffered = data[:cut]
        length, why = native.stream_framing(buffered)
        try:
            expected = stun.stream_frame_length(buffered)
        except stun.StunError as exc:
            assert (length, why) == (-1, str(exc)), buffered
            assert why in stun.FRAMING_ERRORS
        else:
            assert (length, why) == (expected or 0, None), buffered


def test_data_indications_match_the_python_encoder(rig: Rig) -> None:
    rig.engine.remove_channel(rig.handle, CHANNEL)
    try:
        for payload in (b"", b"1", b"12", b"123", b"1234", b"12345" * 100):
            rig.peer.sendto(payload, rig.relay_address)
            native_packet = rig.received()
            python_packet = stun.data_indication(rig.peer_address, payload)
            # Identical but for the random transaction id (bytes 8-20).
            assert native_packet[:8] + native_packet[20:] == python_packet[:8] + python_packet[20:]
    finally:
        rig.bind()
        rig.engine.decide(rig.peer_address, CLUSTER)


@pytest.fixture(scope="module")
def strangers() -> Iterator[Rig]:
    rig = Rig(stranger_rate=0.5)  # a burst of one unsigned message per source IP
    yield rig
    rig.close()


_stranger_ips = iter(f"127.1.{i // 250}.{i % 250 + 1}" for i in range(60000))


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    attributes=st.lists(
        st.tuples(
            st.sampled_from([0x0006, 0x0008, 0x0014, 0x8022, 0x0019]), st.binary(max_size=30)
        ),
        max_size=5,
    ),
    bad_length=st.none() | st.tuples(st.integers(0, 4), st.integers(0, 0xFFFF)),
)
def test_message_integrity_is_found_as_the_python_path_finds_it(
    strangers: Rig,
    attributes: list[tuple[int, bytes]],
    bad_length: tuple[int, int] | None,
) -> None:
    """A stranger past its budget: what the engine drops as unauthenticated is exactly what
    the Python path (transports.has_integrity) rate-limits, for attribute headers of any
    length, MESSAGE-INTEGRITY anywhere or nowhere."""
    body = bytearray()
    for index, (kind, value) in enumerate(attributes):
        length = len(value)
        if bad_length is not None and bad_length[0] == index:
            length = bad_length[1]  # a header that lies about its length
        body += struct.pack("!HH", kind, length) + value + bytes(-len(value) % 4)
    header = Message(Method.BINDING, Class.REQUEST).encode(fingerprint=False)[:20]
    data = header[:2] + struct.pack("!H", len(body)) + header[4:] + bytes(body)
    address = (f"::ffff:{next(_stranger_ips)}", 5000)

    def decide(datagram: bytes) -> int:
        packet = native.HandedUp(native.SOURCE_CLIENT, 0, address, datagram)
        return strangers.engine.reinject(packet)

    assert decide(header[:2] + b"\0\0" + header[4:]) == native.UP  # its one token
    before = strangers.engine.counters().drops["unauthenticated_rate"]
    outcome = decide(data)
    dropped = strangers.engine.counters().drops["unauthenticated_rate"] - before
    if _invalid(data):
        assert (outcome, dropped) == (native.DROPPED, 0)
    elif has_integrity(data):
        assert (outcome, dropped) == (native.UP, 0)
    else:
        assert (outcome, dropped) == (native.DROPPED, 1)


@settings(max_examples=500, deadline=None)
@given(
    attributes=st.lists(
        st.tuples(
            st.sampled_from([0x0006, 0x0008, 0x0014, 0x0015, 0x8022, 0x0019, 0x8028]),
            st.binary(max_size=30),
        ),
        max_size=5,
    ),
    fingerprint=st.booleans(),
    mutations=_mutations(),
    cut=st.none() | st.integers(0, 100),
)
def test_unsigned_allocates_are_answered_as_the_python_path_answers_them(
    attributes: list[tuple[int, bytes]],
    fingerprint: bool,
    mutations: list[tuple[int, int]],
    cut: int | None,
) -> None:
    """Issue 28: the engine answers a stranger's unsigned Allocate itself (a stateless 401)
    exactly when the Python path does (stateless.unsigned_allocate), whatever the attributes,
    FINGERPRINT right or wrong, headers that lie about their lengths."""
    from stunnerd import _relay
    from stunnerd.turn.stateless import unsigned_allocate

    body = b"".join(
        struct.pack("!HH", kind, len(value)) + value + bytes(-len(value) % 4)
        for kind, value in attributes
    )
    header = Message(Method.ALLOCATE, Class.REQUEST).encode(fingerprint=False)[:20]
    data = header[:2] + struct.pack("!H", len(body)) + header[4:] + body
    if fingerprint:
        data = data[:2] + struct.pack("!H", len(body) + 8) + data[4:]
        crc = binascii.crc32(data) ^ stun.FINGERPRINT_XOR
        data += struct.pack("!HHI", 0x8028, 4, crc)
    data = _apply(data, mutations, cut)
    for limit in (64, 2):
        assert _relay.unsigned_allocate(data, limit) == unsigned_allocate(data, limit), data
