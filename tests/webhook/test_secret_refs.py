"""Secrets referenced across namespaces are read only on the requester's behalf (issue 10,
fault 1: the Secret oracle).

A user who may not read Secrets in namespace `stunner` applies, in their own namespace, a
GatewayConfig whose authRef (or a Gateway whose certificateRef) names a Secret there. The webhook
reads with its own rights, so it must not answer with anything about that Secret: not its type
value, not its data, not whether it exists, not whether its certificate matches its key. It
reads the Secret only when a ReferenceGrant in the Secret's namespace permits the reference or
a SubjectAccessReview says the requesting user may `get` it; otherwise it admits with a warning
that the reference cannot be checked. Everything runs through the official client against the
fake API server, which plays the RBAC (SubjectAccessReviews) and stores the ReferenceGrants.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from flask.testing import FlaskClient

from tests.support.fakeapi import FakeApiServer
from tests.support.objects import gateway_class, secret
from tests.support.pki import key_pem, self_signed
from tests.webhook.conftest import admission_review, answer

ALICE = {"username": "alice", "uid": "a-1", "groups": ["system:authenticated"]}
BOB = {"username": "bob", "groups": ["system:authenticated", "secret-readers"]}
SECRET_WORDS = ("oauth-s3cr3t", "admin-user", "hunter2-pw")  # what the victim Secret holds
KEY, OTHER_KEY = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())


def gateway_config(namespace: str, secret_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "GatewayConfig",
        "metadata": {"name": "cfg", "namespace": namespace},
        "spec": {"authRef": {"name": secret_name, "namespace": "stunner"}},
    }


def tls_gateway(namespace: str, secret_name: str) -> dict[str, Any]:
    tls = {"certificateRefs": [{"name": secret_name, "namespace": "stunner"}]}
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "gw", "namespace": namespace},
        "spec": {
            "gatewayClassName": "stunner-gatewayclass",
            "listeners": [{"name": "tls", "port": 443, "protocol": "TURN-TLS", "tls": tls}],
        },
    }


def reference_grant(kind: str, namespace: str, name: str | None = None) -> dict[str, Any]:
    group = "stunner.l7mp.io" if kind == "GatewayConfig" else "gateway.networking.k8s.io"
    to: dict[str, Any] = {"group": "", "kind": "Secret"}
    if name:
        to["name"] = name
    return {
        "apiVersion": "gateway.networking.k8s.io/v1beta1",
        "kind": "ReferenceGrant",
        "metadata": {"name": f"from-{namespace}-{kind.lower()}", "namespace": "stunner"},
        "spec": {"from": [{"group": group, "kind": kind, "namespace": namespace}], "to": [to]},
    }


@pytest.fixture(autouse=True)
def cluster(fake: FakeApiServer) -> FakeApiServer:
    fake.seed(secret("victim", type="oauth-s3cr3t", username="admin-user", password="hunter2-pw"))
    fake.seed(
        secret(
            "tls-victim",
            "kubernetes.io/tls",
            **{"tls.crt": self_signed(KEY), "tls.key": key_pem(OTHER_KEY)},
        )
    )
    fake.seed(gateway_class("stunner-gatewayclass"))
    fake.allow("secret-readers", "get", "secrets", namespace="stunner")
    return fake


def secret_reads(fake: FakeApiServer, name: str) -> int:
    return fake.requests.count(("GET", f"/api/v1/namespaces/stunner/secrets/{name}"))


def assert_nothing_leaks(response: dict[str, Any]) -> None:
    text = json.dumps(response)
    for word in SECRET_WORDS:
        assert word not in text, text


def test_a_user_without_rights_learns_nothing_about_the_secret(
    kube_client: FlaskClient, fake: FakeApiServer
) -> None:
    response = answer(
        kube_client, "/validate", admission_review(gateway_config("alice", "victim"), ALICE)
    )
    assert response["allowed"] is True
    assert response["warnings"] == [
        "spec.authRef: Secret stunner/victim is in another namespace and neither a "
        "ReferenceGrant in namespace stunner permits this GatewayConfig to refer to it nor may "
        "you read it: the reference cannot be checked here (STUNner reports it in status)"
    ]
    assert_nothing_leaks(response)
    assert secret_reads(fake, "victim") == 0  # never read with the webhook's own rights
    asked = fake.access_reviews[-1]
    assert asked["user"] == "alice" and asked["uid"] == "a-1"
    assert asked["resourceAttributes"] == {
        "namespace": "stunner",
        "verb": "get",
        "group": "",
        "version": "v1",
        "resource": "secrets",
        "name": "victim",
    }


def test_whether_the_secret_exists_is_not_told(kube_client: FlaskClient) -> None:
    def warnings(name: str) -> list[str]:
        review = admission_review(gateway_config("alice", name), ALICE)
        response = answer(kube_client, "/validate", review)
        assert response["allowed"] is True
        return [w.replace(name, "NAME") for w in response["warnings"]]

    assert warnings("victim") == warnings("no-such-secret")


def test_whether_a_certificate_matches_its_key_is_not_told(
    kube_client: FlaskClient, fake: FakeApiServer
) -> None:
    response = answer(
        kube_client, "/validate", admission_review(tls_gateway("alice", "tls-victim"), ALICE)
    )
    assert response["allowed"] is True
    assert len(response["warnings"]) == 1
    assert "the reference cannot be checked here" in response["warnings"][0]
    assert "match" not in json.dumps(response)
    assert secret_reads(fake, "tls-victim") == 0


@pytest.mark.parametrize(
    ("obj", "grant", "refusal"),
    [
        (
            gateway_config("alice", "victim"),
            reference_grant("GatewayConfig", "alice"),
            "spec.authRef: Secret stunner/victim: the 'type' key must be static or ephemeral",
        ),
        (
            gateway_config("alice", "victim"),
            reference_grant("GatewayConfig", "alice", "victim"),
            "spec.authRef: Secret stunner/victim: the 'type' key must be static or ephemeral",
        ),
        (
            tls_gateway("alice", "tls-victim"),
            reference_grant("Gateway", "alice"),
            "Secret stunner/tls-victim is unusable: key does not match the certificate",
        ),
    ],
    ids=["gatewayconfig", "gatewayconfig-named", "gateway"],
)
def test_a_reference_grant_lets_the_webhook_check_the_secret(
    kube_client: FlaskClient,
    fake: FakeApiServer,
    obj: dict[str, Any],
    grant: dict[str, Any],
    refusal: str,
) -> None:
    fake.seed(grant)
    response = answer(kube_client, "/validate", admission_review(obj, ALICE))
    assert response["allowed"] is False
    assert refusal in response["status"]["message"]
    assert_nothing_leaks(response)


@pytest.mark.parametrize(
    "grant",
    [
        reference_grant("GatewayConfig", "bob-ns"),  # another namespace
        reference_grant("Gateway", "alice"),  # another kind
        reference_grant("GatewayConfig", "alice", "other-secret"),  # another Secret
    ],
    ids=["namespace", "kind", "name"],
)
def test_a_grant_for_something_else_permits_nothing(
    kube_client: FlaskClient, fake: FakeApiServer, grant: dict[str, Any]
) -> None:
    fake.seed(grant)
    response = answer(
        kube_client, "/validate", admission_review(gateway_config("alice", "victim"), ALICE)
    )
    assert response["allowed"] is True and "cannot be checked" in response["warnings"][0]
    assert secret_reads(fake, "victim") == 0


def test_a_user_who_may_read_the_secret_gets_it_checked(
    kube_client: FlaskClient, fake: FakeApiServer
) -> None:
    response = answer(
        kube_client, "/validate", admission_review(gateway_config("bob", "victim"), BOB)
    )
    assert response["allowed"] is False
    assert "the 'type' key must be static or ephemeral" in response["status"]["message"]
    assert_nothing_leaks(response)
    assert fake.access_reviews[-1]["groups"] == ["system:authenticated", "secret-readers"]


def test_a_secret_in_the_objects_own_namespace_is_checked(kube_client: FlaskClient) -> None:
    response = answer(
        kube_client, "/validate", admission_review(gateway_config("stunner", "victim"), ALICE)
    )
    assert response["allowed"] is False
    assert "the 'type' key must be static or ephemeral" in response["status"]["message"]
    assert_nothing_leaks(response)


def test_when_the_permission_cannot_be_asked_the_secret_is_not_read(
    kube_client: FlaskClient, fake: FakeApiServer
) -> None:
    """ReferenceGrants unreadable (RBAC) and no SubjectAccessReview answer: not read, warned."""
    fake.forbid("gateway.networking.k8s.io", "referencegrants")
    fake.forbid("authorization.k8s.io", "subjectaccessreviews")  # BOB may read it, but who knows
    response = answer(
        kube_client, "/validate", admission_review(gateway_config("alice", "victim"), BOB)
    )
    assert response["allowed"] is True and "cannot be checked" in response["warnings"][0]
    assert secret_reads(fake, "victim") == 0
