"""The Kubernetes resources STUNner consumes, as pydantic models (docs/GATEWAY.md).

GatewayClass, Gateway (Gateway API), GatewayConfig, Dataplane, StaticService and UDPRoute
(`stunner.l7mp.io/v1`, and the Gateway API `gateway.networking.k8s.io/v1alpha2` UDPRoute).
Python attribute names are snake_case; the JSON/YAML keys are the camelCase ones of the CRDs
(aliases), and either spelling is accepted on input.

Unknown fields are kept (`extra="allow"`) at every level, so `parse_resource(obj).to_dict()`
gives back `obj` unchanged: an object patched back to the API server never loses a field this
code does not know about. Defaults are the documented ones; `to_dict()` leaves out what the
user did not set, so defaults never leak into a round trip.

Pure: no Kubernetes client, no I/O. `parse_resource` raises `ValueError` for a kind it does not
know and `pydantic.ValidationError` for a malformed object.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from stunner_api.vocabulary import (
    CORE_GROUP,
    DATAPLANE,
    DEFAULT_ADDRESS_TYPE,
    DEFAULT_AUTH_TYPE,
    DEFAULT_DATAPLANE,
    DEFAULT_LOG_LEVEL,
    DEFAULT_REALM,
    DEFAULT_ROUTE_NAMESPACES_FROM,
    DEFAULT_TLS_MODE,
    GATEWAY,
    GATEWAY_API_GROUP,
    GATEWAY_API_TCP_ROUTE,
    GATEWAY_API_UDP_ROUTE,
    GATEWAY_CLASS,
    GATEWAY_CONFIG,
    STATIC_SERVICE,
    STUNNER_GROUP,
    STUNNER_UDP_ROUTE,
    KindInfo,
    judged_kind,
)


class Model(BaseModel):
    """Base of every model: camelCase aliases, unknown fields kept."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="allow",
    )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form with the CRD's keys, only the fields that were set (plus unknown ones)."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class ObjectMeta(Model):
    name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    # Values are strings for the API server; manifests in the docs also show bare booleans.
    annotations: dict[str, Any] = Field(default_factory=dict)


class Resource(Model):
    """Common envelope of every resource."""

    api_version: str
    kind: str
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)


# --- references -------------------------------------------------------------------------------


class SecretObjectReference(Model):
    """Gateway API SecretObjectReference: a Secret, namespace defaulting to the referrer's."""

    group: str = CORE_GROUP
    kind: str = "Secret"
    name: str
    namespace: str | None = None


class ParametersReference(Model):
    """GatewayClass.spec.parametersRef: a GatewayConfig (group and kind may be omitted)."""

    group: str = STUNNER_GROUP
    kind: str = "GatewayConfig"
    name: str
    namespace: str | None = None


class ParentReference(Model):
    group: str = GATEWAY_API_GROUP
    kind: str = "Gateway"
    name: str
    namespace: str | None = None
    section_name: str | None = None
    port: int | None = None


class BackendRef(Model):
    """A UDPRoute backend: a Service (group "") or a StaticService (group stunner.l7mp.io)."""

    group: str = CORE_GROUP
    kind: str = "Service"
    name: str
    namespace: str | None = None
    port: int | None = None
    end_port: int | None = None
    weight: int | None = None


# --- GatewayClass -----------------------------------------------------------------------------


class GatewayClassSpec(Model):
    controller_name: str
    parameters_ref: ParametersReference | None = None
    description: str | None = None


class GatewayClass(Resource):
    spec: GatewayClassSpec


# --- GatewayConfig ----------------------------------------------------------------------------


class GatewayConfigSpec(Model):
    dataplane: str = DEFAULT_DATAPLANE
    log_level: str = DEFAULT_LOG_LEVEL
    realm: str = DEFAULT_REALM
    auth_ref: SecretObjectReference | None = None
    auth_type: str = DEFAULT_AUTH_TYPE.value
    user_name: str | None = None
    password: str | None = None
    shared_secret: str | None = None
    auth_lifetime: int | None = None
    load_balancer_service_annotations: dict[str, Any] = Field(default_factory=dict)
    user_quota: int | None = None
    stun_mode: bool | None = None
    # Ours (issue 29): user ids that may no longer allocate (rendered as auth.revoked_users),
    # and allocations of ephemeral credentials that end with them (auth.strict_expiry).
    revoked_users: list[str] | None = None
    strict_expiry: bool | None = None
    # Ours (issue 29; coturn's max-bps): bits per second each allocation may relay, each
    # direction on its own (rendered as auth.allocation_bandwidth_limit; stunner_api.bandwidth).
    allocation_bandwidth_limit: int | None = None


class GatewayConfig(Resource):
    spec: GatewayConfigSpec = Field(default_factory=GatewayConfigSpec)


# --- Gateway ----------------------------------------------------------------------------------


class GatewayTLSConfig(Model):
    mode: str = DEFAULT_TLS_MODE
    certificate_refs: list[SecretObjectReference] = Field(default_factory=list)
    options: dict[str, str] = Field(default_factory=dict)


