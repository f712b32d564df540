"""Bring-ups shared by the webhook tests: the fake API server, and the webhook app reading it
through the official client (webhook.kube.KubeLookup), as in a cluster."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from flask.testing import FlaskClient

from stunner_api.rules import Settings
from tests.support.fakeapi import FakeApiServer
from webhook import create_app
from webhook.kube import KubeLookup

ADMIN = {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]}


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def kube_client(fake: FakeApiServer) -> Iterator[FlaskClient]:
    """The webhook app with a KubeLookup on the fake API server."""
    lookup = KubeLookup(fake.api_client(), timeout=2.0)
    app = create_app(Settings(), lookup)
    app.config["TESTING"] = True
    try:
        yield app.test_client()
    finally:
        lookup.close()


def admission_review(
    obj: dict[str, Any],
    user: dict[str, Any] | None = None,
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An AdmissionReview v1 request as a kube-apiserver sends it, by `user`."""
    group, _, version = str(obj["apiVersion"]).rpartition("/")
    gvk = {"group": group, "version": version, "kind": obj["kind"]}
    gvr = {"group": group, "version": version, "resource": obj["kind"].lower() + "s"}
    meta = obj.get("metadata", {})
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", ""),
            "operation": operation,
            "userInfo": ADMIN if user is None else user,
            "object": obj,
            "oldObject": old,
            "dryRun": False,
        },
    }


def answer(client: FlaskClient, path: str, review: dict[str, Any]) -> dict[str, Any]:
    """The AdmissionReview response's `response`."""
    resp = client.post(path, json=review)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    body: dict[str, Any] = resp.get_json()
    assert body["response"]["uid"] == review["request"]["uid"]
    response: dict[str, Any] = body["response"]
    return response
