"""Rules of a Dataplane (the stunnerd pod template); the default one is never deleted."""

from __future__ import annotations

from stunner_api.rules.base import (
    Problem,
    Request,
    error,
    is_int,
    quote_list,
    schema_problems,
    warning,
)
from stunner_api.vocabulary import (
    DATAPLANE_RESOURCES,
    DEFAULT_DATAPLANE,
    DEFAULT_SERVICE_ACCOUNT,
    PULL_POLICIES,
    ConditionReason,
)

REASON = ConditionReason.INVALID_PARAMETERS


def dataplane_schema(req: Request) -> list[Problem]:
    """Field types and required fields."""
    return schema_problems(req, REASON)


def dataplane_image(req: Request) -> list[Problem]:
    """image is set and imagePullPolicy is Always, IfNotPresent or Never."""
    problems = []
    image = req.spec.get("image")
    if not isinstance(image, str) or not image.strip():
        problems.append(
            error("spec.image", "required: the stunnerd image, like l7mp/stunnerd:latest", REASON)
        )
    policy = req.spec.get("imagePullPolicy")
    if policy is not None and policy not in PULL_POLICIES:
        problems.append(
            error(
                "spec.imagePullPolicy",
                f"must be one of {quote_list(PULL_POLICIES)}, got {policy!r}",
                REASON,
            )
        )
    return problems


def dataplane_counts(req: Request) -> list[Problem]:
    """replicas and terminationGracePeriodSeconds are not negative."""
    problems = []
    for key in ("replicas", "terminationGracePeriodSeconds"):
        value = req.spec.get(key)
        if is_int(value) and value < 0:
            problems.append(error(f"spec.{key}", f"must be 0 or more, got {value}", REASON))
    return problems


def dataplane_resource(req: Request) -> list[Problem]:
    """dataplaneResource is Deployment or DaemonSet; a DaemonSet has no replica count."""
    kind = req.spec.get("dataplaneResource")
    if kind is not None and kind not in DATAPLANE_RESOURCES:
        return [
            error(
                "spec.dataplaneResource",
                f"must be one of {quote_list(DATAPLANE_RESOURCES)}, got {kind!r}",
                REASON,
            )
        ]
    replicas = req.spec.get("replicas")
    if kind == "DaemonSet" and is_int(replicas) and replicas != 1:
        return [
            warning(
                "spec.replicas",
                f"ignored with dataplaneResource DaemonSet (one stunnerd per node), got {replicas}",
                REASON,
            )
        ]
    return []


def dataplane_service_account(req: Request) -> list[Problem]:
    """serviceAccountName is not the namespaces' `default` account: the CDS serves a Gateway's
    config to the account its pods run as, and every other pod of the namespace runs as
    `default` unless told otherwise (issue 28 #3)."""
    if req.spec.get("serviceAccountName") != DEFAULT_SERVICE_ACCOUNT:
        return []
    return [
        warning(
            "spec.serviceAccountName",
            f"{DEFAULT_SERVICE_ACCOUNT!r} is the account every pod of a namespace runs as unless "
            "told otherwise: each of them could read the Gateway's config (its passwords and TLS "
            "keys) from the config discovery service; leave it unset for an account of the "
            "Gateway's own",
            REASON,
        )
    ]


def dataplane_default_kept(req: Request) -> list[Problem]:
    """The Dataplane named default is never deleted (a DELETE rule)."""
    if req.name == DEFAULT_DATAPLANE:
        return [
            error(
                "metadata.name",
                "the default Dataplane cannot be deleted: removing it breaks the installation "
                "(the operator provisions stunnerd pods from it)",
                REASON,
            )
        ]
    return []


RULES = [
    dataplane_schema,
    dataplane_image,
    dataplane_counts,
    dataplane_resource,
    dataplane_service_account,
    dataplane_default_kept,
]
# The rules that judge a DELETE (and only a DELETE).
ON_DELETE = frozenset({dataplane_default_kept})
