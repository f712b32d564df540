"""Rules of a Gateway whose GatewayClass is ours: listeners (names, protocols, ports, TLS),
addresses, allowed routes and the STUNner annotations."""

from __future__ import annotations

import ipaddress
from typing import Any

from stunner_api.annotations import GATEWAY as GATEWAY_KIND
from stunner_api.annotations import (
    MIXED_PROTOCOL_LB_ROW,
    RELAY_ADDRESS_DISCOVERY_ROW,
    RELAY_STUN_SERVER_ROW,
    Limits,
)
from stunner_api.certs import pair_problem
from stunner_api.rules.base import (
    LookupFailed,
    Problem,
    Request,
    annotation_problems,
    as_dict,
    as_list,
    error,
    indexed,
    is_int,
    listener_protocol,
    quote_list,
    read_referenced_secret,
    schema_problems,
    secret_data,
    secret_ref,
    warning,
)
from stunner_api.rules.host_ports import (
    gateway_daemon_ports,
    gateway_host_ports,
    host_network_dataplane,
)
from stunner_api.vocabulary import (
    ADDRESS_TYPES,
    DEFAULT_ADDRESS_TYPE,
    DEFAULT_ROUTE_NAMESPACES_FROM,
    DEFAULT_TLS_MODE,
    DNS_NAME,
    LISTENER_PROTOCOL_ALIASES,
    LISTENER_TRANSPORT,
    MIXED_PROTOCOL_LB,
    ROUTE_NAMESPACES_FROM,
    TLS_CERT_KEYS,
    TLS_KEY_KEYS,
    TLS_PROTOCOLS,
    TLS_SECRET_TYPES,
    ConditionReason,
    ListenerProtocol,
)

CERT_REF = ConditionReason.INVALID_CERTIFICATE_REF


def _listeners(req: Request) -> list[tuple[str, dict[str, Any]]]:
    return list(indexed(as_list(req.spec.get("listeners")), "spec.listeners"))


def gateway_schema(req: Request) -> list[Problem]:
    """Field types and required fields."""
    return schema_problems(req, ConditionReason.INVALID)


def gateway_listener_names(req: Request) -> list[Problem]:
    """Listener names are unique within the Gateway."""
    problems = []
    seen: dict[str, str] = {}
    for path, listener in _listeners(req):
        name = listener.get("name")
        if not isinstance(name, str):
            continue
        if name in seen:
            problems.append(
                error(
                    f"{path}.name",
                    f"duplicate listener name {name!r}, already used by {seen[name]}: "
                    "listener names must be unique within a Gateway",
                    ConditionReason.INVALID,
                )
            )
        else:
            seen[name] = path
    return problems


def gateway_listener_protocols(req: Request) -> list[Problem]:
    """protocol is TURN-UDP, TURN-TCP, TURN-TLS or TURN-DTLS (UDP/TCP/TLS/DTLS deprecated)."""
    problems = []
    reason = ConditionReason.UNSUPPORTED_PROTOCOL
    for path, listener in _listeners(req):
        protocol = listener.get("protocol")
        if protocol is None:
            continue
        canonical = listener_protocol(protocol)
        if canonical is None:
            problems.append(
                error(
                    f"{path}.protocol",
                    f"must be one of {quote_list(ListenerProtocol)}, got {protocol!r}",
                    reason,
                )
            )
        elif protocol in LISTENER_PROTOCOL_ALIASES:
            problems.append(
                warning(
                    f"{path}.protocol",
                    f"{protocol} is deprecated, write {canonical} instead",
                    reason,
                )
            )
    return problems


def gateway_listener_ports(req: Request) -> list[Problem]:
    """port is 1..65535 and no two listeners share a port on the same transport."""
    problems = []
    seen: dict[tuple[str, int], str] = {}
    for path, listener in _listeners(req):
        port = listener.get("port")
        if not is_int(port):
            continue
        if not 1 <= port <= 65535:
            problems.append(
                error(
                    f"{path}.port",
                    f"must be between 1 and 65535, got {port}",
                    ConditionReason.PORT_UNAVAILABLE,
                )
            )
            continue
        protocol = listener_protocol(listener.get("protocol"))
        if protocol is None:
            continue
        transport = LISTENER_TRANSPORT[protocol]
        if (transport, port) in seen:
            problems.append(
                error(
                    f"{path}.port",
                    f"{transport} port {port} is already used by {seen[transport, port]}: "
                    "choose another port",
                    ConditionReason.PROTOCOL_CONFLICT,
                )
            )
        else:
            seen[transport, port] = path
    return problems


