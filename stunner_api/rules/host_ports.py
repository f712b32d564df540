"""Rules of the ports a Gateway's stunnerd binds for itself and, for Gateways whose pods use
their nodes' network, of the ports they share with the other such Gateways (issue 23).

stunnerd binds its listeners' ports (the listener's port, or its targetport annotation's) and
its own: the health check (TCP 8086, unless the Dataplane sets disableHealthCheck) and the
metrics endpoint (TCP 8080, with enableMetricsEndpoint), both movable per Gateway with the
health-check-port and metrics-port annotations (`stunner_api.annotations.daemon_ports`, the
one answer render writes into the config and the pod's probes too). Every Gateway's own ports
must differ; host-network Gateways' must also differ from every other host-network Gateway's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stunner_api.annotations import (
    DISABLE_MANAGED_DATAPLANE_ROW,
    HEALTH_CHECK_PORT_ROW,
    METRICS_PORT_ROW,
    TARGETPORT_ROW,
    Limits,
    daemon_ports,
)
from stunner_api.rules.base import (
    Lookup,
    LookupFailed,
    Problem,
    Request,
    as_dict,
    as_list,
    error,
    indexed,
    is_int,
    listener_protocol,
    warning,
)
from stunner_api.vocabulary import (
    DEFAULT_DATAPLANE,
    LISTENER_TRANSPORT,
    ConditionReason,
)

REASON = ConditionReason.PORT_UNAVAILABLE


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return as_dict(obj.get("metadata"))


def _annotations(obj: dict[str, Any]) -> dict[str, Any]:
    return as_dict(_meta(obj).get("annotations"))


def gateway_dataplane(
    gateway: dict[str, Any], lookup: Lookup | _Remembered, controller_name: str
) -> tuple[str, dict[str, Any]] | None:
    """(name, spec) of the Dataplane whose stunnerd pods serve a Gateway, None when the Gateway
    is not ours, its pods are not managed (disable-managed-dataplane) or its GatewayConfig or
    Dataplane is missing. Raises LookupFailed."""
    if DISABLE_MANAGED_DATAPLANE_ROW.value(_annotations(gateway), {}, Limits()):
        return None
    gateway_class = lookup.gateway_class(str(as_dict(gateway.get("spec")).get("gatewayClassName")))
    spec = as_dict((gateway_class or {}).get("spec"))
    if spec.get("controllerName") != controller_name:
        return None
    ref = as_dict(spec.get("parametersRef"))
    config = lookup.gateway_config(str(ref.get("namespace")), str(ref.get("name")))
    if config is None:
        return None
    name = str(as_dict(config.get("spec")).get("dataplane") or DEFAULT_DATAPLANE)
    dataplane = lookup.dataplane(name)
    return None if dataplane is None else (name, as_dict(dataplane.get("spec")))


def host_network_dataplane(
    gateway: dict[str, Any], lookup: Lookup | _Remembered, controller_name: str
) -> tuple[str, dict[str, Any]] | None:
    """`gateway_dataplane`, when its pods use their nodes' network (`spec.hostNetwork: true`)."""
    found = gateway_dataplane(gateway, lookup, controller_name)
    return found if found is not None and found[1].get("hostNetwork") is True else None


