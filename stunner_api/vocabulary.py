"""The words of STUNner, each declared once: groups, versions, kinds, defaults, keys, aliases,
patterns, the log-level grammar and the status condition vocabulary (ANCHORS §2.7).

The webhook, the reconciler, stunnerd and the CRD generator read these; none keeps a copy.
Pure: the standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any

# --- API groups, versions and kinds -----------------------------------------------------------

CORE_GROUP = ""
STUNNER_GROUP = "stunner.l7mp.io"
GATEWAY_API_GROUP = "gateway.networking.k8s.io"


# The labels render gives what it makes: our Deployments, DaemonSets and Services (OWNED_BY) and
# the Gateway they are of (RELATED_GATEWAY_*), and the pods of a Gateway's dataplane (APP).
OWNED_BY_LABEL = "stunner.l7mp.io/owned-by"
OWNED_BY_VALUE = "stunner"
RELATED_GATEWAY_NAME = "stunner.l7mp.io/related-gateway-name"
RELATED_GATEWAY_NAMESPACE = "stunner.l7mp.io/related-gateway-namespace"
APP_LABEL = "app"
APP_VALUE = "stunner"
# The dataplane pods of every Gateway (cluster-wide user quotas: only they report usage).
DATAPLANE_POD_SELECTOR = f"{APP_LABEL}={APP_VALUE},{RELATED_GATEWAY_NAME}"


@dataclass(frozen=True)
class KindInfo:
    """One row of the kinds table (`KINDS`): a kind as the API server serves it (served versions,
    the preferred one first) and what STUNner does with it."""

    group: str
    kind: str
    plural: str
    versions: tuple[str, ...]
    namespaced: bool = True
    judged: bool = False  # the admission rules judge it (every served version)
    # The versions the reconciler lists and watches, in order of preference (the first the API
    # server serves is watched: an optional CRD version is detected, as Go does); () for none.
    watch: tuple[str, ...] = ()
    owned_only: bool = False  # watched only where labelled OWNED_BY_LABEL=OWNED_BY_VALUE
    selector: str = ""  # else: watched only where this label selector matches ("": all)
    rendered: bool = False  # render reads it: a reconciler Snapshot holds it
    written: bool = False  # the reconciler creates, updates or deletes it (or its status)

    @property
    def api_versions(self) -> tuple[str, ...]:
        return tuple(api_version(self.group, v) for v in self.versions)

    @property
    def preferred_version(self) -> str:
        return self.versions[0]

    @property
    def name(self) -> str:
        """ "Kind.group" ("Kind" in the core group), as kubectl names a resource."""
        return f"{self.kind}.{self.group}" if self.group else self.kind


def api_version(group: str, version: str) -> str:
    """ "v1" for the core group, "<group>/<version>" otherwise."""
    return f"{group}/{version}" if group else version


def group_of(api_version_text: str) -> str:
    """The API group of an apiVersion ("v1" -> "", "stunner.l7mp.io/v1" -> "stunner.l7mp.io")."""
    return api_version_text.rpartition("/")[0]


def version_of(api_version_text: str) -> str:
    """The version of an apiVersion ("stunner.l7mp.io/v1" -> "v1")."""
    return api_version_text.rpartition("/")[2]


# The kinds table: every kind STUNner judges (webhook), reads (reconciler: ANCHORS §2.8's watch
# list, what render reads plus the Deployments we own) or writes, one row each. Gateway API v1.6
# serves UDPRoute at v1 (standard channel) and still at v1alpha2.
GATEWAY_CLASS = KindInfo(
    GATEWAY_API_GROUP,
    "GatewayClass",
    "gatewayclasses",
    ("v1", "v1beta1"),
    namespaced=False,
    judged=True,
    watch=("v1",),
    rendered=True,
    written=True,
)
GATEWAY_CONFIG = KindInfo(
    STUNNER_GROUP,
    "GatewayConfig",
    "gatewayconfigs",
    ("v1", "v1alpha1"),
    judged=True,
    watch=("v1",),
    rendered=True,
)
DATAPLANE = KindInfo(
    STUNNER_GROUP,
    "Dataplane",
    "dataplanes",
    ("v1", "v1alpha1"),
    namespaced=False,
    judged=True,
    watch=("v1",),
    rendered=True,
)
GATEWAY = KindInfo(
    GATEWAY_API_GROUP,
    "Gateway",
    "gateways",
    ("v1", "v1beta1"),
    judged=True,
    watch=("v1",),
    rendered=True,
    written=True,
)
STUNNER_UDP_ROUTE = KindInfo(
    STUNNER_GROUP,
    "UDPRoute",
    "udproutes",
    ("v1",),
    judged=True,
    watch=("v1",),
    rendered=True,
    written=True,
)
GATEWAY_API_UDP_ROUTE = KindInfo(
    GATEWAY_API_GROUP,
    "UDPRoute",
    "udproutes",
    ("v1", "v1alpha2"),
    judged=True,
    watch=("v1", "v1alpha2"),
    rendered=True,
    written=True,
)
# Gateway API's TCPRoute (experimental channel only: v1alpha2, a CRD the chart does not ship):
# TCP backends of RFC 6062 TCP allocations, a cluster of protocol TCP. Watched only where the
# API server serves it (the informer finds it not served and looks again later).
GATEWAY_API_TCP_ROUTE = KindInfo(
    GATEWAY_API_GROUP,
    "TCPRoute",
    "tcproutes",
    ("v1alpha2",),
    judged=True,
    watch=("v1alpha2",),
    rendered=True,
    written=True,
)
STATIC_SERVICE = KindInfo(
    STUNNER_GROUP,
    "StaticService",
    "staticservices",
    ("v1", "v1alpha1"),
    judged=True,
    watch=("v1",),
    rendered=True,
)
SERVICE = KindInfo(
    CORE_GROUP, "Service", "services", ("v1",), watch=("v1",), rendered=True, written=True
)
ENDPOINT_SLICE = KindInfo(
    "discovery.k8s.io", "EndpointSlice", "endpointslices", ("v1",), watch=("v1",), rendered=True
)
SECRET = KindInfo(CORE_GROUP, "Secret", "secrets", ("v1",), watch=("v1",), rendered=True)
NAMESPACE = KindInfo(
    CORE_GROUP, "Namespace", "namespaces", ("v1",), namespaced=False, watch=("v1",), rendered=True
)
NODE = KindInfo(
    CORE_GROUP, "Node", "nodes", ("v1",), namespaced=False, watch=("v1",), rendered=True
)
# ReferenceGrant: v1beta1 is read (served since Gateway API v0.6, the storage version of v1.6.1,
# which also serves v1 and no longer v1alpha2).
REFERENCE_GRANT = KindInfo(
    GATEWAY_API_GROUP,
    "ReferenceGrant",
    "referencegrants",
    ("v1beta1", "v1"),
    watch=("v1beta1", "v1"),
    rendered=True,
)
# Our Deployments and DaemonSets (a Dataplane's `dataplaneResource`) are watched only to be
# compared with the plan; render does not read them.
DEPLOYMENT = KindInfo(
    "apps", "Deployment", "deployments", ("v1",), watch=("v1",), owned_only=True, written=True
)
DAEMON_SET = KindInfo(
    "apps", "DaemonSet", "daemonsets", ("v1",), watch=("v1",), owned_only=True, written=True
)
# Each Gateway's dataplane ServiceAccount (issue 28 #3), watched the same way.
SERVICE_ACCOUNT = KindInfo(
    CORE_GROUP,
    "ServiceAccount",
    "serviceaccounts",
    ("v1",),
    watch=("v1",),
    owned_only=True,
    written=True,
)
# The Gateways' dataplane pods, watched only to know who may report usage (reconciler.cds.usage).
POD = KindInfo(CORE_GROUP, "Pod", "pods", ("v1",), watch=("v1",), selector=DATAPLANE_POD_SELECTOR)
LEASE = KindInfo("coordination.k8s.io", "Lease", "leases", ("v1",))  # leader election
EVENT = KindInfo("events.k8s.io", "Event", "events", ("v1",))  # what the reconciler did
# The webhook reads the cluster's service networks from these (Kubernetes 1.33 and later).
SERVICE_CIDR = KindInfo("networking.k8s.io", "ServiceCIDR", "servicecidrs", ("v1",), False)

KINDS: tuple[KindInfo, ...] = (
    GATEWAY_CLASS,
    GATEWAY_CONFIG,
    DATAPLANE,
    GATEWAY,
    STUNNER_UDP_ROUTE,
    GATEWAY_API_UDP_ROUTE,
    GATEWAY_API_TCP_ROUTE,
    STATIC_SERVICE,
    SERVICE,
    ENDPOINT_SLICE,
    SECRET,
    NAMESPACE,
    NODE,
    REFERENCE_GRANT,
    DEPLOYMENT,
    DAEMON_SET,
    SERVICE_ACCOUNT,
    POD,
    LEASE,
    EVENT,
    SERVICE_CIDR,
)
# The lists every other part reads, derived from the table's columns.
JUDGED_KINDS: tuple[KindInfo, ...] = tuple(k for k in KINDS if k.judged)
WATCHED_KINDS: tuple[KindInfo, ...] = tuple(k for k in KINDS if k.watch)
RENDERED_KINDS: tuple[KindInfo, ...] = tuple(k for k in KINDS if k.rendered)
WRITTEN_KINDS: tuple[KindInfo, ...] = tuple(k for k in KINDS if k.written)


def judged_kind(api_version_text: str, kind: str) -> KindInfo | None:
    """The judged kind of (apiVersion, kind) by group and kind, whatever the version."""
    group = group_of(api_version_text)
    for info in JUDGED_KINDS:
        if info.group == group and info.kind == kind:
            return info
    return None


# --- defaults (docs/GATEWAY.md, Go's pkg/apis/v1/default.go) ----------------------------------

DEFAULT_CONTROLLER_NAME = "stunner.l7mp.io/gateway-operator"
DEFAULT_REALM = "stunner.l7mp.io"
DEFAULT_LOG_LEVEL = "all:INFO"
DEFAULT_DATAPLANE = "default"  # GatewayConfig.spec.dataplane, and the Dataplane never deleted
DEFAULT_TLS_MODE = "Terminate"
DEFAULT_ROUTE_NAMESPACES_FROM = "Same"
DEFAULT_ADDRESS_TYPE = "IPAddress"
# Dataplane: Go's renderer defaults (ANCHORS §2.2). The spec's "30 seconds" grace period and
# "disableHealthCheck: true" are documentation errors (ANCHORS §8); Go's values are the truth.
DEFAULT_DATAPLANE_REPLICAS = 1
DEFAULT_TERMINATION_GRACE_PERIOD = 3600
DEFAULT_DATAPLANE_RESOURCE = "Deployment"
# Dataplane.spec.dataplaneResource: one stunnerd Deployment per Gateway, or one stunnerd per node
# (a DaemonSet; Go sells it as a premium feature).
DATAPLANE_RESOURCES = (DEFAULT_DATAPLANE_RESOURCE, "DaemonSet")
# The pod's DNS policy with spec.hostNetwork: cluster DNS names (the CDS Service) still resolve.
HOST_NETWORK_DNS_POLICY = "ClusterFirstWithHostNet"
# The Dataplane `default` the chart installs (charts/stunner values `dataplane.spec`; ANCHORS §4's
# values, stunnerd from the chart's dataplane image, CHART_DATAPLANE_IMAGE_REPOSITORY:<appVersion>).
# `stunner render` assumes it when the files hold none; tests/charts/test_default_dataplane.py
# checks that the chart renders exactly this. The control plane runs CHART_IMAGE_REPOSITORY (the
# Dockerfile's default target), stunnerd the dataplane image (its `dataplane` target).
CHART_IMAGE_REPOSITORY = "localhost/stunner"
CHART_DATAPLANE_IMAGE_REPOSITORY = "localhost/stunnerd"
# stunnerd's --max-allocations default; the chart passes its `dataplane.maxAllocations` (this by
# default) as STUNNER_MAX_ALLOCATIONS, so its allocation alert knows the cap a pod runs with.
DEFAULT_MAX_ALLOCATIONS = 50000
CHART_DATAPLANE_SPEC: Mapping[str, Any] = MappingProxyType(
    {
        "replicas": 1,
        "imagePullPolicy": "IfNotPresent",
        "command": ["stunnerd"],
        "args": ["-w", "--udp-thread-num=16"],
        "env": [{"name": "STUNNER_MAX_ALLOCATIONS", "value": str(DEFAULT_MAX_ALLOCATIONS)}],
        "resources": {
            "limits": {"cpu": "2", "memory": "512Mi"},
            "requests": {"cpu": "500m", "memory": "128Mi"},
        },
        "terminationGracePeriodSeconds": DEFAULT_TERMINATION_GRACE_PERIOD,
        "enableMetricsEndpoint": False,
        "dataplaneResource": DEFAULT_DATAPLANE_RESOURCE,
        "hostNetwork": False,
        "offloadEngine": "None",  # the kernel offload: off (stunnerd's README section)
        "offloadInterfaces": [],
    }
)

# --- label and annotation keys ----------------------------------------------------------------

ANNOTATION_PREFIX = "stunner.l7mp.io/"
SERVICE_TYPE = "stunner.l7mp.io/service-type"
MIXED_PROTOCOL_LB = "stunner.l7mp.io/enable-mixed-protocol-lb"
EXTERNAL_TRAFFIC_POLICY = "stunner.l7mp.io/external-traffic-policy"
DISABLE_MANAGED_DATAPLANE = "stunner.l7mp.io/disable-managed-dataplane"
NODEPORT = "stunner.l7mp.io/nodeport"
TARGETPORT = "stunner.l7mp.io/targetport"
DISABLE_HEALTH_CHECK_EXPOSE = "stunner.l7mp.io/disable-health-check-expose"
DISABLE_SESSION_AFFINITY = "stunner.l7mp.io/disable-session-affinity"
RELAY_ADDRESS_DISCOVERY = "stunner.l7mp.io/enable-relay-address-discovery"
# Our own (not Go's): the ports a Gateway's stunnerd binds its health check and metrics on
# (default STATUS_PORT and METRICS_PORT), so host-network Gateways can share nodes.
HEALTH_CHECK_PORT = "stunner.l7mp.io/health-check-port"
METRICS_PORT_ANNOTATION = "stunner.l7mp.io/metrics-port"
# The listener address of a Gateway with relay address discovery, in the rendered config: the
# CDS replaces it, per requesting stunnerd, with its Node's public address (Go's name).
NODE_ADDRESS_PLACEHOLDER = "__node_address_placeholder"
# Our own names (Go's premium reference names none): a Node's operator-named public address,
# the relay address there when the Node has no ExternalIP or ExternalDNS (an IP or a DNS name);
# and a Gateway's STUN server (host:port), which its stunnerd pods ask for their public address
# where their Node has none (the rendered pod template carries it in RELAY_STUN_SERVER_ENV).
NODE_RELAY_ADDRESS = "stunner.l7mp.io/relay-address"
RELAY_STUN_SERVER = "stunner.l7mp.io/relay-address-stun-server"
RELAY_STUN_SERVER_ENV = "STUNNER_RELAY_STUN_SERVER"
# The families a Gateway's relays are made in (issue 31: Go v2.0.2's operator "declares the
# relay address family annotation"; its exact key and values are not public here, so these
# are ours in Go's style). Rendered into the config's admin.relay_address_family.
RELAY_ADDRESS_FAMILY = "stunner.l7mp.io/relay-address-family"
RELAY_ADDRESS_FAMILIES = ("IPv4", "IPv6", "DualStack")
# The grammar, default and scope of each annotation: stunner_api.annotations.
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
DEFAULT_NODE_PORT_RANGE = (30000, 32767)  # Kubernetes' default --service-node-port-range


# --- who may read configs from the CDS (issue 20 #5) -------------------------------------------
# stunnerd (and the auth service) present a projected ServiceAccount token of this audience to
# the CDS; the reconciler checks it with a TokenReview asking for this audience only, so the
# token is useless against the API server and a token minted for the API server is refused here.
CDS_TOKEN_AUDIENCE = "stunner.l7mp.io/config-discovery"
CDS_TOKEN_VOLUME = "stunner-cds-token"
CDS_TOKEN_DIR = "/var/run/secrets/stunner.l7mp.io/cds"
CDS_TOKEN_PATH = "token"  # the file's name inside CDS_TOKEN_DIR
CDS_TOKEN_FILE = f"{CDS_TOKEN_DIR}/{CDS_TOKEN_PATH}"
CDS_TOKEN_EXPIRATION = 3600  # seconds; the kubelet rotates the file at 80 % of it
CDS_TOKEN_FILE_ENV = "STUNNER_CDS_TOKEN_FILE"  # where stunnerd reads the token from
# stunnerd's --force-ready-status from the environment ("true"/"1"/"yes"): /ready stays 200 while
# it drains. The pods the reconciler renders carry it: a terminating pod leaves new connections
# by Kubernetes' own rule (its endpoint is `ready: false` once it terminates), and an endpoint
# that also stops `serving` has its UDP conntrack entries flushed by kube-proxy, which moves
# every live call on the draining pod to another one (README, "Rollouts").
FORCE_READY_ENV = "STUNNER_FORCE_READY_STATUS"
# The headers the CDS reads a bearer token from: the API server's service proxy strips
# Authorization (kubernetes/kubernetes#38775), so the CLI sends the second one.
CDS_AUTH_HEADERS = ("Authorization", "X-Stunner-Authorization")
DEFAULT_SERVICE_ACCOUNT = "default"

# --- where an installation's parts are found --------------------------------------------------
# (the CDS's own port and paths: stunner_api.cds)

SYSTEM_NAMESPACE = "stunner-system"  # the namespace the chart's docs install STUNner in
CDS_SERVICE_NAME = "stunner-config-discovery"  # the chart's Service in front of the CDS
CDS_SERVICE_LABEL = "stunner.l7mp.io/config-discovery-service"  # "true" on that Service
STATUS_PORT = 8086  # stunnerd's /live, /ready and /status (Go: the health-check port)
METRICS_PORT = 8080  # stunnerd's metrics endpoint (Dataplane enableMetricsEndpoint)

# --- authentication ---------------------------------------------------------------------------


class AuthType(StrEnum):
    STATIC = "static"
    EPHEMERAL = "ephemeral"
    NONE = "none"


# Every spelling -> the canonical type, the one table. `none` (a pure STUN server) is a
# dataplane type only: Go's GatewayConfig CRD pattern does not accept it, so the webhook refuses
# it in a GatewayConfig (and in an authRef Secret) like the API server would, while stunnerd
# loads it like Go's stunnerd. `timewindowed` is the operator's extra alias.
AUTH_TYPE_ALIASES: Mapping[str, AuthType] = {
    "static": AuthType.STATIC,
    "plaintext": AuthType.STATIC,
    "ephemeral": AuthType.EPHEMERAL,
    "longterm": AuthType.EPHEMERAL,
    "timewindowed": AuthType.EPHEMERAL,
    "none": AuthType.NONE,
}
# The spellings a GatewayConfig (authType, or an authRef Secret's `type`) may use.
GATEWAY_CONFIG_AUTH_TYPES: tuple[str, ...] = tuple(
    spelling for spelling, canonical in AUTH_TYPE_ALIASES.items() if canonical != AuthType.NONE
)
DEFAULT_AUTH_TYPE = AuthType.STATIC

# Keys of an authRef Secret and of a TLS Secret.
AUTH_SECRET_TYPE_KEY = "type"
AUTH_SECRET_USERNAME_KEYS = ("username",)
AUTH_SECRET_PASSWORD_KEYS = ("password",)
AUTH_SECRET_SHARED_SECRET_KEYS = ("secret", "sharedSecret")
TLS_SECRET_TYPES = ("kubernetes.io/tls", "Opaque")
TLS_CERT_KEYS = ("tls.crt", "crt", "cert")
TLS_KEY_KEYS = ("tls.key", "key")

# --- protocols --------------------------------------------------------------------------------


class ListenerProtocol(StrEnum):
    """The canonical names; each has its row in LISTENER_PROTOCOL_TABLE below."""

    TURN_UDP = "TURN-UDP"
    TURN_TCP = "TURN-TCP"
    TURN_TLS = "TURN-TLS"
    TURN_DTLS = "TURN-DTLS"


@dataclass(frozen=True)
class ProtocolFacts:
    """One row of the listener-protocol table: what a listener protocol is."""

    protocol: ListenerProtocol
    alias: str  # the deprecated short spelling Go still accepts ("" if none)
    transport: str  # "UDP" or "TCP": what a Service port and a port clash are about
    tls: bool  # terminates TLS or DTLS: the listener needs a certificate and key

    @property
    def stream(self) -> bool:
        """Runs over a byte stream (TCP) rather than datagrams."""
        return self.transport == "TCP"

    @property
    def scheme(self) -> str:
        """The client URI's scheme (RFC 7065, Go's GetListenerURI): turns for TLS and DTLS."""
        return "turns" if self.tls else "turn"

    @property
    def uri_transport(self) -> str:
        """The client URI's `?transport=` value."""
        return self.transport.lower()


