"""`stunner-reconciler` in cluster mode as a process: Go's flag names, the Lease taken, and
SIGTERM: the Lease released, a clean exit."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from stunner_api.vocabulary import CDS_TOKEN_AUDIENCE
from tests.reconciler import clusterkit as k
from tests.support.fakeapi import FakeApiServer
from tests.support.ports import free_port


def _lease(fake: FakeApiServer) -> dict[str, str]:
    obj = fake.get_object("coordination.k8s.io/v1", "Lease", "test-ns", "92062b70.l7mp.io")
    return dict((obj or {}).get("spec") or {})


def _until(check: object, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_cluster_mode_process_leads_and_releases_on_sigterm(tmp_path: Path) -> None:
    with FakeApiServer() as fake:
        k.world(fake)
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        cds, health, metrics = free_port(), free_port(), free_port()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reconciler",
                "--kubeconfig",
                str(kubeconfig),
                "--leader-elect",
                "--leader-election-namespace",
                "test-ns",
                "--config-discovery-address",
                f"127.0.0.1:{cds}",
                "--health-probe-bind-address",
                f"127.0.0.1:{health}",
                "--metrics-bind-address",
                f"127.0.0.1:{metrics}",
                "--throttle-timeout",
                "50ms",
                "--zap-log-level",
                "info",
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _until(lambda: _lease(fake).get("holderIdentity"))
            _until(lambda: fake.get_object("apps/v1", "Deployment", k.NS, "gw") is not None)
            url = f"http://127.0.0.1:{cds}/api/v1/configs/{k.NS}/gw"
            # --cds-auth=required is cluster mode's default: no token, no config.
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(url, timeout=5)
            assert refused.value.code == 401
            refused.value.close()
            token = fake.issue_token(k.NS, "gw-stunnerd", (CDS_TOKEN_AUDIENCE,))
            request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(request, timeout=5) as response:
                assert response.status == 200
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, stderr
        assert _lease(fake)["holderIdentity"] == ""
        assert "releasing the Lease" in stderr and "released Lease test-ns/" in stderr
