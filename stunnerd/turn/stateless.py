"""Strangers' unsigned STUN over UDP, answered without state (issue 28 #6): the Python side of
the native engine's relaycore/stateless.c.

A flood of unsigned Allocates from spoofed sources (every packet from another address) passes
every per-source budget. Such a message is therefore judged on its bytes alone and answered
without state, within budgets that do not depend on its source being honest:

- `UnsignedBudget`: a stranger's message without MESSAGE-INTEGRITY spends a token of its source
  IP's bucket (--unauthenticated-rate, issue 20), then one of the process's bucket for all of
  them (--unauthenticated-rate-total); past either it is dropped unparsed;
- `unsigned_allocate`: whether it is an Allocate request Python answers with 401 at once (no
  MESSAGE-INTEGRITY, attributes that tile the message, FINGERPRINT last and matching if any);
- `unauthorized`: that 401, built from the request's header, the realm and a nonce bound to the
  client's address (`auth.NonceManager`, `auth.nonce_binding`): what `TurnServer` encodes
  for it, byte for byte, and what the engine builds (relay_unauthorized).

The signed retry carries the nonce, which any process of the stunnerd (and its engine) verifies
with the shared secret; on the native path a stranger's request whose nonce verifies goes up to
Python through a queue of its own, so the flood cannot starve it. Pure code.
"""

from __future__ import annotations

import binascii
import functools
import struct
import time
from collections.abc import Callable
from typing import Any

from stunner_api import stun

from .limits import Limits, RateLimiter

_ALLOCATE_REQUEST = 0x0003
_ALLOCATE_ERROR = 0x0113
_MESSAGE_INTEGRITY = 0x0008
_ERROR_CODE = 0x0009
_REALM = 0x0014
_NONCE = 0x0015
_FINGERPRINT = 0x8028
_ATTRIBUTE = struct.Struct("!HH")
STRANGER_IPS = 65536  # source IPs whose unauthenticated-STUN budget is tracked at a time


def unsigned_allocate(data: bytes, max_attributes: int) -> bool:
    """Whether `data` (a stranger's datagram) is an Allocate request that `TurnServer` answers
    with 401 at once: the STUN header of one message, no MESSAGE-INTEGRITY, attributes that
    tile the message exactly, at most `max_attributes` of them (0: any number), FINGERPRINT (if
    any) last and matching. The values are not decoded (a malformed one gets its 401 too; the
    signed retry is parsed in full). relay_unsigned_allocate, byte for byte."""
    end = len(data)
    if (
        end < stun.HEADER_LENGTH
        or data[0] != 0
        or data[1] != _ALLOCATE_REQUEST
        or data[4:8] != stun.COOKIE_BYTES
        or end != stun.HEADER_LENGTH + ((data[2] << 8) | data[3])
        or end % 4
    ):
        return False
    offset, count = stun.HEADER_LENGTH, 0
    while offset < end:
        count += 1
        if max_attributes and count > max_attributes:
            return False
        kind, length = _ATTRIBUTE.unpack_from(data, offset)
        stop = offset + 4 + length
        if stop > end or kind == _MESSAGE_INTEGRITY:
            return False
        if kind == _FINGERPRINT:
            crc = binascii.crc32(data[:offset]) ^ stun.FINGERPRINT_XOR
            return length == 4 and stop == end and data[offset + 4 : stop] == crc.to_bytes(4, "big")
        offset = stop + (-length % 4)
    return True


def signed_nonce(data: bytes) -> str | None:
    """The NONCE of a STUN message that carries MESSAGE-INTEGRITY (attribute headers walked by
    their lengths, nothing verified), or None: no MESSAGE-INTEGRITY, no NONCE before it, or
    one that is not ASCII. A stranger's signed request whose nonce does not verify (one HMAC,
    `auth.NonceManager.is_valid`) is judged as an unsigned one (red team finding D: a flood
    of forged MESSAGE-INTEGRITY was parsed in full on the Python path)."""
    offset, end = stun.HEADER_LENGTH, len(data)
    nonce = None
    while offset + 4 <= end:
        kind, length = _ATTRIBUTE.unpack_from(data, offset)
        if kind == _MESSAGE_INTEGRITY:
            return nonce
        if kind == _NONCE:
            value = data[offset + 4 : offset + 4 + length]
            nonce = value.decode("ascii", "replace") if value.isascii() else None
        offset += 4 + length + (-length % 4)
    return None


def _attribute(kind: int, value: bytes) -> bytes:
    return _ATTRIBUTE.pack(kind, len(value)) + value + bytes(-len(value) % 4)


@functools.lru_cache(maxsize=8)
def _template(realm: str, nonce_length: int) -> tuple[bytes, bytes]:
    """The first 8 bytes of a 401 (its type, length and cookie), and its attributes before the
    nonce's value (ERROR-CODE 401, REALM, NONCE's header): the same in every 401 of a realm."""
    reason = stun.ERROR_REASONS[401].encode()
    body = _attribute(_ERROR_CODE, bytes((0, 0, 4, 1)) + reason) + _attribute(
        _REALM, realm.encode()
    )
    body += _ATTRIBUTE.pack(_NONCE, nonce_length)
    length = len(body) + nonce_length + (-nonce_length % 4) + 8  # FINGERPRINT counted
    return struct.pack("!HHI", _ALLOCATE_ERROR, length, stun.COOKIE), body


def unauthorized(request: bytes, realm: str, nonce: str) -> bytes:
    """The 401 to the Allocate request `request` (its header: the transaction id): ERROR-CODE
    401, REALM, NONCE, FINGERPRINT, as `TurnServer` encodes it (RFC 8489 §9.2.4: not
    integrity-protected)."""
    value = nonce.encode()
    start, body = _template(realm, len(value))
    message = start + request[8:20] + body + value + bytes(-len(value) % 4)
    crc = binascii.crc32(message) ^ stun.FINGERPRINT_XOR
    return message + struct.pack("!HHI", _FINGERPRINT, 4, crc)


class UnsignedBudget:
    """What a stranger's STUN without MESSAGE-INTEGRITY spends before it is parsed, on the
    Python path (the native engine keeps the same two buckets, relay.c and stateless.c): a
    token of its source IP's bucket (`Limits.unauthenticated_rate`, at most `ips` IPs
    tracked), then one of this process's bucket for every source (`unauthenticated_rate_total`;
    a spoofed flood comes from everywhere). A rate of 0 is no limit."""

    def __init__(
        self, limits: Limits, ips: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_ip = RateLimiter(limits.unauthenticated_rate, clock=clock, max_keys=ips)
        rate = limits.unauthenticated_rate_total
        # The total bucket as GCRA (relay_unsigned_admitted): one float per message, no key.
        self._interval = 1.0 / rate if rate > 0 else 0.0
        self._tolerance = 2.0 - self._interval
        self._tat = 0.0
        self._clock = clock

    def admit(self, address: tuple[Any, ...]) -> bool:
        return self.admit_source(address) and self.admit_total()

    def admit_source(self, address: tuple[Any, ...]) -> bool:
        """A token of the source IP's bucket (always, with no per-source limit)."""
        per_ip = self.per_ip
        return per_ip.rate <= 0 or per_ip.allow(address[0])

    def admit_total(self) -> bool:
        """A token of the bucket for every source together."""
        if not self._interval:
            return True
        now = self._clock()
        tat = self._tat if self._tat > now else now
        if tat - now > self._tolerance + 1e-9:
            return False
        self._tat = tat + self._interval
        return True