class _Remembered:
    """A Lookup's answers about classes, GatewayConfigs and Dataplanes, each asked once: the
    Gateways of a cluster share a few of them (the webhook asks the API server for each)."""

    def __init__(self, lookup: Lookup) -> None:
        self.lookup = lookup
        self.answers: dict[tuple[str, ...], dict[str, Any] | None] = {}

    def _once(self, key: tuple[str, ...], ask: Any) -> dict[str, Any] | None:
        if key not in self.answers:
            self.answers[key] = ask()
        return self.answers[key]

    def gateway_class(self, name: str) -> dict[str, Any] | None:
        return self._once(("class", name), lambda: self.lookup.gateway_class(name))

    def gateway_config(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._once(
            ("config", namespace, name), lambda: self.lookup.gateway_config(namespace, name)
        )

    def dataplane(self, name: str) -> dict[str, Any] | None:
        return self._once(("dataplane", name), lambda: self.lookup.dataplane(name))


@dataclass(frozen=True)
class Claim:
    """What binds a port: "listener 'udp'" or "its health check", and the field that sets it
    (a listener's port, an annotation, or the class when the port is stunnerd's default)."""

    what: str
    path: str
    fix: str  # what the refusal suggests


Ports = dict[tuple[str, int], Claim]  # (transport, port) -> what binds it
HEALTH, METRICS = "its health check", "its metrics endpoint"
CHOOSE = "choose another port"


def _listener_ports(gateway: dict[str, Any], limits: Limits) -> Ports:
    """Every port a Gateway's listeners bind: the targetport annotation's where it names the
    listener, else the listener's port."""
    targetports = TARGETPORT_ROW.value(_annotations(gateway), {}, limits)
    ports: Ports = {}
    listeners = as_list(as_dict(gateway.get("spec")).get("listeners"))
    for path, listener in indexed(listeners, "spec.listeners"):
        protocol, name = listener_protocol(listener.get("protocol")), listener.get("name")
        port = targetports.get(str(name), listener.get("port"))
        if protocol is not None and is_int(port) and 1 <= port <= 65535:
            claim = Claim(f"listener {str(name)!r}", f"{path}.port", CHOOSE)
            ports.setdefault((LISTENER_TRANSPORT[protocol], port), claim)
    return ports


def _daemon_ports(gateway: dict[str, Any], dataplane: dict[str, Any]) -> Ports:
    """The ports stunnerd binds for itself, each at the annotation that moves it (else at the
    class, suggesting the annotation)."""
    annotations, ports = _annotations(gateway), daemon_ports(_annotations(gateway), dataplane)
    out: Ports = {}
    for what, port, row, off in (
        (HEALTH, ports.health, HEALTH_CHECK_PORT_ROW, "set disableHealthCheck"),
        (METRICS, ports.metrics, METRICS_PORT_ROW, "leave enableMetricsEndpoint off"),
    ):
        if port is None or ("TCP", port) in out:
            continue
        if row.key in annotations:
            claim = Claim(what, f'metadata.annotations["{row.key}"]', CHOOSE)
        else:
            fix = (
                f"move it to a free port with the {row.key} annotation (or {off} in one Dataplane)"
            )
            claim = Claim(what, "spec.gatewayClassName", fix)
        out["TCP", port] = claim
    return out


def _age(gateway: dict[str, Any]) -> tuple[str, str, str]:
    """The order Gateways claim host ports in: the older first (one not created yet last),
    then by namespace and name."""
    meta = _meta(gateway)
    created = meta.get("creationTimestamp")
    return (
        str(created) if created else "~",
        str(meta.get("namespace") or "default"),
        str(meta.get("name") or ""),
    )


def gateway_daemon_ports(req: Request) -> list[Problem]:
    """No listener binds stunnerd's own port (its health check's or metrics endpoint's, in the
    pod's network namespace or the node's: one of the two would not bind); stunnerd's health
    check and metrics endpoint are on different ports (both annotated to one port, stunnerd
    could bind only the first); a port annotation for an endpoint the Dataplane turns off is a
    warning (it has no effect)."""
    try:
        found = gateway_dataplane(req.obj, req.lookup, req.settings.controller_name)
    except LookupFailed:
        return []  # gateway_host_ports says so
    if found is None:
        return []
    annotations, (name, spec) = _annotations(req.obj), found
    ports = daemon_ports(annotations, spec)
    listeners = _listener_ports(req.obj, Limits(req.settings.node_port_range))
    daemon = _daemon_ports(req.obj, spec)
    network = (
        f"on the nodes' network: Dataplane {name!r} sets hostNetwork"
        if spec.get("hostNetwork") is True
        else "in its pods' network"
    )
    problems = [
        error(
            claim.path,
            f"{transport} port {port} is {daemon[transport, port].what} (stunnerd's own port, "
            f"{network}): {CHOOSE}",
            REASON,
        )
        for (transport, port), claim in listeners.items()
        if (transport, port) in daemon
    ]
    problems += [
        warning(
            f'metadata.annotations["{row.key}"]',
            f"has no effect: Dataplane {name!r} {why}",
            ConditionReason.INVALID,
        )
        for row, port, why in (
            (HEALTH_CHECK_PORT_ROW, ports.health, "sets disableHealthCheck"),
            (METRICS_PORT_ROW, ports.metrics, "does not set enableMetricsEndpoint"),
        )
        if row.key in annotations and port is None
    ]
    if ports.health is not None and ports.health == ports.metrics:
        # Invalid, not PortUnavailable: render keeps the Gateway (stunnerd serves TURN and its
        # health check, and logs that the metrics server cannot start).
        problems.append(
            error(
                f'metadata.annotations["{METRICS_PORT_ROW.key}"]',
                f"TCP port {ports.metrics} is also stunnerd's health check "
                f"({HEALTH_CHECK_PORT_ROW.key}): {CHOOSE}",
                ConditionReason.INVALID,
            )
        )
    return problems


def gateway_host_ports(req: Request) -> list[Problem]:
    """Gateways whose stunnerd pods use the host network bind their ports on the nodes
    themselves: their listeners' and stunnerd's own (the health check, the metrics endpoint).
    A transport and port another such Gateway (any namespace) binds is refused. The older
    Gateway keeps the port (render drops the younger one's listener, or the whole Gateway for
    stunnerd's own port); an update that brings a clash in is refused whatever the ages."""
    controller, remembered = req.settings.controller_name, _Remembered(req.lookup)
    try:
        host = host_network_dataplane(req.obj, remembered, controller)
        if host is None:
            return []
        others: list[tuple[dict[str, Any], tuple[str, dict[str, Any]]]] = []
        for gateway in req.lookup.gateways():
            if (_meta(gateway).get("namespace"), _meta(gateway).get("name")) == (
                req.namespace,
                req.name,
            ):
                continue
            found = host_network_dataplane(gateway, remembered, controller)
            if found is not None:
                others.append((gateway, found))
        old = None
        if req.operation == "UPDATE" and req.old is not None:
            old = host_network_dataplane(req.old, remembered, controller)
    except LookupFailed as failure:
        return [
            warning(
                "spec.listeners",
                f"the host-network ports of other Gateways could not be read ({failure}): "
                "a clash is reported in status",
                ConditionReason.PENDING,
            )
        ]
    limits = Limits(req.settings.node_port_range)
    listeners, daemon = _listener_ports(req.obj, limits), _daemon_ports(req.obj, host[1])
    problems: list[Problem] = []  # a listener on stunnerd's own port: gateway_daemon_ports
    mine = {k: v for k, v in listeners.items() if k not in daemon} | daemon
    before: Ports = {}
    if req.old is not None and old is not None:
        before = _listener_ports(req.old, limits) | _daemon_ports(req.old, old[1])
    for other, (other_dataplane, other_spec) in sorted(others, key=lambda o: _age(o[0])):
        theirs = _listener_ports(other, limits) | _daemon_ports(other, other_spec)
        where = f"{_meta(other).get('namespace')}/{_meta(other).get('name')}"
        dataplanes = (
            f"Dataplane {host[0]!r} sets"
            if host[0] == other_dataplane
            else f"Dataplanes {host[0]!r} and {other_dataplane!r} set"
        )
        for (transport, port), claim in mine.items():
            if (transport, port) not in theirs:
                continue
            introduced = req.operation == "UPDATE" and (transport, port) not in before
            if _age(other) > _age(req.obj) and not introduced:
                continue  # ours first: the younger one is refused (in its own status)
            own = "" if claim.what.startswith("listener ") else f" (stunnerd: {claim.what})"
            problems.append(
                error(
                    claim.path,
                    f"{transport} port {port}{own} is already bound on the nodes by Gateway "
                    f"{where} ({theirs[transport, port].what}): the stunnerd pods of both use "
                    f"the host network ({dataplanes} hostNetwork), so they share the nodes' "
                    f"ports; {claim.fix}",
                    REASON,
                )
            )
        mine = {key: claim for key, claim in mine.items() if key not in theirs}
    return problems


RULES = [gateway_daemon_ports, gateway_host_ports]
