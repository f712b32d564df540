"""AdmissionReview v1 in and out: strict parsing, one ``build_response``, and the two reviews.

The rules themselves live in :mod:`stunner_api.rules` (pure); this module only translates.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping
from typing import Any, Literal, NotRequired, Protocol, Required, TypedDict, runtime_checkable

from stunner_api.rules import Lookup, LookupFailed, Settings, defaults_patch, validate

log = logging.getLogger(__name__)

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


class GroupVersionKind(TypedDict):
    group: str
    version: str
    kind: str


class GroupVersionResource(TypedDict):
    group: str
    version: str
    resource: str


class UserInfo(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]
    extra: dict[str, list[str]]


class RequestPayload(TypedDict, total=False):
    uid: Required[str]
    kind: GroupVersionKind
    resource: GroupVersionResource
    subResource: str
    requestKind: GroupVersionKind
    requestResource: GroupVersionResource
    name: str
    namespace: str
    operation: Required[Operation]
    userInfo: UserInfo
    object: dict[str, Any] | None
    oldObject: dict[str, Any] | None
    dryRun: bool
    options: dict[str, Any] | None


class ReviewRequest(TypedDict):
    apiVersion: str
    kind: str
    request: RequestPayload


class Status(TypedDict, total=False):
    code: int
    message: str
    reason: str


class ResponsePayload(TypedDict):
    uid: str
    allowed: bool
    status: NotRequired[Status]
    warnings: NotRequired[list[str]]
    patch: NotRequired[str]
    patchType: NotRequired[Literal["JSONPatch"]]


class ReviewResponse(TypedDict):
    apiVersion: str
    kind: str
    response: ResponsePayload


class BadReview(ValueError):
    """The body is not an AdmissionReview v1 request (answered with HTTP 400)."""


def parse_review(body: bytes) -> RequestPayload:
    """Parse and check an AdmissionReview v1 request body; raise BadReview with the reason."""
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadReview(f"request body is not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise BadReview("request body is not a JSON object")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise BadReview(
            f"expected apiVersion {API_VERSION!r} and kind {KIND!r}, "
            f"got {doc.get('apiVersion')!r} and {doc.get('kind')!r}"
        )
    request = doc.get("request")
    if not isinstance(request, dict):
        raise BadReview("request is missing or not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid is missing")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise BadReview(f"request.operation {operation!r} is not one of {', '.join(OPERATIONS)}")
    for field in ("object", "oldObject"):
        if request.get(field) is not None and not isinstance(request[field], dict):
            raise BadReview(f"request.{field} is not an object")
    if operation in ("CREATE", "UPDATE") and request.get("object") is None:
        raise BadReview(f"request.object is missing on {operation}")
    if operation == "UPDATE" and request.get("oldObject") is None:
        raise BadReview("request.oldObject is missing on UPDATE")
    if operation == "DELETE" and request.get("oldObject") is None:
        raise BadReview("request.oldObject is missing on DELETE")
    if "dryRun" in request and not isinstance(request["dryRun"], bool):
        raise BadReview("request.dryRun is not a boolean")
    payload: RequestPayload = request  # type: ignore[assignment]  # checked above
    return payload


def build_response(
    *,
    request: RequestPayload,
    allowed: bool,
    message: str = "",
    code: int | None = None,
    reason: str = "",
    warnings: list[str] | None = None,
    jsonpatch: list[dict[str, Any]] | None = None,
) -> ReviewResponse:
    """The one place an AdmissionReview v1 response is put together."""
    response: ResponsePayload = {"uid": request["uid"], "allowed": allowed}
    if not allowed:
        status: Status = {"code": code or 403, "message": message}
        if reason:
            status["reason"] = reason
        response["status"] = status
    if warnings:
        response["warnings"] = list(warnings)
    if allowed and jsonpatch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(jsonpatch).encode("utf-8")).decode("ascii")
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def _refusal(request: RequestPayload, error: Exception) -> ReviewResponse:
    if isinstance(error, LookupFailed):
        log.warning("admission %s refused: %s", request["uid"], error)
        return build_response(
            request=request,
            allowed=False,
            code=503,
            reason="ServiceUnavailable",
            message=str(error),
        )
    log.exception("admission %s failed", request["uid"], exc_info=error)
    return build_response(
        request=request,
        allowed=False,
        code=500,
        reason="InternalError",
        message=f"internal error in the STUNner admission webhook: {error!r}",
    )


@runtime_checkable
class UserBoundLookup(Protocol):
    """A Lookup that answers for a given user (webhook.kube.KubeLookup)."""

    def for_user(self, user: Mapping[str, Any] | None) -> Lookup: ...


def lookup_for(lookup: Lookup, request: RequestPayload) -> Lookup:
    """The lookup answering for the review's user (request.userInfo), when it can."""
    if isinstance(lookup, UserBoundLookup):
        return lookup.for_user(request.get("userInfo"))
    return lookup


def review_validate(request: RequestPayload, lookup: Lookup, settings: Settings) -> ReviewResponse:
    """Run the validation rules for the review's user. On DELETE the object being deleted is
    request.oldObject."""
    operation = request["operation"]
    if operation == "CONNECT":
        return build_response(request=request, allowed=True)
    if operation == "DELETE":
        obj, old = request.get("oldObject") or {}, None
    else:
        obj, old = request.get("object") or {}, request.get("oldObject")
    try:
        verdict = validate(obj, old, operation, lookup_for(lookup, request), settings)
    except Exception as e:  # LookupFailed, or a bug: answer, never crash
        return _refusal(request, e)
    return build_response(
        request=request,
        allowed=verdict.allowed,
        code=422,
        reason="Invalid",
        message=verdict.message,
        warnings=verdict.warning_messages,
    )


def review_mutate(request: RequestPayload, lookup: Lookup, settings: Settings) -> ReviewResponse:
    """Compute the defaulting JSON patch (CREATE and UPDATE only), with the same settings as
    validation (whose GatewayClasses are ours)."""
    if request["operation"] not in ("CREATE", "UPDATE"):
        return build_response(request=request, allowed=True)
    try:
        patch = defaults_patch(request.get("object") or {}, lookup, settings)
    except Exception as e:
        return _refusal(request, e)
    return build_response(request=request, allowed=True, jsonpatch=patch)
