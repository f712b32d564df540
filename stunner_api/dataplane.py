"""The STUNner v1 dataplane config: the contract between the operator and stunnerd.

Pydantic models of Go STUNner's `pkg/apis/v1` (`StunnerConfig`, `AdminConfig`, `AuthConfig`,
`ListenerConfig`, `ClusterConfig`) with the same JSON keys, defaults and aliases. Validation is
Go's `Validate()`: it normalises and fills in defaults, so two configs that mean the same compare
equal (`==`) once loaded. Models are frozen values.

- `validate_config(data)` validates an already parsed config; `dataplane_load.load_config`
  reads one from YAML or JSON text, `turn_uri.config_from_uri` makes one from a URI.
- `StunnerConfig.to_json()` is byte-identical to Go's `json.Marshal` of the validated struct
  (field order, `omitempty`, sorted map keys, compact separators, HTML-safe escaping).
- `zero_config(name)` is what the CDS sends for a deleted Gateway.
- `redacted(config)` and `str(config)` hide credentials, TLS keys and the license HMAC.

Unknown keys are ignored, as Go's `json.Unmarshal` ignores them. Every problem raises
`ConfigError`, whose message starts with the field path: `listeners[0].port: must be 1..65535,
got 70000`.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from .endpoints import EndpointError, parse_static_endpoint
from .vocabulary import (
    AUTH_TYPE_ALIASES,
    LISTENER_PROTOCOL_TABLE,
    METRICS_PORT,
    STATUS_PORT,
    ProtocolFacts,
    field_path,
    parse_log_spec,
    skipped_part_reason,
)
from .vocabulary import DEFAULT_LOG_LEVEL as DEFAULT_LOG_LEVEL
from .vocabulary import DEFAULT_REALM as DEFAULT_REALM
from .vocabulary import LISTENER_PROTOCOLS as VOCABULARY_PROTOCOLS
from .vocabulary import RELAY_ADDRESS_FAMILIES as VOCABULARY_RELAY_FAMILIES

log = logging.getLogger("stunner.config")

# Defaults (Go: pkg/apis/v1/default.go).
API_VERSION = "v1"
API_VERSION_V1ALPHA1 = "v1alpha1"
DEFAULT_STUNNER_NAME = "default-stunnerd"
DEFAULT_PORT = 3478
DEFAULT_ADDRESS = "0.0.0.0"
DEFAULT_METRICS_PORT = METRICS_PORT  # stunnerd's metrics endpoint
DEFAULT_HEALTHCHECK_PORT = STATUS_PORT  # stunnerd's /live, /ready, /status
DEFAULT_HEALTHCHECK_ENDPOINT = f"http://:{DEFAULT_HEALTHCHECK_PORT}"
SECRET = "<SECRET>"

# Credentials of the config the CDS sends for a deleted Gateway (pkg/config/client: ZeroConfig).
ZERO_CONFIG_USERNAME = "dummy-username"
ZERO_CONFIG_PASSWORD = "dummy-password"

AuthType = Literal["static", "ephemeral", "none"]
# The names of stunner_api.vocabulary's LISTENER_PROTOCOL_TABLE, spelled out for the type
# checker (tests/stunner_api/test_protocols.py checks that the two agree).
ListenerProtocol = Literal["TURN-UDP", "TURN-TCP", "TURN-TLS", "TURN-DTLS"]
ClusterType = Literal["STATIC", "STRICT_DNS"]
ClusterProtocol = Literal["UDP", "TCP"]
OffloadEngine = Literal["None", "XDP", "TC", "Auto"]
# The families relays are made in (issue 31; Go v2.0.2 "the relay address family of the admin",
# whose exact spelling is not public here: ours). "" is the listener address's family.
RelayAddressFamily = Literal["", "IPv4", "IPv6", "DualStack"]

# Accepted spellings, keyed by their case-folded form (the tables live in stunner_api.vocabulary).
AUTH_TYPES: Mapping[str, AuthType] = {
    spelling: canonical.value for spelling, canonical in AUTH_TYPE_ALIASES.items()
}
LISTENER_PROTOCOLS: Mapping[str, ListenerProtocol] = {
    spelling: canonical.value for spelling, canonical in VOCABULARY_PROTOCOLS.items()
}
CLUSTER_TYPES: Mapping[str, ClusterType] = {"STATIC": "STATIC", "STRICT_DNS": "STRICT_DNS"}
CLUSTER_PROTOCOLS: Mapping[str, ClusterProtocol] = {"UDP": "UDP", "TCP": "TCP"}
RELAY_ADDRESS_FAMILIES: Mapping[str, RelayAddressFamily] = {
    family.lower(): family  # type: ignore[misc]
    for family in VOCABULARY_RELAY_FAMILIES
}
OFFLOAD_ENGINES: Mapping[str, OffloadEngine] = {
    "none": "None",
    "xdp": "XDP",
    "tc": "TC",
    "auto": "Auto",
}

_DNS_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


class ConfigError(ValueError):
    """The config cannot be used; the message names the field path and the reason."""


def _reject(reason: str, field: str = "") -> PydanticCustomError:
    """A validation error with an exact message; `field` extends the error's path."""
    return PydanticCustomError("stunner_config", "{reason}", {"reason": reason, "field": field})