def gateway_mixed_protocols(req: Request) -> list[Problem]:
    """A Gateway mixing UDP and TCP listeners needs the mixed-protocol annotation (warning)."""
    transports = {
        LISTENER_TRANSPORT[p]
        for _, lst in _listeners(req)
        if (p := listener_protocol(lst.get("protocol")))
    }
    annotations = as_dict(as_dict(req.obj.get("metadata")).get("annotations"))
    enabled = MIXED_PROTOCOL_LB_ROW.value(annotations, {}, Limits(req.settings.node_port_range))
    if len(transports) > 1 and not enabled:
        return [
            warning(
                "spec.listeners",
                "the listeners mix UDP and TCP; the LoadBalancer Service exposes only the first "
                f'transport unless the annotation {MIXED_PROTOCOL_LB}: "true" is set (on the '
                "Gateway, or in its GatewayConfig's loadBalancerServiceAnnotations)",
                ConditionReason.UNSUPPORTED_PROTOCOL,
            )
        ]
    return []


def _tls_secret_problems(req: Request, ref: dict[str, Any], path: str) -> list[Problem]:
    problems, key = secret_ref(ref, path, req.namespace, CERT_REF)
    if key is None:
        return problems
    read = read_referenced_secret(
        req, *key, path, "the listener will not serve TLS until it is created", CERT_REF
    )
    if read.secret is None:
        return read.problems
    secret, where = read.secret, f"{key[0]}/{key[1]}"
    if secret.get("type", "Opaque") not in TLS_SECRET_TYPES:
        return [
            error(
                path,
                f"Secret {where} is not of type {' or '.join(TLS_SECRET_TYPES)}: use one of them",
                CERT_REF,
            )
        ]
    data = secret_data(secret)
    cert = next((data[k] for k in TLS_CERT_KEYS if data.get(k)), None)
    tls_key = next((data[k] for k in TLS_KEY_KEYS if data.get(k)), None)
    if cert is None or tls_key is None:
        return [
            error(
                path,
                f"Secret {where} must hold a PEM certificate in tls.crt and its key in tls.key",
                CERT_REF,
            )
        ]
    problem = pair_problem(cert, tls_key)
    if problem:
        return [error(path, f"Secret {where} is unusable: {problem}", CERT_REF)]
    return []


def gateway_listener_tls(req: Request) -> list[Problem]:
    """TLS/DTLS listeners terminate TLS with a Secret holding a matching PEM cert and key."""
    problems: list[Problem] = []
    for path, listener in _listeners(req):
        protocol = listener_protocol(listener.get("protocol"))
        tls = listener.get("tls")
        if protocol not in TLS_PROTOCOLS:
            if tls is not None and protocol is not None:
                problems.append(
                    warning(
                        f"{path}.tls",
                        f"ignored, {protocol} listeners do not use TLS",
                        ConditionReason.INVALID,
                    )
                )
            continue
        if not isinstance(tls, dict):
            problems.append(
                error(
                    f"{path}.tls",
                    f"required for {protocol}: set tls.certificateRefs to a Secret holding "
                    "tls.crt and tls.key",
                    CERT_REF,
                )
            )
            continue
        mode = tls.get("mode", DEFAULT_TLS_MODE)
        if mode != DEFAULT_TLS_MODE:
            problems.append(
                error(
                    f"{path}.tls.mode",
                    f"must be Terminate or omitted (TURN cannot pass TLS through), got {mode!r}",
                    ConditionReason.UNSUPPORTED_VALUE,
                )
            )
        refs = as_list(tls.get("certificateRefs"))
        if not refs:
            problems.append(
                error(
                    f"{path}.tls.certificateRefs",
                    "required: reference a Secret holding tls.crt and tls.key",
                    CERT_REF,
                )
            )
        for ref_path, ref in indexed(refs, f"{path}.tls.certificateRefs"):
            problems += _tls_secret_problems(req, ref, ref_path)
    return problems


