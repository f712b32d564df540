"""Rules of a GatewayConfig: realm, authentication (inline or an authRef Secret, neither needed
with stunMode), log level and the LoadBalancer Service annotations. Every problem but an
annotation's invalidates the GatewayClasses using it, so its reason is InvalidParameters; render
ignores a refused annotation (the default applies, as in Go), and its reason is the annotation
rule's, Invalid."""

from __future__ import annotations

from typing import Any

from stunner_api.annotations import GATEWAY_CONFIG
from stunner_api.bandwidth import MAX_BANDWIDTH_LIMIT, MIN_BANDWIDTH_LIMIT
from stunner_api.rules.base import (
    Problem,
    Request,
    annotation_problems,
    as_dict,
    error,
    quote_list,
    read_referenced_secret,
    schema_problems,
    secret_data,
    secret_ref,
    warning,
)
from stunner_api.vocabulary import (
    AUTH_SECRET_PASSWORD_KEYS,
    AUTH_SECRET_SHARED_SECRET_KEYS,
    AUTH_SECRET_TYPE_KEY,
    AUTH_SECRET_USERNAME_KEYS,
    AUTH_TYPE_ALIASES,
    CREDENTIAL,
    DEFAULT_AUTH_TYPE,
    DEFAULT_REALM,
    DNS_NAME,
    GATEWAY_CONFIG_AUTH_TYPES,
    AuthType,
    ConditionReason,
    parse_log_spec,
    skipped_part_reason,
)

REASON = ConditionReason.INVALID_PARAMETERS
AUTH_TYPES_TEXT = "static or ephemeral (or the aliases plaintext, longterm, timewindowed)"


def gatewayconfig_schema(req: Request) -> list[Problem]:
    """Field types and required fields."""
    return schema_problems(req, REASON)


def gatewayconfig_realm(req: Request) -> list[Problem]:
    """realm is a lower-case DNS name; changing it restarts every listener (warning)."""
    realm = req.spec.get("realm")
    if realm is None:
        return []
    if not isinstance(realm, str) or not DNS_NAME.match(realm):
        return [
            error(
                "spec.realm",
                "must be a lower-case DNS name (letters a-z, digits, '-' and '.', starting and "
                f"ending with a letter or digit), like stunner.l7mp.io, got {realm!r}",
                REASON,
            )
        ]
    old_realm = (
        as_dict((req.old or {}).get("spec")).get("realm", DEFAULT_REALM) if req.old else None
    )
    if old_realm is not None and old_realm != realm:
        return [
            warning(
                "spec.realm",
                f"changing the realm from {old_realm!r} to {realm!r} restarts every "
                "TURN listener of the Gateways using this GatewayConfig",
                REASON,
            )
        ]
    return []


def _auth_type(value: Any) -> AuthType | None:
    """The canonical auth type of a GatewayConfig spelling (the default for None), or None."""
    if value is None:
        return DEFAULT_AUTH_TYPE
    text = str(value)
    return AUTH_TYPE_ALIASES[text] if text in GATEWAY_CONFIG_AUTH_TYPES else None


def gatewayconfig_auth_type(req: Request) -> list[Problem]:
    """authType is one of the types or their aliases."""
    value = req.spec.get("authType")
    if _auth_type(value) is None:
        return [error("spec.authType", f"must be {AUTH_TYPES_TEXT}, got {value!r}", REASON)]
    return []


def _stun_mode(req: Request) -> bool:
    return req.spec.get("stunMode") is True


# What STUN-only mode leaves unused: the credentials (no TURN request is served) and the quota.
STUN_MODE_IGNORES = ("authType", "userName", "password", "sharedSecret", "authRef", "userQuota")


def gatewayconfig_stun_mode(req: Request) -> list[Problem]:
    """stunMode: true makes the Gateways pure STUN servers: credentials and userQuota are not
    needed, and set they are ignored (warning, as Go's CRD documents them optional)."""
    if not _stun_mode(req):
        return []
    ignored = [key for key in STUN_MODE_IGNORES if req.spec.get(key) is not None]
    if not ignored:
        return []
    return [
        warning(
            "spec.stunMode",
            f"STUN-only mode refuses every TURN request, so {quote_list(ignored)} "
            f"{'is' if len(ignored) == 1 else 'are'} ignored",
            REASON,
        )
    ]


