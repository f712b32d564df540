"""The STUN/TURN codec against RFC 5769 test vectors, hand-built packets and aioice."""

import binascii
import hashlib
import ipaddress
import pathlib
import stringprep
import struct
import unicodedata
from typing import Any

import aioice.stun
import pytest

from stunner_api import stun
from stunner_api.stun import Class, Message, Method, StunError

DATA = pathlib.Path(__file__).parents[1] / "data" / "stun"
SHORT_TERM_KEY = b"VOkJxbRl1RmTxUk/WvJxBt"  # RFC 5769 §2.1-2.3
RFC_TID = bytes.fromhex("b7e7a701bc34d686fa87dfae")
TID = bytes(range(12))


def load(name: str) -> bytes:
    """A golden packet: hex bytes, whitespace free-form, `#` starts a comment."""
    lines = (line.partition("#")[0] for line in (DATA / name).read_text().splitlines())
    return bytes.fromhex(" ".join(lines))


def build(*attributes: tuple[int, bytes], message_type: int = 0x0001, tid: bytes = TID) -> bytes:
    """A STUN message assembled by hand (zero padding, no integrity), independent of the codec."""
    body = b"".join(
        struct.pack("!HH", attr_type, len(value)) + value + bytes(-len(value) % 4)
        for attr_type, value in attributes
    )
    return struct.pack("!HHI12s", message_type, len(body), stun.COOKIE, tid) + body


def blank(data: bytes, *ranges: range) -> bytes:
    """`data` with the bytes at `ranges` zeroed: what a comparison deliberately skips."""
    out = bytearray(data)
    for r in ranges:
        out[r.start : r.stop] = bytes(len(r))
    return bytes(out)


def saslprep(password: str) -> str:
    """Enough of SASLprep (RFC 4013) for the RFC 5769 password: drop table B.1, NFKC."""
    return unicodedata.normalize(
        "NFKC", "".join(c for c in password if not stringprep.in_table_b1(c))
    )


# --- RFC 5769 test vectors --------------------------------------------------------------------


def test_rfc5769_sample_request() -> None:
    data = load("rfc5769-2.1-request.hex")
    message = stun.parse_message(data)
    assert message.method == Method.BINDING
    assert message.message_class == Class.REQUEST
    assert message.transaction_id == RFC_TID
    assert message.attributes == {
        "SOFTWARE": "STUN test client",
        "PRIORITY": 0x6E0001FF,
        "ICE-CONTROLLED": 0x932FF9B151263B36,
        "USERNAME": "evtj:h6vY",
        "MESSAGE-INTEGRITY": data[80:100],
        "FINGERPRINT": 0xE57A3BCF,
    }
    assert message.unknown_required == ()
    assert message.check_integrity(SHORT_TERM_KEY)
    assert not message.check_integrity(b"VOkJxbRl1RmTxUk/WvJxBu")

    # Re-encoding pads USERNAME with zeros where the RFC uses 0x20, which changes the three
    # padding bytes and therefore the MESSAGE-INTEGRITY and FINGERPRINT values; every other
    # byte is identical, and the result verifies with the same key.
    encoded = message.encode(integrity_key=SHORT_TERM_KEY)
    assert len(encoded) == len(data)
    assert data[73:76] == b"   " and encoded[73:76] == bytes(3)
    skipped = (range(73, 76), range(80, 100), range(104, 108))
    assert blank(encoded, *skipped) == blank(data, *skipped)
    assert stun.parse_message(encoded).check_integrity(SHORT_TERM_KEY)


def test_rfc5769_sample_ipv4_response() -> None:
    data = load("rfc5769-2.2-response-ipv4.hex")
    message = stun.parse_message(data)
    assert (message.method, message.message_class) == (Method.BINDING, Class.SUCCESS)
    assert message.transaction_id == RFC_TID
    assert message.attributes["SOFTWARE"] == "test vector"
    assert message.attributes["XOR-MAPPED-ADDRESS"] == ("192.0.2.1", 32853)
    assert message.attributes["FINGERPRINT"] == 0xC07D4C96
    assert message.check_integrity(SHORT_TERM_KEY)
    assert not message.check_integrity(b"wrong")

    # Only the SOFTWARE padding byte (0x20 in the RFC) and the MAC/CRC covering it differ.
    encoded = message.encode(integrity_key=SHORT_TERM_KEY)
    skipped = (range(35, 36), range(52, 72), range(76, 80))
    assert blank(encoded, *skipped) == blank(data, *skipped)
    assert stun.parse_message(encoded).check_integrity(SHORT_TERM_KEY)


def test_rfc5769_sample_ipv6_response() -> None:
    data = load("rfc5769-2.3-response-ipv6.hex")
    message = stun.parse_message(data)
    assert (message.method, message.message_class) == (Method.BINDING, Class.SUCCESS)
    assert message.attributes["SOFTWARE"] == "test vector"
    assert message.attributes["XOR-MAPPED-ADDRESS"] == (
        "2001:db8:1234:5678:11:2233:4455:6677",
        32853,
    )
    assert message.attributes["FINGERPRINT"] == 0xC8FB0B4C
    assert message.check_integrity(SHORT_TERM_KEY)
    assert not message.check_integrity(b"wrong")

    encoded = message.encode(integrity_key=SHORT_TERM_KEY)
    skipped = (range(35, 36), range(64, 84), range(88, 92))
    assert blank(encoded, *skipped) == blank(data, *skipped)
    assert stun.parse_message(encoded).check_integrity(SHORT_TERM_KEY)


