"""The ServiceAccount of a Gateway's dataplane (issue 28 #3): the one account the CDS serves the
Gateway's config to.

Every Gateway whose config renders gets an account of its own, `<gateway>-stunnerd` in its
namespace (`account_name`), owned by the Gateway and labelled like its Service and Deployment,
with `automountServiceAccountToken: false`: stunnerd never calls the API server, its only
credential is the projected CDS token its pod template mounts (deployment.py). Its pods run as
it, so the namespace's `default` account (every other pod's) reads no config. It is rendered for
a Gateway with `disable-managed-dataplane` too: the dataplane you run yourself runs as it.

A Dataplane that names a `serviceAccountName` keeps that choice: its pods run as that account
(in each Gateway's namespace), none is rendered, and the CDS serves the config to it.

The name is the Gateway's with a suffix, so two Gateways never share one, and it is never the
namespace's `default` (a Gateway named "default" gets `default-stunnerd`). A ServiceAccount name
is a DNS subdomain of at most 253 characters, like a Gateway's: a name that would be longer is
cut and keeps a digest of the whole Gateway name before the suffix. An account of that name that
is not the Gateway's (a user's) is never taken over (apply.py), and the CDS then serves the
config to no pod until it is renamed (reconciler.cluster).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from stunner_api.vocabulary import OWNED_BY_LABEL, OWNED_BY_VALUE, RELATED_GATEWAY_NAME

from ..store import Object, name_of, namespace_of
from .context import Context, GatewayPlan, Staged, id_of
from .manifests import owner_references, related_labels

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


def service_account(gateway: Object) -> dict[str, Any]:
    """The rendered ServiceAccount of a Gateway (see the module's docstring)."""
    metadata: dict[str, Any] = {
        "name": account_name(name_of(gateway)),
        "namespace": namespace_of(gateway),
        "labels": {OWNED_BY_LABEL: OWNED_BY_VALUE} | related_labels(gateway),
        "annotations": {RELATED_GATEWAY_NAME: id_of(gateway)},
    }
    owners = owner_references(gateway)
    if owners:
        metadata["ownerReferences"] = owners
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata,
        "automountServiceAccountToken": False,
    }


def service_account_of(ctx: Context, plan: GatewayPlan) -> Staged[dict[str, Any] | None]:
    """The stage: the ServiceAccount of a Gateway whose config rendered, None when its
    Dataplane names one."""
    if named_account(plan.context.dataplane):
        return Staged(None)
    return Staged(service_account(plan.gateway))
