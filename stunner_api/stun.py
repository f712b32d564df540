"""STUN and TURN wire codec: RFC 8489 (STUN), RFC 8656 (TURN), RFC 6062 (TURN over TCP).

Sans-I/O: bytes in, values out, and back. `parse_message` raises `StunError` (a `ValueError`)
with a precise message on anything malformed; encoding raises `ValueError` on values that
cannot be represented on the wire.

Every attribute is one row of `ATTRIBUTES`: its type, RFC name, pack/unpack pair, whether its
value is XORed with the transaction id (`needs_tid`) and its length limits, checked both ways.
The relay hot path (`data_indication`, `pack_channel_data`, `unpack_channel_data`) bypasses
`Message` and builds or reads the packet with one `struct` call and a concatenation.
"""

import binascii
import dataclasses
import enum
import hashlib
import hmac
import os
import socket
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

COOKIE = 0x2112A442
HEADER_LENGTH = 20
FINGERPRINT_XOR = 0x5354554E  # "STUN", RFC 8489 §14.7
TRANSACTION_ID_LENGTH = 12
MAX_LENGTH = 0xFFFF  # the 16-bit message length field

FAMILY_IPV4 = 0x01
FAMILY_IPV6 = 0x02

# RFC 5766 §11 made 0x4000-0x7FFF channel numbers; RFC 8656 §12 narrowed them to 0x4000-0x4FFF.
# Clients in the wild (coturn's, older browsers') still bind above 0x4FFF and pion/turn, hence Go
# STUNner, accepts them: for wire compatibility, so do we.
CHANNEL_MIN = 0x4000
CHANNEL_MAX = 0x7FFF

Address = tuple[str, int]
"""(IP string, port); IPv6 without brackets."""

_HEADER = struct.Struct("!HHI12s")
_ATTRIBUTE_HEADER = struct.Struct("!HH")
CHANNEL_HEADER = struct.Struct("!HH")  # channel number, length (RFC 8656 §12.4)
_ADDRESS_HEADER = struct.Struct("!BBH")
COOKIE_BYTES = _COOKIE_BYTES = COOKIE.to_bytes(4, "big")
_PADDING = (b"", b"\x00", b"\x00\x00", b"\x00\x00\x00")

# Attribute types the message walk itself acts on (RFC 8489 §14.5-14.7).
_MESSAGE_INTEGRITY = 0x0008
_MESSAGE_INTEGRITY_SHA256 = 0x001C
_FINGERPRINT = 0x8028
_XOR_PEER_ADDRESS = 0x0012
_DATA = 0x0013
_DATA_INDICATION = 0x0017  # Method.DATA | Class.INDICATION
_SEND_INDICATION = 0x0016  # Method.SEND | Class.INDICATION
SEND_INDICATION_PREFIX = _SEND_INDICATION.to_bytes(2, "big")


class Method(enum.IntEnum):
    """STUN methods (RFC 8489 §18.2, RFC 8656 §17, RFC 6062 §6.1)."""

    BINDING = 0x001
    ALLOCATE = 0x003
    REFRESH = 0x004
    SEND = 0x006
    DATA = 0x007
    CREATE_PERMISSION = 0x008
    CHANNEL_BIND = 0x009
    CONNECT = 0x00A
    CONNECTION_BIND = 0x00B
    CONNECTION_ATTEMPT = 0x00C


class Class(enum.IntEnum):
    """STUN message classes, as the C1/C0 bits sit in the message type (RFC 8489 §5)."""

    REQUEST = 0x000
    INDICATION = 0x010
    SUCCESS = 0x100
    ERROR = 0x110


ERROR_REASONS: dict[int, str] = {
    300: "Try Alternate",
    400: "Bad Request",
    401: "Unauthenticated",
    403: "Forbidden",
    420: "Unknown Attribute",
    437: "Allocation Mismatch",
    438: "Stale Nonce",
    440: "Address Family not Supported",
    441: "Wrong Credentials",
    442: "Unsupported Transport Protocol",
    443: "Peer Address Family Mismatch",
    446: "Connection Already Exists",
    447: "Connection Timeout or Failure",
    486: "Allocation Quota Reached",
    500: "Server Error",
    508: "Insufficient Capacity",
}
"""Reason phrases of RFC 8489 §14.8, RFC 8656 §19 and RFC 6062 §6.3."""


