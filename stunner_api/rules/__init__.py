"""The rule table of STUNner's resources, read by the admission webhook (refuse at the door)
and the reconciler (set status conditions): one module per kind, `defaults` for the mutating
hook.

Go STUNner accepts whatever the CRD patterns allow and reports problems later, in status. These
rules find them at the door, with a message that names the field and says what to do:

    spec.listeners[1].port: must be between 1 and 65535, got 70000

Each rule looks at one concern and returns `Problem`s: path, message, severity, and the
Gateway API / STUNner condition reason (stunner_api.vocabulary.ConditionReason) the reconciler
writes for it. `validate` runs the rules of a kind into a `Verdict`; `defaults_patch` computes
the JSON patch of the documented defaults.

Rules work on the raw JSON dicts (not the models) so that a malformed object still gets precise
messages; the schema rule of each kind reports type errors through the models of
`stunner_api.resources`. Pure: the Kubernetes API is reached only through the `Lookup` passed in.

Whose objects: GatewayClasses are ours when their controllerName is ours; Gateways when their
class is (looked up); Gateway API UDPRoutes (every served version) and TCPRoutes when one of their
parent Gateways is (looked up: other controllers serve UDPRoutes too, with backends of their own).
STUNner's own kinds (GatewayConfig, StaticService, Dataplane, STUNner's UDPRoute) are always
judged; anything else gets an empty verdict.

A Gateway whose GatewayClass cannot be read, or a UDPRoute whose parents cannot be, is admitted
with a warning and not judged: it may be another controller's, and a STUNner fault must not
block it (the reconciler's status reports problems of STUNner's own objects). A UDPRoute whose
parent Gateways do not exist yet is not judged either: the reconciler judges it once they do. A
referenced Secret that does not exist is admitted with a warning (manifests are applied in any
order); one that exists but is unusable is refused; one in another namespace that neither a
ReferenceGrant nor the requester's rights let us read is not read at all (a warning says it
cannot be checked).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from stunner_api.rules import (
    dataplane,
    gateway,
    gatewayclass,
    gatewayconfig,
    staticservice,
    tcproute,
    udproute,
)
from stunner_api.rules.base import (
    Lookup,
    LookupFailed,
    Problem,
    Request,
    Rule,
    Settings,
    Severity,
    Verdict,
    as_dict,
    as_list,
    warning,
)
from stunner_api.rules.defaults import json_pointer, patch_for
from stunner_api.vocabulary import (
    GATEWAY,
    GATEWAY_API_GROUP,
    GATEWAY_API_TCP_ROUTE,
    GATEWAY_API_UDP_ROUTE,
    ConditionReason,
    group_of,
    judged_kind,
)

__all__ = [
    "ON_DELETE",
    "RULES",
    "Lookup",
    "LookupFailed",
    "Problem",
    "Request",
    "Rule",
    "Settings",
    "Severity",
    "Verdict",
    "defaults_patch",
    "is_ours",
    "json_pointer",
    "validate",
]

# kind -> its rules, in the order their problems are reported.
RULES: dict[str, list[Rule]] = {
    "GatewayClass": list(gatewayclass.RULES),
    "GatewayConfig": list(gatewayconfig.RULES),
    "Gateway": list(gateway.RULES),
    "UDPRoute": list(udproute.RULES),
    "TCPRoute": list(tcproute.RULES),
    "StaticService": list(staticservice.RULES),
    "Dataplane": list(dataplane.RULES),
}

# The Gateway API route kinds STUNner judges only when one of their parent Gateways is ours.
ROUTE_KINDS = frozenset({GATEWAY_API_UDP_ROUTE.kind, GATEWAY_API_TCP_ROUTE.kind})

# Rules that judge a DELETE; every other rule judges CREATE and UPDATE only (deleting an
# invalid object is always fine).
ON_DELETE: frozenset[Rule] = frozenset(dataplane.ON_DELETE)


def is_ours(obj: dict[str, Any], lookup: Lookup, settings: Settings) -> bool:
    """Whether STUNner's rules apply: our kinds, our GatewayClasses, Gateways of our classes,
    Gateway API UDPRoutes and TCPRoutes attached to such a Gateway.

    Raises LookupFailed when a Gateway's class, or a route's parent, cannot be read."""
    kind = str(obj.get("kind"))
    if judged_kind(str(obj.get("apiVersion")), kind) is None:
        return False
    if kind == "GatewayClass":
        return bool(as_dict(obj.get("spec")).get("controllerName") == settings.controller_name)
    if kind == "Gateway":
        return _class_is_ours(as_dict(obj.get("spec")).get("gatewayClassName"), lookup, settings)
    if group_of(str(obj.get("apiVersion"))) == GATEWAY_API_GROUP and kind in ROUTE_KINDS:
        namespace = str(as_dict(obj.get("metadata")).get("namespace") or "default")
        return any(
            _class_is_ours(as_dict(gateway.get("spec")).get("gatewayClassName"), lookup, settings)
            for gateway in _parent_gateways(obj, namespace, lookup)
        )
    return True


def _class_is_ours(name: object, lookup: Lookup, settings: Settings) -> bool:
    if not isinstance(name, str) or not name:
        return False
    gwc = lookup.gateway_class(name)
    if gwc is None:
        return False
    return bool(as_dict(gwc.get("spec")).get("controllerName") == settings.controller_name)


def _parent_gateways(
    route: dict[str, Any], namespace: str, lookup: Lookup
) -> Iterator[dict[str, Any]]:
    """The Gateways a route's parentRefs name that exist (other parent kinds are skipped)."""
    for ref in as_list(as_dict(route.get("spec")).get("parentRefs")):
        ref = as_dict(ref)
        group, kind = ref.get("group", GATEWAY.group), ref.get("kind", GATEWAY.kind)
        name = ref.get("name")
        if (group, kind) != (GATEWAY.group, GATEWAY.kind) or not isinstance(name, str):
            continue
        gateway = lookup.gateway(str(ref.get("namespace") or namespace), name)
        if gateway is not None:
            yield gateway


