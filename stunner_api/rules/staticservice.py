"""Rules of a StaticService: its prefixes stay outside the cluster's pod and service networks."""

from __future__ import annotations

import ipaddress

from stunner_api.rules.base import (
    Problem,
    Request,
    Settings,
    as_list,
    error,
    schema_problems,
    warning,
)
from stunner_api.vocabulary import ConditionReason

REASON = ConditionReason.INVALID


def staticservice_schema(req: Request) -> list[Problem]:
    """Field types and required fields."""
    return schema_problems(req, REASON)


def _cluster_networks(
    settings: Settings,
) -> list[tuple[str, ipaddress.IPv4Network | ipaddress.IPv6Network]]:
    out = []
    for what, cidrs in (("pod", settings.pod_cidrs), ("service", settings.service_cidrs)):
        for cidr in cidrs:
            out.append((what, ipaddress.ip_network(cidr, strict=False)))
    return out


def staticservice_prefixes(req: Request) -> list[Problem]:
    """prefixes are CIDRs or IPs, outside the cluster's pod and service networks."""
    problems: list[Problem] = []
    prefixes = as_list(req.spec.get("prefixes"))
    if not prefixes:
        problems.append(
            warning("spec.prefixes", "empty, the StaticService gives access to nothing", REASON)
        )
    cluster = _cluster_networks(req.settings)
    unchecked = False
    for i, prefix in enumerate(prefixes):
        path = f"spec.prefixes[{i}]"
        try:
            network = ipaddress.ip_network(str(prefix), strict=False)
        except ValueError:
            problems.append(
                error(
                    path,
                    f"must be a CIDR like 192.0.2.0/24 or an IP address, got {prefix!r}",
                    REASON,
                )
            )
            continue
        if network.prefixlen == 0:
            problems.append(
                warning(
                    path,
                    f"{network} opens a public relay to every address, the cluster's "
                    "included: use it only for a public TURN service",
                    REASON,
                )
            )
            continue
        unchecked = True
        for what, net in cluster:
            if network.version == net.version and network.overlaps(net):
                problems.append(
                    error(
                        path,
                        f"{network} overlaps the {what} network {net}: a StaticService must "
                        "not reach inside the cluster (a backdoor); use a Service backend",
                        REASON,
                    )
                )
    if unchecked:
        for what, why in req.settings.unknown_networks:
            problems.append(
                warning(
                    "spec.prefixes",
                    f"not checked against the cluster's {what} network: {why}",
                    REASON,
                )
            )
    return problems


RULES = [staticservice_schema, staticservice_prefixes]
