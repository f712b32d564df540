"""Rules of a Gateway API TCPRoute (v1alpha2, the experimental channel): the TCP backends of
RFC 6062 TCP allocations. Its fields are a UDPRoute's (parentRefs, rules of backendRefs: Services
and StaticServices), so the UDPRoute's rules judge them; the port of a backend is the port TCP
peers are reached on (not ignored, as a Gateway API UDPRoute's is), and a parent listener must be
able to carry TCP allocations (TURN-TCP or TURN-TLS)."""

from __future__ import annotations

from stunner_api.rules.base import Problem, Request, as_dict, as_list, error, indexed, warning
from stunner_api.rules.udproute import (
    port_range_problems,
    udproute_backend_kinds,
    udproute_parent_refs,
    udproute_schema,
)
from stunner_api.vocabulary import (
    GATEWAY,
    GATEWAY_API_GROUP,
    LISTENER_PROTOCOL_TABLE,
    LISTENER_PROTOCOLS,
    SERVICE,
    ConditionReason,
    ListenerProtocol,
)

# The listener protocols RFC 6062 TCP allocations run over (a stream: TURN-TCP, TURN-TLS).
TCP_ALLOCATION_PROTOCOLS: frozenset[ListenerProtocol] = frozenset(
    row.protocol for row in LISTENER_PROTOCOL_TABLE.values() if row.stream
)


def tcp_allocations_refused(protocol: object) -> str | None:
    """Why a listener of `protocol` carries no TCPRoute (None: it does). The routes stage and
    this rule say it in the same words."""
    canonical = LISTENER_PROTOCOLS.get(str(protocol).upper()) if protocol else None
    if canonical is None or canonical in TCP_ALLOCATION_PROTOCOLS:
        return None
    allowed = " or ".join(sorted(TCP_ALLOCATION_PROTOCOLS))
    return (
        f"a {canonical} listener carries no TCP allocations (RFC 6062 runs over {allowed} "
        f"only): attach the TCPRoute to a {allowed} listener"
    )


def tcproute_backend_ports(req: Request) -> list[Problem]:
    """port and endPort are 1..65535, endPort needs port and is not below it; a Service backend
    needs a port (Gateway API requires it): the port TCP peers are reached on."""
    problems = []
    for path, ref, found in port_range_problems(req):
        problems += found
        if ref.get("port") is None and ref.get("kind", SERVICE.kind) == SERVICE.kind:
            problems.append(
                error(
                    f"{path}.port",
                    "required for a Service: the port its TCP peers are reached on (with "
                    "endPort, the last of a range)",
                    ConditionReason.UNSUPPORTED_VALUE,
                )
            )
    return problems


def tcproute_listeners(req: Request) -> list[Problem]:
    """A parentRef's sectionName names a listener that can carry TCP allocations (a warning:
    the route is admitted, and not accepted by that listener: NotAllowedByListeners)."""
    problems = []
    for path, ref in indexed(as_list(req.spec.get("parentRefs")), "spec.parentRefs"):
        group, kind = ref.get("group", GATEWAY_API_GROUP), ref.get("kind", GATEWAY.kind)
        section, name = ref.get("sectionName"), ref.get("name")
        if (group, kind) != (GATEWAY_API_GROUP, GATEWAY.kind) or not isinstance(name, str):
            continue
        if not isinstance(section, str):
            continue
        gateway = req.lookup.gateway(str(ref.get("namespace") or req.namespace), name)
        for listener in as_list(as_dict(as_dict(gateway).get("spec")).get("listeners")):
            listener = as_dict(listener)
            why = tcp_allocations_refused(listener.get("protocol"))
            if listener.get("name") == section and why is not None:
                reason = ConditionReason.NOT_ALLOWED_BY_LISTENERS
                problems.append(warning(f"{path}.sectionName", f"{section!r}: {why}", reason))
    return problems


RULES = [
    udproute_schema,
    udproute_parent_refs,
    udproute_backend_kinds,
    tcproute_backend_ports,
    tcproute_listeners,
]
