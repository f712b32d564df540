"""What every rule module shares: Problem, Verdict, the Lookup Protocol, Settings, Request, and
the helpers for references, Secrets and annotations."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypeGuard

from pydantic import ValidationError

from stunner_api.annotations import BY_KEY as ANNOTATION_TABLE
from stunner_api.annotations import KEYS as ANNOTATION_KEYS
from stunner_api.annotations import Limits, Refused, is_stunner_annotation, text_of
from stunner_api.resources import model_of
from stunner_api.vocabulary import (
    CORE_GROUP,
    DEFAULT_CONTROLLER_NAME,
    DEFAULT_NODE_PORT_RANGE,
    LISTENER_PROTOCOL_ALIASES,
    LISTENER_PROTOCOLS,
    NODEPORT,
    SECRET,
    TARGETPORT,
    ConditionReason,
    ListenerProtocol,
    field_path,
    group_of,
)

# --- outcomes ---------------------------------------------------------------------------------


class Severity(StrEnum):
    ERROR = "Error"  # the webhook refuses; the reconciler sets the condition False
    WARNING = "Warning"  # the webhook admits with a warning; the reconciler may note it


@dataclass(frozen=True)
class Problem:
    """One finding of one rule: where, what to do, how bad, and the status condition reason the
    reconciler writes for it. The message never holds Secret content."""

    path: str  # "spec.listeners[1].port"
    message: str
    severity: Severity
    reason: str  # a ConditionReason

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def error(path: str, message: str, reason: str) -> Problem:
    return Problem(path, message, Severity.ERROR, reason)


def warning(path: str, message: str, reason: str) -> Problem:
    return Problem(path, message, Severity.WARNING, reason)


@dataclass
class Verdict:
    problems: list[Problem] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == Severity.ERROR]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == Severity.WARNING]

    @property
    def allowed(self) -> bool:
        return not self.errors

    @property
    def message(self) -> str:
        """The refusal: every error as "path: message", joined by "; "."""
        return "; ".join(str(e) for e in self.errors)

    @property
    def warning_messages(self) -> list[str]:
        return [str(w) for w in self.warnings]

    def add(self, problems: Iterable[Problem]) -> None:
        for problem in problems:
            if problem not in self.problems:
                self.problems.append(problem)


# --- what the rules read ----------------------------------------------------------------------


class LookupFailed(Exception):
    """The Kubernetes API could not be read; the webhook refuses with this as the cause."""


class Lookup(Protocol):
    """What the rules read beyond the object. The webhook answers with live GETs on behalf of
    the requesting user; the reconciler with its snapshot and its own rights."""

    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Secret as JSON (data values base64), None if it does not exist."""
        ...

    def gateway_class(self, name: str) -> dict[str, Any] | None:
        """The GatewayClass as JSON, None if it does not exist."""
        ...

    def gateway(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Gateway as JSON, None if it does not exist (a Gateway API UDPRoute is STUNner's
        to judge only when one of its parent Gateways is of a STUNner GatewayClass)."""
        ...

    def reference_grants(self, namespace: str) -> list[dict[str, Any]]:
        """The ReferenceGrants of a namespace as JSON ([] when there are none)."""
        ...

    def gateways(self) -> list[dict[str, Any]]:
        """Every Gateway of every namespace as JSON (the host-network port clash: Gateways whose
        stunnerd pods share their nodes' ports)."""
        ...

    def gateway_config(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The GatewayConfig as JSON, None if it does not exist."""
        ...

    def dataplane(self, name: str) -> dict[str, Any] | None:
        """The Dataplane as JSON, None if it does not exist."""
        ...

    def may_read_secret(self, namespace: str, name: str) -> bool:
        """Whether the requester may `get` that Secret (the webhook asks the API server with a
        SubjectAccessReview for the AdmissionReview's user; the reconciler answers False: its
        own rights are no reason to read across namespaces)."""
        ...


@dataclass(frozen=True)
class Settings:
    controller_name: str = DEFAULT_CONTROLLER_NAME
    pod_cidrs: tuple[str, ...] = ()
    service_cidrs: tuple[str, ...] = ()
    node_port_range: tuple[int, int] = DEFAULT_NODE_PORT_RANGE
    # The cluster networks a caller meant to guard and could not learn: (network, why and what
    # supplies it), e.g. ("pod", "it is unknown (no Node has spec.podCIDRs); set ..."). The
    # webhook fills it; a StaticService admitted unchecked then says so in a warning.
    unknown_networks: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Request:
    """What a rule looks at: the object (on DELETE, the object being deleted) and its context."""

    obj: dict[str, Any]
    old: dict[str, Any] | None
    operation: str
    lookup: Lookup
    settings: Settings

    @property
    def spec(self) -> dict[str, Any]:
        return as_dict(self.obj.get("spec"))

    @property
    def namespace(self) -> str:
        return str(as_dict(self.obj.get("metadata")).get("namespace") or "default")

    @property
    def name(self) -> str:
        return str(as_dict(self.obj.get("metadata")).get("name") or "")

    @property
    def group(self) -> str:
        return group_of(str(self.obj.get("apiVersion")))

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind"))


Rule = Callable[[Request], list[Problem]]

# --- small helpers ----------------------------------------------------------------------------


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def quote_list(values: Iterable[str]) -> str:
    return ", ".join(values)


def listener_protocol(value: Any) -> ListenerProtocol | None:
    """The canonical TURN-* protocol of a listener: the aliases exactly, the TURN-* names in
    any case; None if unknown."""
    text = str(value)
    if text in LISTENER_PROTOCOL_ALIASES:
        return LISTENER_PROTOCOL_ALIASES[text]
    protocol = LISTENER_PROTOCOLS.get(text.upper())
    return protocol if protocol is not None and protocol.value == text.upper() else None


def indexed(items: list[Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path[i], item) for each item that is an object."""
    for i, item in enumerate(items):
        if isinstance(item, dict):
            yield f"{path}[{i}]", item


# --- schema (types) through the models --------------------------------------------------------


def schema_problems(req: Request, reason: str) -> list[Problem]:
    """Field types and required fields, as the models of stunner_api.resources declare them."""
    model = model_of(str(req.obj.get("apiVersion")), req.kind)
    if model is None:
        return []
    try:
        model.model_validate(req.obj)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            message = err["msg"][0].lower() + err["msg"][1:]
            if err["type"] == "missing":
                message = "required"
            problems.append(error(field_path(err["loc"]), message, reason))
        return problems
    return []


# --- Secrets ----------------------------------------------------------------------------------


def secret_data(secret: dict[str, Any]) -> dict[str, bytes | None]:
    """Secret data decoded; None for a value that is not valid base64."""
    out: dict[str, bytes | None] = {}
    for key, value in as_dict(secret.get("data")).items():
        try:
            out[key] = base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            out[key] = None
    for key, value in as_dict(secret.get("stringData")).items():
        out[key] = str(value).encode()
    return out


def secret_ref(
    ref: dict[str, Any], path: str, default_namespace: str, reason: str
) -> tuple[list[Problem], tuple[str, str] | None]:
    """Check a SecretObjectReference; (problems, (namespace, name)) when it can be looked up."""
    problems: list[Problem] = []
    group, kind = ref.get("group", ""), ref.get("kind", "Secret")
    if group not in ("", "v1", None) or kind not in ("Secret", None):
        problems.append(
            error(
                path,
                f'must reference a core Secret (group "" and kind Secret, or omitted), '
                f"got group {group!r} kind {kind!r}",
                reason,
            )
        )
    name = ref.get("name")
    if not isinstance(name, str) or not name:
        problems.append(error(f"{path}.name", "required: the name of the Secret", reason))
    if problems:
        return problems, None
    return problems, (str(ref.get("namespace") or default_namespace), str(name))


def _grant_permits(grant: dict[str, Any], req: Request, name: str) -> bool:
    """Whether a ReferenceGrant lets req's object (its group, kind and namespace) refer to the
    Secret `name` (Gateway API semantics: a `to` entry without a name covers every Secret)."""
    spec = as_dict(grant.get("spec"))
    sources = (as_dict(f) for f in as_list(spec.get("from")))
    if not any(
        f.get("group", "") == req.group
        and f.get("kind") == req.kind
        and f.get("namespace") == req.namespace
        for f in sources
    ):
        return False
    return any(
        t.get("group", "") == CORE_GROUP
        and t.get("kind") == SECRET.kind
        and t.get("name") in (None, "", name)
        for t in (as_dict(t) for t in as_list(spec.get("to")))
    )


@dataclass(frozen=True)
class SecretRead:
    """The outcome of reading a referenced Secret: the Secret (None if it does not exist or
    may not be read) and the problems of reading it."""

    secret: dict[str, Any] | None
    problems: list[Problem]
    readable: bool


def read_referenced_secret(
    req: Request, namespace: str, name: str, path: str, missing: str, reason: str
) -> SecretRead:
    """Read a Secret that req's object refers to, on the requester's behalf.

    A Secret in the object's own namespace is read. One in another namespace is read only when
    a ReferenceGrant there permits the reference or the requester may `get` it; otherwise it is
    not read and the only problem is a warning that the reference cannot be checked, which
    tells nothing about the Secret (not even whether it exists). `missing` completes the
    warning for a Secret that does not exist."""
    where = f"{namespace}/{name}"
    if namespace != req.namespace and not _may_refer(req, namespace, name):
        return SecretRead(
            None,
            [
                warning(
                    path,
                    f"Secret {where} is in another namespace and neither a ReferenceGrant in "
                    f"namespace {namespace} permits this {req.kind} to refer to it nor may you "
                    "read it: the reference cannot be checked here (STUNner reports it in "
                    "status)",
                    ConditionReason.REF_NOT_PERMITTED,
                )
            ],
            False,
        )
    secret = req.lookup.secret(namespace, name)
    if secret is None:
        return SecretRead(
            None, [warning(path, f"Secret {where} does not exist (yet): {missing}", reason)], True
        )
    return SecretRead(secret, [], True)


def _may_refer(req: Request, namespace: str, name: str) -> bool:
    """A ReferenceGrant permits it or the requester may read the Secret. A question the API
    cannot answer counts as no."""
    try:
        if any(_grant_permits(g, req, name) for g in req.lookup.reference_grants(namespace)):
            return True
        return req.lookup.may_read_secret(namespace, name)
    except LookupFailed:
        return False


# --- annotations (Gateway, GatewayConfig.loadBalancerServiceAnnotations) ---------------------


def annotation_problems(
    annotations: dict[str, Any],
    base: str,
    settings: Settings,
    kind: str,
    listeners: set[str] | None,
) -> list[Problem]:
    """stunner.l7mp.io/ annotations are rows of the annotation table (stunner_api.annotations)
    with values their parser accepts: one error per refused annotation, worded by the parser.
    `kind` is where they were written (a row out of its scope is a warning: it has no effect
    there); `listeners`, a Gateway's listener names, warns of a port map naming another."""
    problems: list[Problem] = []
    reason = ConditionReason.INVALID
    limits = Limits(settings.node_port_range)
    for key, value in annotations.items():
        if not is_stunner_annotation(key):
            continue
        path = f'{base}["{key}"]'
        row = ANNOTATION_TABLE.get(key)
        if row is None:
            problems.append(
                error(
                    path,
                    f"unknown STUNner annotation: use one of {quote_list(ANNOTATION_KEYS)}",
                    reason,
                )
            )
            continue
        if kind not in row.scope:
            problems.append(
                warning(
                    path,
                    f"has no effect in a {kind}: it is read from a {quote_list(row.scope)} only",
                    reason,
                )
            )
            continue
        parsed = row.parse(text_of(value), limits)
        if isinstance(parsed, Refused):
            problems.append(error(path, parsed.reason, reason))
        elif key in (NODEPORT, TARGETPORT) and listeners is not None:
            problems += [
                warning(
                    path,
                    f"no listener named {name!r} (listeners: "
                    f"{quote_list(sorted(listeners))}): the entry is ignored",
                    reason,
                )
                for name in parsed
                if name not in listeners
            ]
    return problems
