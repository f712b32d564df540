"""The admission webhook, in process (Flask test client) and for real (gunicorn over TLS).

We test these aspects:
- The AdmissionReview v1 response shape: uid echoed, allowed, status.code/message listing every
  failing field, warnings, patchType JSONPatch with a base64 patch that jsonpatch applies.
- Strict parsing: malformed JSON, wrong apiVersion/kind, no request.uid -> HTTP 400 with a
  reason, and the app keeps serving.
- DELETE validates request.oldObject; dryRun requests get the same answer.
- A Lookup that cannot reach the API gives a refusal naming the cause (status.code 503).
- Settings from the environment.
- The real thing: ``gunicorn -c webhook/gunicorn.conf.py 'webhook:create_app()'`` with a TLS
  certificate made here, KUBECONFIG pointing at the fake API server, and real AdmissionReview
  bodies: valid / invalid GatewayConfigs, an authRef Secret lacking keys, a missing Secret
  (admitted with a warning), and an API server that hangs (a prompt refusal, not a hang).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from flask.testing import FlaskClient

from reconciler.store import Snapshot
from stunner_api.rules import Lookup, LookupFailed, Settings
from tests.support import lookups
from tests.support.fakeapi import FakeApiServer
from tests.webhook.serving import Webhook
from webhook import create_app, settings_from_env
from webhook.kube import KubeLookup

GVK = {"group": "stunner.l7mp.io", "version": "v1", "kind": "GatewayConfig"}
GVR = {"group": "stunner.l7mp.io", "version": "v1", "resource": "gatewayconfigs"}


def gateway_config(name: str = "gwcfg", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "GatewayConfig",
        "metadata": {"name": name, "namespace": "stunner", "uid": str(uuid.uuid4())},
        "spec": spec,
    }


VALID = gateway_config(realm="stunner.l7mp.io", authType="static", userName="u", password="p")
INVALID = gateway_config(realm="Not A Realm!", authType="bogus", userName="u", password="p")


def review(
    obj: dict[str, Any] | None,
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """The exact shape a kube-apiserver sends."""
    meta = (obj or old or {}).get("metadata", {})
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": GVK,
            "resource": GVR,
            "requestKind": GVK,
            "requestResource": GVR,
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", ""),
            "operation": operation,
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
            "object": obj,
            "oldObject": old,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": f"{operation.title()}Options"},
        },
    }


def auth_secret(name: str, **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": "stunner"},
        "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def app_client(lookup: Lookup) -> FlaskClient:
    app = create_app(Settings(), lookup)
    app.config["TESTING"] = True
    return app.test_client()


@pytest.fixture
def client() -> FlaskClient:
    """The app judging with a snapshot holding one Secret, `partial`, that lacks a password."""
    return app_client(Snapshot.from_objects([auth_secret("partial", type="static", username="u")]))


def post(client: FlaskClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = client.post(path, json=body)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    out: dict[str, Any] = resp.get_json()
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    assert out["response"]["uid"] == body["request"]["uid"]
    return out["response"]


# --- in process ------------------------------------------------------------------------------


def test_valid_object_is_allowed(client: FlaskClient) -> None:
    resp = post(client, "/validate", review(VALID))
    assert resp["allowed"] is True
    assert "status" not in resp


def test_invalid_object_lists_every_failing_field(client: FlaskClient) -> None:
    resp = post(client, "/validate", review(INVALID))
    assert resp["allowed"] is False
    message = resp["status"]["message"]
    assert "spec.realm" in message and "spec.authType" in message
    assert "; " in message
    assert resp["status"]["code"] == 422


def test_update_and_dry_run_answer_the_same(client: FlaskClient) -> None:
    for body in (review(INVALID, "UPDATE", old=VALID), review(INVALID, "UPDATE", VALID, True)):
        resp = post(client, "/validate", body)
        assert resp["allowed"] is False and "spec.authType" in resp["status"]["message"]
    assert post(client, "/validate", review(VALID, "UPDATE", VALID, True))["allowed"] is True


def test_delete_validates_old_object(client: FlaskClient) -> None:
    resp = post(client, "/validate", review(None, "DELETE", old=VALID))
    assert resp["allowed"] is True
    assert client.post("/validate", json=review(None, "DELETE")).status_code == 400


def test_authref_missing_secret_warns_and_partial_secret_refuses(client: FlaskClient) -> None:
    missing = gateway_config(realm="stunner.l7mp.io", authRef={"name": "nope"})
    resp = post(client, "/validate", review(missing))
    assert resp["allowed"] is True
    assert any("nope" in w for w in resp["warnings"])

    partial = gateway_config(
        realm="stunner.l7mp.io", authRef={"name": "partial", "namespace": "stunner"}
    )
    resp = post(client, "/validate", review(partial))
    assert resp["allowed"] is False
    assert "authRef" in resp["status"]["message"]


def test_lookup_failure_is_a_clear_refusal() -> None:
    obj = gateway_config(realm="stunner.l7mp.io", authRef={"name": "s", "namespace": "stunner"})
    with lookups.failing() as lookup:
        resp = post(app_client(lookup), "/validate", review(obj))
    assert resp["allowed"] is False
    assert resp["status"]["code"] == 503
    assert "cannot read Secret stunner/s from the Kubernetes API" in resp["status"]["message"]


def test_mutate_returns_an_applicable_json_patch(client: FlaskClient) -> None:
    obj = gateway_config(userName="u", password="p")
    resp = post(client, "/mutate", review(obj))
    assert resp["allowed"] is True
    assert resp["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(resp["patch"]))
    patched = jsonpatch.apply_patch(obj, patch)
    assert patched["spec"]["realm"] == "stunner.l7mp.io"
    assert patched["metadata"] == obj["metadata"]

    # Nothing to default: no patch at all.
    again = post(client, "/mutate", review(patched))
    assert "patch" not in again and "patchType" not in again
    # DELETE: nothing to mutate.
    assert "patch" not in post(client, "/mutate", review(None, "DELETE", old=obj))


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "not a JSON object"),
        (json.dumps({**review(VALID), "apiVersion": "admission.k8s.io/v1beta1"}), "apiVersion"),
        (json.dumps({**review(VALID), "kind": "Pod"}), "kind"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}), "request"),
        (json.dumps({**review(VALID), "request": {"operation": "CREATE"}}), "request.uid"),
        (
            json.dumps(
                {**review(VALID), "request": {**review(VALID)["request"], "operation": "X"}}
            ),
            "operation",
        ),
    ],
)
def test_malformed_bodies_get_400(client: FlaskClient, body: bytes | str, reason: str) -> None:
    for path in ("/validate", "/mutate"):
        resp = client.post(path, data=body, content_type="application/json")
        assert resp.status_code == 400
        assert reason in resp.get_json()["response"]["status"]["message"]
    assert post(client, "/validate", review(VALID))["allowed"] is True  # still serving


def test_health_routes(client: FlaskClient) -> None:
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert client.get("/validate").status_code == 405


def test_settings_from_env() -> None:
    settings = settings_from_env(
        {
            "STUNNER_WEBHOOK_POD_CIDRS": "10.244.0.0/16, fd00::/64",
            "STUNNER_WEBHOOK_SERVICE_CIDRS": "10.96.0.0/12",
            "STUNNER_CONTROLLER_NAME": "example.com/ctl",
            "STUNNER_WEBHOOK_NODE_PORT_RANGE": "31000-31999",
        }
    )
    assert settings.pod_cidrs == ("10.244.0.0/16", "fd00::/64")
    assert settings.service_cidrs == ("10.96.0.0/12",)
    assert settings.controller_name == "example.com/ctl"
    assert settings.node_port_range == (31000, 31999)
    assert settings_from_env({}) == Settings()
    with pytest.raises(ValueError):
        settings_from_env({"STUNNER_WEBHOOK_NODE_PORT_RANGE": "lots"})


def test_kube_lookup_against_the_fake_api() -> None:
    with FakeApiServer() as fake:
        fake.seed(auth_secret("s", type="static"))
        fake.seed(
            {
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "GatewayClass",
                "metadata": {"name": "stunner"},
                "spec": {"controllerName": "stunner.l7mp.io/gateway-operator"},
            }
        )
        api_client = fake.api_client()
        try:
            kube = KubeLookup(api_client, timeout=0.5)
            secret = kube.secret("stunner", "s")
            assert secret is not None and secret["data"]["type"] == "c3RhdGlj"
            assert kube.secret("stunner", "absent") is None
            gwc = kube.gateway_class("stunner")
            assert gwc is not None and gwc["spec"]["controllerName"].startswith("stunner")
            assert kube.gateway_class("absent") is None
            fake.fail_status = 403
            with pytest.raises(LookupFailed, match="Secret stunner/s.*403"):
                kube.secret("stunner", "s")
        finally:
            api_client.close()
    # The server is gone: connection refused, promptly.
    api_client = fake.api_client(retries=False)
    try:
        started = time.monotonic()
        with pytest.raises(LookupFailed, match="cannot read GatewayClass x"):
            KubeLookup(api_client, timeout=0.5).gateway_class("x")
        assert time.monotonic() - started < 2
    finally:
        api_client.close()


# --- the real thing: gunicorn over TLS ---------------------------------------------------------


@pytest.fixture
def gunicorn(tmp_path: Path, fake: FakeApiServer) -> Iterator[Webhook]:
    """gunicorn -c webhook/gunicorn.conf.py over TLS, KUBECONFIG pointing at the fake API."""
    with Webhook(tmp_path, fake.write_kubeconfig(tmp_path / "kubeconfig")) as server:
        yield server


def test_gunicorn_over_tls_with_the_fake_api(gunicorn: Webhook, fake: FakeApiServer) -> None:
    fake.seed(auth_secret("partial", type="static", username="u"))
    fake.seed(auth_secret("full", type="static", username="u", password="p"))

    assert gunicorn.review("/validate", review(VALID))["allowed"] is True

    refused = gunicorn.review("/validate", review(INVALID))
    assert refused["allowed"] is False
    assert "spec.realm" in refused["status"]["message"]
    assert "spec.authType" in refused["status"]["message"]

    ref = {"namespace": "stunner"}
    full = gateway_config(realm="stunner.l7mp.io", authRef={**ref, "name": "full"})
    assert gunicorn.review("/validate", review(full))["allowed"] is True

    partial = gateway_config(realm="stunner.l7mp.io", authRef={**ref, "name": "partial"})
    refused = gunicorn.review("/validate", review(partial))
    assert refused["allowed"] is False and "authRef" in refused["status"]["message"]

    missing = gateway_config(realm="stunner.l7mp.io", authRef={**ref, "name": "missing"})
    warned = gunicorn.review("/validate", review(missing))
    assert warned["allowed"] is True and any("missing" in w for w in warned["warnings"])

    mutated = gunicorn.review("/mutate", review(gateway_config(userName="u", password="p")))
    assert mutated["patchType"] == "JSONPatch"
    assert any(op["path"] == "/spec/realm" for op in json.loads(base64.b64decode(mutated["patch"])))

    status, body = gunicorn.request("POST", "/validate", b"{nope")
    assert status == 400 and "JSON" in body["response"]["status"]["message"]

    # The API server hangs: a clear refusal well within the 10 s webhook timeout.
    fake.delay = 30
    started = time.monotonic()
    refused = gunicorn.review("/validate", review(partial))
    assert time.monotonic() - started < 10
    assert refused["allowed"] is False and refused["status"]["code"] == 503
    assert (
        "cannot read Secret stunner/partial from the Kubernetes API"
        in (refused["status"]["message"])
    )
