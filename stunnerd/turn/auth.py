"""TURN authentication: long-term credentials, TURN REST ephemeral usernames, stateless nonces.

Pure code: no I/O, and the clock is injected wherever time matters.

- `long_term_key` is the RFC 8489 §9.2.2 key, MD5("username:realm:password"). Like pion/turn's
  GenerateAuthKey (and so Go STUNner), no SASLprep/OpaqueString is applied.
- Ephemeral credentials follow draft-uberti-behave-turn-rest-00 as Go STUNner does (coturn
  `use-auth-secret` compatible): the username carries a UNIX expiry timestamp, the password is
  base64(HMAC-SHA1(secret, username)).
- `NonceManager` issues nonces that carry their own expiry and an HMAC over it, so nothing is
  stored per client and every worker process sharing the secret accepts every other's nonces;
  the native engine issues and verifies the same nonces with the same secret (issue 28:
  relaycore/stateless.c), bound to the same bytes (`nonce_binding`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Mapping

from stunner_api.dataplane import AUTH_TYPES
from stunner_api.ice import USERNAME_SEPARATOR, ephemeral_password

log = logging.getLogger("stunner.auth")


# strconv.Atoi (base 10): an optional sign, then ASCII digits only; the value must fit an int64.
_GO_ATOI = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class AuthError(Exception):
    """An authentication configuration or credential is not acceptable; the text says why."""


def long_term_key(username: str, realm: str, password: str) -> bytes:
    """The STUN long-term credential key: MD5("username:realm:password") (RFC 8489 §9.2.2)."""
    return hashlib.md5(f"{username}:{realm}:{password}".encode(), usedforsecurity=False).digest()


def _parse_go_int(text: str) -> int | None:
    """`strconv.Atoi(text)`: the integer, or None where Go returns an error."""
    if not _GO_ATOI.fullmatch(text):
        return None
    value = int(text)
    return value if _INT64_MIN <= value <= _INT64_MAX else None


def _first_integer(parts: list[str]) -> tuple[int, int] | None:
    """(position, value) of the first part that `strconv.Atoi` accepts, or None."""
    for position, part in enumerate(parts):
        value = _parse_go_int(part)
        if value is not None:
            return position, value
    return None


def check_time_windowed_username(username: str, now: float) -> str:
    """Check a TURN REST username at time `now` (UNIX seconds) and return its user id.

    As Go STUNner's CheckTimeWindowedUsername: the username is split on ':' and the first
    component that parses as an integer is the expiry timestamp, wherever it stands. A missing
    or zero timestamp is invalid; a timestamp before the current second has expired. The user id
    is the second component of "timestamp:userid", otherwise the whole username.
    """
    parts = username.split(USERNAME_SEPARATOR)
    found = _first_integer(parts)
    if found is None:
        raise AuthError(f"invalid time-windowed username {username!r}: no timestamp")
    index, expiry = found
    if expiry == 0:
        raise AuthError(f"invalid time-windowed username {username!r}: zero timestamp")
    if expiry < int(now):
        raise AuthError(f"expired time-windowed username {username!r}")
    if len(parts) == 2 and index == 0:
        return parts[1]
    return username


def _required(auth_type: str, credentials: Mapping[str, str], key: str) -> str:
    value = credentials.get(key)
    if not value:
        raise AuthError(f"{auth_type} authentication needs a non-empty credential {key!r}")
    return value


class Authenticator:
    """Maps a USERNAME to its long-term key under one auth config (static, ephemeral or none).

    `key_for(username)` gives the key or None; `reason_for(username)` tells why it was None,
    in words fit for a log line (never a secret). `user_id(username)` is the identity quotas
    are counted against.
    """

    def __init__(
        self,
        auth_type: str,
        realm: str,
        credentials: Mapping[str, str],
        clock: Callable[[], float] = time.time,
    ) -> None:
        normalized = AUTH_TYPES.get(auth_type.strip().lower())
        if normalized is None:
            raise AuthError(f"unknown authentication type {auth_type!r}")
        self.auth_type = normalized
        self.stun_only = normalized == "none"  # an attribute: read for every message (turn.py)
        self.realm = realm
        self._clock = clock
        self._static_username = ""
        self._static_key = b""
        self._secret = ""
        if normalized == "static":
            self._static_username = _required("static", credentials, "username")
            password = _required("static", credentials, "password")
            self._static_key = long_term_key(self._static_username, realm, password)
        elif normalized == "ephemeral":
            self._secret = _required("ephemeral", credentials, "secret")

    def _check(self, username: str) -> tuple[bytes | None, str]:
        """The key for `username`, or None with the reason."""
        if self.auth_type == "static":
            if username != self._static_username:
                return None, "unknown username"
            return self._static_key, ""
        if self.auth_type == "ephemeral":
            try:
                check_time_windowed_username(username, self._clock())
            except AuthError as exc:
                return None, str(exc)
            password = ephemeral_password(self._secret, username)
            return long_term_key(username, self.realm, password), ""
        return None, "authentication is disabled (auth type none)"

    def key_for(self, username: str) -> bytes | None:
        """The long-term key of `username`, or None when this username cannot authenticate."""
        return self._check(username)[0]

    def reason_for(self, username: str) -> str:
        """Why `key_for(username)` is None ("" when it is not)."""
        return self._check(username)[1]

    def expiry_of(self, username: str) -> float | None:
        """The UNIX time an ephemeral username's timestamp says it expires, else None."""
        if self.auth_type != "ephemeral":
            return None
        found = _first_integer(username.split(USERNAME_SEPARATOR))
        return float(found[1]) if found is not None else None

    def user_id(self, username: str) -> str:
        """The identity quotas count: the TURN REST user id for ephemeral, else the username."""
        if self.auth_type == "ephemeral":
            try:
                return check_time_windowed_username(username, self._clock())
            except AuthError:
                return username
        return username


