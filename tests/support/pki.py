"""Certificates and keys for tests: a self-signed certificate for a key, a CA issuing client
and serving certificates, PEM bytes."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def self_signed(key: CertificateIssuerPrivateKeyTypes, name: str = "turn.example.com") -> bytes:
    """A PEM certificate for key's public key, signed by key, valid for a day."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = _builder(subject, subject, key, datetime.timedelta(days=1)).sign(key, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: CertificateIssuerPrivateKeyTypes,
    lifetime: datetime.timedelta,
) -> x509.CertificateBuilder:
    """A certificate of key's public key from 5 minutes ago (a skewed clock) for `lifetime`."""
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + lifetime)
    )


def key_pem(key: CertificateIssuerPrivateKeyTypes) -> bytes:
    """The unencrypted PKCS#8 PEM of key."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


LIFETIME = datetime.timedelta(hours=6)  # of an Authority's certificates


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class Authority:
    """A CA that signs client and serving certificates."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def new(cls, name: str) -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (
            _builder(subject, subject, key, LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    @property
    def pem(self) -> bytes:
        return _pem(self.cert)

    def issue(
        self,
        common_name: str,
        organizations: Iterable[str] = (),
        *,
        server: bool = False,
        names: Sequence[str] = ("localhost", "127.0.0.1"),
    ) -> tuple[bytes, bytes]:
        """(certificate PEM, key PEM): a client certificate whose CN is the user name and whose
        O entries are its groups, or (server=True) a serving certificate for `names` (DNS names
        and IP addresses)."""
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        attributes += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = _builder(x509.Name(attributes), self.cert.subject, key, LIFETIME).add_extension(
            x509.ExtendedKeyUsage([usage]), critical=False
        )
        if server:
            alternatives = [_general_name(name) for name in names]
            builder = builder.add_extension(
                x509.SubjectAlternativeName(alternatives), critical=False
            )
        cert = builder.sign(self.key, hashes.SHA256())
        return _pem(cert), key_pem(key)
