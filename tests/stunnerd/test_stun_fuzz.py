"""Property tests of the codec: hostile bytes only ever raise StunError; encode/parse invert."""

import socket
import struct
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from stunner_api import stun
from stunner_api.stun import Class, Message, Method, StunError

FUZZ = settings(max_examples=300, deadline=None)
ROUND_TRIP = settings(max_examples=150, deadline=None)

COMPUTED = {"MESSAGE-INTEGRITY", "MESSAGE-INTEGRITY-SHA256", "FINGERPRINT"}

uint8 = st.integers(0, 0xFF)
uint16 = st.integers(0, 0xFFFF)
uint32 = st.integers(0, 0xFFFF_FFFF)
uint64 = st.integers(0, 2**64 - 1)
text = st.text(alphabet=st.characters(codec="utf-8"), max_size=60)
ipv4 = st.ip_addresses(v=4).map(str)
# inet_ntop's spelling is the canonical one the codec returns (e.g. for IPv4-mapped addresses).
ipv6 = st.ip_addresses(v=6).map(lambda ip: socket.inet_ntop(socket.AF_INET6, ip.packed))
address = st.tuples(st.one_of(ipv4, ipv6), uint16)
transaction_id = st.binary(min_size=12, max_size=12)

VALUES: dict[str, st.SearchStrategy[Any]] = {
    "MAPPED-ADDRESS": address,
    "USERNAME": text,
    "ERROR-CODE": st.tuples(st.integers(300, 699), text),
    "UNKNOWN-ATTRIBUTES": st.lists(uint16, max_size=8).map(tuple),
    "CHANNEL-NUMBER": uint16,
    "LIFETIME": uint32,
    "XOR-PEER-ADDRESS": address,
    "DATA": st.binary(max_size=64),
    "REALM": text,
    "NONCE": text,
    "XOR-RELAYED-ADDRESS": address,
    "REQUESTED-ADDRESS-FAMILY": uint8,
    "EVEN-PORT": st.booleans(),
    "REQUESTED-TRANSPORT": uint8,
    "DONT-FRAGMENT": st.none(),
    "PASSWORD-ALGORITHM": st.binary(max_size=16),
    "USERHASH": st.binary(min_size=32, max_size=32),
    "XOR-MAPPED-ADDRESS": address,
    "RESERVATION-TOKEN": st.binary(min_size=8, max_size=8),
    "PRIORITY": uint32,
    "USE-CANDIDATE": st.none(),
    "CONNECTION-ID": uint32,
    "ADDITIONAL-ADDRESS-FAMILY": uint8,
    "ADDRESS-ERROR-CODE": st.tuples(uint8, st.integers(300, 699), text),
    "PASSWORD-ALGORITHMS": st.binary(max_size=16),
    "ALTERNATE-DOMAIN": text,
    "ICMP": st.tuples(st.integers(0, 127), st.integers(0, 511), uint32),
    "SOFTWARE": text,
    "ALTERNATE-SERVER": address,
    "ICE-CONTROLLED": uint64,
    "ICE-CONTROLLING": uint64,
    "RESPONSE-ORIGIN": address,
    "OTHER-ADDRESS": address,
}

attribute_dicts = st.lists(st.sampled_from(sorted(VALUES)), unique=True, max_size=8).flatmap(
    lambda names: st.fixed_dictionaries({name: VALUES[name] for name in names})
)
messages = st.builds(
    Message,
    method=st.sampled_from(Method),
    message_class=st.sampled_from(Class),
    transaction_id=transaction_id,
    attributes=attribute_dicts,
)


def raw_message(message_type: int, attributes: list[tuple[int, bytes]]) -> bytes:
    body = b"".join(
        struct.pack("!HH", attr_type, len(value)) + value + bytes(-len(value) % 4)
        for attr_type, value in attributes
    )
    return struct.pack("!HHI12s", message_type, len(body), stun.COOKIE, bytes(12)) + body


# Well-framed messages with arbitrary attribute values: they get past the header checks and
# exercise every attribute decoder with hostile input.
framed = st.builds(
    raw_message,
    st.integers(0, 0x3FFF),
    st.lists(
        st.tuples(
            st.one_of(st.sampled_from([entry.type for entry in stun.ATTRIBUTES]), uint16),
            st.binary(max_size=40),
        ),
        max_size=6,
    ),
)


def parse_or_stun_error(data: bytes) -> Message | None:
    try:
        return stun.parse_message(data)
    except StunError:
        return None


def test_every_encodable_attribute_is_generated() -> None:
    assert set(VALUES) == set(stun.ATTRIBUTES_BY_NAME) - COMPUTED


@FUZZ
@given(st.binary(max_size=128))
def test_parse_arbitrary_bytes(data: bytes) -> None:
    parse_or_stun_error(data)


