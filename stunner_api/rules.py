"""Admission rules for STUNner's resources: one table, shared by the webhook and the reconciler.

Go STUNner accepts whatever the CRD patterns allow and reports problems later, in status. These
rules refuse them at the door, with a message that names the field and says what to do:

    spec.listeners[1].port: must be between 1 and 65535, got 70000

`RULES` maps a kind to its rule functions; each rule looks at one concern and returns
``(errors, warnings)``. `validate` runs the rules of a kind and collects a `Verdict`;
`defaults_patch` computes the RFC 6902 patch that writes the documented defaults explicitly.

Rules work on the raw JSON dicts (not the models) so that a malformed object still gets precise
messages; the one `conforms_to_schema` rule reports type errors through the models of
`stunner_api.resources`. Pure: the Kubernetes API is reached only through the `Lookup` passed in.

Whose objects: GatewayClasses are ours when their controllerName is ours; Gateways when their
class is (looked up). STUNner's own kinds (GatewayConfig, UDPRoute in both API groups,
StaticService, Dataplane) are always judged; anything else gets an empty verdict.

A referenced Secret that does not exist is admitted with a warning (manifests are applied in any
order); one that exists but is unusable is refused.
"""

from __future__ import annotations

import base64
import binascii
import copy
import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from pydantic import ValidationError

from stunner_api.resources import (
    DEFAULT_ADDRESS_TYPE,
    DEFAULT_AUTH_TYPE,
    DEFAULT_DATAPLANE,
    DEFAULT_REALM,
    DEFAULT_ROUTE_NAMESPACES_FROM,
    DEFAULT_TLS_MODE,
    GATEWAY_API_GROUP,
    KINDS,
    STUNNER_GROUP,
    group_of,
)

# --- public API -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldError:
    """One refused field: `path` in dotted form with indices, `message` says what to do."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@dataclass
class Verdict:
    errors: list[FieldError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def allowed(self) -> bool:
        return not self.errors

    @property
    def message(self) -> str:
        return "; ".join(str(e) for e in self.errors)


class LookupFailed(Exception):
    """The Kubernetes API could not be read; the webhook refuses with this as the cause."""


class Lookup(Protocol):
    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Secret as JSON (data values base64), None if it does not exist."""
        ...

    def gateway_class(self, name: str) -> dict[str, Any] | None:
        """The GatewayClass as JSON, None if it does not exist."""
        ...


@dataclass(frozen=True)
class Settings:
    controller_name: str = "stunner.l7mp.io/gateway-operator"
    pod_cidrs: tuple[str, ...] = ()
    service_cidrs: tuple[str, ...] = ()
    node_port_range: tuple[int, int] = (30000, 32767)


@dataclass(frozen=True)
class Request:
    """What a rule looks at: the object (on DELETE, the object being deleted) and its context."""

    obj: dict[str, Any]
    old: dict[str, Any] | None
    operation: str
    lookup: Lookup
    settings: Settings

    @property
    def spec(self) -> dict[str, Any]:
        return _dict(self.obj.get("spec"))

    @property
    def namespace(self) -> str:
        return str(_dict(self.obj.get("metadata")).get("namespace") or "default")

    @property
    def name(self) -> str:
        return str(_dict(self.obj.get("metadata")).get("name") or "")


Outcome = tuple[list[FieldError], list[str]]
Rule = Callable[[Request], Outcome]

# --- constants of the spec --------------------------------------------------------------------

DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
CREDENTIAL = re.compile(r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$")
AUTH_TYPES = {  # every accepted spelling -> the canonical type
    "static": "static",
    "plaintext": "static",
    "ephemeral": "ephemeral",
    "longterm": "ephemeral",
    "timewindowed": "ephemeral",
}
LOG_LEVELS = ("DISABLE", "ERROR", "WARN", "INFO", "DEBUG", "TRACE")

PROTOCOLS = {"TURN-UDP": "UDP", "TURN-TCP": "TCP", "TURN-TLS": "TCP", "TURN-DTLS": "UDP"}
PROTOCOL_ALIASES = {"UDP": "TURN-UDP", "TCP": "TURN-TCP", "TLS": "TURN-TLS", "DTLS": "TURN-DTLS"}
TLS_PROTOCOLS = ("TURN-TLS", "TURN-DTLS")
ROUTE_NAMESPACES_FROM = ("All", "Selector", "Same")
ADDRESS_TYPES = ("IPAddress", "Hostname")
TLS_SECRET_TYPES = ("kubernetes.io/tls", "Opaque")
CERT_KEYS = ("tls.crt", "crt", "cert")
KEY_KEYS = ("tls.key", "key")

ANNOTATION_PREFIX = "stunner.l7mp.io/"
SERVICE_TYPE = "stunner.l7mp.io/service-type"
MIXED_PROTOCOL_LB = "stunner.l7mp.io/enable-mixed-protocol-lb"
EXTERNAL_TRAFFIC_POLICY = "stunner.l7mp.io/external-traffic-policy"
DISABLE_MANAGED_DATAPLANE = "stunner.l7mp.io/disable-managed-dataplane"
NODEPORT = "stunner.l7mp.io/nodeport"
TARGETPORT = "stunner.l7mp.io/targetport"
DISABLE_HEALTH_CHECK_EXPOSE = "stunner.l7mp.io/disable-health-check-expose"
DISABLE_SESSION_AFFINITY = "stunner.l7mp.io/disable-session-affinity"
ANNOTATIONS = (
    SERVICE_TYPE,
    MIXED_PROTOCOL_LB,
    EXTERNAL_TRAFFIC_POLICY,
    DISABLE_MANAGED_DATAPLANE,
    NODEPORT,
    TARGETPORT,
    DISABLE_HEALTH_CHECK_EXPOSE,
    DISABLE_SESSION_AFFINITY,
)
BOOLEAN_ANNOTATIONS = (
    MIXED_PROTOCOL_LB,
    DISABLE_MANAGED_DATAPLANE,
    DISABLE_HEALTH_CHECK_EXPOSE,
    DISABLE_SESSION_AFFINITY,
)
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
TRAFFIC_POLICIES = ("local", "cluster")

BACKEND_KINDS = {("", "Service"), (STUNNER_GROUP, "StaticService")}
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
DEFAULT_DATAPLANE_NAME = "default"

# --- small helpers ----------------------------------------------------------------------------


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _quote_list(values: Iterable[str]) -> str:
    return ", ".join(values)


def _indexed(items: list[Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path[i], item) for each item that is an object."""
    for i, item in enumerate(items):
        if isinstance(item, dict):
            yield f"{path}[{i}]", item


def _annotation_path(base: str, key: str) -> str:
    return f'{base}["{key}"]'


def _secret_data(secret: dict[str, Any]) -> dict[str, bytes | None]:
    """Secret data decoded; None for a value that is not valid base64."""
    out: dict[str, bytes | None] = {}
    for key, value in _dict(secret.get("data")).items():
        try:
            out[key] = base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            out[key] = None
    for key, value in _dict(secret.get("stringData")).items():
        out[key] = str(value).encode()
    return out


def _secret_ref(
    ref: dict[str, Any], path: str, default_namespace: str
) -> tuple[list[FieldError], tuple[str, str] | None]:
    """Check a SecretObjectReference; (errors, (namespace, name)) when it can be looked up."""
    errors: list[FieldError] = []
    group, kind = ref.get("group", ""), ref.get("kind", "Secret")
    if group not in ("", "v1", None) or kind not in ("Secret", None):
        errors.append(
            FieldError(
                path,
                f'must reference a core Secret (group "" and kind Secret, or omitted), '
                f"got group {group!r} kind {kind!r}",
            )
        )
    name = ref.get("name")
    if not isinstance(name, str) or not name:
        errors.append(FieldError(f"{path}.name", "required: the name of the Secret"))
    if errors:
        return errors, None
    return errors, (str(ref.get("namespace") or default_namespace), str(name))


# --- schema (types) through the models --------------------------------------------------------


def _loc_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def conforms_to_schema(req: Request) -> Outcome:
    """Field types and required fields, as the models of stunner_api.resources declare them."""
    model = KINDS[(str(req.obj.get("apiVersion")), str(req.obj.get("kind")))]
    try:
        model.model_validate(req.obj)
    except ValidationError as e:
        errors = []
        for err in e.errors():
            message = err["msg"][0].lower() + err["msg"][1:]
            if err["type"] == "missing":
                message = "required"
            errors.append(FieldError(_loc_path(tuple(err["loc"])), message))
        return errors, []
    return [], []


# --- annotations (Gateway, GatewayConfig.loadBalancerServiceAnnotations) ---------------------


def _port_map(
    key: str, value: Any, path: str, valid: tuple[int, int], listeners: set[str] | None
) -> Outcome:
    errors: list[FieldError] = []
    warnings: list[str] = []
    what = "NodePort" if key == NODEPORT else "target port"
    try:
        ports = json.loads(str(value))
    except ValueError:
        ports = None
    if not isinstance(ports, dict):
        example = '{"udp-listener":' + str(valid[0]) + "}"
        return [
            FieldError(
                path,
                f"must be a JSON map of listener name to {what}, like {example}, got {value!r}",
            )
        ], []
    low, high = valid
    for name, port in ports.items():
        if not _is_int(port) or not low <= port <= high:
            errors.append(
                FieldError(
                    path,
                    f"{what} of listener {name!r} must be between {low} and {high}, got {port!r}",
                )
            )
        if listeners is not None and name not in listeners:
            warnings.append(
                f"{path}: no listener named {name!r} (listeners: "
                f"{_quote_list(sorted(listeners))}): the entry is ignored"
            )
    return errors, warnings


def _check_annotations(
    annotations: dict[str, Any], base: str, settings: Settings, listeners: set[str] | None
) -> Outcome:
    errors: list[FieldError] = []
    warnings: list[str] = []
    for key, value in annotations.items():
        if not key.startswith(ANNOTATION_PREFIX):
            continue
        path = _annotation_path(base, key)
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if key not in ANNOTATIONS:
            errors.append(
                FieldError(
                    path,
                    f"unknown STUNner annotation: use one of {_quote_list(ANNOTATIONS)}",
                )
            )
        elif key == SERVICE_TYPE and text not in SERVICE_TYPES:
            errors.append(
                FieldError(path, f"must be one of {_quote_list(SERVICE_TYPES)}, got {text!r}")
            )
        elif key in BOOLEAN_ANNOTATIONS and text.lower() not in ("true", "false"):
            errors.append(FieldError(path, f'must be "true" or "false", got {text!r}'))
        elif key == EXTERNAL_TRAFFIC_POLICY and text.lower() not in TRAFFIC_POLICIES:
            errors.append(FieldError(path, f"must be Local or Cluster, got {text!r}"))
        elif key == NODEPORT:
            e, w = _port_map(key, value, path, settings.node_port_range, listeners)
            errors += e
            warnings += w
        elif key == TARGETPORT:
            e, w = _port_map(key, value, path, (1, 65535), listeners)
            errors += e
            warnings += w
    return errors, warnings


# --- GatewayClass -----------------------------------------------------------------------------


def gatewayclass_parameters_ref(req: Request) -> Outcome:
    """parametersRef points at a GatewayConfig by name and namespace."""
    ref = req.spec.get("parametersRef")
    path = "spec.parametersRef"
    if not isinstance(ref, dict):
        return [
            FieldError(
                path,
                "required: point it at a GatewayConfig (group stunner.l7mp.io, kind "
                "GatewayConfig, name and namespace)",
            )
        ], []
    errors = []
    if ref.get("group", STUNNER_GROUP) != STUNNER_GROUP:
        errors.append(
            FieldError(f"{path}.group", f"must be stunner.l7mp.io or omitted, got {ref['group']!r}")
        )
    if ref.get("kind", "GatewayConfig") != "GatewayConfig":
        errors.append(
            FieldError(f"{path}.kind", f"must be GatewayConfig or omitted, got {ref['kind']!r}")
        )
    if not ref.get("name"):
        errors.append(FieldError(f"{path}.name", "required: the name of the GatewayConfig"))
    if not ref.get("namespace"):
        errors.append(
            FieldError(
                f"{path}.namespace",
                "required: GatewayConfigs are namespaced, set the namespace of the GatewayConfig",
            )
        )
    return errors, []


# --- GatewayConfig ----------------------------------------------------------------------------


def gatewayconfig_realm(req: Request) -> Outcome:
    """realm is a lower-case DNS name; changing it restarts every listener (warning)."""
    realm = req.spec.get("realm")
    if realm is None:
        return [], []
    if not isinstance(realm, str) or not DNS_NAME.match(realm):
        return [
            FieldError(
                "spec.realm",
                "must be a lower-case DNS name (letters a-z, digits, '-' and '.', starting and "
                f"ending with a letter or digit), like stunner.l7mp.io, got {realm!r}",
            )
        ], []
    old_realm = _dict((req.old or {}).get("spec")).get("realm", DEFAULT_REALM) if req.old else None
    if old_realm is not None and old_realm != realm:
        return [], [
            f"spec.realm: changing the realm from {old_realm!r} to {realm!r} restarts every "
            "TURN listener of the Gateways using this GatewayConfig"
        ]
    return [], []


def _auth_type(value: Any, path: str) -> tuple[str | None, list[FieldError]]:
    """The canonical auth type (static|ephemeral) of a spelling, or an error."""
    if value is None:
        return DEFAULT_AUTH_TYPE, []
    canonical = AUTH_TYPES.get(str(value))
    if canonical is None:
        return None, [
            FieldError(
                path,
                "must be static or ephemeral (or the aliases plaintext, longterm, "
                f"timewindowed), got {value!r}",
            )
        ]
    return canonical, []


def gatewayconfig_auth_type(req: Request) -> Outcome:
    """authType is one of the types or their aliases."""
    return _auth_type(req.spec.get("authType"), "spec.authType")[1], []


def gatewayconfig_inline_auth(req: Request) -> Outcome:
    """Without authRef: authType is known; static needs userName and password, ephemeral a
    sharedSecret. With authRef, inline credentials are ignored (warning)."""
    spec = req.spec
    inline = [k for k in ("authType", "userName", "password", "sharedSecret") if k in spec]
    if spec.get("authRef") is not None:
        if inline:
            return [], [
                f"spec.authRef overrides the inline {_quote_list(inline)}: they are ignored"
            ]
        return [], []
    auth_type, _ = _auth_type(spec.get("authType"), "spec.authType")  # reported by its own rule
    errors: list[FieldError] = []
    if auth_type == "static":
        for key in ("userName", "password"):
            value = spec.get(key)
            if value is None or value == "":
                errors.append(
                    FieldError(
                        f"spec.{key}",
                        "required for static authentication: set spec.userName and "
                        "spec.password, or point spec.authRef at a Secret",
                    )
                )
            elif not isinstance(value, str) or not CREDENTIAL.match(value):
                errors.append(
                    FieldError(
                        f"spec.{key}",
                        "may hold only letters, digits and !#$%&'*+-.^_`|~ (no spaces, quotes, "
                        "':' or '@')",
                    )
                )
    elif auth_type == "ephemeral" and not spec.get("sharedSecret"):
        errors.append(
            FieldError(
                "spec.sharedSecret",
                "required for ephemeral authentication: set spec.sharedSecret, or point "
                "spec.authRef at a Secret",
            )
        )
    return errors, []


def gatewayconfig_auth_ref(req: Request) -> Outcome:
    """The authRef Secret holds the keys its auth type needs; a missing one is a warning."""
    ref = req.spec.get("authRef")
    if not isinstance(ref, dict):
        return [], []
    path = "spec.authRef"
    errors, key = _secret_ref(ref, path, req.namespace)
    if key is None:
        return errors, []
    secret = req.lookup.secret(*key)
    where = f"{key[0]}/{key[1]}"
    if secret is None:
        return [], [
            f"{path}: Secret {where} does not exist (yet): the GatewayConfig is admitted, but "
            "STUNner will refuse clients until the Secret is created"
        ]
    warnings = []
    if secret.get("type", "Opaque") != "Opaque":
        warnings.append(f"{path}: Secret {where} is of type {secret.get('type')!r}, not Opaque")
    data = _secret_data(secret)
    bad = sorted(k for k, v in data.items() if v is None)
    if bad:
        errors.append(
            FieldError(path, f"Secret {where} holds invalid base64 in {_quote_list(bad)}")
        )
        return errors, warnings
    raw_type = data.get("type")
    type_text = raw_type.decode(errors="replace") if raw_type is not None else None
    auth_type = AUTH_TYPES.get(type_text) if type_text is not None else DEFAULT_AUTH_TYPE
    if auth_type is None:
        errors.append(
            FieldError(
                path,
                f"Secret {where} has type {type_text!r}: the 'type' key must be static or "
                "ephemeral (or plaintext, longterm, timewindowed)",
            )
        )
    elif auth_type == "static":
        missing = [k for k in ("username", "password") if not data.get(k)]
        if missing:
            errors.append(
                FieldError(
                    path,
                    f"Secret {where} has no {' or '.join(repr(k) for k in missing)} key, which "
                    "static authentication needs: add username and password to the Secret",
                )
            )
    elif not data.get("secret") and not data.get("sharedSecret"):
        errors.append(
            FieldError(
                path,
                f"Secret {where} has no 'secret' (or 'sharedSecret') key, which ephemeral "
                "authentication needs: add the shared secret to the Secret",
            )
        )
    return errors, warnings


def gatewayconfig_log_level(req: Request) -> Outcome:
    """logLevel is a comma-separated list of scope:LEVEL, like all:INFO,turn:DEBUG."""
    spec = req.spec.get("logLevel")
    if spec is None:
        return [], []
    errors = []
    for item in str(spec).split(","):
        scope, sep, level = item.strip().partition(":")
        if not sep or not scope:
            errors.append(
                FieldError(
                    "spec.logLevel",
                    f"{item.strip()!r} is not scope:LEVEL (write it like all:INFO,turn:DEBUG)",
                )
            )
        elif level.upper() not in LOG_LEVELS:
            errors.append(
                FieldError(
                    "spec.logLevel",
                    f"unknown level {level!r} in {item.strip()!r}: use one of "
                    f"{_quote_list(LOG_LEVELS)}",
                )
            )
    return errors, []


def gatewayconfig_annotations(req: Request) -> Outcome:
    """loadBalancerServiceAnnotations obey the STUNner annotation rules."""
    return _check_annotations(
        _dict(req.spec.get("loadBalancerServiceAnnotations")),
        "spec.loadBalancerServiceAnnotations",
        req.settings,
        None,
    )


# --- Gateway ----------------------------------------------------------------------------------


def _listeners(req: Request) -> list[tuple[str, dict[str, Any]]]:
    return list(_indexed(_list(req.spec.get("listeners")), "spec.listeners"))


def _protocol(value: Any) -> str | None:
    """The canonical TURN-* protocol of a listener, None if unknown."""
    text = str(value)
    if text in PROTOCOL_ALIASES:
        return PROTOCOL_ALIASES[text]
    return text.upper() if text.upper() in PROTOCOLS else None


def gateway_listener_names(req: Request) -> Outcome:
    """Listener names are unique within the Gateway."""
    errors = []
    seen: dict[str, str] = {}
    for path, listener in _listeners(req):
        name = listener.get("name")
        if not isinstance(name, str):
            continue
        if name in seen:
            errors.append(
                FieldError(
                    f"{path}.name",
                    f"duplicate listener name {name!r}, already used by {seen[name]}: "
                    "listener names must be unique within a Gateway",
                )
            )
        else:
            seen[name] = path
    return errors, []


def gateway_listener_protocols(req: Request) -> Outcome:
    """protocol is TURN-UDP, TURN-TCP, TURN-TLS or TURN-DTLS (UDP/TCP/TLS/DTLS deprecated)."""
    errors = []
    warnings = []
    for path, listener in _listeners(req):
        protocol = listener.get("protocol")
        if protocol is None:
            continue
        canonical = _protocol(protocol)
        if canonical is None:
            errors.append(
                FieldError(
                    f"{path}.protocol",
                    f"must be one of {_quote_list(PROTOCOLS)}, got {protocol!r}",
                )
            )
        elif protocol in PROTOCOL_ALIASES:
            warnings.append(f"{path}.protocol: {protocol} is deprecated, write {canonical} instead")
    return errors, warnings


def gateway_listener_ports(req: Request) -> Outcome:
    """port is 1..65535 and no two listeners share a port on the same transport."""
    errors = []
    seen: dict[tuple[str, int], str] = {}
    for path, listener in _listeners(req):
        port = listener.get("port")
        if not _is_int(port):
            continue
        if not 1 <= port <= 65535:
            errors.append(FieldError(f"{path}.port", f"must be between 1 and 65535, got {port}"))
            continue
        protocol = _protocol(listener.get("protocol"))
        if protocol is None:
            continue
        transport = PROTOCOLS[protocol]
        if (transport, port) in seen:
            errors.append(
                FieldError(
                    f"{path}.port",
                    f"{transport} port {port} is already used by {seen[transport, port]}: "
                    "choose another port",
                )
            )
        else:
            seen[transport, port] = path
    return errors, []


def gateway_mixed_protocols(req: Request) -> Outcome:
    """A Gateway mixing UDP and TCP listeners needs the mixed-protocol annotation (warning)."""
    transports = {
        PROTOCOLS[p] for _, lst in _listeners(req) if (p := _protocol(lst.get("protocol")))
    }
    annotations = _dict(_dict(req.obj.get("metadata")).get("annotations"))
    enabled = str(annotations.get(MIXED_PROTOCOL_LB, "false")).lower() == "true"
    if len(transports) > 1 and not enabled:
        return [], [
            "spec.listeners: the listeners mix UDP and TCP; the LoadBalancer Service exposes "
            f'only the first transport unless the annotation {MIXED_PROTOCOL_LB}: "true" is set '
            "(on the Gateway, or in its GatewayConfig's loadBalancerServiceAnnotations)"
        ]
    return [], []


def _tls_pair(cert_pem: bytes, key_pem: bytes) -> str | None:
    """Why a PEM certificate and key are unusable, or None when they parse and match."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except (ValueError, UnsupportedAlgorithm):
        return "its certificate is not a PEM X.509 certificate"
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return "its key is not an unencrypted PEM private key"
    raw = serialization.PublicFormat.SubjectPublicKeyInfo
    pem = serialization.Encoding.PEM
    if cert.public_key().public_bytes(pem, raw) != key.public_key().public_bytes(pem, raw):
        return "its certificate and key do not match (different public keys)"
    return None


def _check_tls_secret(
    req: Request, ref: dict[str, Any], path: str
) -> tuple[list[FieldError], list[str]]:
    errors, key = _secret_ref(ref, path, req.namespace)
    if key is None:
        return errors, []
    where = f"{key[0]}/{key[1]}"
    secret = req.lookup.secret(*key)
    if secret is None:
        return [], [
            f"{path}: Secret {where} does not exist (yet): the listener will not serve TLS "
            "until it is created"
        ]
    secret_type = secret.get("type", "Opaque")
    if secret_type not in TLS_SECRET_TYPES:
        return [
            FieldError(
                path,
                f"Secret {where} is of type {secret_type!r}: use kubernetes.io/tls or Opaque",
            )
        ], []
    data = _secret_data(secret)
    cert = next((data[k] for k in CERT_KEYS if data.get(k)), None)
    tls_key = next((data[k] for k in KEY_KEYS if data.get(k)), None)
    if cert is None or tls_key is None:
        return [
            FieldError(
                path,
                f"Secret {where} must hold a PEM certificate in tls.crt and its key in tls.key",
            )
        ], []
    problem = _tls_pair(cert, tls_key)
    if problem:
        return [FieldError(path, f"Secret {where} is unusable: {problem}")], []
    return [], []


def gateway_listener_tls(req: Request) -> Outcome:
    """TLS/DTLS listeners terminate TLS with a Secret holding a matching PEM cert and key."""
    errors: list[FieldError] = []
    warnings: list[str] = []
    for path, listener in _listeners(req):
        protocol = _protocol(listener.get("protocol"))
        tls = listener.get("tls")
        if protocol not in TLS_PROTOCOLS:
            if tls is not None and protocol is not None:
                warnings.append(f"{path}.tls: ignored, {protocol} listeners do not use TLS")
            continue
        if not isinstance(tls, dict):
            errors.append(
                FieldError(
                    f"{path}.tls",
                    f"required for {protocol}: set tls.certificateRefs to a Secret holding "
                    "tls.crt and tls.key",
                )
            )
            continue
        mode = tls.get("mode", DEFAULT_TLS_MODE)
        if mode != DEFAULT_TLS_MODE:
            errors.append(
                FieldError(
                    f"{path}.tls.mode",
                    f"must be Terminate or omitted (TURN cannot pass TLS through), got {mode!r}",
                )
            )
        refs = _list(tls.get("certificateRefs"))
        if not refs:
            errors.append(
                FieldError(
                    f"{path}.tls.certificateRefs",
                    "required: reference a Secret holding tls.crt and tls.key",
                )
            )
        for ref_path, ref in _indexed(refs, f"{path}.tls.certificateRefs"):
            e, w = _check_tls_secret(req, ref, ref_path)
            errors += e
            warnings += w
    return errors, warnings


def gateway_addresses(req: Request) -> Outcome:
    """addresses hold an IP (IPAddress) or a DNS name (Hostname); only the first is used."""
    errors = []
    warnings = []
    addresses = _list(req.spec.get("addresses"))
    if len(addresses) > 1:
        warnings.append(
            f"spec.addresses: {len(addresses)} addresses given, only the first one is used"
        )
    for path, address in _indexed(addresses, "spec.addresses"):
        kind, value = address.get("type", DEFAULT_ADDRESS_TYPE), str(address.get("value", ""))
        if kind == "IPAddress":
            try:
                ipaddress.ip_address(value)
            except ValueError:
                errors.append(FieldError(f"{path}.value", f"must be an IP address, got {value!r}"))
        elif kind == "Hostname":
            if not DNS_NAME.match(value):
                errors.append(
                    FieldError(f"{path}.value", f"must be a lower-case DNS name, got {value!r}")
                )
        else:
            errors.append(
                FieldError(
                    f"{path}.type", f"must be one of {_quote_list(ADDRESS_TYPES)}, got {kind!r}"
                )
            )
    return errors, warnings


def gateway_allowed_routes(req: Request) -> Outcome:
    """allowedRoutes.namespaces.from is All, Selector (with a selector) or Same."""
    errors = []
    for path, listener in _listeners(req):
        namespaces = _dict(_dict(listener.get("allowedRoutes")).get("namespaces"))
        where = f"{path}.allowedRoutes.namespaces"
        origin = namespaces.get("from", DEFAULT_ROUTE_NAMESPACES_FROM)
        if origin not in ROUTE_NAMESPACES_FROM:
            errors.append(
                FieldError(
                    f"{where}.from",
                    f"must be one of {_quote_list(ROUTE_NAMESPACES_FROM)}, got {origin!r}",
                )
            )
        elif origin == "Selector" and not isinstance(namespaces.get("selector"), dict):
            errors.append(
                FieldError(
                    f"{where}.selector",
                    "required when from is Selector: a label selector of the namespaces",
                )
            )
    return errors, []


def gateway_annotations(req: Request) -> Outcome:
    """stunner.l7mp.io/ annotations are the documented ones with valid values."""
    names = {str(lst.get("name")) for _, lst in _listeners(req) if "name" in lst}
    return _check_annotations(
        _dict(_dict(req.obj.get("metadata")).get("annotations")),
        "metadata.annotations",
        req.settings,
        names,
    )


# --- UDPRoute ---------------------------------------------------------------------------------


def udproute_parent_refs(req: Request) -> Outcome:
    """parentRefs name at least one Gateway."""
    refs = _list(req.spec.get("parentRefs"))
    if not refs:
        return [
            FieldError("spec.parentRefs", "required: name the Gateway(s) to attach the route to")
        ], []
    errors = []
    for path, ref in _indexed(refs, "spec.parentRefs"):
        group, kind = ref.get("group", GATEWAY_API_GROUP), ref.get("kind", "Gateway")
        if (group, kind) != (GATEWAY_API_GROUP, "Gateway"):
            errors.append(
                FieldError(
                    path,
                    f"must reference a Gateway (group {GATEWAY_API_GROUP}, kind Gateway, or "
                    f"omitted), got group {group!r} kind {kind!r}",
                )
            )
    return errors, []


def _backend_refs(req: Request) -> Iterator[tuple[str, dict[str, Any]]]:
    for rule_path, rule in _indexed(_list(req.spec.get("rules")), "spec.rules"):
        yield from _indexed(_list(rule.get("backendRefs")), f"{rule_path}.backendRefs")


def udproute_backend_kinds(req: Request) -> Outcome:
    """backendRefs are Services (group "") or StaticServices (group stunner.l7mp.io)."""
    errors = []
    warnings = []
    if len(_list(req.spec.get("rules"))) > 1:
        warnings.append("spec.rules: only the first rule is used; merge the backendRefs into it")
    for path, ref in _backend_refs(req):
        group, kind = ref.get("group", ""), ref.get("kind", "Service")
        if (group, kind) not in BACKEND_KINDS:
            errors.append(
                FieldError(
                    path,
                    f"group {group!r} kind {kind!r} is not a backend STUNner knows: use kind "
                    'Service (group "") or kind StaticService (group stunner.l7mp.io)',
                )
            )
    return errors, warnings


def udproute_backend_ports(req: Request) -> Outcome:
    """port and endPort are 1..65535; endPort needs port and is not below it."""
    errors = []
    v1alpha2 = group_of(str(req.obj.get("apiVersion"))) == GATEWAY_API_GROUP
    for path, ref in _backend_refs(req):
        port, end_port = ref.get("port"), ref.get("endPort")
        for key, value in (("port", port), ("endPort", end_port)):
            if _is_int(value) and not 1 <= value <= 65535:
                errors.append(
                    FieldError(f"{path}.{key}", f"must be between 1 and 65535, got {value}")
                )
        if end_port is not None and port is None:
            errors.append(
                FieldError(f"{path}.endPort", "needs port: set port to the start of the range")
            )
        elif _is_int(port) and _is_int(end_port) and end_port < port:
            errors.append(
                FieldError(f"{path}.endPort", f"must not be below port {port}, got {end_port}")
            )
        if v1alpha2 and port is None and ref.get("kind", "Service") == "Service":
            errors.append(
                FieldError(
                    f"{path}.port",
                    f"required by {GATEWAY_API_GROUP}/v1alpha2 for a Service (any port: STUNner "
                    "ignores it), or use apiVersion stunner.l7mp.io/v1",
                )
            )
    return errors, []


# --- StaticService ----------------------------------------------------------------------------


def _cluster_networks(
    settings: Settings,
) -> list[tuple[str, ipaddress.IPv4Network | ipaddress.IPv6Network]]:
    out = []
    for what, cidrs in (("pod", settings.pod_cidrs), ("service", settings.service_cidrs)):
        for cidr in cidrs:
            out.append((what, ipaddress.ip_network(cidr, strict=False)))
    return out


def staticservice_prefixes(req: Request) -> Outcome:
    """prefixes are CIDRs or IPs, outside the cluster's pod and service networks."""
    errors: list[FieldError] = []
    warnings: list[str] = []
    prefixes = _list(req.spec.get("prefixes"))
    if not prefixes:
        warnings.append("spec.prefixes: empty, the StaticService gives access to nothing")
    cluster = _cluster_networks(req.settings)
    for i, prefix in enumerate(prefixes):
        path = f"spec.prefixes[{i}]"
        try:
            network = ipaddress.ip_network(str(prefix), strict=False)
        except ValueError:
            errors.append(
                FieldError(
                    path, f"must be a CIDR like 192.0.2.0/24 or an IP address, got {prefix!r}"
                )
            )
            continue
        if network.prefixlen == 0:
            warnings.append(
                f"{path}: {network} opens a public relay to every address, the cluster's "
                "included: use it only for a public TURN service"
            )
            continue
        for what, net in cluster:
            if network.version == net.version and network.overlaps(net):
                errors.append(
                    FieldError(
                        path,
                        f"{network} overlaps the {what} network {net}: a StaticService must "
                        "not reach inside the cluster (a backdoor); use a Service backend",
                    )
                )
    return errors, warnings


# --- Dataplane --------------------------------------------------------------------------------


def dataplane_image(req: Request) -> Outcome:
    """image is set and imagePullPolicy is Always, IfNotPresent or Never."""
    errors = []
    image = req.spec.get("image")
    if not isinstance(image, str) or not image.strip():
        errors.append(
            FieldError("spec.image", "required: the stunnerd image, like l7mp/stunnerd:latest")
        )
    policy = req.spec.get("imagePullPolicy")
    if policy is not None and policy not in PULL_POLICIES:
        errors.append(
            FieldError(
                "spec.imagePullPolicy",
                f"must be one of {_quote_list(PULL_POLICIES)}, got {policy!r}",
            )
        )
    return errors, []


def dataplane_counts(req: Request) -> Outcome:
    """replicas and terminationGracePeriodSeconds are not negative."""
    errors = []
    for key in ("replicas", "terminationGracePeriodSeconds"):
        value = req.spec.get(key)
        if _is_int(value) and value < 0:
            errors.append(FieldError(f"spec.{key}", f"must be 0 or more, got {value}"))
    return errors, []


def dataplane_default_kept(req: Request) -> Outcome:
    """The Dataplane named default is never deleted."""
    if req.name == DEFAULT_DATAPLANE_NAME:
        return [
            FieldError(
                "metadata.name",
                "the default Dataplane cannot be deleted: removing it breaks the installation "
                "(the operator provisions stunnerd pods from it)",
            )
        ], []
    return [], []


# --- the table --------------------------------------------------------------------------------

RULES: dict[str, list[Rule]] = {
    "GatewayClass": [conforms_to_schema, gatewayclass_parameters_ref],
    "GatewayConfig": [
        conforms_to_schema,
        gatewayconfig_realm,
        gatewayconfig_auth_type,
        gatewayconfig_inline_auth,
        gatewayconfig_auth_ref,
        gatewayconfig_log_level,
        gatewayconfig_annotations,
    ],
    "Gateway": [
        conforms_to_schema,
        gateway_listener_names,
        gateway_listener_protocols,
        gateway_listener_ports,
        gateway_mixed_protocols,
        gateway_listener_tls,
        gateway_addresses,
        gateway_allowed_routes,
        gateway_annotations,
    ],
    "UDPRoute": [
        conforms_to_schema,
        udproute_parent_refs,
        udproute_backend_kinds,
        udproute_backend_ports,
    ],
    "StaticService": [conforms_to_schema, staticservice_prefixes],
    "Dataplane": [conforms_to_schema, dataplane_image, dataplane_counts, dataplane_default_kept],
}

# Rules that judge a DELETE; every other rule judges CREATE and UPDATE only (deleting an
# invalid object is always fine).
ON_DELETE: frozenset[Rule] = frozenset({dataplane_default_kept})


def is_ours(obj: dict[str, Any], lookup: Lookup, settings: Settings) -> bool:
    """Whether STUNner's rules apply: our kinds, our GatewayClasses, Gateways of our classes."""
    kind = str(obj.get("kind"))
    if (str(obj.get("apiVersion")), kind) not in KINDS:
        return False
    if kind == "GatewayClass":
        return bool(_dict(obj.get("spec")).get("controllerName") == settings.controller_name)
    if kind == "Gateway":
        name = _dict(obj.get("spec")).get("gatewayClassName")
        if not isinstance(name, str) or not name:
            return False
        gwc = lookup.gateway_class(name)
        if gwc is None:
            return False
        return bool(_dict(gwc.get("spec")).get("controllerName") == settings.controller_name)
    return True


def validate(
    obj: dict[str, Any],
    old: dict[str, Any] | None,
    operation: str,
    lookup: Lookup,
    settings: Settings,
) -> Verdict:
    """Run the rules of obj's kind. On DELETE, obj is the object being deleted.

    Raises LookupFailed when the Kubernetes API cannot be read.
    """
    verdict = Verdict()
    if not is_ours(obj, lookup, settings):
        return verdict
    req = Request(obj=obj, old=old, operation=operation, lookup=lookup, settings=settings)
    for rule in RULES.get(str(obj.get("kind")), []):
        if (operation == "DELETE") != (rule in ON_DELETE):
            continue
        errors, warnings = rule(req)
        verdict.errors += [e for e in errors if e not in verdict.errors]
        verdict.warnings += [w for w in warnings if w not in verdict.warnings]
    return verdict


# --- defaults ---------------------------------------------------------------------------------


def json_pointer(tokens: Iterable[str | int]) -> str:
    """An RFC 6901 JSON pointer ('~' -> '~0', '/' -> '~1')."""
    return "".join("/" + str(t).replace("~", "~0").replace("/", "~1") for t in tokens)


@dataclass
class _Patcher:
    """Collects "add" ops on a working copy, so later defaults see the parents created."""

    doc: dict[str, Any]
    ops: list[dict[str, Any]] = field(default_factory=list)

    def default(self, tokens: list[str | int], value: Any) -> None:
        """Add value at tokens unless something is there; create missing parent objects."""
        node: Any = self.doc
        for i, token in enumerate(tokens):
            last = i == len(tokens) - 1
            if isinstance(node, list) and isinstance(token, int) and token < len(node):
                if last:
                    return
                node = node[token]
                continue
            if not isinstance(node, dict):
                return  # malformed (validation reports it): never replace what the user wrote
            if token in node:
                if last:
                    return
                node = node[token]
                continue
            nested: Any = copy.deepcopy(value)
            for parent in reversed(tokens[i + 1 :]):
                nested = {parent: nested}
            node[token] = nested
            op = {
                "op": "add",
                "path": json_pointer(tokens[: i + 1]),
                "value": copy.deepcopy(nested),
            }
            self.ops.append(op)
            return


def _gatewayconfig_defaults(p: _Patcher) -> None:
    spec = _dict(p.doc.get("spec"))
    p.default(["spec", "realm"], DEFAULT_REALM)
    if spec.get("authRef") is None:  # the auth type of an authRef comes from the Secret
        p.default(["spec", "authType"], DEFAULT_AUTH_TYPE)
    p.default(["spec", "dataplane"], DEFAULT_DATAPLANE)


def _gateway_defaults(p: _Patcher) -> None:
    for i, listener in enumerate(_list(_dict(p.doc.get("spec")).get("listeners"))):
        if not isinstance(listener, dict):
            continue
        base: list[str | int] = ["spec", "listeners", i]
        if isinstance(listener.get("tls"), dict):
            p.default([*base, "tls", "mode"], DEFAULT_TLS_MODE)
        p.default([*base, "allowedRoutes", "namespaces", "from"], DEFAULT_ROUTE_NAMESPACES_FROM)


def _udproute_defaults(p: _Patcher) -> None:
    spec = _dict(p.doc.get("spec"))
    namespace = _dict(p.doc.get("metadata")).get("namespace")
    for i, ref in enumerate(_list(spec.get("parentRefs"))):
        if isinstance(ref, dict):
            base: list[str | int] = ["spec", "parentRefs", i]
            p.default([*base, "group"], GATEWAY_API_GROUP)
            p.default([*base, "kind"], "Gateway")
            if namespace:
                p.default([*base, "namespace"], namespace)
    for i, rule in enumerate(_list(spec.get("rules"))):
        for j, ref in enumerate(_list(_dict(rule).get("backendRefs"))):
            if isinstance(ref, dict):
                base = ["spec", "rules", i, "backendRefs", j]
                p.default([*base, "group"], "")
                p.default([*base, "kind"], "Service")
                if namespace:
                    p.default([*base, "namespace"], namespace)


DEFAULTS: dict[str, Callable[[_Patcher], None]] = {
    "GatewayConfig": _gatewayconfig_defaults,
    "Gateway": _gateway_defaults,
    "UDPRoute": _udproute_defaults,
}


def defaults_patch(
    obj: dict[str, Any], lookup: Lookup | None = None, settings: Settings | None = None
) -> list[dict[str, Any]]:
    """RFC 6902 "add" ops writing the documented defaults that obj leaves out.

    Never changes a value the user set. With a lookup, a Gateway whose class is not ours is left
    alone; without one, Gateways get the (upstream Gateway API) defaults regardless.
    """
    kind = str(obj.get("kind"))
    if (str(obj.get("apiVersion")), kind) not in KINDS or kind not in DEFAULTS:
        return []
    if (
        lookup is not None
        and kind == "Gateway"
        and not is_ours(obj, lookup, settings or Settings())
    ):
        return []
    patcher = _Patcher(copy.deepcopy(obj))
    DEFAULTS[kind](patcher)
    return patcher.ops
