"""Certificates and keys: PEM decoding and the certificate/key match, for stunnerd's TLS and DTLS
listeners and for the rules that check a Gateway's certificateRefs.

Messages say what is wrong, never what the key or certificate holds.

The match compares the public key in the certificate with the one derived from the private key.
cryptography's RSA consistency check of the private numbers (~27 ms for a 2048-bit key) is not
needed for that: the admission webhook, which matches a Gateway's certificate on every review,
skips it (`check_private_numbers=False`, issue 10); stunnerd, which loads a key once per config
and then signs with it, keeps it, so a key with broken private numbers is refused at apply.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

NO_CERTIFICATE = "no PEM X.509 certificate could be parsed"
NO_KEY = "no unencrypted PEM private key could be parsed"
MISMATCH = "key does not match the certificate (different public keys)"


class CertificateError(ValueError):
    """A certificate/key pair is unusable; `part` says which side ("cert", "key" or "pair")."""

    def __init__(self, part: Literal["cert", "key", "pair"], message: str) -> None:
        super().__init__(message)
        self.part = part


@dataclass(frozen=True)
class CertificatePair:
    chain: list[x509.Certificate]  # the leaf first
    key: PrivateKeyTypes


def decode_base64_pem(value: str, what: str) -> bytes:
    """The PEM bytes of a base64-encoded PEM value (the dataplane config's `cert`/`key`);
    ValueError naming `what` and the problem."""
    try:
        pem = base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what} is not valid base64 PEM: bad base64") from None
    if b"-----BEGIN " not in pem:
        raise ValueError(f"{what} is not valid base64 PEM: no PEM block after base64 decoding")
    return pem


def _public_key_der(key: x509.Certificate | PrivateKeyTypes) -> bytes:
    public = key.public_key()
    return public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def load_pair(
    cert_pem: bytes, key_pem: bytes, check_private_numbers: bool = True
) -> CertificatePair:
    """The certificate chain and its private key, checked to belong together (public keys
    compared); CertificateError otherwise. `check_private_numbers=False` skips the RSA private
    key consistency check (a match needs only the public key)."""
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except (ValueError, UnsupportedAlgorithm):
        raise CertificateError("cert", NO_CERTIFICATE) from None
    try:
        key = serialization.load_pem_private_key(
            key_pem, password=None, unsafe_skip_rsa_key_validation=not check_private_numbers
        )
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise CertificateError("key", NO_KEY) from None
    try:
        matches = _public_key_der(chain[0]) == _public_key_der(key)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        matches = False
    if not matches:
        raise CertificateError("pair", MISMATCH)
    return CertificatePair(chain, key)


# Memoised: the reconciler asks it for every TLS listener in each render, and Gateways share
# certificate Secrets. Keyed by a SHA-256 digest of the pair, so the memo keeps no key material
# (an lru_cache would keep the private keys of up to PAIR_MEMO_SIZE Secrets alive, deleted or
# not); what it keeps, the answer, never holds Secret content.
PAIR_MEMO_SIZE = 256
_pair_memo: OrderedDict[bytes, str | None] = OrderedDict()
_pair_memo_lock = threading.Lock()


def pair_problem(cert_pem: bytes, key_pem: bytes) -> str | None:
    """Why a PEM certificate and key do not belong together, or None when they do; the RSA
    private numbers are not checked (the admission webhook's question, on every review)."""
    digest = hashlib.sha256(len(cert_pem).to_bytes(8, "big") + cert_pem + key_pem).digest()
    with _pair_memo_lock:
        if digest in _pair_memo:
            _pair_memo.move_to_end(digest)
            return _pair_memo[digest]
    try:
        load_pair(cert_pem, key_pem, check_private_numbers=False)
        answer = None
    except CertificateError as e:
        answer = str(e)
    with _pair_memo_lock:
        _pair_memo[digest] = answer
        while len(_pair_memo) > PAIR_MEMO_SIZE:
            _pair_memo.popitem(last=False)
    return answer