@FUZZ
@given(st.binary(max_size=108), uint16)
def test_parse_arbitrary_body(body: bytes, message_type: int) -> None:
    # A valid header in front of random bytes, so the attribute walk itself is fuzzed.
    header = struct.pack("!HHI12s", message_type & 0x3FFF, len(body), stun.COOKIE, bytes(12))
    parse_or_stun_error(header + body)


@FUZZ
@given(framed)
def test_parse_framed_attributes(data: bytes) -> None:
    message = parse_or_stun_error(data)
    if message is not None:
        assert set(message.attributes) <= set(stun.ATTRIBUTES_BY_NAME)
        assert all(
            t < 0x8000 and t not in stun.ATTRIBUTES_BY_TYPE for t in message.unknown_required
        )


@ROUND_TRIP
@given(messages)
def test_round_trip(message: Message) -> None:
    parsed = stun.parse_message(message.encode(fingerprint=False))
    assert parsed == message
    assert [name for name, _ in parsed.attribute_list] == list(message.attributes)


@ROUND_TRIP
@given(messages, st.binary(min_size=1, max_size=32))
def test_round_trip_signed(message: Message, key: bytes) -> None:
    parsed = stun.parse_message(message.encode(integrity_key=key))
    assert parsed.check_integrity(key)
    assert not parsed.check_integrity(key + b"x")
    assert list(parsed.attributes)[-2:] == ["MESSAGE-INTEGRITY", "FINGERPRINT"]
    del parsed.attributes["MESSAGE-INTEGRITY"], parsed.attributes["FINGERPRINT"]
    assert parsed == message


@FUZZ
@given(messages, st.booleans(), st.data())
def test_mutations(message: Message, fingerprint: bool, data: st.DataObject) -> None:
    encoded = bytearray(message.encode(integrity_key=b"key", fingerprint=fingerprint))
    mutation = data.draw(st.sampled_from(["flip", "truncate", "insert"]))
    position = data.draw(st.integers(0, len(encoded) - 1))
    if mutation == "flip":
        encoded[position] ^= 1 << data.draw(st.integers(0, 7))
    elif mutation == "truncate":
        del encoded[position:]
    else:
        encoded[position:position] = data.draw(st.binary(min_size=1, max_size=8))
    parsed = parse_or_stun_error(bytes(encoded))
    if parsed is None or mutation != "flip":
        return
    if fingerprint:
        # CRC-32 catches every single-bit error in what it covers, so a flip that parses left
        # no FINGERPRINT: it hit the FINGERPRINT type (an attribute ignored after an intact
        # MESSAGE-INTEGRITY), or an attribute's length, which swallowed MESSAGE-INTEGRITY and
        # FINGERPRINT into its value (an unsigned message, which never checks).
        assert "FINGERPRINT" not in parsed.attributes
        assert parsed.check_integrity(b"key") == ("MESSAGE-INTEGRITY" in parsed.attributes)
    else:
        assert not parsed.check_integrity(b"key")


def test_a_length_flip_that_swallows_integrity_and_fingerprint_leaves_an_unsigned_message() -> None:
    """Found by test_mutations: PASSWORD-ALGORITHM's length 0 -> 64 makes MESSAGE-INTEGRITY and
    FINGERPRINT its value; the message parses, without either, and its integrity never checks."""
    message = Message(Method.BINDING, Class.REQUEST, bytes(12))
    message.attributes.update({"USERHASH": bytes(32), "PASSWORD-ALGORITHM": b""})
    encoded = bytearray(message.encode(integrity_key=b"key", fingerprint=True))
    length_at = 20 + 4 + 32 + 2  # header, USERHASH, PASSWORD-ALGORITHM's type
    assert encoded[length_at : length_at + 2] == b"\x00\x00"
    encoded[length_at + 1] = 24 + 8  # MESSAGE-INTEGRITY (24) and FINGERPRINT (8)
    parsed = parse_or_stun_error(bytes(encoded))
    assert parsed is not None
    assert list(parsed.attributes) == ["USERHASH", "PASSWORD-ALGORITHM"]
    assert not parsed.check_integrity(b"key")


@FUZZ
@given(st.binary(max_size=64))
def test_stream_frame_length_arbitrary(data: bytes) -> None:
    try:
        length = stun.stream_frame_length(data)
    except StunError:
        assert data[0] & 0x80 or data[0] & 0xC0 == 0
        return
    if len(data) < 4:
        assert length is None
    else:
        assert length is not None and length >= 4 and length % 4 == 0


@FUZZ
@given(st.binary(max_size=64))
def test_unpack_channel_data_arbitrary(data: bytes) -> None:
    assert stun.is_channel_data(data) == (len(data) > 0 and data[0] >> 6 == 1)
    stun.is_stun(data)
    try:
        channel, payload = stun.unpack_channel_data(data)
    except StunError:
        return
    assert stun.is_valid_channel_number(channel)
    assert len(payload) == int.from_bytes(data[2:4], "big")
    assert 0 <= len(data) - 4 - len(payload) <= 3


