"""The dataplane config of one Gateway, the parts of ANCHORS §2.3 (managed mode).

- `admin` from the GatewayConfig and the Dataplane;
- `auth` from the GatewayConfig's inline fields or its `authRef` Secret, or type `none` for
  `stunMode: true`;
- one listener per rendered Gateway listener (built by core), at `$STUNNER_ADDR`;
- one cluster per attached UDPRoute: the EndpointSlice addresses of Service backends (every
  one, ready or not: the list is a permission, and a starting or terminating pod still carries
  calls) plus the ClusterIP, StaticService prefixes, the `:<port-endPort>` suffix; STRICT_DNS
  cluster DNS names when endpoint discovery is off.

Unlike Go STUNner, a backend in another namespace needs a ReferenceGrant there, and a cluster
whose backends are all TCP Service ports is a TCP cluster (Go always renders UDP).
"""

from __future__ import annotations

import base64
import binascii
import functools
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stunner_api.dataplane import DEFAULT_HEALTHCHECK_ENDPOINT as HEALTHCHECK_ENDPOINT
from stunner_api.vocabulary import (
    AUTH_SECRET_PASSWORD_KEYS,
    AUTH_SECRET_SHARED_SECRET_KEYS,
    AUTH_SECRET_TYPE_KEY,
    AUTH_SECRET_USERNAME_KEYS,
    AUTH_TYPE_ALIASES,
    BACKEND_KINDS,
    CORE_GROUP,
    DEFAULT_AUTH_TYPE,
    DEFAULT_LOG_LEVEL,
    DEFAULT_REALM,
    GATEWAY_API_GROUP,
    GATEWAY_CONFIG_AUTH_TYPES,
    STUNNER_GROUP,
    TLS_CERT_KEYS,
    TLS_KEY_KEYS,
    AuthType,
    group_of,
)
from stunner_api.vocabulary import ConditionReason as Reason

from ..store import Kind, Object, Snapshot, name_of, namespace_of
from .plan import RenderSettings

STUNNER_ADDR = "$STUNNER_ADDR"
METRICS_ENDPOINT = "http://:8080/metrics"


def _spec(obj: Object | None) -> Mapping[str, Any]:
    value = (obj or {}).get("spec")
    return value if isinstance(value, Mapping) else {}


# --- admin and auth ---------------------------------------------------------------------------


def admin(config_id: str, gateway_config: Object, dataplane: Object) -> dict[str, Any]:
    """The `admin` section: name, log level, health check, metrics, quota, offload."""
    gwc, dp = _spec(gateway_config), _spec(dataplane)
    out: dict[str, Any] = {
        "name": config_id,
        "loglevel": gwc.get("logLevel") or DEFAULT_LOG_LEVEL,
        "healthcheck_endpoint": "" if dp.get("disableHealthCheck") else HEALTHCHECK_ENDPOINT,
    }
    if dp.get("enableMetricsEndpoint"):
        out["metrics_endpoint"] = METRICS_ENDPOINT
    if isinstance(gwc.get("userQuota"), int):
        out["user_quota"] = gwc["userQuota"]
    if dp.get("offloadEngine"):
        out["offload_engine"] = dp["offloadEngine"]
    if dp.get("offloadInterfaces"):
        out["offload_interfaces"] = list(dp["offloadInterfaces"])
    return out


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
    spec = _spec(gateway_config)
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
    return {"type": str(auth_type), "realm": realm, "credentials": credentials}


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


# --- clusters ---------------------------------------------------------------------------------


@dataclass
class Cluster:
    """One route's cluster and what went wrong resolving its backends."""

    name: str
    type: str = "STATIC"
    protocol: str = "UDP"
    endpoints: list[str] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (reason, message)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "protocol": self.protocol,
            "endpoints": sorted(set(self.endpoints)),
        }


def _port_suffix(ref: Mapping[str, Any], ports_apply: bool) -> str:
    port, end_port = ref.get("port"), ref.get("endPort")
    if not ports_apply or not isinstance(port, int):
        return ""
    end = end_port if isinstance(end_port, int) else port
    return f":<{port}-{end}>"


