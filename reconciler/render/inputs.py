"""What render reads of an input object, in one room for every stage: copies and read-only views
of its values, its STUNner annotations by their rows of the annotation table, the metadata and
labels every rendered object of a Gateway shares, its listeners as written, the ports of its
stunnerd, and the account its dataplane runs as.

The stages (classes, listeners, routes, addresses, config, manifests, account, deployment,
gateways) read objects through here and never import one another (an import contract holds it).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from typing import Any, TypeVar

from stunner_api.annotations import Annotation, DaemonPorts, Limits, daemon_ports
from stunner_api.vocabulary import GATEWAY, RELATED_GATEWAY_NAME, RELATED_GATEWAY_NAMESPACE

from ..store import Object, meta, name_of, namespace_of
from .context import spec_of

T = TypeVar("T")

_SCALARS = (str, int, float, bool, type(None))


def copy_json(value: Any) -> Any:
    """A deep copy of a JSON value: its dicts and lists are rebuilt and its scalars shared, much
    faster than copy.deepcopy; anything else (not from JSON or YAML) goes to copy.deepcopy."""
    if type(value) is dict:
        return {k: copy_json(v) for k, v in value.items()}
    if type(value) is list:
        return [copy_json(v) for v in value]
    if isinstance(value, _SCALARS):
        return value
    return copy.deepcopy(value)


def owned_map(value: Any) -> dict[str, Any]:
    """A deep copy of a mapping taken from an input object (a manifest never shares state with
    the snapshot), {} for anything else."""
    return {k: copy_json(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


_EMPTY: Mapping[str, Any] = {}


def view(value: Any) -> Mapping[str, Any]:
    """A mapping taken from an input object, only to be read (no copy), {} for anything else.
    What goes into a manifest from it is copied there (`owned_map`) or is a scalar."""
    return value if isinstance(value, Mapping) else _EMPTY


def annotation(row: Annotation[T], gateway: Object, gateway_config: Object, limits: Limits) -> T:
    """A STUNner annotation's value for a Gateway, read by its row of the annotation table from
    the Gateway and its GatewayConfig's loadBalancerServiceAnnotations."""
    return row.value(
        view(meta(gateway).get("annotations")),
        view(view(gateway_config.get("spec")).get("loadBalancerServiceAnnotations")),
        limits,
    )


def owner_references(gateway: Object) -> list[dict[str, Any]]:
    uid = meta(gateway).get("uid")
    if not uid:
        return []
    return [
        {
            "apiVersion": str(gateway.get("apiVersion") or GATEWAY.api_versions[0]),
            "kind": "Gateway",
            "name": name_of(gateway),
            "uid": str(uid),
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def gateway_metadata(
    gateway: Object, labels: dict[str, str], annotations: dict[str, str]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": name_of(gateway),
        "namespace": namespace_of(gateway),
        "labels": labels,
        "annotations": annotations,
    }
    owners = owner_references(gateway)
    if owners:
        out["ownerReferences"] = owners
    return out


def related_labels(gateway: Object) -> dict[str, str]:
    return {
        RELATED_GATEWAY_NAME: name_of(gateway),
        RELATED_GATEWAY_NAMESPACE: namespace_of(gateway),
    }


def stunnerd_ports(gateway: Object, dataplane: Object) -> DaemonPorts:
    """The health-check and metrics ports of a Gateway's stunnerd (its annotations, else 8086
    and 8080; None when its Dataplane turns that endpoint off): the config's admin endpoints
    and the pod's probes and ports are both rendered from this one answer."""
    annotations = meta(gateway).get("annotations")
    return daemon_ports(annotations if isinstance(annotations, Mapping) else {}, spec_of(dataplane))


def listener_specs(gateway: Object) -> list[Any]:
    """A Gateway's spec.listeners as written (entries that are not mappings included: they
    keep the indexes of the others)."""
    value = spec_of(gateway).get("listeners")
    return value if isinstance(value, list) else []


# --- the dataplane's account (the account stage renders it) ---------------------------------


ACCOUNT_SUFFIX = "-stunnerd"
MAX_NAME = 253  # a ServiceAccount name is a DNS subdomain (RFC 1123)
DIGEST = 10  # hex digits of the Gateway name's SHA-256 kept in a shortened name


def account_name(gateway_name: str) -> str:
    """The ServiceAccount rendered for the Gateway named `gateway_name`."""
    name = gateway_name + ACCOUNT_SUFFIX
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(gateway_name.encode()).hexdigest()[:DIGEST]
    head = gateway_name[: MAX_NAME - len(ACCOUNT_SUFFIX) - DIGEST - 1].rstrip("-.")
    return f"{head}-{digest}{ACCOUNT_SUFFIX}"


def named_account(dataplane: Object | None) -> str:
    """The Dataplane's `serviceAccountName`, "" when it names none."""
    spec = (dataplane or {}).get("spec")
    name = spec.get("serviceAccountName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) else ""


def dataplane_account(gateway: Object, dataplane: Object | None) -> str:
    """The account a Gateway's dataplane runs as: the Dataplane's, else the rendered one."""
    return named_account(dataplane) or account_name(name_of(gateway))
