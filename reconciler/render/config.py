"""The dataplane config of one Gateway, the parts of ANCHORS §2.3 (managed mode).

- `admin` from the GatewayConfig and the Dataplane;
- `auth` from the GatewayConfig's inline fields or its `authRef` Secret, or type `none` for
  `stunMode: true` (the classes stage);
- one listener per rendered Gateway listener, at `$STUNNER_ADDR` (or, with relay address
  discovery, the node placeholder the CDS patches per Node) (its TLS pair found by the
  listeners stage, `tls_pair`; its public address by the addresses stage);
- one cluster per attached UDPRoute (clusters.py, found by the routes stage).

The config stage (`dataplane_config`) puts them together and validates the result.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

from stunner_api.annotations import (
    RELAY_ADDRESS_DISCOVERY_ROW,
    TARGETPORT_ROW,
    DaemonPorts,
    Limits,
    daemon_ports,
)
from stunner_api.dataplane import ConfigError, StunnerConfig, validate_config
from stunner_api.vocabulary import (
    AUTH_SECRET_PASSWORD_KEYS,
    AUTH_SECRET_SHARED_SECRET_KEYS,
    AUTH_SECRET_TYPE_KEY,
    AUTH_SECRET_USERNAME_KEYS,
    AUTH_TYPE_ALIASES,
    CORE_GROUP,
    DEFAULT_AUTH_TYPE,
    DEFAULT_LOG_LEVEL,
    DEFAULT_REALM,
    GATEWAY_API_GROUP,
    GATEWAY_CONFIG_AUTH_TYPES,
    NODE_ADDRESS_PLACEHOLDER,
    STUNNER_GROUP,
    TLS_CERT_KEYS,
    TLS_KEY_KEYS,
    AuthType,
)
from stunner_api.vocabulary import ConditionReason as Reason

from ..store import Kind, Object, Snapshot, meta, namespace_of
from . import manifests
from .clusters import Cluster
from .context import Attachments, Context, GatewayPlan, ListenerPlan, Staged, finding, id_of
from .plan import Finding

STUNNER_ADDR = "$STUNNER_ADDR"


def _spec(obj: Object | None) -> Mapping[str, Any]:
    value = (obj or {}).get("spec")
    return value if isinstance(value, Mapping) else {}


# --- admin and auth ---------------------------------------------------------------------------


def stunnerd_ports(gateway: Object, dataplane: Object) -> DaemonPorts:
    """The health-check and metrics ports of a Gateway's stunnerd (its annotations, else 8086
    and 8080; None when its Dataplane turns that endpoint off): the config's admin endpoints
    and the pod's probes and ports are both rendered from this one answer."""
    annotations = meta(gateway).get("annotations")
    return daemon_ports(annotations if isinstance(annotations, Mapping) else {}, _spec(dataplane))


def admin(
    config_id: str, gateway_config: Object, dataplane: Object, ports: DaemonPorts
) -> dict[str, Any]:
    """The `admin` section: name, log level, health check and metrics (at `ports`), quota,
    offload."""
    gwc, dp = _spec(gateway_config), _spec(dataplane)
    out: dict[str, Any] = {
        "name": config_id,
        "loglevel": gwc.get("logLevel") or DEFAULT_LOG_LEVEL,
        "healthcheck_endpoint": "" if ports.health is None else f"http://:{ports.health}",
    }
    if ports.metrics is not None:
        out["metrics_endpoint"] = f"http://:{ports.metrics}/metrics"
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


# --- the stage --------------------------------------------------------------------------------


def relay_address(gateway: Object, gateway_config: Object, limits: Limits) -> str:
    """A rendered listener's `address`: the pod's address (stunnerd expands it), or with relay
    address discovery the node placeholder, which the CDS replaces for each stunnerd with its
    Node's public address (reconciler.cds; the pod sends its node name, STUNNER_NODENAME)."""
    if manifests.annotation(RELAY_ADDRESS_DISCOVERY_ROW, gateway, gateway_config, limits):
        return NODE_ADDRESS_PLACEHOLDER
    return STUNNER_ADDR


def _listener(
    gw_id: str,
    listener: ListenerPlan,
    public: tuple[str, int] | None,
    routes: Sequence[str],
    targetports: Mapping[str, int],
    address: str,
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": f"{gw_id}/{listener.name}",
        "protocol": str(listener.protocol),
        "address": address,
        "port": targetports.get(listener.name, listener.port),
        "routes": list(routes),
    }
    if public is not None:
        entry["public_address"], entry["public_port"] = public
    if listener.cert:
        entry["cert"], entry["key"] = listener.cert, listener.key
    return entry


def dataplane_config(
    ctx: Context,
    plan: GatewayPlan,
    publics: Sequence[tuple[str, int] | None],
    attachments: Attachments,
    clusters: Mapping[str, Cluster],
) -> Staged[StunnerConfig | str]:
    """The stage: a rendered Gateway's dataplane config, or why the config it makes is invalid
    (a finding too). `publics` are its listeners' public addresses (the addresses stage, in the
    order of `plan.listeners`), `attachments` the routes attached to them (the routes stage)."""
    gateway, of_class = plan.gateway, plan.context
    assert of_class.gateway_config is not None and of_class.dataplane is not None
    gw_id, key = id_of(gateway), plan.key
    limits = Limits(ctx.rule_settings.node_port_range)
    targetports = manifests.annotation(TARGETPORT_ROW, gateway, of_class.gateway_config, limits)
    address = relay_address(gateway, of_class.gateway_config, limits)
    listeners = [
        _listener(gw_id, lst, public, attachments.get((key, lst.index), ()), targetports, address)
        for lst, public in zip(plan.listeners, publics, strict=True)
        if lst.rendered
    ]
    routes = sorted({r for lst in plan.listeners for r in attachments.get((key, lst.index), ())})
    data = {
        "version": "v1",
        "admin": admin(
            gw_id,
            of_class.gateway_config,
            of_class.dataplane,
            stunnerd_ports(gateway, of_class.dataplane),
        ),
        "auth": of_class.auth,
        "listeners": listeners,
        "clusters": [clusters[r].to_dict() for r in routes],
    }
    found: tuple[Finding, ...] = ()
    try:
        rendered: StunnerConfig | str = validate_config(data)
    except ConfigError as exc:
        rendered = f"rendered dataplane config is invalid: {exc}"
        found = (finding(gateway, "", rendered, Reason.INVALID),)
    return Staged(rendered, found)
