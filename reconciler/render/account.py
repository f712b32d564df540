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

from typing import Any

from stunner_api.vocabulary import OWNED_BY_LABEL, OWNED_BY_VALUE, RELATED_GATEWAY_NAME

from ..store import Object, name_of, namespace_of
from .context import Context, GatewayPlan, Staged, id_of
from .inputs import account_name, named_account, owner_references, related_labels


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
