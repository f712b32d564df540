"""`stunner config` against a CDS that requires tokens (issue 20 #5), through the API server's
service proxy, which strips Authorization (the fake does as kube-apiserver does).

The CLI mints a 10-minute token of the CDS's audience for the chart's reader account with the
TokenRequest API and sends it as X-Stunner-Authorization: it lists every config. A user RBAC
refuses `create serviceaccounts/token` gets a message saying so, and no config. The minted
token appears in no output and no log line.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from reconciler.cds.access import Access, Account, TokenVerifier
from reconciler.cds.server import cds_app
from reconciler.cds.store import ConfigStore
from reconciler.kube.api import Api
from stunner_api.dataplane import validate_config
from stunner_api.vocabulary import CDS_TOKEN_AUDIENCE
from stunner_cli.__main__ import main as stunner
from tests.support.background import Background
from tests.support.fakeapi import FakeApiServer
from tests.support.objects import cds_service

SYSTEM = "stunner-system"
READER = "stunner-config-reader"


def config(id: str) -> dict[str, object]:
    return {
        "version": "v1",
        "admin": {"name": id, "loglevel": "all:INFO"},
        "auth": {
            "type": "static",
            "realm": "stunner.l7mp.io",
            "credentials": {"username": "u", "password": "p-secret"},
        },
        "listeners": [],
        "clusters": [],
    }


def test_the_cli_reads_configs_as_the_reader_account(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    store = ConfigStore()
    for id in ("a/gw", "b/gw"):
        store.set(id, validate_config(config(id)))
    background = Background()
    with FakeApiServer() as fake:
        api = Api(fake.api_client())
        access = Access(
            TokenVerifier(lambda token: api.review_token(token, (CDS_TOKEN_AUDIENCE,))),
            readers={Account(SYSTEM, READER)},
            account_of=lambda id: "default",
        )
        try:
            cds = background.serve(cds_app(store, access=access.middleware))
            for obj in (
                cds_service(SYSTEM),
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": READER}},
            ):
                obj["metadata"]["namespace"] = SYSTEM  # type: ignore[index]
                fake.seed(obj)
            fake.proxy(SYSTEM, "services", "stunner-config-discovery", 13478, cds)
            kube = ["--kubeconfig", str(fake.write_kubeconfig(tmp_path / "kubeconfig"))]
            assert stunner(["config", "-o", "json", *kube]) == 0
            shown = capsys.readouterr().out
            assert '"a/gw"' in shown and '"b/gw"' in shown
            assert fake.token_reviews == 1
            (minted,) = list(fake.tokens)
            # Who may not mint the reader's token reads nothing, and is told why.
            fake.forbidden.add(("", "serviceaccounts/token"))
            assert stunner(["config", *kube]) != 0
            refused = capsys.readouterr()
            assert "create serviceaccounts/token" in refused.err
            assert f"{SYSTEM}/{READER}" in refused.err
            assert '"a/gw"' not in refused.out
        finally:
            background.close()
            api.close()
    assert minted not in shown + refused.out + refused.err
    assert all(minted not in record.getMessage() for record in caplog.records)