@FUZZ
@given(st.integers(0x4000, 0x7FFF), st.binary(max_size=64), st.booleans())
def test_channel_data_round_trip(channel: int, payload: bytes, pad: bool) -> None:
    data = stun.pack_channel_data(channel, payload, pad=pad)
    assert stun.unpack_channel_data(data) == (channel, payload)
    assert stun.stream_frame_length(data) == len(data) + (0 if pad else -len(payload) % 4)


@FUZZ
@given(address, st.binary(max_size=64))
def test_data_indication_round_trip(peer: stun.Address, payload: bytes) -> None:
    message = stun.parse_message(stun.data_indication(peer, payload))
    assert message.attributes == {"XOR-PEER-ADDRESS": peer, "DATA": payload}


@FUZZ
@given(address, transaction_id)
def test_xor_address_round_trip(peer: stun.Address, tid: bytes) -> None:
    assert stun.unpack_xor_address(stun.pack_xor_address(peer, tid), tid) == peer
    assert stun.unpack_address(stun.pack_address(peer)) == peer


# --- the Send-indication fast path agrees with the full parser ------------------------------

SEND_INDICATION = 0x0016
PEER_V4 = ("10.0.0.7", 5004)

send_indications = st.builds(
    raw_message,
    st.just(SEND_INDICATION),
    st.lists(
        st.tuples(
            st.sampled_from([0x0012, 0x0013, 0x8028, 0x8022, 0x0001, 0x0024]),
            st.binary(max_size=24),
        ),
        max_size=4,
    ),
)


def fast_agrees_with_full(data: bytes) -> None:
    """The fast path either declines (the full parser decides) or gives what the full parser
    would relay: the first XOR-PEER-ADDRESS and DATA of a message with nothing unknown."""
    fast = stun.parse_send_indication(data)
    if fast is None:
        return
    message = stun.parse_message(data)  # must not raise: the fast path took it as valid
    assert (message.method, message.message_class) == (Method.SEND, Class.INDICATION)
    assert not message.unknown_required
    assert fast == (message.attributes["XOR-PEER-ADDRESS"], message.attributes["DATA"])


@FUZZ
@given(send_indications)
def test_send_fast_path_on_framed_attributes(data: bytes) -> None:
    fast_agrees_with_full(data)


@FUZZ
@given(address, st.binary(max_size=64), transaction_id, st.booleans(), st.data())
def test_send_fast_path_on_mutated_indications(
    peer: tuple[str, int], payload: bytes, tid: bytes, fingerprint: bool, data: st.DataObject
) -> None:
    attributes = {"XOR-PEER-ADDRESS": peer, "DATA": payload}
    raw = bytearray(
        Message(Method.SEND, Class.INDICATION, tid, attributes).encode(fingerprint=fingerprint)
    )
    assert stun.parse_send_indication(bytes(raw)) == (peer, payload)  # the plain shape is taken
    for _ in range(data.draw(st.integers(1, 3))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(uint8)
    fast_agrees_with_full(bytes(raw))


def send_indication(*attributes: tuple[int, bytes]) -> bytes:
    return raw_message(SEND_INDICATION, list(attributes))


XOR_PEER_V4 = stun.pack_xor_address(PEER_V4, bytes(12))
FAST_PATH_CASES = [
    # (what, message, what the fast path gives)
    ("plain", send_indication((0x12, XOR_PEER_V4), (0x13, b"media")), (PEER_V4, b"media")),
    ("DATA first", send_indication((0x13, b"m"), (0x12, XOR_PEER_V4)), (PEER_V4, b"m")),
    ("empty DATA", send_indication((0x12, XOR_PEER_V4), (0x13, b"")), (PEER_V4, b"")),
    ("no DATA", send_indication((0x12, XOR_PEER_V4)), None),
    ("no peer", send_indication((0x13, b"media")), None),
    ("SOFTWARE too", send_indication((0x12, XOR_PEER_V4), (0x13, b"m"), (0x8022, b"x")), None),
    ("two peers", send_indication((0x12, XOR_PEER_V4), (0x12, XOR_PEER_V4), (0x13, b"m")), None),
    ("short peer", send_indication((0x12, XOR_PEER_V4[:6]), (0x13, b"m")), None),
    (
        "bad fingerprint",
        send_indication((0x12, XOR_PEER_V4), (0x13, b"m"), (0x8028, bytes(4))),
        None,
    ),
    ("a request", raw_message(0x0006, [(0x12, XOR_PEER_V4), (0x13, b"m")]), None),
    ("truncated", send_indication((0x12, XOR_PEER_V4), (0x13, b"media"))[:-4], None),
]


def test_send_fast_path_table() -> None:
    for what, data, expected in FAST_PATH_CASES:
        assert stun.parse_send_indication(data) == expected, what
        fast_agrees_with_full(data)