class StunError(ValueError):
    """A malformed STUN message or ChannelData frame."""


class UnknownMethodError(StunError):
    """A well-formed header with a method we do not know: a request gets 400 (RFC 8489 §6.3.1)."""

    def __init__(self, message: str, message_class: Class, transaction_id: bytes) -> None:
        super().__init__(message)
        self.message_class = message_class
        self.transaction_id = transaction_id


# --- message type ---------------------------------------------------------------------------


def _message_type(method: int, message_class: int) -> int:
    """Interleave the 12 method bits around the class bits C0 (bit 4) and C1 (bit 8)."""
    return (method & 0x000F) | ((method & 0x0070) << 1) | ((method & 0x0F80) << 2) | message_class


def _method_of(message_type: int) -> int:
    return (message_type & 0x000F) | ((message_type >> 1) & 0x0070) | ((message_type >> 2) & 0x0F80)


# --- pack/unpack pairs ----------------------------------------------------------------------


def _pack_ip(host: str) -> tuple[int, bytes]:
    try:
        if ":" in host:
            return FAMILY_IPV6, socket.inet_pton(socket.AF_INET6, host)
        return FAMILY_IPV4, socket.inet_pton(socket.AF_INET, host)
    except OSError:
        raise ValueError(f"STUN address has invalid IP {host!r}") from None


def _split_address(data: bytes) -> tuple[int, int, bytes]:
    """Validate an address value: (family, port, raw IP bytes)."""
    if len(data) < 4:
        raise StunError("STUN address is shorter than 4 bytes")
    family = data[1]
    if family == FAMILY_IPV4:
        if len(data) != 8:
            raise StunError("STUN address has invalid length for IPv4")
    elif family == FAMILY_IPV6:
        if len(data) != 20:
            raise StunError("STUN address has invalid length for IPv6")
    else:
        raise StunError(f"STUN address has unknown family 0x{family:02x}")
    return family, (data[2] << 8) | data[3], data[4:]


def pack_address(value: Address) -> bytes:
    """MAPPED-ADDRESS and friends (RFC 8489 §14.1): reserved, family, port, address."""
    host, port = value
    family, raw = _pack_ip(host)
    return _ADDRESS_HEADER.pack(0, family, port) + raw


def unpack_address(data: bytes) -> Address:
    family, port, raw = _split_address(data)
    af = socket.AF_INET if family == FAMILY_IPV4 else socket.AF_INET6
    return socket.inet_ntop(af, raw), port


def _xor_mask(family: int, transaction_id: bytes) -> tuple[int, int]:
    """(mask, size): IPv4 is XORed with the cookie, IPv6 with the cookie and transaction id."""
    if family == FAMILY_IPV4:
        return COOKIE, 4
    if len(transaction_id) != TRANSACTION_ID_LENGTH:
        raise ValueError("STUN transaction ID must be 12 bytes")
    return int.from_bytes(_COOKIE_BYTES + transaction_id, "big"), 16


def pack_xor_address(addr: Address, transaction_id: bytes) -> bytes:
    """XOR-MAPPED-ADDRESS, XOR-PEER-ADDRESS, XOR-RELAYED-ADDRESS (RFC 8489 §14.2)."""
    host, port = addr
    family, raw = _pack_ip(host)
    mask, size = _xor_mask(family, transaction_id)
    xored = (int.from_bytes(raw, "big") ^ mask).to_bytes(size, "big")
    return _ADDRESS_HEADER.pack(0, family, port ^ (COOKIE >> 16)) + xored


def unpack_xor_address(data: bytes, transaction_id: bytes) -> Address:
    family, port, raw = _split_address(data)
    mask, size = _xor_mask(family, transaction_id)
    ip = (int.from_bytes(raw, "big") ^ mask).to_bytes(size, "big")
    af = socket.AF_INET if family == FAMILY_IPV4 else socket.AF_INET6
    return socket.inet_ntop(af, ip), port ^ (COOKIE >> 16)


def pack_bytes(value: bytes) -> bytes:
    return memoryview(value).tobytes()  # bytes(5) would be five zeros; memoryview(5) raises


def unpack_bytes(data: bytes) -> bytes:
    return data


def pack_string(value: str) -> bytes:
    return value.encode("utf-8")


def unpack_string(data: bytes) -> str:
    return data.decode("utf-8")  # UnicodeDecodeError becomes a StunError naming the attribute


