"""stunner_api.certs: PEM decoding and the certificate/key match, shared by stunnerd's TLS and
DTLS listeners and the Gateway rule.

- A matching pair loads (RSA and EC); a mismatch, an unparsable certificate and an unparsable
  key are told apart, with messages that hold nothing of the key.
- The admission webhook's match (pair_problem) compares public keys without cryptography's RSA
  private-number consistency check, the ~27 ms of every TLS Gateway review (issue 10, fault 6):
  a key whose public numbers match but whose private numbers do not is not examined there,
  while stunnerd's load (load_pair's default) still refuses it.
"""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from stunner_api.certs import (
    MISMATCH,
    NO_CERTIFICATE,
    NO_KEY,
    CertificateError,
    decode_base64_pem,
    load_pair,
    pair_problem,
)
from tests.support.pki import key_pem, self_signed

RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY, OTHER_KEY = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())


def inconsistent_rsa_key() -> bytes:
    """RSA_KEY's public numbers with one private number off (what RSA_check_key catches)."""
    n = RSA_KEY.private_numbers()
    broken = rsa.RSAPrivateNumbers(n.p, n.q, n.d, n.dmp1 + 2, n.dmq1, n.iqmp, n.public_numbers)
    return key_pem(broken.private_key(unsafe_skip_rsa_key_validation=True))


@pytest.mark.parametrize("key", [RSA_KEY, EC_KEY], ids=["rsa", "ec"])
def test_a_matching_pair_loads(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> None:
    pair = load_pair(self_signed(key), key_pem(key))
    assert pair.key.public_key() == key.public_key()
    assert pair_problem(self_signed(key), key_pem(key)) is None


@pytest.mark.parametrize(
    ("cert", "key", "part", "message"),
    [
        (self_signed(EC_KEY), key_pem(OTHER_KEY), "pair", MISMATCH),
        (self_signed(EC_KEY), key_pem(RSA_KEY), "pair", MISMATCH),
        (
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            key_pem(EC_KEY),
            "cert",
            NO_CERTIFICATE,
        ),
        (self_signed(EC_KEY), self_signed(EC_KEY), "key", NO_KEY),
    ],
    ids=["other-key", "other-algorithm", "bad-cert", "cert-as-key"],
)
def test_problems_are_told_apart(cert: bytes, key: bytes, part: str, message: str) -> None:
    with pytest.raises(CertificateError) as info:
        load_pair(cert, key)
    assert (info.value.part, str(info.value)) == (part, message)
    assert pair_problem(cert, key) == message
    assert key.decode() not in message


def test_the_webhooks_match_skips_the_rsa_consistency_check() -> None:
    broken = inconsistent_rsa_key()
    assert pair_problem(self_signed(RSA_KEY), broken) is None  # public keys match: that's all
    with pytest.raises(CertificateError, match=NO_KEY):
        load_pair(self_signed(RSA_KEY), broken)  # stunnerd, which signs with it, refuses it


def test_decode_base64_pem() -> None:
    pem = self_signed(EC_KEY)
    assert decode_base64_pem(base64.b64encode(pem).decode(), "cert") == pem
    with pytest.raises(ValueError, match="^cert is not valid base64 PEM: bad base64$"):
        decode_base64_pem("not base64!", "cert")
    with pytest.raises(ValueError, match="^key is not valid base64 PEM: no PEM block"):
        decode_base64_pem(base64.b64encode(b"text").decode(), "key")


def test_the_match_is_memoised_by_digest_and_keeps_no_key_material() -> None:
    from stunner_api import certs

    cert, key, other = self_signed(EC_KEY), key_pem(EC_KEY), key_pem(OTHER_KEY)
    assert pair_problem(cert, key) is None
    assert pair_problem(cert, other) == MISMATCH  # the digest covers the key, not the cert alone
    assert pair_problem(cert, key) is None  # answered from the memo, the same
    for digest, answer in list(certs._pair_memo.items()):
        assert len(digest) == 32 and (answer is None or "PRIVATE KEY" not in answer)
    for n in range(certs.PAIR_MEMO_SIZE + 10):  # bounded
        pair_problem(cert + b"\n" * n, key)
    assert len(certs._pair_memo) == certs.PAIR_MEMO_SIZE