def test_rfc5769_sample_request_long_term() -> None:
    data = load("rfc5769-2.4-request-long-term.hex")
    message = stun.parse_message(data)
    username = "\u30de\u30c8\u30ea\u30c3\u30af\u30b9"
    assert (message.method, message.message_class) == (Method.BINDING, Class.REQUEST)
    assert message.attributes == {
        "USERNAME": username,
        "NONCE": "f//499k954d6OL34oL9FSTvy64sA",
        "REALM": "example.org",
        "MESSAGE-INTEGRITY": data[-20:],
    }
    password = saslprep("The\u00adM\u00aatr\u2168")
    assert password == "TheMatrIX"
    key = hashlib.md5(f"{username}:example.org:{password}".encode()).digest()
    assert message.check_integrity(key)
    assert not message.check_integrity(hashlib.md5(b"user:example.org:TheMatrIX").digest())
    # This vector pads with zeros and has no FINGERPRINT: it re-encodes byte for byte.
    assert message.encode(integrity_key=key, fingerprint=False) == data


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("rfc5769-*.hex")))
def test_rfc5769_vectors_are_stun(name: str) -> None:
    data = load(name)
    assert stun.is_stun(data)
    assert not stun.is_channel_data(data)
    assert stun.stream_frame_length(data) == len(data)
    assert stun.stream_frame_length(data[:4]) == len(data)


# --- header and message type ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "message_class", "message_type"),
    [
        (Method.BINDING, Class.REQUEST, 0x0001),
        (Method.BINDING, Class.SUCCESS, 0x0101),
        (Method.ALLOCATE, Class.ERROR, 0x0113),
        (Method.SEND, Class.INDICATION, 0x0016),
        (Method.DATA, Class.INDICATION, 0x0017),
        (Method.CHANNEL_BIND, Class.SUCCESS, 0x0109),
        (Method.CONNECTION_ATTEMPT, Class.INDICATION, 0x001C),
    ],
)
def test_message_type(method: Method, message_class: Class, message_type: int) -> None:
    data = Message(method, message_class, TID).encode(fingerprint=False)
    assert data == struct.pack("!HHI12s", message_type, 0, stun.COOKIE, TID)
    parsed = stun.parse_message(data)
    assert (parsed.method, parsed.message_class) == (method, message_class)


def test_default_transaction_ids_are_random() -> None:
    first, second = Message(Method.BINDING, Class.REQUEST), Message(Method.BINDING, Class.REQUEST)
    assert len(first.transaction_id) == 12
    assert first.transaction_id != second.transaction_id


def test_parse_accepts_bytearray_and_memoryview() -> None:
    data = load("rfc5769-2.1-request.hex")
    for view in (bytearray(data), memoryview(data)):
        message = stun.parse_message(view)
        assert message.attributes["USERNAME"] == "evtj:h6vY"
        assert message.check_integrity(SHORT_TERM_KEY)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"", "STUN message is shorter than 20 bytes"),
        (build()[:19], "STUN message is shorter than 20 bytes"),
        (b"\xc0" + build()[1:], "STUN message does not start with two zero bits"),
        (b"\x40" + build()[1:], "STUN message does not start with two zero bits"),
        (
            build()[:4] + b"\x21\x12\xa4\x43" + build()[8:],
            "STUN message has an invalid magic cookie",
        ),
        (
            b"\x00\x01\x00\x02" + build()[4:] + b"\x00\x00",
            "STUN message length is not a multiple of 4",
        ),
        (build() + bytes(4), "STUN message length does not match"),
        (build((0x8022, b"abcd"))[:-4], "STUN message length does not match"),
        (
            build((0x8022, b"abcd"))[:2] + b"\x00\x04" + build()[4:],
            "STUN message length does not match",
        ),
    ],
)
def test_header_errors(data: bytes, error: str) -> None:
    with pytest.raises(StunError) as info:
        stun.parse_message(data)
    assert str(info.value) == error


@pytest.mark.parametrize(
    ("message_type", "message_class", "error"),
    [
        (0x0002, Class.REQUEST, "STUN message has unknown method 0x002"),
        (0x001F, Class.INDICATION, "STUN message has unknown method 0x00f"),
        (0x0020, Class.REQUEST, "STUN message has unknown method 0x010"),
        (0x3EEF, Class.REQUEST, "STUN message has unknown method 0xfff"),
        (0x0115, Class.ERROR, "STUN message has unknown method 0x005"),
    ],
)
def test_unknown_method(message_type: int, message_class: Class, error: str) -> None:
    with pytest.raises(stun.UnknownMethodError) as info:
        stun.parse_message(build(message_type=message_type))
    assert str(info.value) == error
    assert info.value.message_class == message_class
    assert info.value.transaction_id == TID
    assert isinstance(info.value, StunError)


# --- attribute walk ---------------------------------------------------------------------------

LIFETIME = 0x000D
USERNAME = 0x0006
XOR_PEER = 0x0012
XOR_MAPPED = 0x0020
FINGERPRINT = 0x8028


