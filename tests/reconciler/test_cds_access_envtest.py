"""The CDS's token check against a real kube-apiserver (issue 20 #5; envtest layer, skipped
without KUBEBUILDER_ASSETS).

Tokens minted by the real TokenRequest API (`kubectl create token --audience`), checked by the
CDS through the reconciler's own Kubernetes door (`kube.api.Api.review_token`): a token of the CDS's
audience for the Gateway's account reads its config; the same account's token for the API
server's own audience is refused (401), and so is an account that is not the Gateway's (403).
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from reconciler.cds.access import Access, TokenVerifier
from reconciler.cds.server import cds_app, serve
from reconciler.cds.store import ConfigStore
from reconciler.kube.api import Api, load_client
from stunner_api.dataplane import validate_config
from stunner_api.vocabulary import CDS_TOKEN_AUDIENCE
from tests.envtest.controlplane import ControlPlane

pytestmark = pytest.mark.envtest

NS = "cds-auth"


def token(plane: ControlPlane, account: str, *audience: str) -> str:
    extra = [f"--audience={a}" for a in audience]
    result = plane.kubectl("create", "token", account, "-n", NS, *extra)
    assert result.returncode == 0, result.stderr
    return str(result.stdout).strip()


def test_the_cds_checks_tokens_with_the_real_token_review(control_plane: ControlPlane) -> None:
    plane = control_plane
    plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    for account in ("stunnerd", "app"):
        plane.apply(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": account, "namespace": NS},
            }
        )
    own = token(plane, "stunnerd", CDS_TOKEN_AUDIENCE)
    for_the_api_server = token(plane, "stunnerd")
    other = token(plane, "app", CDS_TOKEN_AUDIENCE)
    api = Api(load_client(str(plane.admin_kubeconfig)))
    status = api.review_token(own, (CDS_TOKEN_AUDIENCE,))
    assert status["authenticated"] is True
    assert status["user"]["username"] == f"system:serviceaccount:{NS}:stunnerd"
    assert status["audiences"] == [CDS_TOKEN_AUDIENCE]
    assert not api.review_token(for_the_api_server, (CDS_TOKEN_AUDIENCE,)).get("authenticated")

    async def main() -> dict[str, int]:
        store = ConfigStore()
        store.set(
            f"{NS}/gw",
            validate_config(
                {
                    "version": "v1",
                    "admin": {"name": f"{NS}/gw"},
                    "auth": {
                        "type": "static",
                        "realm": "stunner.l7mp.io",
                        "credentials": {"username": "u", "password": "p"},
                    },
                }
            ),
        )
        access = Access(
            TokenVerifier(lambda t: api.review_token(t, (CDS_TOKEN_AUDIENCE,))),
            account_of=lambda id: "stunnerd",
        )
        answers = {}
        async with serve(cds_app(store, access=access.middleware)) as cds:
            async with aiohttp.ClientSession() as session:
                for name, shown in (
                    ("own", own),
                    ("for the API server", for_the_api_server),
                    ("another account", other),
                ):
                    headers = {"Authorization": f"Bearer {shown}"}
                    url = f"{cds.address}/api/v1/configs/{NS}/gw"
                    async with session.get(url, headers=headers) as response:
                        answers[name] = response.status
        return answers

    try:
        answers = asyncio.run(main())
    finally:
        api.close()
    assert answers == {"own": 200, "for the API server": 401, "another account": 403}
