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
answer). Everything else gets HTTP 200 and an AdmissionReview, including refusals because the
Kubernetes API could not be read (``status.code`` 503).

Settings come from the environment unless passed to :func:`create_app`; a malformed value stops
the application factory (and so gunicorn) with a message naming the variable:

- ``STUNNER_CONTROLLER_NAME``: the GatewayClass controllerName we own
  (default ``stunner.l7mp.io/gateway-operator``).
- ``STUNNER_WEBHOOK_POD_CIDRS``, ``STUNNER_WEBHOOK_SERVICE_CIDRS``: comma-separated CIDR lists
  a StaticService must not overlap. Unset, they are read from the API at start: the pod CIDRs
  from every Node's ``spec.podCIDRs``, the service CIDRs from the ``ServiceCIDR`` objects
  (networking.k8s.io/v1). The start-up log says which CIDRs are guarded and where they came
  from, or warns that the check is off.
- ``STUNNER_WEBHOOK_NODE_PORT_RANGE``: ``low-high`` (default ``30000-32767``).

The Kubernetes API is reached with the official client, configured in-cluster, else from
``KUBECONFIG`` / ``~/.kube/config`` (see :mod:`webhook.kube`).
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from stunner_api.rules import Lookup, Settings
from webhook.admission import (
    API_VERSION,
    KIND,
    BadReview,
    RequestPayload,
    parse_review,
    review_mutate,
    review_validate,
)

if TYPE_CHECKING:  # webhook.kube imports kubernetes: only in the worker, after gevent patched ssl
    from webhook.kube import ClusterNetworks

__all__ = ["MAX_BODY_BYTES", "create_app", "settings_from_env", "with_cluster_networks"]

log = logging.getLogger(__name__)

EXTENSION = "stunner_webhook"

# The kube-apiserver refuses request bodies over 3 MiB, and an UPDATE's AdmissionReview carries
# the object and the old object: 2 x 3 MiB plus the envelope stays under 8 MiB. Anything larger
# is not from the apiserver; refusing it before parsing caps a worker's memory per request.
MAX_BODY_BYTES = 8 * 1024 * 1024

POD_CIDRS = "STUNNER_WEBHOOK_POD_CIDRS"
SERVICE_CIDRS = "STUNNER_WEBHOOK_SERVICE_CIDRS"
NODE_PORT_RANGE = "STUNNER_WEBHOOK_NODE_PORT_RANGE"

bp = Blueprint("admission", __name__)


@dataclass(frozen=True)
class _State:
    settings: Settings
    lookup: Lookup


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
    low, sep, high = (part.strip() for part in raw.partition("-"))
    if not sep or not low.isdigit() or not high.isdigit() or not 0 < int(low) <= int(high) < 65536:
        raise ValueError(f"{NODE_PORT_RANGE}: expected low-high within 1-65535, got {raw!r}")
    return int(low), int(high)


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
    lines: list[tuple[int, str]] = []
    lists: dict[str, tuple[str, ...]] = {}
    for what, variable, given, source in (
        ("pod", POD_CIDRS, settings.pod_cidrs, "Nodes' spec.podCIDRs"),
        ("service", SERVICE_CIDRS, settings.service_cidrs, "ServiceCIDR objects"),
    ):
        cidrs, origin = given, variable
        if not cidrs and found is not None:
            cidrs, origin = (found.pod_cidrs if what == "pod" else found.service_cidrs), source
        lists[what] = cidrs
        if cidrs:
            listed = ", ".join(cidrs)
            lines.append((logging.INFO, f"guarding {what} CIDRs {listed} (from {origin})"))
        else:
            lines.append(
                (
                    logging.WARNING,
                    f"no {what} CIDRs: {variable} is unset and the API offered none, so a "
                    f"StaticService may reach the {what} network; set {variable}",
                )
            )
    for problem in found.problems if found else ():
        lines.append((logging.WARNING, f"reading the cluster's networks: {problem}"))
    if not lists["pod"] and not lists["service"]:
        lines.append((logging.WARNING, "the StaticService backdoor check is off"))
    for level, line in lines:
        log.log(level, "StaticService prefixes: %s", line)
    return replace(settings, pod_cidrs=lists["pod"], service_cidrs=lists["service"])


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


def _review() -> RequestPayload:
    """The AdmissionReview request of this HTTP request; BadReview when it is not one."""
    body = request.get_data()  # over MAX_CONTENT_LENGTH with a Content-Length: 413 already
    if request.content_length is None and len(body) >= MAX_BODY_BYTES:
        raise RequestEntityTooLarge()  # a chunked body werkzeug cut off at the limit
    try:
        return parse_review(body)
    except RecursionError:
        raise BadReview("request body nests JSON too deeply to be an AdmissionReview") from None


@bp.errorhandler(BadReview)
def _bad_review(error: BadReview) -> tuple[Response, int]:
    return _error(400, "BadRequest", f"bad AdmissionReview: {error}")


@bp.post("/validate")
def validate_route() -> Response:
    state = _state()
    return jsonify(review_validate(_review(), state.lookup, state.settings))


@bp.post("/mutate")
def mutate_route() -> Response:
    state = _state()
    return jsonify(review_mutate(_review(), state.lookup, state.settings))


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
    app.extensions[EXTENSION] = _State(settings, lookup)
    app.register_blueprint(bp)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _internal_error)
    return app
