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

from collections.abc import Mapping, Sequence
from typing import Any

from stunner_api.annotations import (
    RELAY_ADDRESS_DISCOVERY_ROW,
    RELAY_ADDRESS_FAMILY_ROW,
    TARGETPORT_ROW,
    DaemonPorts,
    Limits,
)
from stunner_api.dataplane import ConfigError, StunnerConfig, validate_config
from stunner_api.vocabulary import (
    DEFAULT_LOG_LEVEL,
    NODE_ADDRESS_PLACEHOLDER,
)
from stunner_api.vocabulary import ConditionReason as Reason

from ..store import Object
from .clusters import Cluster
from .context import (
    Attachments,
    Context,
    GatewayPlan,
    ListenerPlan,
    Public,
    Staged,
    finding,
    id_of,
    spec_of,
)
from .inputs import annotation, stunnerd_ports
from .plan import Finding

STUNNER_ADDR = "$STUNNER_ADDR"


# --- admin and auth ---------------------------------------------------------------------------


def admin(
    config_id: str,
    gateway_config: Object,
    dataplane: Object,
    ports: DaemonPorts,
    relay_family: str = "",
) -> dict[str, Any]:
    """The `admin` section: name, log level, health check and metrics (at `ports`), quota,
    offload, and the relay address family (the Gateway's annotation, when set)."""
    gwc, dp = spec_of(gateway_config), spec_of(dataplane)
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
    if relay_family:
        out["relay_address_family"] = relay_family
    return out


# --- the stage --------------------------------------------------------------------------------


def relay_address(gateway: Object, gateway_config: Object, limits: Limits) -> str:
    """A rendered listener's `address`: the pod's address (stunnerd expands it), or with relay
    address discovery the node placeholder, which the CDS replaces for each stunnerd with its
    Node's public address (reconciler.cds.server; the pod sends its node name, STUNNER_NODENAME)."""
    if annotation(RELAY_ADDRESS_DISCOVERY_ROW, gateway, gateway_config, limits):
        return NODE_ADDRESS_PLACEHOLDER
    return STUNNER_ADDR


def _listener(
    gw_id: str,
    listener: ListenerPlan,
    public: Public | None,
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
        entry["public_address"], entry["public_port"] = public.address, public.port
    if listener.cert:
        entry["cert"], entry["key"] = listener.cert, listener.key
    return entry


def dataplane_config(
    ctx: Context,
    plan: GatewayPlan,
    publics: Sequence[Public | None],
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
    targetports = annotation(TARGETPORT_ROW, gateway, of_class.gateway_config, limits)
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
            annotation(RELAY_ADDRESS_FAMILY_ROW, gateway, of_class.gateway_config, limits),
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