def gatewayconfig_inline_auth(req: Request) -> list[Problem]:
    """Without authRef: static needs userName and password, ephemeral a sharedSecret. With
    authRef, inline credentials are ignored (warning). In STUN-only mode nothing is needed."""
    spec = req.spec
    if _stun_mode(req):
        return []
    inline = [k for k in ("authType", "userName", "password", "sharedSecret") if k in spec]
    if spec.get("authRef") is not None:
        if inline:
            return [
                warning(
                    "spec.authRef",
                    f"overrides the inline {quote_list(inline)}: they are ignored",
                    REASON,
                )
            ]
        return []
    auth_type = _auth_type(spec.get("authType"))  # an unknown one is reported by its own rule
    problems: list[Problem] = []
    if auth_type == AuthType.STATIC:
        for key in ("userName", "password"):
            value = spec.get(key)
            if value is None or value == "":
                problems.append(
                    error(
                        f"spec.{key}",
                        "required for static authentication: set spec.userName and "
                        "spec.password, or point spec.authRef at a Secret",
                        REASON,
                    )
                )
            elif not isinstance(value, str) or not CREDENTIAL.match(value):
                problems.append(
                    error(
                        f"spec.{key}",
                        "may hold only letters, digits and !#$%&'*+-.^_`|~ (no spaces, quotes, "
                        "':' or '@')",
                        REASON,
                    )
                )
    elif auth_type == AuthType.EPHEMERAL and not spec.get("sharedSecret"):
        problems.append(
            error(
                "spec.sharedSecret",
                "required for ephemeral authentication: set spec.sharedSecret, or point "
                "spec.authRef at a Secret",
                REASON,
            )
        )
    return problems


def gatewayconfig_auth_ref(req: Request) -> list[Problem]:
    """The authRef Secret holds the keys its auth type needs; a missing one is a warning. No
    message says what the Secret holds (its type value, data), only which keys are wrong. In
    STUN-only mode the Secret is not read (gatewayconfig_stun_mode warns that it is ignored)."""
    ref = req.spec.get("authRef")
    if not isinstance(ref, dict) or _stun_mode(req):
        return []
    path = "spec.authRef"
    problems, key = secret_ref(ref, path, req.namespace, REASON)
    if key is None:
        return problems
    read = read_referenced_secret(
        req,
        *key,
        path,
        "the GatewayConfig is admitted, but STUNner will refuse clients until the Secret is "
        "created",
        REASON,
    )
    if read.secret is None:
        return read.problems
    secret, where = read.secret, f"{key[0]}/{key[1]}"
    if secret.get("type", "Opaque") != "Opaque":
        problems.append(warning(path, f"Secret {where} is not of type Opaque", REASON))
    data = secret_data(secret)
    bad = sorted(k for k, v in data.items() if v is None)
    if bad:
        problems.append(
            error(path, f"Secret {where} holds invalid base64 in {quote_list(bad)}", REASON)
        )
        return problems
    raw_type = data.get(AUTH_SECRET_TYPE_KEY)
    auth_type = _auth_type(None if raw_type is None else raw_type.decode(errors="replace"))
    if auth_type is None:
        problems.append(
            error(
                path,
                f"Secret {where}: the 'type' key must be {AUTH_TYPES_TEXT}",
                REASON,
            )
        )
    elif auth_type == AuthType.STATIC:
        missing = [
            keys[0]
            for keys in (AUTH_SECRET_USERNAME_KEYS, AUTH_SECRET_PASSWORD_KEYS)
            if not any(data.get(k) for k in keys)
        ]
        if missing:
            problems.append(
                error(
                    path,
                    f"Secret {where} has no {' or '.join(repr(k) for k in missing)} key, which "
                    "static authentication needs: add username and password to the Secret",
                    REASON,
                )
            )
    elif not any(data.get(k) for k in AUTH_SECRET_SHARED_SECRET_KEYS):
        problems.append(
            error(
                path,
                f"Secret {where} has no 'secret' (or 'sharedSecret') key, which ephemeral "
                "authentication needs: add the shared secret to the Secret",
                REASON,
            )
        )
    return problems