def _unchecked(obj: dict[str, Any], failure: LookupFailed) -> Problem:
    if obj.get("kind") == GATEWAY.kind:
        name = as_dict(obj.get("spec")).get("gatewayClassName")
        path, what = "spec.gatewayClassName", f"GatewayClass {name!r}"
    else:
        path, what = "spec.parentRefs", "the Gateways (or their classes) it attaches to"
    return warning(
        path,
        f"the STUNner webhook could not read {what} ({failure}), so it did not check this "
        f"{obj.get('kind')}: if STUNner manages it, STUNner reports any problem in its status",
        ConditionReason.PENDING,
    )


def validate(
    obj: dict[str, Any],
    old: dict[str, Any] | None,
    operation: str,
    lookup: Lookup,
    settings: Settings,
) -> Verdict:
    """Run the rules of obj's kind. On DELETE, obj is the object being deleted.

    Raises LookupFailed when the Kubernetes API cannot be read for one of our objects.
    """
    verdict = Verdict()
    try:
        ours = is_ours(obj, lookup, settings)
    except LookupFailed as e:  # a Gateway or route we cannot place: maybe not ours
        verdict.add([_unchecked(obj, e)])
        return verdict
    if not ours:
        return verdict
    req = Request(obj=obj, old=old, operation=operation, lookup=lookup, settings=settings)
    for rule in RULES.get(req.kind, []):
        if (operation == "DELETE") != (rule in ON_DELETE):
            continue
        verdict.add(rule(req))
    return verdict


def defaults_patch(
    obj: dict[str, Any], lookup: Lookup | None = None, settings: Settings | None = None
) -> list[dict[str, Any]]:
    """RFC 6902 "add" ops writing the documented defaults that obj leaves out.

    Never changes a value the user set. With a lookup, only our objects are defaulted (a
    Gateway whose class is not ours, or cannot be read, is left alone); without one, every
    object of a judged kind gets its defaults.
    """
    kind = str(obj.get("kind"))
    if judged_kind(str(obj.get("apiVersion")), kind) is None:
        return []
    if lookup is not None:
        try:
            if not is_ours(obj, lookup, settings or Settings()):
                return []
        except LookupFailed:
            return []
    return patch_for(kind, obj)