def go_quote(value: object) -> str:
    """Roughly Go's %q: a double-quoted string (non-strings are rendered first)."""
    return json.dumps(value if isinstance(value, str) else str(value), ensure_ascii=False)


def _normalize(
    value: object, table: Mapping[str, str], fold: Callable[[str], str], default: str, what: str
) -> object:
    """Map an accepted spelling to its canonical form; "" means the default."""
    if not isinstance(value, str):
        return value  # strict type validation reports it
    if value == "":
        value = default
    try:
        return table[fold(value)]
    except KeyError:
        valid = ", ".join(dict.fromkeys(table.values()))
        raise _reject(f"unknown {what}: {go_quote(value)} (valid: {valid})") from None


def _empty_is_default(value: object, default: object) -> object:
    """Go treats the zero value as unset: "" and 0 mean the default."""
    return default if value == "" or (type(value) is int and value == 0) else value


def _check_url(value: str, what: str) -> str:
    """A minimal url.Parse: the URL must split and a port, if any, must be a number."""
    if value:
        try:
            urlsplit(value).port  # noqa: B018 - parsing the port is the check
        except ValueError as exc:
            raise _reject(f"invalid {what} endpoint URL {value}: {exc}") from None
    return value


def _omitempty(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Go's `omitempty`: drop "", 0, empty lists and maps, and nil."""
    return {k: v for k, v in pairs if v is not None and v != "" and v != [] and v != {} and v != 0}


class _GoStruct(BaseModel):
    """Common model settings: frozen values, Go's strict JSON types, unknown keys ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, data: Any) -> Any:
        """JSON null leaves a Go field at its zero value, which validation then defaults."""
        if isinstance(data, Mapping):
            return {k: v for k, v in data.items() if v is not None}
        return data


class LicenseConfig(_GoStruct):
    """Premium licensing info (informational in the open-source build)."""

    key: str = ""
    hmac: str = Field(default="", repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Go JSON form: both keys always present."""
        return {"key": self.key, "hmac": self.hmac}

    def __str__(self) -> str:
        return f"{{key={self.key},pass={SECRET}}}"


class AdminConfig(_GoStruct):
    """`admin`: daemon name, log levels, metrics and health-check endpoints, quota, offload."""

    name: str = DEFAULT_STUNNER_NAME
    loglevel: str = DEFAULT_LOG_LEVEL
    metrics_endpoint: str = ""
    # Go: a nil pointer means the default; an explicit "" disables health checks.
    healthcheck_endpoint: str = DEFAULT_HEALTHCHECK_ENDPOINT
    user_quota: int = 0
    offload_engine: OffloadEngine = "None"
    offload_interfaces: list[str] = Field(default_factory=list)
    relay_address_family: RelayAddressFamily = ""
    license_config: LicenseConfig | None = None

    @field_validator("name", mode="before")
    @classmethod
    def _default_name(cls, value: object) -> object:
        return _empty_is_default(value, DEFAULT_STUNNER_NAME)

    @field_validator("loglevel", mode="before")
    @classmethod
    def _default_loglevel(cls, value: object) -> object:
        return _empty_is_default(value, DEFAULT_LOG_LEVEL)

    @field_validator("loglevel")
    @classmethod
    def _warn_skipped_log_parts(cls, value: str) -> str:
        """Go STUNner skips a part of the spec it cannot read; say so at load, naming it."""
        for part in parse_log_spec(value).skipped:
            log.warning("admin.loglevel: skipping %s", skipped_part_reason(part))
        return value

    @field_validator("metrics_endpoint")
    @classmethod
    def _check_metrics_endpoint(cls, value: str) -> str:
        return _check_url(value, "metric server")

    @field_validator("healthcheck_endpoint")
    @classmethod
    def _check_healthcheck_endpoint(cls, value: str) -> str:
        return _check_url(value, "health-check server")

    @field_validator("user_quota")
    @classmethod
    def _clamp_quota(cls, value: int) -> int:
        return max(value, 0)

    @field_validator("offload_engine", mode="before")
    @classmethod
    def _normalize_offload(cls, value: object) -> object:
        return _normalize(value, OFFLOAD_ENGINES, str.lower, "None", "offload mode")

    @field_validator("relay_address_family", mode="before")
    @classmethod
    def _normalize_relay_family(cls, value: object) -> object:
        if value == "":
            return value  # unset: each listener relays in its address's family
        return _normalize(value, RELAY_ADDRESS_FAMILIES, str.lower, "", "relay address family")

    @field_validator("offload_interfaces")
    @classmethod
    def _sort_interfaces(cls, value: list[str]) -> list[str]:
        return sorted(value)

    def to_dict(self) -> dict[str, Any]:
        """Go JSON form (`omitempty` everywhere; the health-check pointer is always set)."""
        out = _omitempty(
            [
                ("name", self.name),
                ("loglevel", self.loglevel),
                ("metrics_endpoint", self.metrics_endpoint),
            ]
        )
        out["healthcheck_endpoint"] = self.healthcheck_endpoint
        out |= _omitempty(
            [
                ("user_quota", self.user_quota),
                ("offload_engine", self.offload_engine),
                ("offload_interfaces", list(self.offload_interfaces)),
                ("relay_address_family", self.relay_address_family),
                ("license_config", self.license_config and self.license_config.to_dict()),
            ]
        )
        return out

    def __str__(self) -> str:
        status = [f"name={go_quote(self.name)}", f"logLevel={go_quote(self.loglevel)}"]
        if self.metrics_endpoint:
            status.append(f"metrics={go_quote(self.metrics_endpoint)}")
        status.append(f"health-check={go_quote(self.healthcheck_endpoint)}")
        if self.user_quota > 0:
            status.append(f"quota={self.user_quota}")
        interfaces = "all"
        if self.offload_engine != "None" and self.offload_interfaces:
            interfaces = "<" + ",".join(self.offload_interfaces) + ">"
        status.append(f"offload={self.offload_engine}[{interfaces}]")
        if self.relay_address_family:
            status.append(f"relay-family={self.relay_address_family}")
        status.append(f"license_info={self.license_config or '<MISSING>'}")
        return "admin:{" + ",".join(status) + "}"


class AuthConfig(_GoStruct):
    """`auth`: the STUN/TURN long-term credential mechanism."""

    type: AuthType = "static"
    realm: str = DEFAULT_REALM
    credentials: dict[str, str] = Field(default_factory=dict, repr=False)
    # Ours (issue 29; Go's stunnerd ignores them): user ids that may no longer allocate (their
    # allocations end, a new Allocate gets 403), and, for ephemeral credentials, allocations
    # that end when their username's timestamp passes (eturnal's strict_expiry).
    revoked_users: list[str] = Field(default_factory=list)
    strict_expiry: bool = False
    # Ours (issue 29; coturn's max-bps): each allocation's relayed traffic, each direction on
    # its own, capped at this many bits per second (stunner_api.bandwidth); 0: no cap.
    allocation_bandwidth_limit: int = Field(default=0, ge=0)

    @field_validator("type", mode="before")
    @classmethod
    def _normalize_type(cls, value: object) -> object:
        return _normalize(value, AUTH_TYPES, str.lower, "static", "authentication type")

    @property
    def stun_only(self) -> bool:
        """Type `none`: a pure STUN server (Go's nil auth handler; the operator renders it for
        a GatewayConfig with `stunMode: true`). Binding is answered, every TURN request gets
        403 and no allocation is ever made."""
        return self.type == "none"

    @field_validator("realm", mode="before")
    @classmethod
    def _default_realm(cls, value: object) -> object:
        return _empty_is_default(value, DEFAULT_REALM)

    @field_validator("credentials", mode="before")
    @classmethod
    def _null_credential_is_empty(cls, value: object) -> object:
        if isinstance(value, Mapping):
            return {k: "" if v is None else v for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _check_credentials(self) -> AuthConfig:
        keys = self.credentials.keys()
        if self.type == "static" and not {"username", "password"} <= keys:
            raise _reject("static: empty username or password", "credentials")
        if self.type == "ephemeral" and "secret" not in keys:
            raise _reject(
                "cannot handle auth config for type ephemeral: invalid secret", "credentials"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        """Go JSON form: `credentials` has no omitempty; its keys are sorted."""
        out = _omitempty([("type", self.type), ("realm", self.realm)])
        out["credentials"] = dict(sorted(self.credentials.items()))
        return out | _omitempty(
            [
                ("revoked_users", sorted(set(self.revoked_users))),
                ("strict_expiry", self.strict_expiry),
                ("allocation_bandwidth_limit", self.allocation_bandwidth_limit),
            ]
        )

    def __str__(self) -> str:
        def shown(key: str) -> str:
            value = self.credentials.get(key)
            return "-" if value is None else SECRET if value else "<MISSING>"

        status = [f"realm={go_quote(self.realm)}", f"type={go_quote(self.type)}"]
        if self.type == "static":
            status.append(f"username={go_quote(shown('username'))}")
            status.append(f"password={go_quote(shown('password'))}")
        elif self.type == "ephemeral":
            status.append(f"shared-secret={go_quote(shown('secret'))}")
        if self.revoked_users:
            status.append(f"revoked={len(set(self.revoked_users))}")
        if self.strict_expiry:
            status.append("strict-expiry=true")
        if self.allocation_bandwidth_limit:
            status.append(f"bandwidth-limit={self.allocation_bandwidth_limit}bps")
        return "auth:{" + ",".join(status) + "}"


def uri_host_port(host: str, port: int | str) -> str:
    """`host:port` as a URI's authority: an IPv6 literal in brackets (RFC 3986 §3.2.2)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class ListenerConfig(_GoStruct):
    """`listeners[]`: a TURN server socket and the clusters its clients may reach."""

    name: str = ""
    protocol: ListenerProtocol = "TURN-UDP"
    public_address: str = ""
    public_port: int = 0
    # The advertised relay address (the pod IP in Kubernetes); sockets bind the wildcard.
    address: str = DEFAULT_ADDRESS
    port: int = DEFAULT_PORT
    cert: str = Field(default="", repr=False)  # base64 PEM
    key: str = Field(default="", repr=False)  # base64 PEM
    routes: list[str] = Field(default_factory=list)

    @field_validator("protocol", mode="before")
    @classmethod
    def _normalize_protocol(cls, value: object) -> object:
        return _normalize(value, LISTENER_PROTOCOLS, str.upper, "TURN-UDP", "listener protocol")

    @field_validator("public_port")
    @classmethod
    def _check_public_port(cls, value: int) -> int:
        if not 0 <= value <= 65535:
            raise _reject(f"must be 0..65535, got {value}")
        return value

    @field_validator("address", mode="before")
    @classmethod
    def _default_address(cls, value: object) -> object:
        return "127.0.0.1" if value == "localhost" else _empty_is_default(value, DEFAULT_ADDRESS)

    @field_validator("port", mode="before")
    @classmethod
    def _default_port(cls, value: object) -> object:
        return _empty_is_default(value, DEFAULT_PORT)

    @field_validator("port")
    @classmethod
    def _check_port(cls, value: int) -> int:
        if not 1 <= value <= 65535:
            raise _reject(f"must be 1..65535, got {value}")
        return value

    @field_validator("routes")
    @classmethod
    def _sort_routes(cls, value: list[str]) -> list[str]:
        return sorted(value)

    @model_validator(mode="after")
    def _check_listener(self) -> ListenerConfig:
        if not self.name:
            raise _reject("missing name in listener configuration", "name")
        if self.facts.tls:
            if not self.cert:
                raise _reject(f"empty TLS cert for {self.protocol} listener", "cert")
            if not self.key:
                raise _reject(f"empty TLS key for {self.protocol} listener", "key")
        return self

    @property
    def facts(self) -> ProtocolFacts:
        """The protocol's row of the vocabulary's protocol table."""
        return LISTENER_PROTOCOL_TABLE[self.protocol]

    def uri(self, rfc7065: bool = True) -> str:
        """The client URI (GetListenerURI): `turn:<addr>:<port>?transport=udp` and the like.

        The public address and port win over `address` and `port`. An IPv6 address is
        bracketed (`turn:[2001:db8::1]:3478`, RFC 7065's host is RFC 3986's, whose IPv6
        literal is in brackets; Go writes it bare, which browsers refuse). With
        `rfc7065=False` the scheme is followed by "://".
        """
        facts = self.facts
        address = self.public_address or self.address
        port = self.public_port or self.port
        separator = ":" if rfc7065 else "://"
        authority = uri_host_port(address, port)
        return f"{facts.scheme}{separator}{authority}?transport={facts.uri_transport}"

    def to_dict(self) -> dict[str, Any]:
        """Go JSON form (`omitempty` everywhere)."""
        return _omitempty(
            [
                ("name", self.name),
                ("protocol", self.protocol),
                ("public_address", self.public_address),
                ("public_port", self.public_port),
                ("address", self.address),
                ("port", self.port),
                ("cert", self.cert),
                ("key", self.key),
                ("routes", list(self.routes)),
            ]
        )

    def __str__(self) -> str:
        public = uri_host_port(self.public_address or "-", self.public_port or "-")
        cert_key = f"{SECRET if self.cert else '-'}/{SECRET if self.key else '-'}"
        status = [
            f"turn://{uri_host_port(self.address, self.port)}?transport={self.protocol}",
            f"public={public}",
            f"cert/key={cert_key}",
            "routes=[" + ",".join(self.routes) + "]",
        ]
        return f"{go_quote(self.name or '-')}:{{" + ",".join(status) + "}"


# Memoised: a pure function of the text, asked of every endpoint of every cluster each time the
# reconciler renders (pod addresses repeat from one render to the next); bounded for pod churn.
@functools.lru_cache(maxsize=1 << 16)
def static_endpoint_error(endpoint: str) -> str | None:
    """Why `endpoint` is not a STATIC cluster endpoint (IP or CIDR, optional ":<min-max>").

    None when it is one. The parser is the router's own (`endpoints.parse_static_endpoint`), so
    what admission accepts is exactly what the dataplane can route. Stricter than Go, which logs
    and skips a bad endpoint.
    """
    try:
        parse_static_endpoint(endpoint)
    except EndpointError as exc:
        if exc.port_range is not None:
            low, high = exc.port_range
            return (
                f"invalid endpoint {go_quote(endpoint)}: port range <{low}-{high}> "
                "must have 0 <= min <= max <= 65535"
            )
        return f"invalid endpoint {go_quote(endpoint)}: not an IP address or CIDR prefix"
    return None


def dns_endpoint_error(endpoint: str) -> str | None:
    """Why `endpoint` is not a STRICT_DNS cluster endpoint (a DNS name); None when it is one."""
    name = endpoint.removesuffix(".")
    if 0 < len(name) <= 253 and all(_DNS_LABEL.fullmatch(lab) for lab in name.split(".")):
        return None
    return f"invalid endpoint {go_quote(endpoint)}: not a DNS name"


_ENDPOINT_CHECKS: Mapping[str, Callable[[str], str | None]] = {
    "STATIC": static_endpoint_error,
    "STRICT_DNS": dns_endpoint_error,
}


class ClusterConfig(_GoStruct):
    """`clusters[]`: the peers a client may reach, by address (STATIC) or by name (STRICT_DNS)."""

    name: str = ""
    type: ClusterType = "STATIC"
    protocol: ClusterProtocol = "UDP"
    endpoints: list[str] = Field(default_factory=list)

    @field_validator("type", mode="before")
    @classmethod
    def _normalize_type(cls, value: object) -> object:
        return _normalize(value, CLUSTER_TYPES, str.upper, "STATIC", "cluster type")

    @field_validator("protocol", mode="before")
    @classmethod
    def _normalize_protocol(cls, value: object) -> object:
        return _normalize(value, CLUSTER_PROTOCOLS, str.upper, "UDP", "cluster protocol")

    @field_validator("endpoints")
    @classmethod
    def _check_endpoints(cls, value: list[str], info: ValidationInfo) -> list[str]:
        # `type` is validated first; if it failed, that error is reported instead.
        check = _ENDPOINT_CHECKS.get(info.data.get("type", ""))
        for index, endpoint in enumerate(value):
            if check is not None and (reason := check(endpoint)):
                raise _reject(reason, f"[{index}]")
        return sorted(value)

    @model_validator(mode="after")
    def _check_name(self) -> ClusterConfig:
        if not self.name:
            raise _reject("missing name in cluster configuration", "name")
        return self

    def to_dict(self) -> dict[str, Any]:
        """Go JSON form: `name` is always present, the rest is `omitempty`."""
        return {"name": self.name} | _omitempty(
            [("type", self.type), ("protocol", self.protocol), ("endpoints", list(self.endpoints))]
        )

    def __str__(self) -> str:
        status = [
            f"type={go_quote(self.type)}",
            f"protocol={go_quote(self.protocol)}",
            "endpoints=[" + ",".join(self.endpoints) + "]",
        ]
        return f"{go_quote(self.name or '-')}:{{" + ",".join(status) + "}"


def _check_unique(names: list[str], kind: str) -> None:
    seen: set[str] = set()
    for index, name in enumerate(names):
        if name in seen:
            raise _reject(f"duplicate {kind} name {go_quote(name)}", f"[{index}].name")
        seen.add(name)


class StunnerConfig(_GoStruct):
    """The whole dataplane config (`version`, `admin`, `auth`, `listeners`, `clusters`)."""

    version: Literal["v1"]
    admin: AdminConfig = Field(default_factory=AdminConfig)
    auth: AuthConfig
    listeners: list[ListenerConfig] = Field(default_factory=list)
    clusters: list[ClusterConfig] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _go_zero_values(cls, data: Any) -> Any:
        """A missing version or auth is Go's zero value, which validation then rejects."""
        if isinstance(data, Mapping):
            return {"version": "", "auth": {}} | {k: v for k, v in data.items() if v is not None}
        return data

    @field_validator("version", mode="before")
    @classmethod
    def _check_version(cls, value: object) -> object:
        if value == API_VERSION_V1ALPHA1:
            return API_VERSION  # same shape; the v1alpha1-only keys are dropped as unknown
        if value != API_VERSION:
            raise _reject(f"unsupported API version: {go_quote(value)}")
        return value

    @field_validator("listeners")
    @classmethod
    def _unique_listeners(cls, value: list[ListenerConfig]) -> list[ListenerConfig]:
        _check_unique([item.name for item in value], "listener")
        return value

    @field_validator("clusters")
    @classmethod
    def _unique_clusters(cls, value: list[ClusterConfig]) -> list[ClusterConfig]:
        _check_unique([item.name for item in value], "cluster")
        return value

    def to_dict(self) -> dict[str, Any]:
        """The content of `to_json()` as a dict."""
        out: dict[str, Any] = {
            "version": self.version,
            "admin": self.admin.to_dict(),
            "auth": self.auth.to_dict(),
        }
        return out | _omitempty(
            [
                ("listeners", [listener.to_dict() for listener in self.listeners]),
                ("clusters", [cluster.to_dict() for cluster in self.clusters]),
            ]
        )

    def to_json(self) -> str:
        """What Go's `json.Marshal` emits for this config, byte for byte."""
        text = json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))
        # encoding/json escapes HTML-significant characters and the JS line separators.
        for char, escaped in (
            ("<", "\\u003c"),
            (">", "\\u003e"),
            ("&", "\\u0026"),
            ("\u2028", "\\u2028"),
            ("\u2029", "\\u2029"),
        ):
            text = text.replace(char, escaped)
        return text

    def listener(self, name: str) -> ListenerConfig | None:
        """The listener called `name`, if any."""
        return next((item for item in self.listeners if item.name == name), None)

    def cluster(self, name: str) -> ClusterConfig | None:
        """The cluster called `name`, if any."""
        return next((item for item in self.clusters if item.name == name), None)

    def __str__(self) -> str:
        listeners = ",".join(str(item) for item in self.listeners)
        clusters = ",".join(str(item) for item in self.clusters)
        return (
            f"{{version={go_quote(self.version)},{self.admin},{self.auth},"
            f"listeners=[{listeners}],clusters=[{clusters}]}}"
        )


def _error_path(error: ErrorDetails) -> str:
    """pydantic's loc (+ our `field` suffix) as "listeners[0].port"."""
    path = field_path(error["loc"])
    suffix = str(error.get("ctx", {}).get("field", ""))
    if suffix:
        path += suffix if suffix.startswith("[") or not path else f".{suffix}"
    return path


def _error_message(error: ErrorDetails) -> str:
    path = _error_path(error)
    given = error["input"]
    if error["type"] == "stunner_config" or _is_secret_path(path):
        reason = error["msg"]  # a secret's value is never echoed, as `redacted` hides it
    elif error["type"] in _SECTION_ERRORS or isinstance(given, Mapping | list | tuple):
        reason = f"{error['msg']}, got {type(given).__name__}"  # it may hold credentials, a key
    else:  # pydantic's own type errors on a scalar field: show what was given
        reason = f"{error['msg']}, got {given!r}"
    return f"{path}: {reason}" if path else reason


_SECRET_PATH = re.compile(r"auth\.credentials\b|listeners\[\d+\]\.(cert|key)$|.*\.hmac$")


# pydantic's errors where a section (a model, a list or map of them) was wanted: what came in
# place of one that holds credentials or a TLS key is named by its type only.
_SECTION_ERRORS = frozenset({"model_type", "model_attributes_type", "dict_type", "list_type"})


def _is_secret_path(path: str) -> bool:
    """A field `redacted` hides (credentials, TLS cert/key, license HMAC), or one inside it."""
    return _SECRET_PATH.match(path) is not None


def _config_error(exc: ValidationError) -> ConfigError:
    return ConfigError("; ".join(_error_message(error) for error in exc.errors()))


def validate_config(data: Mapping[str, Any]) -> StunnerConfig:
    """Validate and normalise an already parsed config (no env substitution)."""
    try:
        return StunnerConfig.model_validate(data)
    except ValidationError as exc:
        raise _config_error(exc) from None


def redacted(config: StunnerConfig) -> StunnerConfig:
    """A copy safe to log or show: credential values, TLS cert/key and license HMAC hidden."""
    auth = config.auth.model_copy(
        update={"credentials": {key: SECRET for key in config.auth.credentials}}
    )
    admin = config.admin
    if admin.license_config is not None and admin.license_config.hmac:
        license_config = admin.license_config.model_copy(update={"hmac": SECRET})
        admin = admin.model_copy(update={"license_config": license_config})
    listeners = [
        listener.model_copy(
            update={"cert": SECRET if listener.cert else "", "key": SECRET if listener.key else ""}
        )
        for listener in config.listeners
    ]
    return config.model_copy(update={"admin": admin, "auth": auth, "listeners": listeners})


def zero_config(name: str = DEFAULT_STUNNER_NAME) -> StunnerConfig:
    """The config the CDS sends for a deleted Gateway: dummy static auth, nothing else."""
    return validate_config(
        {
            "version": API_VERSION,
            "admin": {"name": name},
            "auth": {
                "type": "static",
                "realm": DEFAULT_REALM,
                "credentials": {
                    "username": ZERO_CONFIG_USERNAME,
                    "password": ZERO_CONFIG_PASSWORD,
                },
            },
        }
    )


ZERO_CONFIG = zero_config()


def is_zero_config(config: StunnerConfig) -> bool:
    """Whether `config` is the zero config of its daemon name: a deletion (IsConfigDeleted)."""
    return config == zero_config(config.admin.name)