def test_attribute_overrun() -> None:
    data = bytearray(build((USERNAME, b"abcd")))
    data[22:24] = struct.pack("!H", 5)  # claims 5 bytes, the message has 4
    with pytest.raises(StunError) as info:
        stun.parse_message(bytes(data))
    assert str(info.value) == "STUN attribute length exceeds message length"


def test_padding_is_skipped_whatever_its_value() -> None:
    data = bytearray(build((USERNAME, b"abcde"), (LIFETIME, struct.pack("!I", 600))))
    data[29:32] = b"\xff\xff\xff"
    message = stun.parse_message(bytes(data))
    assert message.attributes == {"USERNAME": "abcde", "LIFETIME": 600}


def test_fingerprint_mismatch() -> None:
    data = load("rfc5769-2.2-response-ipv4.hex")
    for corrupt in (data[:-1] + bytes([data[-1] ^ 1]), data[:24] + b"T" + data[25:]):
        with pytest.raises(StunError) as info:
            stun.parse_message(corrupt)
        assert str(info.value) == "STUN message fingerprint does not match"


def test_fingerprint_must_be_last() -> None:
    # A correct FINGERPRINT (CRC-32 over the header with the final length) followed by LIFETIME.
    header = struct.pack("!HHI12s", 0x0001, 16, stun.COOKIE, TID)
    crc = binascii.crc32(header) ^ 0x5354554E
    data = header + struct.pack("!HHI", FINGERPRINT, 4, crc) + struct.pack("!HHI", LIFETIME, 4, 0)
    with pytest.raises(StunError) as info:
        stun.parse_message(data)
    assert str(info.value) == "STUN FINGERPRINT is not the last attribute"


def test_fingerprint_optional() -> None:
    message = stun.parse_message(build((LIFETIME, struct.pack("!I", 600))))
    assert message.attributes == {"LIFETIME": 600}
    assert not message.check_integrity(b"any key")


def test_attributes_after_message_integrity_are_ignored() -> None:
    key = b"key"
    request = Message(Method.REFRESH, Class.REQUEST, TID, {"USERNAME": "user"})
    signed = request.encode(integrity_key=key, fingerprint=False)
    extra = struct.pack("!HHI", LIFETIME, 4, 0) + struct.pack("!HH", 0x0031, 0)
    body = signed[20:] + extra
    data = signed[:2] + struct.pack("!H", len(body)) + signed[4:20] + body
    message = stun.parse_message(data)
    assert list(message.attributes) == ["USERNAME", "MESSAGE-INTEGRITY"]
    assert message.unknown_required == ()
    assert message.check_integrity(key)


def test_fingerprint_after_message_integrity_is_checked() -> None:
    request = Message(Method.REFRESH, Class.REQUEST, TID, {"LIFETIME": 0})
    data = request.encode(integrity_key=b"key")
    message = stun.parse_message(data)
    assert list(message.attributes) == ["LIFETIME", "MESSAGE-INTEGRITY", "FINGERPRINT"]
    assert message.check_integrity(b"key")
    with pytest.raises(StunError, match="fingerprint does not match"):
        stun.parse_message(data[:-1] + bytes([data[-1] ^ 0x80]))


def test_integrity_covers_the_attributes() -> None:
    message = Message(Method.REFRESH, Class.REQUEST, TID, {"LIFETIME": 600})
    data = bytearray(message.encode(integrity_key=b"k", fingerprint=False))
    assert stun.parse_message(bytes(data)).check_integrity(b"k")
    data[27] ^= 1  # LIFETIME 600 -> 601
    tampered = stun.parse_message(bytes(data))
    assert tampered.attributes["LIFETIME"] == 601
    assert not tampered.check_integrity(b"k")


def test_integrity_of_an_unparsed_message_is_false() -> None:
    assert not Message(Method.BINDING, Class.REQUEST).check_integrity(b"key")


def test_unknown_attributes() -> None:
    data = build(
        (0x0030, b"abcd"),
        (LIFETIME, struct.pack("!I", 60)),
        (0x8030, b"xyz"),
        (0x7FFF, b""),
        (0x0030, b""),
        (0xFFFF, b"\x01"),
    )
    message = stun.parse_message(data)
    assert message.attributes == {"LIFETIME": 60}
    assert message.attribute_list == [("LIFETIME", 60)]
    assert message.unknown_required == (0x0030, 0x7FFF, 0x0030)


def test_repeated_attributes() -> None:
    peers = [("192.0.2.1", 1000), ("192.0.2.2", 2000), ("2001:db8::1", 3000)]
    data = build(*((XOR_PEER, stun.pack_xor_address(peer, TID)) for peer in peers))
    message = stun.parse_message(data)
    assert message.attributes == {"XOR-PEER-ADDRESS": peers[0]}
    assert message.attribute_list == [("XOR-PEER-ADDRESS", peer) for peer in peers]


def test_equality_ignores_attribute_list() -> None:
    message = Message(Method.ALLOCATE, Class.REQUEST, TID, {"REQUESTED-TRANSPORT": 17})
    parsed = stun.parse_message(message.encode(fingerprint=False))
    assert parsed.attribute_list == [("REQUESTED-TRANSPORT", 17)]
    assert parsed == message