# Memoised: asked of every endpoint address of every backend Service in each render, and the
# addresses repeat from one render to the next; bounded for pod churn.
@functools.lru_cache(maxsize=1 << 16)
def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _service_addresses(service: Object, snapshot: Snapshot, settings: RenderSettings) -> list[str]:
    namespace, name = namespace_of(service), name_of(service)
    out: list[str] = []
    for endpoint_slice in snapshot.endpoint_slices(namespace, name):
        if endpoint_slice.get("addressType") not in ("IPv4", "IPv6", None):
            continue  # FQDN slices carry names, not addresses
        for endpoint in endpoint_slice.get("endpoints") or []:
            out += [a for a in endpoint.get("addresses") or [] if is_ip(str(a))]
    if settings.relay_to_cluster_ip:
        spec = _spec(service)
        cluster_ips = spec.get("clusterIPs") or [spec.get("clusterIP")]
        out += [str(ip) for ip in cluster_ips if ip and ip != "None" and is_ip(str(ip))]
    return out


def _service_transports(service: Object, ref: Mapping[str, Any]) -> set[str]:
    """The protocols of the Service ports a backendRef's port range selects."""
    port, end_port = ref.get("port"), ref.get("endPort")
    if not isinstance(port, int):
        return {"UDP"}  # every port: the route is about media, which is UDP
    end = end_port if isinstance(end_port, int) else port
    selected = [
        str(p.get("protocol") or "TCP")
        for p in _spec(service).get("ports") or []
        if isinstance(p, Mapping) and isinstance(p.get("port"), int) and port <= p["port"] <= end
    ]
    return set(selected) or {"UDP"}


def cluster(route: Object, snapshot: Snapshot, settings: RenderSettings) -> Cluster:
    """The cluster of a UDPRoute: its first rule's backends (the other rules are not used)."""
    route_namespace, route_group = namespace_of(route), group_of(str(route.get("apiVersion")))
    result = Cluster(name=f"{route_namespace}/{name_of(route)}")
    rules_ = [r for r in _spec(route).get("rules") or [] if isinstance(r, Mapping)]
    refs = (
        [r for r in (rules_[0].get("backendRefs") or []) if isinstance(r, Mapping)]
        if rules_
        else []
    )
    # The Gateway API UDPRoute's port is required by its schema and ignored (GATEWAY.md).
    ports_apply = route_group == STUNNER_GROUP
    resolved: list[tuple[str, list[str]]] = []  # (cluster type, endpoints) per backend
    transports: set[str] = set()
    for ref in refs:
        group, kind = str(ref.get("group") or ""), str(ref.get("kind") or "Service")
        namespace, name = str(ref.get("namespace") or route_namespace), str(ref.get("name") or "")
        where = f"{kind} {namespace}/{name}"
        if (group, kind) not in BACKEND_KINDS:
            result.problems.append(
                (Reason.INVALID_KIND, f"backend group {group!r} kind {kind!r} is not supported")
            )
            continue
        if not snapshot.permits(
            (route_group, "UDPRoute", route_namespace), (group, kind, namespace, name)
        ):
            result.problems.append(
                (
                    Reason.REF_NOT_PERMITTED,
                    f"backend {where} is in another namespace and no ReferenceGrant there "
                    f"permits UDPRoutes of {route_namespace}",
                )
            )
            continue
        suffix = _port_suffix(ref, ports_apply)
        if kind == "StaticService":
            static = snapshot.get(Kind.STATIC_SERVICE, namespace, name)
            if static is None:
                result.problems.append((Reason.BACKEND_NOT_FOUND, f"backend {where} not found"))
                continue
            transports.add("UDP")
            prefixes = [str(p) for p in _spec(static).get("prefixes") or []]
            resolved.append(("STATIC", [f"{p}{suffix}" for p in prefixes]))
            continue
        service = snapshot.get(Kind.SERVICE, namespace, name)
        if service is None:
            result.problems.append((Reason.BACKEND_NOT_FOUND, f"backend {where} not found"))
            continue
        transports |= _service_transports(service, ref) if ports_apply else {"UDP"}
        if settings.endpoint_discovery:
            addresses = _service_addresses(service, snapshot, settings)
            resolved.append(("STATIC", [f"{a}{suffix}" for a in addresses]))
        else:
            resolved.append(("STRICT_DNS", [f"{name}.{namespace}.svc.{settings.cluster_domain}"]))
    if resolved:
        result.type = resolved[0][0]
        result.endpoints = [e for t, endpoints in resolved if t == result.type for e in endpoints]
        if any(t != result.type for t, _ in resolved):
            result.problems.append(
                (
                    Reason.BACKEND_NOT_FOUND,
                    "inconsistent cluster type for backends: StaticServices (STATIC) and "
                    "Services without endpoint discovery (STRICT_DNS) cannot share a route",
                )
            )
    result.protocol = "TCP" if transports == {"TCP"} else "UDP"
    return result
