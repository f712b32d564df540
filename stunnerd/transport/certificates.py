"""Certificates of TLS and DTLS listeners, and the TURN-TLS server context.

The listener config holds its certificate and key as base64-encoded PEM (as in Go STUNner);
`stunner_api.certs` decodes them and checks that they belong together. The `turns://`
shorthand gets a self-signed certificate from here, as in Go STUNner.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import os
import ssl
import tempfile
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from stunner_api.certs import CertificateError, load_pair
from stunner_api.certs import decode_base64_pem as decode_pem

__all__ = ["decode_pem", "load_certificate", "self_signed_certificate", "server_ssl_context"]


def load_certificate(cert_b64: str, key_b64: str) -> tuple[list[x509.Certificate], Any]:
    """The certificate chain and private key, checked to belong together."""
    try:
        pair = load_pair(decode_pem(cert_b64, "cert"), decode_pem(key_b64, "key"))
    except CertificateError as exc:
        # The key's bytes never appear in a message: only that it could not be read.
        if exc.part == "pair":
            raise ValueError(str(exc)) from None
        raise ValueError(f"{exc.part} is not valid base64 PEM: {exc}") from None
    return pair.chain, pair.key


def server_ssl_context(cert_b64: str, key_b64: str) -> ssl.SSLContext:
    """A TLS >= 1.2 server context for a TURN-TLS listener."""
    chain, key = load_certificate(cert_b64, key_b64)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # The ssl module loads certificates only from files: a private directory, removed at once.
    with tempfile.TemporaryDirectory(prefix="stunner-tls-") as directory:
        os.chmod(directory, 0o700)
        cert_file = os.path.join(directory, "cert.pem")
        key_file = os.path.join(directory, "key.pem")
        pem = serialization.Encoding.PEM
        with open(cert_file, "wb") as f:
            f.write(b"".join(c.public_bytes(pem) for c in chain))
        descriptor = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as f:
            f.write(
                key.private_bytes(
                    pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
                )
            )
        try:
            context.load_cert_chain(cert_file, key_file)
        except ssl.SSLError as exc:
            raise ValueError(f"cannot use the certificate and key: {exc.reason}") from None
    return context


def self_signed_certificate(hostname: str) -> tuple[str, str]:
    """(cert, key) as base64 PEM: EC P-256, valid for a year, SAN `hostname` (DNS name or IP)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)])
    alt: x509.GeneralName
    try:
        alt = x509.IPAddress(ipaddress.ip_address(hostname))
    except ValueError:
        alt = x509.DNSName(hostname)
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return base64.b64encode(cert_pem).decode(), base64.b64encode(key_pem).decode()