_NONCE_EXPIRY_HEX = 16  # 64-bit big-endian expiry in milliseconds
_NONCE_MAC_HEX = 32  # HMAC-SHA256 truncated to 128 bits
_NONCE_FORMAT = re.compile(f"[0-9a-f]{{{_NONCE_EXPIRY_HEX + _NONCE_MAC_HEX}}}")


_V4_MAPPED = bytes(10) + b"\xff\xff"


def nonce_binding(listener: str, address: tuple[str, int]) -> bytes:
    """What a nonce is bound to: a listener (its name) and one client address, so that a nonce
    is good on one 5-tuple only (issue 15: a captured request replayed from another port gets
    438). The listener's name, NUL, the client's IP as 16 bytes (IPv4 as IPv4-mapped IPv6, a
    zone index dropped) and its port as 2 bytes big-endian: the bytes the native engine binds
    its nonces to (relaycore/stateless.c), so either side verifies the other's."""
    ip, port = address
    if ":" in ip:
        packed = socket.inet_pton(socket.AF_INET6, ip.partition("%")[0])
    else:
        packed = _V4_MAPPED + socket.inet_aton(ip)
    return listener.encode() + b"\0" + packed + port.to_bytes(2, "big")


class NonceManager:
    """Stateless nonces: hex(expiry in ms) followed by a truncated HMAC-SHA256 over that text
    and what the nonce is bound to (`binding`: the turn server passes `nonce_binding` of its
    listener and the client's address, so a nonce is good on one 5-tuple only, yet nothing is
    stored).

    Workers that share `secret` verify each other's nonces, and so does the native engine of
    every process (`secret` is handed to it; it is never logged). A nonce is 48 lowercase hex
    characters: printable, safe inside a quoted-string, well under RFC 8489's 128 characters.
    """

    def __init__(
        self,
        secret: bytes | None = None,
        lifetime: float = 600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if secret is None:
            secret = os.urandom(32)
        if not secret:
            raise ValueError("nonce secret must not be empty")
        if lifetime <= 0:
            raise ValueError(f"nonce lifetime must be positive, got {lifetime}")
        self._secret = secret
        self.lifetime = lifetime
        self._clock = clock
        key = hashlib.sha256(secret).digest() if len(secret) > 64 else secret
        block = key.ljust(64, b"\0")
        self._pads = (
            hashlib.sha256(bytes(b ^ 0x36 for b in block)),
            hashlib.sha256(bytes(b ^ 0x5C for b in block)),
        )

    @property
    def secret(self) -> bytes:
        """The key (for the native engine of this process, which issues the same nonces)."""
        return self._secret

    def _mac(self, expiry_hex: str, binding: bytes) -> str:
        """HMAC-SHA256 (RFC 2104) of the nonce's text, from the key's inner and outer digest
        states computed once (`_pads`): ~1 us where hmac.new or hmac.digest take 2-3 us with
        OpenSSL 3 (a flood of unsigned Allocates is answered with a nonce each: issue 28).
        tests/stunnerd/test_nonces.py checks it against hmac.digest."""
        inner, outer = self._pads
        text = expiry_hex.encode("ascii") + b"\0" + binding
        mac = inner.copy()
        mac.update(text)
        done = outer.copy()
        done.update(mac.digest())
        return done.digest()[: _NONCE_MAC_HEX // 2].hex()

    def issue(self, binding: bytes = b"") -> str:
        """A fresh nonce for `binding`, valid for `lifetime` seconds from now."""
        expiry_ms = int((self._clock() + self.lifetime) * 1000)
        expiry_hex = f"{expiry_ms:0{_NONCE_EXPIRY_HEX}x}"
        return expiry_hex + self._mac(expiry_hex, binding)

    def is_valid(self, nonce: object, binding: bytes = b"") -> bool:
        """Whether `nonce` was issued with this secret for `binding` and has not expired;
        never raises."""
        if not isinstance(nonce, str) or not _NONCE_FORMAT.fullmatch(nonce):
            return False
        expiry_hex, mac = nonce[:_NONCE_EXPIRY_HEX], nonce[_NONCE_EXPIRY_HEX:]
        if not hmac.compare_digest(mac, self._mac(expiry_hex, binding)):
            return False
        return self._clock() * 1000 < int(expiry_hex, 16)