# The listener-protocol table, one row per protocol: every other list of protocols (the
# aliases, the transports, the TLS set, the dataplane's Literal, the URI parts, stunnerd's
# transport registry) is derived from it or checked against it by a test. Keyed by the
# canonical name (a ListenerProtocol is that string).
LISTENER_PROTOCOL_TABLE: Mapping[str, ProtocolFacts] = MappingProxyType(
    {
        row.protocol.value: row
        for row in (
            ProtocolFacts(ListenerProtocol.TURN_UDP, alias="UDP", transport="UDP", tls=False),
            ProtocolFacts(ListenerProtocol.TURN_TCP, alias="TCP", transport="TCP", tls=False),
            ProtocolFacts(ListenerProtocol.TURN_TLS, alias="TLS", transport="TCP", tls=True),
            ProtocolFacts(ListenerProtocol.TURN_DTLS, alias="DTLS", transport="UDP", tls=True),
        )
    }
)
# The deprecated short spellings -> the canonical protocol.
LISTENER_PROTOCOL_ALIASES: Mapping[str, ListenerProtocol] = {
    row.alias: row.protocol for row in LISTENER_PROTOCOL_TABLE.values() if row.alias
}
# Every spelling (canonical and alias, upper case) -> the canonical protocol.
LISTENER_PROTOCOLS: Mapping[str, ListenerProtocol] = {
    **{row.protocol.value: row.protocol for row in LISTENER_PROTOCOL_TABLE.values()},
    **LISTENER_PROTOCOL_ALIASES,
}
# Protocol -> the transport it runs on.
LISTENER_TRANSPORT: Mapping[ListenerProtocol, str] = {
    row.protocol: row.transport for row in LISTENER_PROTOCOL_TABLE.values()
}
TLS_PROTOCOLS: frozenset[ListenerProtocol] = frozenset(
    row.protocol for row in LISTENER_PROTOCOL_TABLE.values() if row.tls
)