@pytest.mark.parametrize(
    ("attribute", "error"),
    [
        ((XOR_MAPPED, b"\x00\x03\x00\x01" + bytes(4)), "STUN address has unknown family 0x03"),
        ((XOR_MAPPED, b"\x00\x00\x00\x01" + bytes(4)), "STUN address has unknown family 0x00"),
        ((XOR_MAPPED, b"\x00\x01\x00\x01" + bytes(16)), "STUN address has invalid length for IPv4"),
        ((XOR_MAPPED, b"\x00\x01\x00\x01" + bytes(3)), "STUN address has invalid length for IPv4"),
        ((XOR_PEER, b"\x00\x02\x00\x01" + bytes(4)), "STUN address has invalid length for IPv6"),
        ((0x0001, b"\x00\x02\x00\x01" + bytes(17)), "STUN address has invalid length for IPv6"),
        ((0x0001, b"\x00\x01"), "STUN address is shorter than 4 bytes"),
        ((0x0009, b"\x00\x00\x04"), "STUN error code is shorter than 4 bytes"),
        ((0x0009, b"\x00\x00\x07\x00"), "STUN error code is out of range"),
        ((0x0009, b"\x00\x00\x02\x00"), "STUN error code is out of range"),
        ((0x0009, b"\x00\x00\x04\x64"), "STUN error code is out of range"),
        ((0x0009, b"\x00\x00\x04\x01\xff"), "STUN ERROR-CODE attribute is not valid UTF-8"),
        ((0x8001, b"\x01\x00\x04"), "STUN address error code is shorter than 4 bytes"),
        ((0x000A, b"\x00\x01\x00"), "STUN UNKNOWN-ATTRIBUTES length is not a multiple of 2"),
        ((LIFETIME, b"\x00\x00"), "STUN LIFETIME attribute has length 2, expected 4"),
        ((0x000C, b"\x40\x00"), "STUN CHANNEL-NUMBER attribute has length 2, expected 4"),
        ((0x0019, b"\x11"), "STUN REQUESTED-TRANSPORT attribute has length 1, expected 4"),
        ((0x0018, b"\x80\x00"), "STUN EVEN-PORT attribute has length 2, expected 1"),
        ((0x001A, b"\x00"), "STUN DONT-FRAGMENT attribute has length 1, expected 0"),
        ((0x0008, bytes(16)), "STUN MESSAGE-INTEGRITY attribute has length 16, expected 20"),
        ((0x0022, bytes(4)), "STUN RESERVATION-TOKEN attribute has length 4, expected 8"),
        ((0x8029, bytes(4)), "STUN ICE-CONTROLLED attribute has length 4, expected 8"),
        ((FINGERPRINT, bytes(8)), "STUN FINGERPRINT attribute has length 8, expected 4"),
        ((0x001C, bytes(12)), "STUN MESSAGE-INTEGRITY-SHA256 has invalid length"),
        ((0x001C, bytes(18)), "STUN MESSAGE-INTEGRITY-SHA256 has invalid length"),
        ((0x001C, bytes(36)), "STUN MESSAGE-INTEGRITY-SHA256 attribute is longer than 32 bytes"),
        ((USERNAME, b"u" * 513), "STUN USERNAME attribute is longer than 512 bytes"),
        ((0x0014, b"r" * 763), "STUN REALM attribute is longer than 762 bytes"),
        ((0x0015, b"n" * 763), "STUN NONCE attribute is longer than 762 bytes"),
        ((USERNAME, b"\xc3\x28"), "STUN USERNAME attribute is not valid UTF-8"),
        ((0x8022, b"\xff"), "STUN SOFTWARE attribute is not valid UTF-8"),
    ],
)
def test_attribute_errors(attribute: tuple[int, bytes], error: str) -> None:
    with pytest.raises(StunError) as info:
        stun.parse_message(build(attribute))
    assert str(info.value) == error


def test_string_limits_are_inclusive() -> None:
    data = build((USERNAME, b"u" * 512), (0x0014, b"r" * 762), (0x0015, b"n" * 762))
    message = stun.parse_message(data)
    assert message.attributes == {"USERNAME": "u" * 512, "REALM": "r" * 762, "NONCE": "n" * 762}


# --- attribute values -------------------------------------------------------------------------