class RouteNamespaces(Model):
    from_: str = Field(default=DEFAULT_ROUTE_NAMESPACES_FROM, alias="from")
    selector: dict[str, Any] | None = None


class AllowedRoutes(Model):
    namespaces: RouteNamespaces = Field(default_factory=RouteNamespaces)
    kinds: list[dict[str, Any]] = Field(default_factory=list)


class Listener(Model):
    name: str
    port: int
    protocol: str
    hostname: str | None = None
    tls: GatewayTLSConfig | None = None
    allowed_routes: AllowedRoutes = Field(default_factory=AllowedRoutes)


class GatewayAddress(Model):
    type: str = DEFAULT_ADDRESS_TYPE
    value: str


class GatewaySpec(Model):
    gateway_class_name: str
    listeners: list[Listener]
    addresses: list[GatewayAddress] = Field(default_factory=list)


class Gateway(Resource):
    spec: GatewaySpec


# --- UDPRoute ---------------------------------------------------------------------------------


class UDPRouteRule(Model):
    name: str | None = None
    backend_refs: list[BackendRef] = Field(default_factory=list)


class UDPRouteSpec(Model):
    parent_refs: list[ParentReference] = Field(default_factory=list)
    rules: list[UDPRouteRule] = Field(default_factory=list)


class UDPRoute(Resource):
    """STUNner's own UDPRoute (stunner.l7mp.io/v1) and the Gateway API v1alpha2 one."""

    spec: UDPRouteSpec = Field(default_factory=UDPRouteSpec)


class TCPRoute(Resource):
    """The Gateway API TCPRoute (v1alpha2, experimental channel): a UDPRoute's schema (parent
    references, rules of backend references), its backends reached over TCP."""

    spec: UDPRouteSpec = Field(default_factory=UDPRouteSpec)


# --- StaticService ----------------------------------------------------------------------------


class StaticServiceSpec(Model):
    prefixes: list[str] = Field(default_factory=list)


class StaticService(Resource):
    spec: StaticServiceSpec = Field(default_factory=StaticServiceSpec)


# --- Dataplane --------------------------------------------------------------------------------


class DataplaneSpec(Model):
    image: str | None = None
    image_pull_policy: str | None = None
    image_pull_secrets: list[dict[str, Any]] = Field(default_factory=list)
    dataplane_resource: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    command: list[str] = Field(default_factory=list)
    args: list[str] = Field(default_factory=list)
    env_from: list[dict[str, Any]] = Field(default_factory=list)
    env: list[dict[str, Any]] = Field(default_factory=list)
    replicas: int | None = None
    resources: dict[str, Any] | None = None
    affinity: dict[str, Any] | None = None
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    security_context: dict[str, Any] | None = None
    container_security_context: dict[str, Any] | None = None
    topology_spread_constraints: list[dict[str, Any]] = Field(default_factory=list)
    termination_grace_period_seconds: int | None = None
    host_network: bool = False
    # The pods' ServiceAccount ("default" when unset): the CDS serves the Gateway's config to
    # this account of the Gateway's namespace only (not Go's: an addition, issue 20 #5).
    service_account_name: str | None = None
    disable_health_check: bool = False
    enable_metrics_endpoint: bool = False
    offload_engine: str | None = None
    offload_interfaces: list[str] = Field(default_factory=list)


class Dataplane(Resource):
    spec: DataplaneSpec = Field(default_factory=DataplaneSpec)


# --- dispatch ---------------------------------------------------------------------------------

# The model of each judged kind; every served version of a kind has the same schema.
MODELS: dict[KindInfo, type[Resource]] = {
    GATEWAY_CLASS: GatewayClass,
    GATEWAY: Gateway,
    GATEWAY_API_UDP_ROUTE: UDPRoute,
    STUNNER_UDP_ROUTE: UDPRoute,
    GATEWAY_API_TCP_ROUTE: TCPRoute,
    GATEWAY_CONFIG: GatewayConfig,
    STATIC_SERVICE: StaticService,
    DATAPLANE: Dataplane,
}

# (apiVersion, kind) -> model, for every served version.
KINDS: dict[tuple[str, str], type[Resource]] = {
    (version, info.kind): model for info, model in MODELS.items() for version in info.api_versions
}


def model_of(api_version: str, kind: str) -> type[Resource] | None:
    """The model of a judged kind by group and kind, whatever the version (a version the API
    server serves that this table does not list yet is still judged)."""
    info = judged_kind(api_version, kind)
    return None if info is None else MODELS[info]


def parse_resource(obj: dict[str, Any]) -> Resource:
    """The model of a resource; ValueError naming apiVersion and kind if it is not one of ours."""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    model = model_of(str(api_version), str(kind))
    if model is None:
        known = ", ".join(sorted({f"{k} ({v})" for v, k in KINDS}))
        raise ValueError(
            f"unknown kind {kind!r} of apiVersion {api_version!r}: expected one of {known}"
        )
    return model.model_validate(obj)
