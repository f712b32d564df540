"""The STUNner admission webhook: a Flask application served by gunicorn over TLS.

Run it with ``gunicorn -c webhook/gunicorn.conf.py 'webhook:create_app()'``.

Routes (one blueprint):

- ``POST /validate``: ValidatingAdmissionWebhook, AdmissionReview v1 in and out.
- ``POST /mutate``: MutatingAdmissionWebhook, answers with a JSONPatch of the defaults.
- ``GET /healthz``, ``GET /readyz``: liveness and readiness.

Every answer is JSON. A body that is not an AdmissionReview v1 request (bad JSON, JSON nested
deeper than Python parses, wrong apiVersion/kind, no ``request.uid``) gets HTTP 400 with an
AdmissionReview whose ``response.status`` gives the reason; a body over :data:`MAX_BODY_BYTES`
gets HTTP 413 the same way, an unknown route 404, a bug 500 (logged, never a traceback in the
answer). A review nested deeper than :data:`MAX_DEPTH` levels is refused (``status.code`` 400,
its uid echoed, so the user sees why) before any rule walks it. A body over
:data:`SMALL_BODY_BYTES` waits for one of :data:`LARGE_BODY_SLOTS` per worker, 503 if none frees
within :data:`LARGE_BODY_WAIT` seconds. Everything else gets HTTP 200
and an AdmissionReview, including refusals because the Kubernetes API could not be read
(``status.code`` 503).

Settings come from the environment unless passed to :func:`create_app`; a malformed value stops
the application factory (and so gunicorn) with a message naming the variable:

- ``STUNNER_CONTROLLER_NAME``: the GatewayClass controllerName we own
  (default ``stunner.l7mp.io/gateway-operator``).
- ``STUNNER_WEBHOOK_POD_CIDRS``, ``STUNNER_WEBHOOK_SERVICE_CIDRS``: comma-separated CIDR lists
  a StaticService must not overlap. Unset, they are read from the API at start: the pod CIDRs
  from every Node's ``spec.podCIDRs``, the service CIDRs from the ``ServiceCIDR`` objects
  (networking.k8s.io/v1). The start-up log says which CIDRs are guarded and where they came
  from. A list neither set nor offered by the API (Nodes without ``spec.podCIDRs``, a cluster
  before ServiceCIDRs) is not guessed: the log warns, and every StaticService admitted unchecked
  gets an admission warning (``response.warnings``, which kubectl prints) naming the missing
  fact and the variable (chart value ``webhook.podCIDRs`` / ``webhook.serviceCIDRs``).
- ``STUNNER_WEBHOOK_NODE_PORT_RANGE``: ``low-high`` (default ``30000-32767``).

The Kubernetes API is reached with the official client, configured in-cluster, else from
``KUBECONFIG`` / ``~/.kube/config`` (see :mod:`webhook.kube`).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge, ServiceUnavailable

from stunner_api.annotations import parse_port_range
from stunner_api.rules import Lookup, Settings
from webhook.admission import (
    API_VERSION,
    KIND,
    BadReview,
    RequestPayload,
    ReviewResponse,
    build_response,
    parse_review,
    review_mutate,
    review_validate,
)

if TYPE_CHECKING:  # webhook.kube imports kubernetes: only in the worker, after gevent patched ssl
    from webhook.kube import ClusterNetworks

__all__ = [
    "LARGE_BODY_SLOTS",
    "LARGE_BODY_WAIT",
    "MAX_BODY_BYTES",
    "MAX_DEPTH",
    "SMALL_BODY_BYTES",
    "create_app",
    "settings_from_env",
    "with_cluster_networks",
]

log = logging.getLogger(__name__)

EXTENSION = "stunner_webhook"

# The kube-apiserver refuses request bodies over 3 MiB, and an UPDATE's AdmissionReview carries
# the object and the old object: 2 x 3 MiB plus the envelope stays under 8 MiB. Anything larger
# is not from the apiserver; refusing it before parsing caps a worker's memory per request.
MAX_BODY_BYTES = 8 * 1024 * 1024
# Kubernetes objects nest a few tens of levels (an AdmissionReview adds three); deeper JSON is
# refused before any rule walks it (a rule or the defaulter would hit Python's recursion limit).
MAX_DEPTH = 100
# Every connection may send a small body at once (a STUNner object's review is a few KiB), but at
# most LARGE_BODY_SLOTS per worker may hold a larger one (read, parsed, judged) at a time: with
# a greenlet per connection, a thousand 8 MiB bodies would otherwise be held at once. A large
# body that finds no slot within LARGE_BODY_WAIT seconds gets 503.
SMALL_BODY_BYTES = 64 * 1024
LARGE_BODY_SLOTS = 4
LARGE_BODY_WAIT = 1.0

POD_CIDRS = "STUNNER_WEBHOOK_POD_CIDRS"
SERVICE_CIDRS = "STUNNER_WEBHOOK_SERVICE_CIDRS"
NODE_PORT_RANGE = "STUNNER_WEBHOOK_NODE_PORT_RANGE"

bp = Blueprint("admission", __name__)


@dataclass(frozen=True)
class _State:
    settings: Settings
    lookup: Lookup
    # Made in create_app, in the worker: gevent has patched threading by then (cooperative).
    large_bodies: threading.BoundedSemaphore


def _cidrs(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    out = []
    for part in env.get(name, "").split(","):
        if not (part := part.strip()):
            continue
        try:
            out.append(str(ipaddress.ip_network(part, strict=False)))
        except ValueError as e:
            raise ValueError(
                f"{name}: {part!r} is not a CIDR (like 10.244.0.0/16 or fd00::/64): {e}"
            ) from None
    return tuple(out)


def _port_range(env: Mapping[str, str], default: tuple[int, int]) -> tuple[int, int]:
    raw = env.get(NODE_PORT_RANGE, "").strip()
    if not raw:
        return default
    try:
        return parse_port_range(raw)
    except ValueError as exc:
        raise ValueError(f"{NODE_PORT_RANGE}: {exc}") from None


def settings_from_env(env: Mapping[str, str] | None = None) -> Settings:
    """Settings from STUNNER_* environment variables; ValueError naming a malformed one."""
    env = os.environ if env is None else env
    defaults = Settings()
    return Settings(
        controller_name=env.get("STUNNER_CONTROLLER_NAME", "").strip() or defaults.controller_name,
        pod_cidrs=_cidrs(env, POD_CIDRS),
        service_cidrs=_cidrs(env, SERVICE_CIDRS),
        node_port_range=_port_range(env, defaults.node_port_range),
    )


def with_cluster_networks(
    settings: Settings, discover: Callable[[], ClusterNetworks] | None
) -> Settings:
    """Fill the CIDR lists the environment left unset from the API, and log what is guarded.

    ``discover`` is called only when a list is unset (None: never read the API).
    """
    found = discover() if discover and not (settings.pod_cidrs and settings.service_cidrs) else None
    prefix = "StaticService prefixes:"
    lists: dict[str, tuple[str, ...]] = {}
    unknown: list[tuple[str, str]] = []
    for what, variable, value, given, source in (
        ("pod", POD_CIDRS, "podCIDRs", settings.pod_cidrs, "Nodes' spec.podCIDRs"),
        ("service", SERVICE_CIDRS, "serviceCIDRs", settings.service_cidrs, "ServiceCIDR objects"),
    ):
        cidrs, origin = given, variable
        if not cidrs and found is not None:
            cidrs, origin = (found.pod_cidrs if what == "pod" else found.service_cidrs), source
        lists[what] = cidrs
        if cidrs:
            log.info("%s guarding %s CIDRs %s (from %s)", prefix, what, ", ".join(cidrs), origin)
            continue
        missing = (found.pod_missing if what == "pod" else found.service_missing) if found else ""
        why = (
            f"it is unknown ({missing or 'the API was not read'}); set {variable} "
            f"(the chart's webhook.{value}) to the {what} CIDRs"
        )
        unknown.append((what, why))
        log.warning(
            "%s no %s CIDRs, so a StaticService may reach the %s network (each admission "
            "says so in a warning): %s",
            prefix,
            what,
            what,
            why,
        )
    for problem in found.problems if found else ():
        log.warning("%s reading the cluster's networks: %s", prefix, problem)
    if not lists["pod"] and not lists["service"]:
        log.warning("%s the StaticService backdoor check is off", prefix)
    return replace(
        settings,
        pod_cidrs=lists["pod"],
        service_cidrs=lists["service"],
        unknown_networks=tuple(unknown),
    )


def _state() -> _State:
    state: _State = current_app.extensions[EXTENSION]
    return state


def _error(code: int, reason: str, message: str) -> tuple[Response, int]:
    """An AdmissionReview error for a request we could not read (no uid to echo)."""
    body = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "response": {
            "uid": "",
            "allowed": False,
            "status": {"code": code, "reason": reason, "message": message},
        },
    }
    return jsonify(body), code


class _Refused(Exception):
    """A review refused before any rule ran (answered as it is)."""

    def __init__(self, response: ReviewResponse) -> None:
        super().__init__(response["response"].get("status", {}).get("message", ""))
        self.response = response


def _depth_over(doc: object, limit: int) -> bool:
    """Whether JSON ``doc`` nests deeper than ``limit`` containers (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(doc, 1)] if isinstance(doc, dict | list) else []
    while stack:
        node, depth = stack.pop()
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


