"""What render reads of Secrets: a GatewayConfig's TURN credentials (the dataplane config's
`auth` section: the authRef Secret, which wins, or the inline fields) and a TLS listener's
certificate and key. A value read here is never echoed in an error (AuthError's messages name
the Secret, never its data).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from stunner_api.vocabulary import (
    AUTH_SECRET_PASSWORD_KEYS,
    AUTH_SECRET_SHARED_SECRET_KEYS,
    AUTH_SECRET_TYPE_KEY,
    AUTH_SECRET_USERNAME_KEYS,
    AUTH_TYPE_ALIASES,
    CORE_GROUP,
    DEFAULT_AUTH_TYPE,
    DEFAULT_REALM,
    GATEWAY_API_GROUP,
    GATEWAY_CONFIG_AUTH_TYPES,
    STUNNER_GROUP,
    TLS_CERT_KEYS,
    TLS_KEY_KEYS,
    AuthType,
)
from stunner_api.vocabulary import ConditionReason as Reason

from ..store import Kind, Object, Snapshot, namespace_of
from .context import spec_of


class AuthError(ValueError):
    """The GatewayConfig's credentials cannot be rendered; the message names what is missing
    and never holds a credential."""


def _secret_value(data: Mapping[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = data.get(key)
        if value:
            return str(value)
    return None


def _decoded(secret: Object) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            out[key] = base64.b64decode(str(value), validate=True).decode()
        except (binascii.Error, ValueError, UnicodeDecodeError):
            continue
    for key, value in (secret.get("stringData") or {}).items():
        out[key] = str(value)
    return out


def _base64_values(secret: Object) -> dict[str, str]:
    """A Secret's values base64-encoded, as the dataplane config carries them: `data` as it is,
    `stringData` (manifests written by hand) encoded; stringData wins, as the API server does."""
    out = {str(k): str(v) for k, v in (secret.get("data") or {}).items()}
    for key, value in (secret.get("stringData") or {}).items():
        out[str(key)] = base64.b64encode(str(value).encode()).decode()
    return out


def auth(gateway_config: Object, snapshot: Snapshot) -> dict[str, Any]:
    """The `auth` section from the authRef Secret (which wins) or the inline fields; with
    `stunMode: true`, type `none` (a pure STUN server, as Go's premium operator renders it) and
    no credentials: the inline ones and the authRef Secret are not read."""
    spec = spec_of(gateway_config)
    realm = spec.get("realm") or DEFAULT_REALM
    if spec.get("stunMode") is True:
        return {"type": str(AuthType.NONE), "realm": realm, "credentials": {}}
    ref = spec.get("authRef")
    if isinstance(ref, Mapping):
        namespace = str(ref.get("namespace") or namespace_of(gateway_config))
        name = str(ref.get("name") or "")
        permitted = snapshot.permits(
            (STUNNER_GROUP, "GatewayConfig", namespace_of(gateway_config)),
            (CORE_GROUP, "Secret", namespace, name),
        )
        secret = snapshot.get(Kind.SECRET, namespace, name) if permitted else None
        if secret is None:
            why = "not permitted by a ReferenceGrant" if not permitted else "not found"
            raise AuthError(
                f"missing or invalid external authentication credentials: Secret "
                f"{namespace}/{name} {why}"
            )
        data = _decoded(secret)
        raw_type = data.get(AUTH_SECRET_TYPE_KEY) or DEFAULT_AUTH_TYPE
        shown_type = f"in Secret {namespace}/{name}"  # Secret data is never echoed
        username = _secret_value(data, AUTH_SECRET_USERNAME_KEYS)
        password = _secret_value(data, AUTH_SECRET_PASSWORD_KEYS)
        shared = _secret_value(data, AUTH_SECRET_SHARED_SECRET_KEYS)
    else:
        raw_type = str(spec.get("authType") or DEFAULT_AUTH_TYPE)
        username, password = spec.get("userName"), spec.get("password")
        shared = spec.get("sharedSecret")
        shown_type = repr(str(raw_type))
    spelling = str(raw_type).lower()
    auth_type = AUTH_TYPE_ALIASES.get(spelling) if spelling in GATEWAY_CONFIG_AUTH_TYPES else None
    if auth_type is None:
        raise AuthError(f"invalid authentication type {shown_type}")
    if auth_type == AuthType.STATIC:
        if not username or not password:
            raise AuthError("missing username and/or password for plaintext authentication")
        credentials = {"username": str(username), "password": str(password)}
    else:
        if not shared:
            raise AuthError("missing shared-secret for longterm authentication")
        credentials = {"secret": str(shared)}
    out: dict[str, Any] = {"type": str(auth_type), "realm": realm, "credentials": credentials}
    return out | sessions_policy(spec)


def sessions_policy(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Ours (issue 29): `revokedUsers` as auth.revoked_users (sorted, once each), and
    `strictExpiry: true` as auth.strict_expiry, a positive `allocationBandwidthLimit` as
    auth.allocation_bandwidth_limit; nothing when unset (Go's config)."""
    out: dict[str, Any] = {}
    revoked = spec.get("revokedUsers")
    if isinstance(revoked, list):
        users = sorted({str(u) for u in revoked if isinstance(u, str) and u})
        if users:
            out["revoked_users"] = users
    if spec.get("strictExpiry") is True:
        out["strict_expiry"] = True
    limit = spec.get("allocationBandwidthLimit")
    if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
        out["allocation_bandwidth_limit"] = limit
    return out


# --- TLS --------------------------------------------------------------------------------------


def tls_pair(
    listener: Mapping[str, Any], gateway: Object, snapshot: Snapshot
) -> tuple[tuple[str, str] | None, str, str]:
    """(base64 PEM cert, base64 PEM key) of a TLS listener's first certificateRef, or None with
    the reason and message why not."""
    gw_namespace = namespace_of(gateway)
    tls = listener.get("tls") if isinstance(listener.get("tls"), Mapping) else {}
    refs = [r for r in (tls or {}).get("certificateRefs") or [] if isinstance(r, Mapping)]
    for ref in refs:
        namespace = str(ref.get("namespace") or gw_namespace)
        name = str(ref.get("name") or "")
        if not snapshot.permits(
            (GATEWAY_API_GROUP, "Gateway", gw_namespace), (CORE_GROUP, "Secret", namespace, name)
        ):
            return (
                None,
                Reason.REF_NOT_PERMITTED,
                f"certificate reference to Secret {namespace}/{name} is not permitted: create a "
                f"ReferenceGrant in {namespace} from Gateways in {gw_namespace}",
            )
        secret = snapshot.get(Kind.SECRET, namespace, name)
        if secret is None:
            continue
        data = _base64_values(secret)
        cert = next((data[k] for k in TLS_CERT_KEYS if data.get(k)), None)
        key = next((data[k] for k in TLS_KEY_KEYS if data.get(k)), None)
        if cert and key:
            return (cert, key), Reason.RESOLVED_REFS, ""
    return (
        None,
        Reason.INVALID_CERTIFICATE_REF,
        "at least one certificate reference failed to be successfully resolved",
    )