SAMPLES: dict[str, Any] = {
    "MAPPED-ADDRESS": ("198.51.100.7", 3478),
    "USERNAME": "1700000000:user\u00e9",
    "MESSAGE-INTEGRITY": bytes(range(20)),
    "ERROR-CODE": (438, "Stale Nonce"),
    "UNKNOWN-ATTRIBUTES": (0x0030, 0x7FFF),
    "CHANNEL-NUMBER": 0x4FFF,
    "LIFETIME": 3600,
    "XOR-PEER-ADDRESS": ("2001:db8::42", 50000),
    "DATA": b"\x00\x01payload",
    "REALM": "stunner.l7mp.io",
    "NONCE": "obMatJos2AAACf//499k954d6OL34oL9FSTvy64sA",
    "XOR-RELAYED-ADDRESS": ("10.0.0.1", 65535),
    "REQUESTED-ADDRESS-FAMILY": 2,
    "EVEN-PORT": True,
    "REQUESTED-TRANSPORT": 17,
    "DONT-FRAGMENT": None,
    "MESSAGE-INTEGRITY-SHA256": bytes(range(32)),
    "PASSWORD-ALGORITHM": b"\x00\x02\x00\x00",
    "USERHASH": bytes(range(32)),
    "XOR-MAPPED-ADDRESS": ("192.0.2.1", 32853),
    "RESERVATION-TOKEN": b"token-08",
    "PRIORITY": 0x6E0001FF,
    "USE-CANDIDATE": None,
    "CONNECTION-ID": 0xDEADBEEF,
    "ADDITIONAL-ADDRESS-FAMILY": 2,
    "ADDRESS-ERROR-CODE": (2, 440, "Address Family not Supported"),
    "PASSWORD-ALGORITHMS": b"\x00\x01\x00\x00\x00\x02\x00\x00",
    "ALTERNATE-DOMAIN": "turn.example.org",
    "ICMP": (3, 4, 1400),
    "SOFTWARE": "stunnerd",
    "ALTERNATE-SERVER": ("::1", 3478),
    "FINGERPRINT": 0xE57A3BCF,
    "ICE-CONTROLLED": 0x932FF9B151263B36,
    "ICE-CONTROLLING": 2**64 - 1,
    "RESPONSE-ORIGIN": ("203.0.113.9", 1),
    "OTHER-ADDRESS": ("2001:db8:1234:5678:11:2233:4455:6677", 0),
}


def test_every_attribute_has_a_sample() -> None:
    assert set(SAMPLES) == set(stun.ATTRIBUTES_BY_NAME)
    assert len(stun.ATTRIBUTES_BY_NAME) == len(stun.ATTRIBUTES_BY_TYPE) == len(stun.ATTRIBUTES)


@pytest.mark.parametrize("entry", stun.ATTRIBUTES, ids=lambda entry: entry.name)
def test_attribute_round_trip(entry: stun.AttributeEntry) -> None:
    value = SAMPLES[entry.name]
    args = (RFC_TID,) if entry.needs_tid else ()
    data = entry.pack(value, *args)
    if entry.length is not None:
        assert len(data) == entry.length
    assert entry.unpack(data, *args) == value
    if entry.name not in ("MESSAGE-INTEGRITY", "MESSAGE-INTEGRITY-SHA256", "FINGERPRINT"):
        message = Message(Method.ALLOCATE, Class.REQUEST, RFC_TID, {entry.name: value})
        parsed = stun.parse_message(message.encode(fingerprint=False))
        assert parsed.attributes == {entry.name: value}
        assert parsed == message


@pytest.mark.parametrize(
    ("name", "value", "wire"),
    [
        ("XOR-MAPPED-ADDRESS", ("192.0.2.1", 32853), "0001a147e112a643"),  # RFC 5769 §2.2
        ("MAPPED-ADDRESS", ("192.0.2.1", 32853), "00018055c0000201"),
        ("CHANNEL-NUMBER", 0x4001, "40010000"),
        ("LIFETIME", 600, "00000258"),
        ("REQUESTED-TRANSPORT", 17, "11000000"),
        ("REQUESTED-ADDRESS-FAMILY", 2, "02000000"),
        ("EVEN-PORT", True, "80"),
        ("EVEN-PORT", False, "00"),
        ("ERROR-CODE", (438, "Stale Nonce"), "00000426" + b"Stale Nonce".hex()),
        ("ERROR-CODE", (300, ""), "00000300"),
        ("ADDRESS-ERROR-CODE", (1, 440, "x"), "01000428" + b"x".hex()),
        ("UNKNOWN-ATTRIBUTES", (0x0030, 0x7FFF), "00307fff"),
        ("ICMP", (3, 4, 1400), "0000060400000578"),
        ("ICMP", (127, 511, 0), "0000ffff00000000"),
        ("DONT-FRAGMENT", None, ""),
        ("CONNECTION-ID", 1, "00000001"),
    ],
)
def test_attribute_wire_format(name: str, value: Any, wire: str) -> None:
    entry = stun.ATTRIBUTES_BY_NAME[name]
    args = (RFC_TID,) if entry.needs_tid else ()
    assert entry.pack(value, *args).hex() == wire
    assert entry.unpack(bytes.fromhex(wire), *args) == value


def test_xor_address_ipv6_rfc5769() -> None:
    wire = bytes.fromhex("0002a1470113a9faa5d3f179bc25f4b5bed2b9d9")
    address = ("2001:db8:1234:5678:11:2233:4455:6677", 32853)
    assert stun.unpack_xor_address(wire, RFC_TID) == address
    assert stun.pack_xor_address(address, RFC_TID) == wire


def test_reserved_bits_are_ignored() -> None:
    data = build(
        (0x000C, b"\x40\x02\xff\xff"),
        (0x0019, b"\x06\xff\xff\xff"),
        (0x0018, b"\x7f"),
        (0x0009, b"\xff\xff\xfc\x01Unauthenticated"),
    )
    assert stun.parse_message(data).attributes == {
        "CHANNEL-NUMBER": 0x4002,
        "REQUESTED-TRANSPORT": 6,
        "EVEN-PORT": False,
        "ERROR-CODE": (401, "Unauthenticated"),
    }


