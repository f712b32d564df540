"""The URI shorthand: `turn://user:pass@host:port?transport=udp` as a full dataplane config.

Go STUNner's `NewDefaultConfig`: `stunnerd turn://...` serves one listener from a URI alone.
The listener protocol is read from the scheme and transport with the vocabulary's protocol
table; a problem raises `dataplane.ConfigError` with the password hidden.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qs, unquote, urlsplit

from .dataplane import (
    API_VERSION,
    DEFAULT_HEALTHCHECK_ENDPOINT,
    SECRET,
    ConfigError,
    StunnerConfig,
    validate_config,
)
from .vocabulary import DEFAULT_LOG_LEVEL, DEFAULT_REALM, LISTENER_PROTOCOL_TABLE, ProtocolFacts

DEFAULT_TLS_PORT = 443  # the turns:// shorthand's default (Go STUNner)

# Names of the URI shorthand config (config.go: NewDefaultConfig).
URI_LISTENER_NAME = "default-listener"
URI_CLUSTER_NAME = "allow-any"
URI_CLUSTER_ENDPOINTS = ("0.0.0.0/0",)


def _redact_uri(uri: str) -> str:
    """The URI with its password, if any, replaced (for error messages)."""
    scheme, slashes, rest = uri.partition("://")
    userinfo, at, host = rest.partition("@")
    if slashes and at and ":" in userinfo:
        return f"{scheme}://{userinfo.partition(':')[0]}:{SECRET}@{host}"
    return uri


def _uri_protocol(scheme: str, transport: str) -> ProtocolFacts | None:
    """getStunnerProtoForURI: a TLS protocol's short name as the transport (tls, dtls) wins,
    else the scheme (turn/turns) and the transport (udp/tcp) name the protocol."""
    rows = LISTENER_PROTOCOL_TABLE.values()
    named = [row for row in rows if row.tls and transport == row.alias.lower()]
    parts = [row for row in rows if (row.scheme, row.uri_transport) == (scheme, transport)]
    return next(iter(named + parts), None)


Certificate = tuple[str, str]  # (cert, key), base64-encoded PEM


def config_from_uri(
    uri: str, certificate: Certificate | Callable[[str], Certificate] | None = None
) -> StunnerConfig:
    """A full config from `turn://user:pass@host:port?transport=udp` (NewDefaultConfig).

    Static auth with that user and password in realm stunner.l7mp.io, one listener
    "default-listener" routing to the cluster "allow-any" (STATIC, 0.0.0.0/0), health checks at
    the default endpoint. The default port is 3478, 443 for TLS/DTLS, whose listener takes
    `certificate`: (cert, key), base64 PEM, or a function making one for the URI's host
    (stunnerd passes one making a self-signed certificate, as Go does).
    """
    shown = _redact_uri(uri)
    try:
        parts = urlsplit(uri)
        port = parts.port or 0
    except ValueError as exc:
        raise ConfigError(f"invalid URI '{shown}': {exc}") from None
    transport = parse_qs(parts.query).get("transport", ["udp"])[0].lower()
    facts = _uri_protocol(parts.scheme.lower() or "turn", transport)
    if facts is None:
        raise ConfigError(f"invalid URI '{shown}': invalid scheme/protocol")
    username = unquote(parts.username or "")
    password = unquote(parts.password or "")
    if not username or not password:
        raise ConfigError(f"username/password must be set: '{shown}'")
    host = parts.netloc.rpartition("@")[2]
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    else:
        host = host.partition(":")[0]
    tls: dict[str, str] = {}
    protocol = facts.protocol.value
    if facts.tls:
        if certificate is None:
            raise ConfigError(f"{protocol} listener from URI '{shown}': needs a certificate")
        cert, key = certificate(host) if callable(certificate) else certificate
        tls = {"cert": cert, "key": key}
        port = port or DEFAULT_TLS_PORT
    return validate_config(
        {
            "version": API_VERSION,
            "admin": {
                "loglevel": DEFAULT_LOG_LEVEL,
                "healthcheck_endpoint": DEFAULT_HEALTHCHECK_ENDPOINT,
            },
            "auth": {
                "type": "static",
                "realm": DEFAULT_REALM,
                "credentials": {"username": username, "password": password},
            },
            "listeners": [
                {
                    "name": URI_LISTENER_NAME,
                    "protocol": protocol,
                    "address": host,
                    "port": port,
                    "routes": [URI_CLUSTER_NAME],
                    **tls,
                }
            ],
            "clusters": [
                {
                    "name": URI_CLUSTER_NAME,
                    "type": "STATIC",
                    "endpoints": list(URI_CLUSTER_ENDPOINTS),
                }
            ],
        }
    )