def pack_none(value: None) -> bytes:
    return b""


def unpack_none(data: bytes) -> None:
    return None


def pack_unsigned(value: int) -> bytes:
    return struct.pack("!I", value)


def unpack_unsigned(data: bytes) -> int:
    return int.from_bytes(data, "big")


def pack_unsigned_64(value: int) -> bytes:
    return struct.pack("!Q", value)


def pack_channel_number(value: int) -> bytes:
    """CHANNEL-NUMBER (RFC 8656 §18.1): 16-bit number, 16 bits RFFU."""
    return struct.pack("!H2x", value)


def unpack_channel_number(data: bytes) -> int:
    return (data[0] << 8) | data[1]


def pack_octet(value: int) -> bytes:
    """REQUESTED-TRANSPORT, REQUESTED-/ADDITIONAL-ADDRESS-FAMILY: one byte, 3 bytes RFFU."""
    return struct.pack("!B3x", value)


def unpack_octet(data: bytes) -> int:
    return data[0]


def pack_even_port(value: bool) -> bytes:
    """EVEN-PORT (RFC 8656 §18.7): the R bit asks to reserve the next port too."""
    return b"\x80" if value else b"\x00"


def unpack_even_port(data: bytes) -> bool:
    return bool(data[0] & 0x80)


def _pack_code(code: int) -> bytes:
    if not 300 <= code <= 699:
        raise ValueError(f"STUN error code {code} is out of range")
    return bytes((code // 100, code % 100))


def _unpack_code(data: bytes) -> int:
    code_class, number = data[2] & 0x07, data[3]
    if not 3 <= code_class <= 6 or number > 99:
        raise StunError("STUN error code is out of range")
    return code_class * 100 + number


def pack_error_code(value: tuple[int, str]) -> bytes:
    """ERROR-CODE (RFC 8489 §14.8): 21 reserved bits, class (3 bits), number, reason."""
    code, reason = value
    return b"\x00\x00" + _pack_code(code) + reason.encode("utf-8")


def unpack_error_code(data: bytes) -> tuple[int, str]:
    if len(data) < 4:
        raise StunError("STUN error code is shorter than 4 bytes")
    return _unpack_code(data), data[4:].decode("utf-8")


def pack_address_error(value: tuple[int, int, str]) -> bytes:
    """ADDRESS-ERROR-CODE (RFC 8656 §18.12): family, reserved, class, number, reason."""
    family, code, reason = value
    return bytes((family, 0)) + _pack_code(code) + reason.encode("utf-8")


def unpack_address_error(data: bytes) -> tuple[int, int, str]:
    if len(data) < 4:
        raise StunError("STUN address error code is shorter than 4 bytes")
    return data[0], _unpack_code(data), data[4:].decode("utf-8")


def pack_types(value: tuple[int, ...]) -> bytes:
    """UNKNOWN-ATTRIBUTES (RFC 8489 §14.13): a list of 16-bit attribute types."""
    return struct.pack(f"!{len(value)}H", *value)


def unpack_types(data: bytes) -> tuple[int, ...]:
    if len(data) % 2:
        raise StunError("STUN UNKNOWN-ATTRIBUTES length is not a multiple of 2")
    return struct.unpack(f"!{len(data) // 2}H", data)


def pack_icmp(value: tuple[int, int, int]) -> bytes:
    """ICMP (RFC 8656 §18.13): 16 bits reserved, type (7 bits), code (9 bits), error data."""
    icmp_type, icmp_code, error_data = value
    if not (0 <= icmp_type < 0x80 and 0 <= icmp_code < 0x200):
        raise ValueError("STUN ICMP type or code is out of range")
    return struct.pack("!HHI", 0, (icmp_type << 9) | icmp_code, error_data)


def unpack_icmp(data: bytes) -> tuple[int, int, int]:
    _, word, error_data = struct.unpack("!HHI", data)
    return word >> 9, word & 0x1FF, error_data


def unpack_sha256(data: bytes) -> bytes:
    """MESSAGE-INTEGRITY-SHA256 (RFC 8489 §14.6): a truncation to 16..32 bytes, by 4."""
    if len(data) < 16 or len(data) % 4:
        raise StunError("STUN MESSAGE-INTEGRITY-SHA256 has invalid length")
    return data


# --- the attribute table --------------------------------------------------------------------


class AttributeEntry(NamedTuple):
    type: int
    name: str
    pack: Callable[..., bytes]
    unpack: Callable[..., Any]
    needs_tid: bool = False  # pack(value, transaction_id) / unpack(data, transaction_id)
    length: int | None = None  # fixed value length
    max_length: int | None = None


_ADDR = (pack_address, unpack_address)
_XOR = (pack_xor_address, unpack_xor_address, True)
_BYTES = (pack_bytes, unpack_bytes)
_STRING = (pack_string, unpack_string)
_U32 = (pack_unsigned, unpack_unsigned, False, 4)
_U64 = (pack_unsigned_64, unpack_unsigned, False, 8)
_OCTET = (pack_octet, unpack_octet, False, 4)
_EMPTY = (pack_none, unpack_none, False, 0)

ATTRIBUTES: list[AttributeEntry] = [
    AttributeEntry(0x0001, "MAPPED-ADDRESS", *_ADDR),
    AttributeEntry(0x0006, "USERNAME", *_STRING, max_length=512),
    AttributeEntry(0x0008, "MESSAGE-INTEGRITY", *_BYTES, length=20),
    AttributeEntry(0x0009, "ERROR-CODE", pack_error_code, unpack_error_code),
    AttributeEntry(0x000A, "UNKNOWN-ATTRIBUTES", pack_types, unpack_types),
    AttributeEntry(0x000C, "CHANNEL-NUMBER", pack_channel_number, unpack_channel_number, length=4),
    AttributeEntry(0x000D, "LIFETIME", *_U32),
    AttributeEntry(0x0012, "XOR-PEER-ADDRESS", *_XOR),
    AttributeEntry(0x0013, "DATA", *_BYTES),
    AttributeEntry(0x0014, "REALM", *_STRING, max_length=762),
    AttributeEntry(0x0015, "NONCE", *_STRING, max_length=762),
    AttributeEntry(0x0016, "XOR-RELAYED-ADDRESS", *_XOR),
    AttributeEntry(0x0017, "REQUESTED-ADDRESS-FAMILY", *_OCTET),
    AttributeEntry(0x0018, "EVEN-PORT", pack_even_port, unpack_even_port, length=1),
    AttributeEntry(0x0019, "REQUESTED-TRANSPORT", *_OCTET),
    AttributeEntry(0x001A, "DONT-FRAGMENT", *_EMPTY),
    AttributeEntry(0x001C, "MESSAGE-INTEGRITY-SHA256", pack_bytes, unpack_sha256, max_length=32),
    AttributeEntry(0x001D, "PASSWORD-ALGORITHM", *_BYTES),
    AttributeEntry(0x001E, "USERHASH", *_BYTES, length=32),
    AttributeEntry(0x0020, "XOR-MAPPED-ADDRESS", *_XOR),
    AttributeEntry(0x0022, "RESERVATION-TOKEN", *_BYTES, length=8),
    AttributeEntry(0x0024, "PRIORITY", *_U32),
    AttributeEntry(0x0025, "USE-CANDIDATE", *_EMPTY),
    AttributeEntry(0x002A, "CONNECTION-ID", *_U32),
    AttributeEntry(0x8000, "ADDITIONAL-ADDRESS-FAMILY", *_OCTET),
    AttributeEntry(0x8001, "ADDRESS-ERROR-CODE", pack_address_error, unpack_address_error),
    AttributeEntry(0x8002, "PASSWORD-ALGORITHMS", *_BYTES),
    AttributeEntry(0x8003, "ALTERNATE-DOMAIN", *_STRING),
    AttributeEntry(0x8004, "ICMP", pack_icmp, unpack_icmp, length=8),
    AttributeEntry(0x8022, "SOFTWARE", *_STRING),
    AttributeEntry(0x8023, "ALTERNATE-SERVER", *_ADDR),
    AttributeEntry(0x8028, "FINGERPRINT", *_U32),
    AttributeEntry(0x8029, "ICE-CONTROLLED", *_U64),
    AttributeEntry(0x802A, "ICE-CONTROLLING", *_U64),
    AttributeEntry(0x802B, "RESPONSE-ORIGIN", *_ADDR),
    AttributeEntry(0x802C, "OTHER-ADDRESS", *_ADDR),
]

ATTRIBUTES_BY_TYPE: dict[int, AttributeEntry] = {entry.type: entry for entry in ATTRIBUTES}
ATTRIBUTES_BY_NAME: dict[str, AttributeEntry] = {entry.name: entry for entry in ATTRIBUTES}

# Computed by `Message.encode`, never copied from `Message.attributes`.
_COMPUTED = frozenset({"MESSAGE-INTEGRITY", "MESSAGE-INTEGRITY-SHA256", "FINGERPRINT"})
# The only attributes honoured after MESSAGE-INTEGRITY (RFC 8489 §14.5).
_AFTER_INTEGRITY = frozenset({_MESSAGE_INTEGRITY_SHA256, _FINGERPRINT})


def _length_problem(entry: AttributeEntry, length: int) -> str | None:
    if entry.length is not None and length != entry.length:
        return f"STUN {entry.name} attribute has length {length}, expected {entry.length}"
    if entry.max_length is not None and length > entry.max_length:
        return f"STUN {entry.name} attribute is longer than {entry.max_length} bytes"
    return None


# --- messages -------------------------------------------------------------------------------


class _TransactionIds:
    """Cryptographically random transaction ids (RFC 8489 §6), drawn from the OS 340 at a
    time: a Data indication per relayed packet must not cost a getrandom() call each."""

    BATCH = 340 * TRANSACTION_ID_LENGTH

    def __init__(self) -> None:
        self._pool = b""
        self._offset = 0

    def next(self) -> bytes:
        offset = self._offset
        if offset + TRANSACTION_ID_LENGTH > len(self._pool):
            self._pool = os.urandom(self.BATCH)
            offset = 0
        self._offset = offset + TRANSACTION_ID_LENGTH
        return self._pool[offset : offset + TRANSACTION_ID_LENGTH]


_random_transaction_id = _TransactionIds().next


class Repeated(tuple[Any, ...]):
    """An attribute sent more than once, in this order: a dual allocation's two
    XOR-RELAYED-ADDRESS attributes (RFC 8656 §7.2)."""


@dataclasses.dataclass
class Message:
    """One STUN message. `attributes` holds the first occurrence of each attribute by RFC name;
    `parse_message` also fills `attribute_list` (every known attribute, in order, repeats
    included) and `unknown_required`. Equality ignores `attribute_list`."""

    method: Method
    message_class: Class
    transaction_id: bytes = dataclasses.field(default_factory=_random_transaction_id)
    attributes: dict[str, Any] = dataclasses.field(default_factory=dict)
    attribute_list: list[tuple[str, Any]] = dataclasses.field(default_factory=list, compare=False)
    unknown_required: tuple[int, ...] = ()
    _raw: bytes = dataclasses.field(default=b"", init=False, repr=False, compare=False)
    _integrity_offset: int | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False
    )

    def check_integrity(self, key: bytes) -> bool:
        """Verify MESSAGE-INTEGRITY (HMAC-SHA1, RFC 8489 §14.5) over the bytes received, with
        the length field covering up to MESSAGE-INTEGRITY. False if absent (or not parsed)."""
        offset = self._integrity_offset
        if offset is None:
            return False
        raw = self._raw
        covered = raw[:2] + struct.pack("!H", offset + 24 - HEADER_LENGTH) + raw[4:offset]
        expected = hmac.new(key, covered, hashlib.sha1).digest()
        return hmac.compare_digest(expected, raw[offset + 4 : offset + 24])

    def encode(self, integrity_key: bytes | None = None, fingerprint: bool = True) -> bytes:
        """Serialize: `attributes` in order, then MESSAGE-INTEGRITY (if a key is given), then
        FINGERPRINT. Computed attributes present in `attributes` are not copied."""
        tid = self.transaction_id
        if len(tid) != TRANSACTION_ID_LENGTH:
            raise ValueError("STUN transaction ID must be 12 bytes")
        parts = []
        for name, values in self.attributes.items():
            if name in _COMPUTED:
                continue
            entry = ATTRIBUTES_BY_NAME.get(name)
            if entry is None:
                raise ValueError(f"STUN attribute {name} is unknown")
            for value in values if isinstance(values, Repeated) else (values,):
                try:
                    data = entry.pack(value, tid) if entry.needs_tid else entry.pack(value)
                except (struct.error, OverflowError) as exc:
                    raise ValueError(f"STUN {name} attribute has invalid value {value!r}") from exc
                problem = _length_problem(entry, len(data))
                if problem is not None:
                    raise ValueError(problem)
                parts.append(_ATTRIBUTE_HEADER.pack(entry.type, len(data)))
                parts.append(data)
                parts.append(_PADDING[-len(data) % 4])
        body = b"".join(parts)
        trailer = (24 if integrity_key is not None else 0) + (8 if fingerprint else 0)
        if len(body) + trailer > MAX_LENGTH:
            raise ValueError("STUN message is too long")
        message_type = _message_type(self.method, self.message_class)
        if integrity_key is not None:
            header = _HEADER.pack(message_type, len(body) + 24, COOKIE, tid)
            mac = hmac.new(integrity_key, header + body, hashlib.sha1).digest()
            body += _ATTRIBUTE_HEADER.pack(_MESSAGE_INTEGRITY, 20) + mac
        if fingerprint:
            header = _HEADER.pack(message_type, len(body) + 8, COOKIE, tid)
            crc = binascii.crc32(header + body) ^ FINGERPRINT_XOR
            body += struct.pack("!HHI", _FINGERPRINT, 4, crc)
        return _HEADER.pack(message_type, len(body), COOKIE, tid) + body


def parse_message(data: bytes | bytearray | memoryview, max_attributes: int = 0) -> Message:
    """Parse and validate one STUN message; raise `StunError` if it is malformed.

    FINGERPRINT, when present, must be last and must match. Attributes after MESSAGE-INTEGRITY
    other than MESSAGE-INTEGRITY-SHA256 and FINGERPRINT are ignored (RFC 8489 §14.5).
    Unknown comprehension-required types (< 0x8000) are listed in `unknown_required`.
    With `max_attributes`, a message with more attributes is refused when the walk reaches
    the first one too many, before it is decoded."""
    raw = bytes(data)
    if len(raw) < HEADER_LENGTH:
        raise StunError("STUN message is shorter than 20 bytes")
    message_type, length, cookie, tid = _HEADER.unpack_from(raw)
    if message_type & 0xC000:
        raise StunError("STUN message does not start with two zero bits")
    if cookie != COOKIE:
        raise StunError("STUN message has an invalid magic cookie")
    if length % 4:
        raise StunError("STUN message length is not a multiple of 4")
    if len(raw) != HEADER_LENGTH + length:
        raise StunError("STUN message length does not match")
    message_class = Class(message_type & 0x0110)
    method_value = _method_of(message_type)
    try:
        method = Method(method_value)
    except ValueError:
        raise UnknownMethodError(
            f"STUN message has unknown method 0x{method_value:03x}", message_class, tid
        ) from None

    attributes: dict[str, Any] = {}
    attribute_list: list[tuple[str, Any]] = []
    unknown: list[int] = []
    integrity_offset: int | None = None
    protected = False  # past MESSAGE-INTEGRITY(-SHA256)
    fingerprinted = False
    offset = HEADER_LENGTH
    end = len(raw)
    budget = max_attributes or -1
    # `end - offset` stays a multiple of 4, so an attribute header always fits.
    while offset < end:
        budget -= 1
        if budget == -1:
            raise StunError(f"STUN message has more than {max_attributes} attributes")
        attr_type, attr_length = _ATTRIBUTE_HEADER.unpack_from(raw, offset)
        start = offset + 4
        stop = start + attr_length
        if stop > end:
            raise StunError("STUN attribute length exceeds message length")
        if fingerprinted:
            raise StunError("STUN FINGERPRINT is not the last attribute")
        next_offset = stop + (-attr_length % 4)
        if protected and attr_type not in _AFTER_INTEGRITY:
            offset = next_offset
            continue
        entry = ATTRIBUTES_BY_TYPE.get(attr_type)
        if entry is None:
            if attr_type < 0x8000:
                unknown.append(attr_type)
            offset = next_offset
            continue
        problem = _length_problem(entry, attr_length)
        if problem is not None:
            raise StunError(problem)
        value_data = raw[start:stop]
        try:
            value = entry.unpack(value_data, tid) if entry.needs_tid else entry.unpack(value_data)
        except UnicodeDecodeError:
            raise StunError(f"STUN {entry.name} attribute is not valid UTF-8") from None
        if attr_type == _FINGERPRINT:
            if binascii.crc32(raw[:offset]) ^ FINGERPRINT_XOR != value:
                raise StunError("STUN message fingerprint does not match")
            fingerprinted = True
        elif attr_type == _MESSAGE_INTEGRITY:
            integrity_offset = offset
            protected = True
        elif attr_type == _MESSAGE_INTEGRITY_SHA256:
            protected = True
        attribute_list.append((entry.name, value))
        attributes.setdefault(entry.name, value)
        offset = next_offset

    message = Message(method, message_class, tid, attributes, attribute_list, tuple(unknown))
    message._raw = raw
    message._integrity_offset = integrity_offset
    return message


def method_bits(data: bytes | bytearray | memoryview) -> int:
    """The method of a STUN message from its first two bytes, known or not (RFC 8489 §5: the
    class bits C1 and C0 sit between the method's)."""
    return _method_of((data[0] << 8) | data[1])


def error_to_header(header: bytes, code: int, reason: str) -> bytes:
    """An error response to the request whose 20-byte header this is: its method (known or
    not) and transaction id echoed, ERROR-CODE `code` with `reason`, nothing else (the answer
    to a request the parser would not take, before any attribute is read)."""
    message_type = (struct.unpack_from("!H", header)[0] & 0x3EEF) | Class.ERROR
    value = pack_error_code((code, reason))
    attribute = struct.pack("!HH", 0x0009, len(value)) + value + bytes(-len(value) % 4)
    return struct.pack("!HHI", message_type, len(attribute), COOKIE) + header[8:20] + attribute


def is_stun(data: bytes | bytearray | memoryview) -> bool:
    """Cheap pre-check: first two bits 0, a full header, the magic cookie."""
    return len(data) >= HEADER_LENGTH and data[0] & 0xC0 == 0 and data[4:8] == _COOKIE_BYTES


def parse_send_indication(raw: bytes) -> tuple[Address, bytes] | None:
    """The relay hot path for a Send indication (RFC 8656 §11.2): (peer, data) without building
    a `Message`, when `raw` has the plain shape: XOR-PEER-ADDRESS, DATA, optionally a matching
    FINGERPRINT last, nothing else. None for anything else (malformed, other attributes,
    duplicates), which `parse_message` then judges exactly as before."""
    if len(raw) < HEADER_LENGTH:
        return None
    message_type, length, cookie, tid = _HEADER.unpack_from(raw)
    end = len(raw)
    if (
        message_type != _SEND_INDICATION
        or cookie != COOKIE
        or length % 4
        or end != HEADER_LENGTH + length
    ):
        return None
    peer: Address | None = None
    payload: bytes | None = None
    offset = HEADER_LENGTH
    while offset < end:
        attr_type, attr_length = _ATTRIBUTE_HEADER.unpack_from(raw, offset)
        start = offset + 4
        stop = start + attr_length
        if stop > end:
            return None
        if attr_type == _XOR_PEER_ADDRESS and peer is None:
            try:
                peer = unpack_xor_address(raw[start:stop], tid)
            except StunError:
                return None
        elif attr_type == _DATA and payload is None:
            payload = raw[start:stop]
        elif attr_type == _FINGERPRINT and attr_length == 4 and stop == end:
            if binascii.crc32(raw[:offset]) ^ FINGERPRINT_XOR != int.from_bytes(raw[start:stop]):
                return None
        else:
            return None
        offset = stop + (-attr_length % 4)
    if peer is None or payload is None:
        return None
    return peer, payload


# XOR-PEER-ADDRESS values of IPv4 peers (an IPv4 XOR uses the cookie only, RFC 8489 §14.2).
_xor_peer_v4: dict[Address, bytes] = {}
_XOR_PEER_CACHE_LIMIT = 4096


def data_indication(peer: Address, payload: bytes) -> bytes:
    """A Data indication (RFC 8656 §11.3): XOR-PEER-ADDRESS and DATA, random transaction id,
    no FINGERPRINT. The relay hot path: no `Message`, no attribute table."""
    tid = _random_transaction_id()
    address = _xor_peer_v4.get(peer)
    if address is None:
        address = pack_xor_address(peer, tid)
        if address[1] == FAMILY_IPV4:  # no transaction id in an IPv4 XOR: reusable
            if len(_xor_peer_v4) >= _XOR_PEER_CACHE_LIMIT:
                _xor_peer_v4.clear()
            _xor_peer_v4[peer] = address
    size = len(payload)
    pad = -size % 4
    length = 8 + len(address) + size + pad
    if length > MAX_LENGTH:
        raise ValueError("STUN message is too long")
    return b"".join(
        (
            _HEADER.pack(_DATA_INDICATION, length, COOKIE, tid),
            _ATTRIBUTE_HEADER.pack(_XOR_PEER_ADDRESS, len(address)),
            address,
            _ATTRIBUTE_HEADER.pack(_DATA, size),
            payload,
            _PADDING[pad],
        )
    )


# --- ChannelData (RFC 8656 §12) -------------------------------------------------------------


def is_valid_channel_number(n: int) -> bool:
    return CHANNEL_MIN <= n <= CHANNEL_MAX


def is_channel_data(data: bytes | bytearray | memoryview) -> bool:
    """ChannelData starts with 0b01; STUN with 0b00 (RFC 8656 §12)."""
    return len(data) > 0 and (data[0] & 0xC0) == 0x40


def pack_channel_data(channel: int, payload: bytes, pad: bool = False) -> bytes:
    """Channel number, length, payload; `pad` to a multiple of 4 over TCP/TLS (RFC 8656 §12.5)."""
    header = CHANNEL_HEADER.pack(channel, len(payload))
    if pad:
        return header + payload + _PADDING[-len(payload) % 4]
    return header + payload


def unpack_channel_data(data: bytes | bytearray | memoryview) -> tuple[int, bytes]:
    """(channel, payload). The length field is authoritative; up to 3 bytes of padding may
    follow the payload (UDP senders may pad, stream senders must)."""
    if len(data) < 4:
        raise StunError("ChannelData message is shorter than 4 bytes")
    channel, length = CHANNEL_HEADER.unpack_from(data)
    if not CHANNEL_MIN <= channel <= CHANNEL_MAX:
        raise StunError("ChannelData channel number is out of range")
    if len(data) < 4 + length:
        raise StunError("ChannelData length exceeds message length")
    if len(data) > 4 + length + 3:
        raise StunError("ChannelData message has more than 3 bytes of padding")
    return channel, bytes(data[4 : 4 + length])


# Why a TCP/TLS stream cannot be framed (`stream_frame_length`); the native engine's stream.c
# closes a stream with the same words.
STREAM_NOT_A_FRAME = "stream data is neither STUN nor ChannelData"
STREAM_UNALIGNED = "STUN message length is not a multiple of 4"
STREAM_OUT_OF_STEP = (
    "STUN message without the magic cookie: the stream is out of step "
    "(ChannelData not padded to a multiple of 4?)"
)
FRAMING_ERRORS = frozenset({STREAM_NOT_A_FRAME, STREAM_UNALIGNED, STREAM_OUT_OF_STEP})


def stream_frame_length(buf: bytes | bytearray | memoryview) -> int | None:
    """Length of the first frame in a TCP/TLS byte stream (RFC 8656 §12.5, RFC 6062), or None
    until its 4-byte header is buffered. STUN: 20 + length, with the magic cookie (checked once
    8 bytes are buffered). ChannelData: 4 + length, padded to a multiple of 4. Anything else
    raises `StunError` (one of FRAMING_ERRORS).

    Padding is required, as RFC 8656 §12.5 says (a sender MUST pad over TCP/TLS) and as coturn
    and pion/turn frame: an unpadded ChannelData message cannot be told from a padded one, so
    the stream after it is out of step. The cookie check (coturn and pion ask for it on TCP
    too) finds that at the next STUN frame boundary, where the stream is closed with a reason
    (coturn waits silently until the client gives up), instead of waiting for a frame that
    never completes while the client's next request goes unanswered (issue 28 #11)."""
    if len(buf) < 4:
        return None
    length = (buf[2] << 8) | buf[3]
    first = buf[0] & 0xC0
    if first == 0x00:
        if length % 4:
            raise StunError(STREAM_UNALIGNED)
        if len(buf) >= 8 and buf[4:8] != COOKIE_BYTES:
            raise StunError(STREAM_OUT_OF_STEP)
        return HEADER_LENGTH + length
    if first == 0x40:
        return 4 + length + (-length % 4)
    raise StunError(STREAM_NOT_A_FRAME)