ROUTE_NAMESPACES_FROM = ("All", "Selector", "Same")
ADDRESS_TYPES = ("IPAddress", "Hostname")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
BACKEND_KINDS = frozenset({(CORE_GROUP, "Service"), (STUNNER_GROUP, "StaticService")})

# --- patterns ---------------------------------------------------------------------------------

DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
CREDENTIAL = re.compile(r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$")

# --- the log-level grammar (Go: pkg/logger) ---------------------------------------------------


class LogLevel(StrEnum):
    DISABLE = "DISABLE"
    ERROR = "ERROR"
    WARN = "WARN"
    INFO = "INFO"
    DEBUG = "DEBUG"
    TRACE = "TRACE"


ALL_SCOPES = "all"


@dataclass(frozen=True)
class LogSpec:
    """A parsed level spec: the (scope, level) parts Go acts on, in order, and the parts Go
    skips (kept verbatim so that a caller can name them)."""

    levels: tuple[tuple[str, LogLevel], ...]
    skipped: tuple[str, ...]

    def as_dict(self) -> dict[str, LogLevel]:
        """scope -> level; a later part for the same scope wins, as in Go."""
        return dict(self.levels)


def parse_log_spec(spec: str) -> LogSpec:
    """Go STUNner's grammar: comma-separated `scope:LEVEL` parts, LEVEL one of DISABLE, ERROR,
    WARN, INFO, DEBUG, TRACE in any case. Every other part (a bare `DEBUG`, `WARNING`, `a:b:c`,
    an empty scope) is one Go skips: it is returned in `skipped`. Blank parts (a trailing comma)
    are no part at all. Whitespace around a part, its scope and its level is ignored."""
    levels: list[tuple[str, LogLevel]] = []
    skipped: list[str] = []
    for raw in spec.split(","):
        part = raw.strip()
        if not part:
            continue
        pieces = part.split(":")
        if len(pieces) != 2 or not pieces[0].strip():
            skipped.append(part)
            continue
        scope, level = pieces[0].strip(), pieces[1].strip().upper()
        if level not in LogLevel.__members__:
            skipped.append(part)
            continue
        levels.append((scope, LogLevel(level)))
    return LogSpec(tuple(levels), tuple(skipped))


def skipped_part_reason(part: str) -> str:
    """Why Go skips a part of a level spec, for a message naming it."""
    pieces = part.split(":")
    if len(pieces) != 2 or not pieces[0].strip():
        return f"{part!r} is not scope:LEVEL (write it like all:INFO,turn:DEBUG)"
    return f"unknown level {pieces[1].strip()!r} in {part!r}: use one of {', '.join(LogLevel)}"


# --- status conditions (ANCHORS §2.7) ---------------------------------------------------------


class ConditionType(StrEnum):
    ACCEPTED = "Accepted"
    PROGRAMMED = "Programmed"
    CONFLICTED = "Conflicted"
    RESOLVED_REFS = "ResolvedRefs"


class ConditionReason(StrEnum):
    """Every reason STUNner writes (ANCHORS §2.7) plus the ones its rules report."""

    ACCEPTED = "Accepted"
    PENDING = "Pending"
    PROGRAMMED = "Programmed"
    INVALID = "Invalid"
    INVALID_PARAMETERS = "InvalidParameters"
    ADDRESS_NOT_ASSIGNED = "AddressNotAssigned"
    UNSUPPORTED_ADDRESS = "UnsupportedAddress"
    PORT_UNAVAILABLE = "PortUnavailable"
    UNSUPPORTED_PROTOCOL = "UnsupportedProtocol"
    NO_CONFLICTS = "NoConflicts"
    PROTOCOL_CONFLICT = "ProtocolConflict"
    HOSTNAME_CONFLICT = "HostnameConflict"
    RESOLVED_REFS = "ResolvedRefs"
    INVALID_CERTIFICATE_REF = "InvalidCertificateRef"
    REF_NOT_PERMITTED = "RefNotPermitted"
    INVALID_ROUTE_KINDS = "InvalidRouteKinds"
    NOT_ALLOWED_BY_LISTENERS = "NotAllowedByListeners"
    NO_MATCHING_PARENT = "NoMatchingParent"
    INVALID_KIND = "InvalidKind"
    BACKEND_NOT_FOUND = "BackendNotFound"
    UNSUPPORTED_VALUE = "UnsupportedValue"


# --- field paths ------------------------------------------------------------------------------


def field_path(loc: Iterable[int | str]) -> str:
    """A pydantic error location as a field path: ("spec", "listeners", 1, "port") ->
    "spec.listeners[1].port"."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path