@contextmanager
def _review() -> Iterator[RequestPayload]:
    """The AdmissionReview request of this HTTP request, holding a large-body slot while the
    review is judged if its body is large; BadReview when it is not one, _Refused when it
    nests deeper than MAX_DEPTH."""
    length = request.content_length
    if length is not None and length > MAX_BODY_BYTES:
        raise RequestEntityTooLarge()
    if length is not None and length <= SMALL_BODY_BYTES:
        yield _parse(request.get_data())
        return
    slots = _state().large_bodies
    if not slots.acquire(timeout=LARGE_BODY_WAIT):
        raise ServiceUnavailable(
            f"{LARGE_BODY_SLOTS} reviews over {SMALL_BODY_BYTES} bytes are being read: retry"
        )
    try:
        body = request.get_data()
        if length is None and len(body) >= MAX_BODY_BYTES:
            raise RequestEntityTooLarge()  # a chunked body werkzeug cut off at the limit
        yield _parse(body)
    finally:
        slots.release()


def _parse(body: bytes) -> RequestPayload:
    try:
        payload = parse_review(body)
    except RecursionError:
        raise BadReview("request body nests JSON too deeply to be an AdmissionReview") from None
    if _depth_over(payload, MAX_DEPTH - 1):  # the AdmissionReview envelope is one level
        message = f"request nests JSON deeper than {MAX_DEPTH} levels: not a Kubernetes object"
        raise _Refused(
            build_response(
                request=payload, allowed=False, code=400, reason="BadRequest", message=message
            )
        )
    return payload