@pytest.mark.parametrize(
    ("attributes", "error"),
    [
        ({"NO-SUCH-THING": 1}, "STUN attribute NO-SUCH-THING is unknown"),
        ({"XOR-PEER-ADDRESS": ("not-an-ip", 1)}, "STUN address has invalid IP 'not-an-ip'"),
        ({"MAPPED-ADDRESS": ("fe80::1%eth0", 1)}, "STUN address has invalid IP 'fe80::1%eth0'"),
        (
            {"XOR-PEER-ADDRESS": ("192.0.2.1", 70000)},
            "STUN XOR-PEER-ADDRESS attribute has invalid value ('192.0.2.1', 70000)",
        ),
        ({"LIFETIME": -1}, "STUN LIFETIME attribute has invalid value -1"),
        ({"ERROR-CODE": (200, "OK")}, "STUN error code 200 is out of range"),
        ({"ADDRESS-ERROR-CODE": (1, 700, "")}, "STUN error code 700 is out of range"),
        ({"ICMP": (128, 0, 0)}, "STUN ICMP type or code is out of range"),
        (
            {"RESERVATION-TOKEN": b"short"},
            "STUN RESERVATION-TOKEN attribute has length 5, expected 8",
        ),
        ({"USERNAME": "u" * 513}, "STUN USERNAME attribute is longer than 512 bytes"),
        ({"NONCE": "\u00e9" * 382}, "STUN NONCE attribute is longer than 762 bytes"),
        ({"DATA": bytes(65521)}, "STUN message is too long"),  # 4 + 65521 + 3 + 8 > 65535
    ],
)
def test_encode_errors(attributes: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError) as info:
        Message(Method.SEND, Class.INDICATION, TID, attributes).encode()
    assert str(info.value) == error


def test_encode_rejects_an_int_for_bytes() -> None:
    with pytest.raises(TypeError):  # bytes(5) would silently encode five zero bytes
        Message(Method.SEND, Class.INDICATION, TID, {"DATA": 5}).encode()


def test_encode_rejects_bad_transaction_id() -> None:
    with pytest.raises(ValueError) as info:
        Message(Method.BINDING, Class.REQUEST, b"short").encode()
    assert str(info.value) == "STUN transaction ID must be 12 bytes"


def test_encode_largest_message() -> None:
    data = Message(Method.SEND, Class.INDICATION, TID, {"DATA": bytes(65520)}).encode()
    assert len(data) == 20 + 65532  # the largest multiple of 4 the length field holds
    assert stun.parse_message(data).attributes["DATA"] == bytes(65520)


def test_encode_layout() -> None:
    message = Message(Method.ALLOCATE, Class.REQUEST, TID, {"REQUESTED-TRANSPORT": 17})
    plain = message.encode(fingerprint=False)
    assert plain == struct.pack("!HHI12sHHI", 0x0003, 8, stun.COOKIE, TID, 0x0019, 4, 0x11000000)
    signed = message.encode(integrity_key=b"key")
    assert len(signed) == len(plain) + 24 + 8
    assert signed[2:4] == struct.pack("!H", 8 + 24 + 8)
    assert signed[28:32] == b"\x00\x08\x00\x14"
    assert signed[-8:-4] == b"\x80\x28\x00\x04"
    assert list(stun.parse_message(signed).attributes) == [
        "REQUESTED-TRANSPORT",
        "MESSAGE-INTEGRITY",
        "FINGERPRINT",
    ]


def test_encode_recomputes_integrity_and_fingerprint() -> None:
    parsed = stun.parse_message(load("rfc5769-2.1-request.hex"))
    plain = stun.parse_message(parsed.encode(fingerprint=False))
    assert "MESSAGE-INTEGRITY" not in plain.attributes
    assert "FINGERPRINT" not in plain.attributes
    assert plain.attributes["USERNAME"] == "evtj:h6vY"


def test_golden_allocate_response() -> None:
    """A TURN Allocate success response as stunnerd sends it, pinned byte for byte."""
    data = load("allocate-success.hex")
    response = Message(
        Method.ALLOCATE,
        Class.SUCCESS,
        RFC_TID,
        {
            "XOR-RELAYED-ADDRESS": ("10.0.0.1", 49152),
            "LIFETIME": 600,
            "XOR-MAPPED-ADDRESS": ("2001:db8::7", 50000),
        },
    )
    assert response.encode(integrity_key=SHORT_TERM_KEY) == data
    parsed = stun.parse_message(data)
    assert parsed.check_integrity(SHORT_TERM_KEY)
    assert parsed.attributes["XOR-MAPPED-ADDRESS"] == ("2001:db8::7", 50000)
    independent = aioice.stun.parse_message(data)  # also verifies the FINGERPRINT
    assert independent.check_message_integrity(SHORT_TERM_KEY)
    assert independent.attributes["XOR-RELAYED-ADDRESS"] == ("10.0.0.1", 49152)
    assert independent.attributes["XOR-MAPPED-ADDRESS"] == ("2001:db8::7", 50000)


# --- interoperability with aioice (an independent implementation) -------------------------------


def test_parse_aioice_request() -> None:
    request = aioice.stun.Message(
        aioice.stun.Method.BINDING,
        aioice.stun.Class.REQUEST,
        transaction_id=TID,
        attributes={
            "USERNAME": "a:b",
            "PRIORITY": 1853824767,
            "ICE-CONTROLLING": 5,
            "USE-CANDIDATE": None,
        },
    )
    request.add_message_integrity(b"secret")
    message = stun.parse_message(bytes(request))
    assert message.attributes["USERNAME"] == "a:b"
    assert message.attributes["PRIORITY"] == 1853824767
    assert message.attributes["ICE-CONTROLLING"] == 5
    assert message.attributes["USE-CANDIDATE"] is None
    assert message.check_integrity(b"secret")
    assert not message.check_integrity(b"other")


