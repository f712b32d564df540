"""The STUNner annotations (`stunner.l7mp.io/...`, ANCHORS §2.4): one row each, the only grammar.

A row is the key, a parser that turns the annotation's text into a value or a `Refused` naming
why, the default, and the scope: the kinds it is read from. The admission rules
(`stunner_api.rules`) refuse what a parser refuses, with the parser's reason as the message; the
renderer (`reconciler.render`) reads values with `Annotation.value`, which gives the default for
an absent or refused value and notes nothing (the rule's finding is the one finding). So
whatever the webhook admits, render honours, and whatever it refuses, render ignores.

The grammar is Go STUNner's operator (`internal/renderer/service_util.go`), made strict where Go
would produce a Service the API server refuses:
- service-type: ClusterIP, NodePort or LoadBalancer, case-sensitive as Go matches it. Go also
  maps ExternalName to that Service type, but never sets the `externalName` such a Service
  needs, so the API server refuses the Service; the documented values are the three.
- the booleans and external-traffic-policy are case-insensitive, as Go lowercases them.
- nodeport/targetport: a JSON map of listener name to an integer port; the braces may be left
  out (Go retries with them added: `"udp": 30000`). A NodePort outside the cluster's range, or
  a target port outside 1-65535, would make the API server refuse the whole Service: refused.

Scope: every row is read from the Gateway's annotations; a row that shapes the Service is also
read from its GatewayConfig's `loadBalancerServiceAnnotations` (the Gateway's wins on a
conflict, as Go merges them). disable-managed-dataplane is the Gateway's only, as in Go.

health-check-port and metrics-port are ours (Go binds 8086 and 8080 always): the Gateway's only,
so that host-network Gateways sharing nodes can each have their own (`daemon_ports`).

Pure: the standard library and the vocabulary only.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from stunner_api.vocabulary import (
    ANNOTATION_PREFIX,
    DEFAULT_NODE_PORT_RANGE,
    DISABLE_HEALTH_CHECK_EXPOSE,
    DISABLE_MANAGED_DATAPLANE,
    DISABLE_SESSION_AFFINITY,
    DNS_NAME,
    EXTERNAL_TRAFFIC_POLICY,
    HEALTH_CHECK_PORT,
    METRICS_PORT,
    METRICS_PORT_ANNOTATION,
    MIXED_PROTOCOL_LB,
    NODEPORT,
    RELAY_ADDRESS_DISCOVERY,
    RELAY_ADDRESS_FAMILIES,
    RELAY_ADDRESS_FAMILY,
    RELAY_STUN_SERVER,
    SERVICE_TYPE,
    SERVICE_TYPES,
    STATUS_PORT,
    TARGETPORT,
)

T = TypeVar("T")

GATEWAY = "Gateway"
GATEWAY_CONFIG = "GatewayConfig"  # its spec.loadBalancerServiceAnnotations
SERVICE_SCOPE = (GATEWAY, GATEWAY_CONFIG)  # what shapes the Service
GATEWAY_SCOPE = (GATEWAY,)
BOOLEAN = "true or false (any case)"
NO_PORTS: Mapping[str, int] = MappingProxyType({})


@dataclass(frozen=True)
class Refused:
    """Why a parser refuses a value: the finding's message, e.g. `must be "true" or "false",
    got 'yes'`."""

    reason: str


@dataclass(frozen=True)
class Limits:
    """What a parser needs to know of the cluster."""

    node_port_range: tuple[int, int] = DEFAULT_NODE_PORT_RANGE


Parser = Callable[[str, Limits], T | Refused]


def parse_port_range(text: str) -> tuple[int, int]:
    """`LOW-HIGH` within 1-65535, as kube-apiserver's --service-node-port-range; ValueError."""
    low, sep, high = (part.strip() for part in text.strip().partition("-"))
    if not sep or not low.isdigit() or not high.isdigit() or not 0 < int(low) <= int(high) < 65536:
        raise ValueError(f"expected low-high within 1-65535, got {text!r}")
    return int(low), int(high)


def text_of(value: Any) -> str:
    """An annotation's text. Annotations are strings in the API; a manifest file may hold a
    YAML boolean (`enable-mixed-protocol-lb: true`), read as "true"."""
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class Annotation(Generic[T]):
    """One row of the table."""

    key: str
    parse: Parser[T]
    default: T
    scope: tuple[str, ...]  # the kinds it is read from
    grammar: str  # what it accepts, for the README's table
    effect: str  # what it does

    def value(
        self,
        gateway: Mapping[str, Any],
        gateway_config: Mapping[str, Any],
        limits: Limits,
    ) -> T:
        """What a Gateway gets from its annotations and its GatewayConfig's
        loadBalancerServiceAnnotations: the Gateway's value when it has the key, else (when the
        row's scope includes it) the GatewayConfig's, else the default. A refused value gives the
        default: the rule reports it."""
        if self.key in gateway:
            raw = gateway[self.key]
        elif GATEWAY_CONFIG in self.scope and self.key in gateway_config:
            raw = gateway_config[self.key]
        else:
            return self.default
        parsed = self.parse(text_of(raw), limits)
        return self.default if isinstance(parsed, Refused) else parsed


# --- parsers ----------------------------------------------------------------------------------


def _service_type(text: str, limits: Limits) -> str | Refused:
    if text in SERVICE_TYPES:
        return text
    return Refused(f"must be one of {', '.join(SERVICE_TYPES)}, got {text!r}")


def _boolean(text: str, limits: Limits) -> bool | Refused:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return Refused(f'must be "true" or "false", got {text!r}')


def _traffic_policy(text: str, limits: Limits) -> str | Refused:
    policies = {"local": "Local", "cluster": "Cluster"}
    if text.lower() in policies:
        return policies[text.lower()]
    return Refused(f"must be Local or Cluster, got {text!r}")


def _port_map(what: str, valid: Callable[[Limits], tuple[int, int]]) -> Parser[Mapping[str, int]]:
    def parse(text: str, limits: Limits) -> Mapping[str, int] | Refused:
        low, high = valid(limits)
        ports: Any = None
        for candidate in (text, "{" + text + "}"):  # Go retries with the braces added
            try:
                ports = json.loads(candidate)
                break
            except ValueError:
                continue
        if not isinstance(ports, dict):
            example = '{"udp-listener":' + str(low) + "}"
            return Refused(
                f"must be a JSON map of listener name to {what}, like {example} (the braces may "
                f"be left out), got {text!r}"
            )
        bad = [
            f"{what} of listener {name!r} must be between {low} and {high}, got {port!r}"
            for name, port in ports.items()
            if not (isinstance(port, int) and not isinstance(port, bool) and low <= port <= high)
        ]
        if bad:
            return Refused("; ".join(bad))
        return {str(name): int(port) for name, port in ports.items()}

    return parse


def relay_address(text: str) -> str | Refused:
    """A Node's operator-named relay address (NODE_RELAY_ADDRESS, a Node annotation, so not a
    row of the table: the webhook sees no Nodes): an IP address or a DNS name."""
    text = text.strip()
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    if len(text) <= 253 and DNS_NAME.match(text.lower()):
        return text.lower()
    return Refused(f"must be an IP address or a DNS name, got {text[:64]!r}")


def host_port(text: str) -> tuple[str, int] | Refused:
    """`host:port` (`[v6]:port` for an IPv6 address): the host an IP address or a DNS name,
    the port 1-65535."""
    host, sep, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if ":" not in host:
            host = "?"  # brackets are for IPv6 addresses only
    elif ":" in host:
        host = "?"  # an IPv6 address without its brackets
    address = relay_address(host) if sep and host else Refused("")
    if isinstance(address, Refused) or not (port.isascii() and port.isdigit() and len(port) <= 5):
        return Refused(
            f"must be host:port ([IPv6]:port), like stun.example.org:3478, got {text[:64]!r}"
        )
    if not 1 <= int(port) <= 65535:
        return Refused(f"the port must be 1-65535, got {text[:64]!r}")
    return address, int(port)


def _stun_server(text: str, limits: Limits) -> str | Refused:
    parsed = host_port(text)
    if isinstance(parsed, Refused):
        return parsed
    host, port = parsed
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _relay_family(text: str, limits: Limits) -> str | Refused:
    by_folded = {family.lower(): family for family in RELAY_ADDRESS_FAMILIES}
    family = by_folded.get(text.strip().lower())
    if family is not None:
        return family
    return Refused(f"must be one of {', '.join(RELAY_ADDRESS_FAMILIES)}, got {text[:64]!r}")


def _port(text: str, limits: Limits) -> int | Refused:
    stripped = text.strip()
    if stripped.isascii() and stripped.isdigit() and 1 <= int(stripped) <= 65535:
        return int(stripped)
    return Refused(f"must be a port number between 1 and 65535, got {text!r}")


# --- the table --------------------------------------------------------------------------------

SERVICE_TYPE_ROW: Annotation[str] = Annotation(
    SERVICE_TYPE,
    _service_type,
    "LoadBalancer",
    SERVICE_SCOPE,
    f"{', '.join(SERVICE_TYPES[:-1])} or {SERVICE_TYPES[-1]} (case-sensitive)",
    "the type of the Gateway's Service",
)
MIXED_PROTOCOL_LB_ROW: Annotation[bool] = Annotation(
    MIXED_PROTOCOL_LB,
    _boolean,
    False,
    SERVICE_SCOPE,
    BOOLEAN,
    "true: the Service exposes the UDP and the TCP listeners (else those of the first "
    "listener's transport only)",
)
EXTERNAL_TRAFFIC_POLICY_ROW: Annotation[str] = Annotation(
    EXTERNAL_TRAFFIC_POLICY,
    _traffic_policy,
    "Cluster",
    SERVICE_SCOPE,
    "local or cluster (any case)",
    "Local: `externalTrafficPolicy: Local` on a NodePort or LoadBalancer Service (keeps the "
    "client's address)",
)
DISABLE_MANAGED_DATAPLANE_ROW: Annotation[bool] = Annotation(
    DISABLE_MANAGED_DATAPLANE,
    _boolean,
    False,
    GATEWAY_SCOPE,
    BOOLEAN,
    "true: no stunnerd Deployment for the Gateway (its config is still served)",
)
NODEPORT_ROW: Annotation[Mapping[str, int]] = Annotation(
    NODEPORT,
    _port_map("NodePort", lambda limits: limits.node_port_range),
    NO_PORTS,
    SERVICE_SCOPE,
    '`{"listener": port, ...}`, braces optional; ports in the cluster\'s NodePort range',
    "the nodePort of each named listener's Service port",
)
TARGETPORT_ROW: Annotation[Mapping[str, int]] = Annotation(
    TARGETPORT,
    _port_map("target port", lambda limits: (1, 65535)),
    NO_PORTS,
    SERVICE_SCOPE,
    '`{"listener": port, ...}`, braces optional; ports 1-65535',
    "the targetPort of each named listener's Service port, and the port stunnerd listens on",
)
DISABLE_HEALTH_CHECK_EXPOSE_ROW: Annotation[bool] = Annotation(
    DISABLE_HEALTH_CHECK_EXPOSE,
    _boolean,
    False,
    SERVICE_SCOPE,
    BOOLEAN,
    "true: no health-check port on the LoadBalancer Service",
)
DISABLE_SESSION_AFFINITY_ROW: Annotation[bool] = Annotation(
    DISABLE_SESSION_AFFINITY,
    _boolean,
    False,
    SERVICE_SCOPE,
    BOOLEAN,
    "true: `sessionAffinity: None` (else ClientIP)",
)
RELAY_ADDRESS_DISCOVERY_ROW: Annotation[bool] = Annotation(
    RELAY_ADDRESS_DISCOVERY,
    _boolean,
    False,
    GATEWAY_SCOPE,
    BOOLEAN,
    "true: each stunnerd hands clients its Node's public address as the relay address "
    "(ExternalIP, else ExternalDNS resolved, else the Node's `stunner.l7mp.io/relay-address` "
    "annotation: the CDS patches it per node; else what the Gateway's STUN server reports, "
    "else the pod's own); for host-network Dataplanes (see Node-local dataplanes)",
)

RELAY_STUN_SERVER_ROW: Annotation[str] = Annotation(
    RELAY_STUN_SERVER,
    _stun_server,
    "",
    GATEWAY_SCOPE,
    "host:port ([IPv6]:port)",
    "with relay address discovery, where a Node has no public address: its stunnerd asks this "
    "STUN server for one (our own; see Node-local dataplanes)",
)

HEALTH_CHECK_PORT_ROW: Annotation[int] = Annotation(
    HEALTH_CHECK_PORT,
    _port,
    STATUS_PORT,
    GATEWAY_SCOPE,
    "a port, 1-65535",
    "the TCP port stunnerd serves its health check on (`/live`, `/ready`, `/status`) and the "
    "pods' probes ask; for host-network Gateways sharing nodes (see Node-local dataplanes)",
)
METRICS_PORT_ROW: Annotation[int] = Annotation(
    METRICS_PORT_ANNOTATION,
    _port,
    METRICS_PORT,
    GATEWAY_SCOPE,
    "a port, 1-65535",
    "the TCP port of stunnerd's metrics endpoint (`metrics-port`, when the Dataplane sets "
    "`enableMetricsEndpoint`); for host-network Gateways sharing nodes",
)

RELAY_ADDRESS_FAMILY_ROW: Annotation[str] = Annotation(
    RELAY_ADDRESS_FAMILY,
    _relay_family,
    "",
    GATEWAY_SCOPE,
    f"{', '.join(RELAY_ADDRESS_FAMILIES[:-1])} or {RELAY_ADDRESS_FAMILIES[-1]} (any case)",
    "the address families of the Gateway's relays (`admin.relay_address_family`): IPv4 or "
    "IPv6 alone (an Allocate naming no family gets it), or DualStack (clients may ask for "
    "either or both, RFC 8656); unset: the family of the pod's address (see Dual stack)",
)

TABLE: tuple[Annotation[Any], ...] = (
    SERVICE_TYPE_ROW,
    MIXED_PROTOCOL_LB_ROW,
    EXTERNAL_TRAFFIC_POLICY_ROW,
    DISABLE_MANAGED_DATAPLANE_ROW,
    NODEPORT_ROW,
    TARGETPORT_ROW,
    DISABLE_HEALTH_CHECK_EXPOSE_ROW,
    DISABLE_SESSION_AFFINITY_ROW,
    RELAY_ADDRESS_DISCOVERY_ROW,
    HEALTH_CHECK_PORT_ROW,
    METRICS_PORT_ROW,
    RELAY_STUN_SERVER_ROW,
    RELAY_ADDRESS_FAMILY_ROW,
)
BY_KEY: Mapping[str, Annotation[Any]] = {row.key: row for row in TABLE}
KEYS = tuple(BY_KEY)


@dataclass(frozen=True)
class DaemonPorts:
    """The TCP ports stunnerd binds besides its listeners: its health check (None when the
    Dataplane sets disableHealthCheck) and its metrics endpoint (None unless the Dataplane sets
    enableMetricsEndpoint). Render writes them into the config and the pod's probes, and the
    host-port rule counts them: one answer for all three."""

    health: int | None
    metrics: int | None


def daemon_ports(
    gateway_annotations: Mapping[str, Any], dataplane_spec: Mapping[str, Any]
) -> DaemonPorts:
    """The ports a Gateway's stunnerd binds for itself: the health-check-port and metrics-port
    annotations (a refused value counts as absent: the rule reports it), else 8086 and 8080."""
    health = HEALTH_CHECK_PORT_ROW.value(gateway_annotations, {}, Limits())
    metrics = METRICS_PORT_ROW.value(gateway_annotations, {}, Limits())
    return DaemonPorts(
        None if dataplane_spec.get("disableHealthCheck") is True else health,
        metrics if dataplane_spec.get("enableMetricsEndpoint") is True else None,
    )


def is_stunner_annotation(key: str) -> bool:
    """Whether the key is in STUNner's namespace (then it must be a row of the table)."""
    return key.startswith(ANNOTATION_PREFIX)
