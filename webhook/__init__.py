"""The STUNner admission webhook: a Flask application served by gunicorn over TLS.

Run it with ``gunicorn -c webhook/gunicorn.conf.py 'webhook:create_app()'``.

Routes (one blueprint):

- ``POST /validate``: ValidatingAdmissionWebhook, AdmissionReview v1 in and out.
- ``POST /mutate``: MutatingAdmissionWebhook, answers with a JSONPatch of the defaults.
- ``GET /healthz``, ``GET /readyz``: liveness and readiness.

Malformed bodies (bad JSON, wrong apiVersion/kind, no ``request.uid``) get HTTP 400 with the
reason; everything else gets HTTP 200 and an AdmissionReview, including refusals because the
Kubernetes API could not be read (``status.code`` 503).

Settings come from the environment unless passed to :func:`create_app`:

- ``STUNNER_CONTROLLER_NAME``: the GatewayClass controllerName we own
  (default ``stunner.l7mp.io/gateway-operator``).
- ``STUNNER_WEBHOOK_POD_CIDRS``, ``STUNNER_WEBHOOK_SERVICE_CIDRS``: comma-separated CIDR lists.
- ``STUNNER_WEBHOOK_NODE_PORT_RANGE``: ``low-high`` (default ``30000-32767``).

The Kubernetes API is reached with the official client, configured in-cluster, else from
``KUBECONFIG`` / ``~/.kube/config`` (see :mod:`webhook.kube`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from flask import Blueprint, Flask, Response, current_app, jsonify, request

from stunner_api.rules import Lookup, Settings
from webhook.admission import BadReview, parse_review, review_mutate, review_validate

__all__ = ["create_app", "settings_from_env"]

EXTENSION = "stunner_webhook"

bp = Blueprint("admission", __name__)


@dataclass(frozen=True)
class _State:
    settings: Settings
    lookup: Lookup


def _split(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def settings_from_env(env: Mapping[str, str] | None = None) -> Settings:
    """Settings from STUNNER_* environment variables; ValueError on a malformed value."""
    env = os.environ if env is None else env
    defaults = Settings()
    node_ports = defaults.node_port_range
    if raw := env.get("STUNNER_WEBHOOK_NODE_PORT_RANGE", "").strip():
        low, sep, high = raw.partition("-")
        if not sep or not low.strip().isdigit() or not high.strip().isdigit():
            raise ValueError(f"STUNNER_WEBHOOK_NODE_PORT_RANGE: expected low-high, got {raw!r}")
        node_ports = (int(low), int(high))
    return Settings(
        controller_name=env.get("STUNNER_CONTROLLER_NAME", "").strip() or defaults.controller_name,
        pod_cidrs=_split(env.get("STUNNER_WEBHOOK_POD_CIDRS", "")),
        service_cidrs=_split(env.get("STUNNER_WEBHOOK_SERVICE_CIDRS", "")),
        node_port_range=node_ports,
    )


def _state() -> _State:
    state: _State = current_app.extensions[EXTENSION]
    return state


def _bad_request(error: BadReview) -> tuple[Response, int]:
    return jsonify({"error": "bad AdmissionReview", "reason": str(error)}), 400


@bp.post("/validate")
def validate_route() -> Response | tuple[Response, int]:
    try:
        review = parse_review(request.get_data())
    except BadReview as e:
        return _bad_request(e)
    state = _state()
    return jsonify(review_validate(review, state.lookup, state.settings))


@bp.post("/mutate")
def mutate_route() -> Response | tuple[Response, int]:
    try:
        review = parse_review(request.get_data())
    except BadReview as e:
        return _bad_request(e)
    state = _state()
    return jsonify(review_mutate(review, state.lookup, state.settings))


@bp.get("/healthz")
def healthz() -> Response:
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz() -> Response:
    return jsonify({"status": "ready"})


def create_app(settings: Settings | None = None, lookup: Lookup | None = None) -> Flask:
    """The application factory (gunicorn: ``'webhook:create_app()'``)."""
    app = Flask(__name__)
    if lookup is None:
        from webhook.kube import KubeLookup  # the kubernetes client only when needed

        lookup = KubeLookup()
    app.extensions[EXTENSION] = _State(settings or settings_from_env(), lookup)
    app.register_blueprint(bp)
    return app