def test_aioice_parses_our_response() -> None:
    response = Message(
        Method.ALLOCATE,
        Class.SUCCESS,
        TID,
        {
            "XOR-RELAYED-ADDRESS": ("2001:db8::1", 49152),
            "XOR-MAPPED-ADDRESS": ("192.0.2.1", 32853),
            "LIFETIME": 600,
            "ERROR-CODE": (437, "Allocation Mismatch"),
        },
    )
    parsed = aioice.stun.parse_message(response.encode(integrity_key=b"secret"))
    assert parsed.message_method == aioice.stun.Method.ALLOCATE
    assert parsed.message_class == aioice.stun.Class.RESPONSE
    assert parsed.transaction_id == TID
    assert parsed.attributes["XOR-RELAYED-ADDRESS"] == ("2001:db8::1", 49152)
    assert parsed.attributes["XOR-MAPPED-ADDRESS"] == ("192.0.2.1", 32853)
    assert parsed.attributes["LIFETIME"] == 600
    assert parsed.attributes["ERROR-CODE"] == (437, "Allocation Mismatch")
    assert parsed.check_message_integrity(b"secret")


# --- Data indications -------------------------------------------------------------------------


@pytest.mark.parametrize("peer", [("192.0.2.1", 5000), ("2001:db8::1", 65535)])
@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 5, 1200])
def test_data_indication(peer: stun.Address, size: int) -> None:
    payload = bytes(range(256)) * 5
    payload = payload[:size]
    data = stun.data_indication(peer, payload)
    assert len(data) % 4 == 0
    message = stun.parse_message(data)
    assert (message.method, message.message_class) == (Method.DATA, Class.INDICATION)
    assert message.attribute_list == [("XOR-PEER-ADDRESS", peer), ("DATA", payload)]
    # The hot path builds exactly what the general encoder builds.
    expected = Message(Method.DATA, Class.INDICATION, message.transaction_id, message.attributes)
    assert expected.encode(fingerprint=False) == data


def test_data_indication_random_transaction_id() -> None:
    first = stun.data_indication(("192.0.2.1", 1), b"x")
    second = stun.data_indication(("192.0.2.1", 1), b"x")
    assert first[8:20] != second[8:20]


def test_transaction_ids_stay_distinct_across_refills() -> None:
    # Ids come from the OS in batches; three batches' worth must never repeat or shrink.
    ids = [stun.data_indication(("192.0.2.1", 1), b"x")[8:20] for _ in range(1100)]
    assert all(len(tid) == 12 for tid in ids)
    assert len(set(ids)) == len(ids)


def test_data_indication_peer_cache_keeps_each_peer() -> None:
    for port in (1, 2, 1):
        message = stun.parse_message(stun.data_indication(("192.0.2.9", port), b"x"))
        assert message.attributes["XOR-PEER-ADDRESS"] == ("192.0.2.9", port)


def test_data_indication_too_long() -> None:
    with pytest.raises(ValueError) as info:
        stun.data_indication(("2001:db8::1", 1), bytes(65505))  # 24 + 4 + 65505 + 3 > 65535
    assert str(info.value) == "STUN message is too long"
    assert len(stun.data_indication(("2001:db8::1", 1), bytes(65504))) == 20 + 65532


# --- ChannelData ------------------------------------------------------------------------------


def test_pack_channel_data() -> None:
    assert stun.pack_channel_data(0x4001, b"abcde") == b"\x40\x01\x00\x05abcde"
    assert stun.pack_channel_data(0x4001, b"abcde", pad=True) == b"\x40\x01\x00\x05abcde\0\0\0"
    assert stun.pack_channel_data(0x4FFF, b"abcd", pad=True) == b"\x4f\xff\x00\x04abcd"
    assert stun.pack_channel_data(0x4000, b"", pad=True) == b"\x40\x00\x00\x00"
    assert load("channel-data-padded.hex") == stun.pack_channel_data(0x4001, b"hello", pad=True)


@pytest.mark.parametrize("padding", [b"", b"\0", b"\0\0", b"\xff\xff\xff"])
def test_unpack_channel_data(padding: bytes) -> None:
    data = b"\x40\x01\x00\x05hello" + padding
    assert stun.unpack_channel_data(data) == (0x4001, b"hello")
    assert stun.unpack_channel_data(bytearray(data)) == (0x4001, b"hello")
    assert stun.unpack_channel_data(memoryview(data)) == (0x4001, b"hello")


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"", "ChannelData message is shorter than 4 bytes"),
        (b"\x40\x01\x00", "ChannelData message is shorter than 4 bytes"),
        (b"\x40\x01\x00\x05hell", "ChannelData length exceeds message length"),
        (b"\x40\x01\x00\x01abcde", "ChannelData message has more than 3 bytes of padding"),
        (b"\x3f\xff\x00\x01a", "ChannelData channel number is out of range"),
        (b"\x80\x00\x00\x00", "ChannelData channel number is out of range"),
    ],
)
def test_unpack_channel_data_errors(data: bytes, error: str) -> None:
    with pytest.raises(StunError) as info:
        stun.unpack_channel_data(data)
    assert str(info.value) == error