def gatewayconfig_log_level(req: Request) -> list[Problem]:
    """logLevel is read with Go STUNner's grammar; a part Go would skip is refused, named."""
    spec = req.spec.get("logLevel")
    if spec is None:
        return []
    return [
        error("spec.logLevel", skipped_part_reason(part), REASON)
        for part in parse_log_spec(str(spec)).skipped
    ]


def gatewayconfig_annotations(req: Request) -> list[Problem]:
    """loadBalancerServiceAnnotations obey the STUNner annotation rules."""
    return annotation_problems(
        as_dict(req.spec.get("loadBalancerServiceAnnotations")),
        "spec.loadBalancerServiceAnnotations",
        req.settings,
        GATEWAY_CONFIG,
        None,
    )


MAX_REVOKED_USERS = 4096  # each pod checks an Allocate's user id against them (a set)


def gatewayconfig_sessions(req: Request) -> list[Problem]:
    """revokedUsers: user ids (non-empty, at most MAX_REVOKED_USERS; a duplicate is a warning);
    strictExpiry applies to ephemeral credentials only (a warning otherwise)."""
    problems: list[Problem] = []
    revoked = req.spec.get("revokedUsers")
    if isinstance(revoked, list):
        if len(revoked) > MAX_REVOKED_USERS:
            problems.append(
                error(
                    "spec.revokedUsers",
                    f"at most {MAX_REVOKED_USERS} user ids, got {len(revoked)}: rotate the "
                    "shared secret (or the static password) instead",
                    REASON,
                )
            )
        for i, user in enumerate(revoked):
            if isinstance(user, str) and not user.strip():
                problems.append(error(f"spec.revokedUsers[{i}]", "an empty user id", REASON))
        strings = [u for u in revoked if isinstance(u, str)]
        if len(set(strings)) != len(strings):
            problems.append(warning("spec.revokedUsers", "lists a user id twice", REASON))
    if (
        req.spec.get("strictExpiry") is True
        and req.spec.get("authRef") is None
        and _auth_type(req.spec.get("authType")) != AuthType.EPHEMERAL
    ):
        problems.append(
            warning(
                "spec.strictExpiry",
                "applies to ephemeral (TURN REST) credentials only: static credentials do not "
                "expire",
                REASON,
            )
        )
    return problems


def gatewayconfig_bandwidth_limit(req: Request) -> list[Problem]:
    """allocationBandwidthLimit: bits per second, 0 (no cap) or within MIN_BANDWIDTH_LIMIT and
    MAX_BANDWIDTH_LIMIT (stunner_api.bandwidth)."""
    field = "spec.allocationBandwidthLimit"
    limit = req.spec.get("allocationBandwidthLimit")
    if limit is None or limit == 0 and not isinstance(limit, bool):
        return []
    if not isinstance(limit, int) or isinstance(limit, bool):
        return [error(field, f"must be an integer (bits per second), got {limit!r}", REASON)]
    if limit < 0:
        return [error(field, f"must not be negative (0: no cap), got {limit}", REASON)]
    if limit < MIN_BANDWIDTH_LIMIT:
        return [
            error(
                field,
                f"at least {MIN_BANDWIDTH_LIMIT} bits per second (one narrowband audio stream; "
                f"0: no cap), got {limit}: the unit is bits, not kilobits",
                REASON,
            )
        ]
    if limit > MAX_BANDWIDTH_LIMIT:
        return [error(field, f"at most {MAX_BANDWIDTH_LIMIT} bits per second, got {limit}", REASON)]
    return []


RULES = [
    gatewayconfig_schema,
    gatewayconfig_realm,
    gatewayconfig_auth_type,
    gatewayconfig_stun_mode,
    gatewayconfig_inline_auth,
    gatewayconfig_auth_ref,
    gatewayconfig_log_level,
    gatewayconfig_annotations,
    gatewayconfig_sessions,
    gatewayconfig_bandwidth_limit,
]
