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
class is (looked up). STUNner's own kinds (GatewayConfig, UDPRoute in both API groups and every
served version, StaticService, Dataplane) are always judged; anything else gets an empty verdict.

A Gateway whose GatewayClass cannot be read is admitted with a warning and not judged: it may
be another controller's, and a STUNner fault must not block it (the reconciler's status reports
problems of STUNner's own Gateways). A referenced Secret that does not exist is admitted with a
warning (manifests are applied in any order); one that exists but is unusable is refused; one in
another namespace that neither a ReferenceGrant nor the requester's rights let us read is not
read at all (a warning says it cannot be checked).
"""

from __future__ import annotations

from typing import Any

from stunner_api.rules import (
    dataplane,
    gateway,
    gatewayclass,
    gatewayconfig,
    staticservice,
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
    warning,
)
from stunner_api.rules.defaults import json_pointer, patch_for
from stunner_api.vocabulary import ConditionReason, judged_kind

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
    "StaticService": list(staticservice.RULES),
    "Dataplane": list(dataplane.RULES),
}

# Rules that judge a DELETE; every other rule judges CREATE and UPDATE only (deleting an
# invalid object is always fine).
ON_DELETE: frozenset[Rule] = frozenset(dataplane.ON_DELETE)


def is_ours(obj: dict[str, Any], lookup: Lookup, settings: Settings) -> bool:
    """Whether STUNner's rules apply: our kinds, our GatewayClasses, Gateways of our classes.

    Raises LookupFailed when a Gateway's class cannot be read."""
    kind = str(obj.get("kind"))
    if judged_kind(str(obj.get("apiVersion")), kind) is None:
        return False
    if kind == "GatewayClass":
        return bool(as_dict(obj.get("spec")).get("controllerName") == settings.controller_name)
    if kind == "Gateway":
        name = as_dict(obj.get("spec")).get("gatewayClassName")
        if not isinstance(name, str) or not name:
            return False
        gwc = lookup.gateway_class(name)
        if gwc is None:
            return False
        return bool(as_dict(gwc.get("spec")).get("controllerName") == settings.controller_name)
    return True


def _unchecked_gateway(obj: dict[str, Any], failure: LookupFailed) -> Problem:
    name = as_dict(obj.get("spec")).get("gatewayClassName")
    return warning(
        "spec.gatewayClassName",
        f"the STUNner webhook could not read GatewayClass {name!r} ({failure}), so it did not "
        "check this Gateway: if STUNner manages it, STUNner reports any problem in its status",
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
    except LookupFailed as e:  # a Gateway of a class we cannot read: maybe not ours
        verdict.add([_unchecked_gateway(obj, e)])
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