def test_channel_numbers() -> None:
    assert not stun.is_valid_channel_number(0x3FFF)
    assert stun.is_valid_channel_number(0x4000)
    assert stun.is_valid_channel_number(0x4FFF)
    assert stun.is_valid_channel_number(0x7FFF)  # RFC 5766's range, as pion/turn accepts
    assert not stun.is_valid_channel_number(0x8000)


def test_demultiplexing() -> None:
    assert stun.is_channel_data(b"\x40")
    assert stun.is_channel_data(b"\x7f\xff\x00\x00")
    assert not stun.is_channel_data(b"")
    assert not stun.is_channel_data(b"\x00\x01")
    assert not stun.is_channel_data(b"\x80")
    assert not stun.is_channel_data(b"\xc0")
    request = build()
    assert stun.is_stun(request)
    assert stun.is_stun(memoryview(request))
    assert not stun.is_stun(request[:19])
    assert not stun.is_stun(request[:4] + b"\x00\x00\x00\x00" + request[8:])
    assert not stun.is_stun(b"\x40" + request[1:])
    assert not stun.is_stun(b"\x80" + request[1:])


# --- TCP framing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("buffer", "length"),
    [
        (b"", None),
        (b"\x00", None),
        (b"\x40\x01\x00", None),
        (b"\x00\x01\x00\x00", 20),
        (b"\x00\x01\x00\x58", 20 + 0x58),
        (b"\x40\x01\x00\x00", 4),
        (b"\x40\x01\x00\x01", 8),
        (b"\x40\x01\x00\x04", 8),
        (b"\x40\x01\x00\x05", 12),
        (b"\x7f\xff\xff\xff", 4 + 0x10000),
    ],
)
def test_stream_frame_length(buffer: bytes, length: int | None) -> None:
    assert stun.stream_frame_length(buffer) == length
    assert stun.stream_frame_length(bytearray(buffer)) == length
    assert stun.stream_frame_length(memoryview(buffer)) == length


# A fixed transaction id: the bytes name a test below, and every pytest-xdist worker must
# collect the same names (a random id made `-n 2` refuse the whole run).
BINDING = Message(Method.BINDING, Class.REQUEST, bytes(range(12))).encode()


@pytest.mark.parametrize(
    ("buffer", "error"),
    [
        (b"\x80\x00\x00\x00", "stream data is neither STUN nor ChannelData"),
        (b"\xc0\x01\x00\x04", "stream data is neither STUN nor ChannelData"),
        (b"\xde\xad\xbe\xef", "stream data is neither STUN nor ChannelData"),
        (b"\x00\x01\x00\x05", "STUN message length is not a multiple of 4"),
        (b"\x00\x01\x00\x00\x21\x12\xa4\x43", stun.STREAM_OUT_OF_STEP),
        # ChannelData of 5 bytes unpadded, then a Binding request: 3 of its bytes taken for
        # padding, the next "header" has no cookie.
        (
            (stun.pack_channel_data(0x4000, b"12345") + BINDING)[12:],
            stun.STREAM_OUT_OF_STEP,
        ),
    ],
    # BINDING's transaction id is random: ids the xdist workers agree on
    ids=["reserved", "channel-0x4001", "garbage", "unaligned", "no-cookie", "unpadded-channel"],
)
def test_stream_frame_length_garbage(buffer: bytes, error: str) -> None:
    with pytest.raises(StunError) as info:
        stun.stream_frame_length(buffer)
    assert str(info.value) == error


def test_stream_framing_splits_a_byte_stream() -> None:
    frames = [
        stun.pack_channel_data(0x4001, b"hello", pad=True),
        load("rfc5769-2.4-request-long-term.hex"),
        stun.pack_channel_data(0x4002, b"", pad=True),
        stun.pack_channel_data(0x4003, b"1234", pad=True),
        load("rfc5769-2.2-response-ipv4.hex"),
    ]
    stream = bytearray(b"".join(frames))
    received = []
    while (length := stun.stream_frame_length(stream)) is not None and len(stream) >= length:
        received.append(bytes(stream[:length]))
        del stream[:length]
    assert received == frames
    assert stream == b""
    assert stun.unpack_channel_data(received[0]) == (0x4001, b"hello")
    assert stun.parse_message(received[1]).attributes["REALM"] == "example.org"


def test_error_reasons() -> None:
    assert stun.ERROR_REASONS[401] == "Unauthenticated"
    assert stun.ERROR_REASONS[437] == "Allocation Mismatch"
    assert stun.ERROR_REASONS[508] == "Insufficient Capacity"
    assert set(stun.ERROR_REASONS) == {
        300,
        400,
        401,
        403,
        420,
        437,
        438,
        440,
        441,
        442,
        443,
        446,
        447,
        486,
        500,
        508,
    }


def test_ipv6_addresses_are_canonical() -> None:
    address = stun.unpack_address(stun.pack_address(("2001:0db8:0000::0001", 1)))
    assert address == ("2001:db8::1", 1)
    assert ipaddress.ip_address(address[0]) == ipaddress.ip_address("2001:db8::1")
