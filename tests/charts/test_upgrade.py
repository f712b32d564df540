"""The webhook's certificate survives an upgrade: `helm template --dry-run=server` (lookup reads
the cluster) against the fake API server holding the Secret a first install made renders the
same CA and certificate, with helm 3 and 4."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import yaml

from tests.charts.conftest import CHART, NAMESPACE, chart_api, of_kind
from tests.support.fakeapi import FakeApiServer


def template_against(helm: Path, api: FakeApiServer, tmp_path: Path) -> list[dict[str, object]]:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    done = subprocess.run(
        [
            str(helm),
            "template",
            "stunner",
            str(CHART),
            "--namespace",
            NAMESPACE,
            "--dry-run=server",
            "--disable-openapi-validation",
            "--kubeconfig",
            str(kubeconfig),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def test_an_upgrade_keeps_the_webhook_certificate(helm: Path, tmp_path: Path) -> None:
    with chart_api() as api:
        first = template_against(helm, api, tmp_path)  # an install: no Secret yet, a fresh CA
        (secret,) = [s for s in of_kind(first, "Secret") if s["type"] == "kubernetes.io/tls"]
        # What the install created: helm marks what it owns, and helm 4 checks the marks.
        owned = {
            "meta.helm.sh/release-name": "stunner",
            "meta.helm.sh/release-namespace": NAMESPACE,
        }
        api.seed({**secret, "metadata": {**secret["metadata"], "annotations": owned}})
        again = template_against(helm, api, tmp_path)
    (kept,) = [s for s in of_kind(again, "Secret") if s["type"] == "kubernetes.io/tls"]
    assert kept["data"] == secret["data"]
    (validating,) = of_kind(again, "ValidatingWebhookConfiguration")
    bundles = {w["clientConfig"]["caBundle"] for w in validating["webhooks"]}
    assert bundles == {secret["data"]["ca.crt"]}
    assert base64.b64decode(secret["data"]["ca.crt"]).startswith(b"-----BEGIN CERTIFICATE-----")