@bp.errorhandler(BadReview)
def _bad_review(error: BadReview) -> tuple[Response, int]:
    return _error(400, "BadRequest", f"bad AdmissionReview: {error}")


@bp.errorhandler(_Refused)
def _refused(refused: _Refused) -> Response:
    return jsonify(refused.response)


@bp.post("/validate")
def validate_route() -> Response:
    state = _state()
    with _review() as review:
        return jsonify(review_validate(review, state.lookup, state.settings))


@bp.post("/mutate")
def mutate_route() -> Response:
    state = _state()
    with _review() as review:
        return jsonify(review_mutate(review, state.lookup, state.settings))


@bp.get("/healthz")
def healthz() -> Response:
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz() -> Response:
    return jsonify({"status": "ready"})


def _http_error(error: HTTPException) -> tuple[Response, int]:
    code = error.code or 500
    if code == 413:
        message = f"request body over {MAX_BODY_BYTES} bytes: not from a kube-apiserver"
    else:
        message = error.description or error.name
    return _error(code, error.name.replace(" ", ""), message)


def _internal_error(error: Exception) -> tuple[Response, int]:
    log.error("unexpected error serving %s %s", request.method, request.path, exc_info=error)
    return _error(500, "InternalError", "internal error in the STUNner admission webhook")


def _use_gunicorn_log() -> None:
    """Under gunicorn, the webhook's log lines go where gunicorn's error log goes."""
    gunicorn_log = logging.getLogger("gunicorn.error")
    webhook_log = logging.getLogger(__name__)
    if gunicorn_log.handlers and not webhook_log.handlers:
        webhook_log.handlers = list(gunicorn_log.handlers)
        webhook_log.setLevel(gunicorn_log.level)
        webhook_log.propagate = False


def create_app(settings: Settings | None = None, lookup: Lookup | None = None) -> Flask:
    """The application factory (gunicorn: ``'webhook:create_app()'``).

    Without ``settings``, they come from the environment, the unset CIDR lists from the API;
    ValueError on a malformed setting (gunicorn then exits, printing it).
    """
    _use_gunicorn_log()
    discover: Callable[[], ClusterNetworks] | None = None
    if lookup is None or settings is None:
        from webhook import kube  # the kubernetes client only when needed

        discover = kube.discover_cluster_networks
        if lookup is None:
            lookup = kube.KubeLookup()
    if settings is None:
        settings = with_cluster_networks(settings_from_env(), discover)
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.extensions[EXTENSION] = _State(
        settings, lookup, threading.BoundedSemaphore(LARGE_BODY_SLOTS)
    )
    app.register_blueprint(bp)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _internal_error)
    return app