def gateway_addresses(req: Request) -> list[Problem]:
    """addresses hold an IP (IPAddress) or a DNS name (Hostname); only the first is used."""
    problems = []
    reason = ConditionReason.UNSUPPORTED_ADDRESS
    addresses = as_list(req.spec.get("addresses"))
    if len(addresses) > 1:
        problems.append(
            warning(
                "spec.addresses",
                f"{len(addresses)} addresses given, only the first one is used",
                reason,
            )
        )
    for path, address in indexed(addresses, "spec.addresses"):
        kind, value = address.get("type", DEFAULT_ADDRESS_TYPE), str(address.get("value", ""))
        if kind == "IPAddress":
            try:
                ipaddress.ip_address(value)
            except ValueError:
                problems.append(
                    error(f"{path}.value", f"must be an IP address, got {value!r}", reason)
                )
        elif kind == "Hostname":
            if not DNS_NAME.match(value):
                problems.append(
                    error(f"{path}.value", f"must be a lower-case DNS name, got {value!r}", reason)
                )
        else:
            problems.append(
                error(
                    f"{path}.type",
                    f"must be one of {quote_list(ADDRESS_TYPES)}, got {kind!r}",
                    reason,
                )
            )
    return problems


def gateway_allowed_routes(req: Request) -> list[Problem]:
    """allowedRoutes.namespaces.from is All, Selector (with a selector) or Same."""
    problems = []
    reason = ConditionReason.INVALID
    for path, listener in _listeners(req):
        namespaces = as_dict(as_dict(listener.get("allowedRoutes")).get("namespaces"))
        where = f"{path}.allowedRoutes.namespaces"
        origin = namespaces.get("from", DEFAULT_ROUTE_NAMESPACES_FROM)
        if origin not in ROUTE_NAMESPACES_FROM:
            problems.append(
                error(
                    f"{where}.from",
                    f"must be one of {quote_list(ROUTE_NAMESPACES_FROM)}, got {origin!r}",
                    reason,
                )
            )
        elif origin == "Selector" and not isinstance(namespaces.get("selector"), dict):
            problems.append(
                error(
                    f"{where}.selector",
                    "required when from is Selector: a label selector of the namespaces",
                    reason,
                )
            )
    return problems


def gateway_relay_address_discovery(req: Request) -> list[Problem]:
    """Relay address discovery needs host-network stunnerd pods (a warning: a pod has no
    Node address of its own to hand out); its STUN server means nothing without it (a
    warning)."""
    annotations = as_dict(as_dict(req.obj.get("metadata")).get("annotations"))
    if not RELAY_ADDRESS_DISCOVERY_ROW.value(annotations, {}, Limits()):
        if RELAY_STUN_SERVER_ROW.key not in annotations:
            return []
        return [
            warning(
                f'metadata.annotations["{RELAY_STUN_SERVER_ROW.key}"]',
                f'has no effect without "{RELAY_ADDRESS_DISCOVERY_ROW.key}": "true"',
                ConditionReason.INVALID,
            )
        ]
    try:
        host = host_network_dataplane(req.obj, req.lookup, req.settings.controller_name)
    except LookupFailed:
        return []
    if host is not None:
        return []
    return [
        warning(
            f'metadata.annotations["{RELAY_ADDRESS_DISCOVERY_ROW.key}"]',
            "the Gateway's stunnerd pods do not use the host network (Dataplane "
            "spec.hostNetwork): clients are handed their Node's public address, which reaches "
            "the pods only where the nodes forward the relay ports to them",
            ConditionReason.INVALID,
        )
    ]


def gateway_annotations(req: Request) -> list[Problem]:
    """stunner.l7mp.io/ annotations are the documented ones with valid values."""
    names = {str(lst.get("name")) for _, lst in _listeners(req) if "name" in lst}
    return annotation_problems(
        as_dict(as_dict(req.obj.get("metadata")).get("annotations")),
        "metadata.annotations",
        req.settings,
        GATEWAY_KIND,
        names,
    )


RULES = [
    gateway_schema,
    gateway_listener_names,
    gateway_listener_protocols,
    gateway_listener_ports,
    gateway_mixed_protocols,
    gateway_listener_tls,
    gateway_addresses,
    gateway_allowed_routes,
    gateway_annotations,
    gateway_daemon_ports,
    gateway_host_ports,
    gateway_relay_address_discovery,
]
