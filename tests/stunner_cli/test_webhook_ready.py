"""`stunner webhook-ready`, the chart's post-install hook (issue 32: the first `kubectl apply`
after `helm install` was refused in every run until the API server reached the webhook). Run as
the chart runs it (the `stunner` console script), against the fake API server calling the real
webhook (gunicorn over TLS) as kube-apiserver calls a ValidatingWebhookConfiguration's URL."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from stunner_cli.webhook_ready import GIVE_UP, PROBE_NAME, READY, WAIT, judge
from tests.support.admission import ValidatingWebhook
from tests.support.fakeapi import FakeApiServer
from tests.webhook.serving import Webhook

STUNNER = str(Path(sys.executable).parent / "stunner")
NAMESPACE = "stunner-system"
NAME = "validate-stunner.stunner.l7mp.io"


def webhook_ready(kubeconfig: Path, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [STUNNER, "webhook-ready", "-n", NAMESPACE, "--kubeconfig", str(kubeconfig), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until(condition: object, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_it_waits_for_the_webhook_then_returns_on_its_refusal(tmp_path: Path) -> None:
    with FakeApiServer() as fake:
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        server = Webhook(tmp_path, kubeconfig)  # its port chosen, nothing listening yet
        registered = ValidatingWebhook(NAME, f"https://127.0.0.1:{server.port}/validate", server.ca)
        fake.webhooks.append(registered)
        proc = webhook_ready(kubeconfig, "--timeout", "60", "--interval", "0.1")
        try:
            wait_until(lambda: registered.calls.count("failed") >= 2)
            assert proc.poll() is None  # still waiting while the webhook is unreachable
            with server:
                stdout, stderr = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert "the webhook judges requests through the API server" in stdout
    assert f'admission webhook "{NAME}" denied the request' in stdout
    assert "spec.userName" in stdout
    assert "failed calling webhook" in stderr
    assert stderr.count("waiting") == 1  # one line per distinct reason, not per attempt
    assert registered.calls[-1] == "denied"
    stored = fake.get_object("stunner.l7mp.io/v1", "GatewayConfig", NAMESPACE, PROBE_NAME)
    assert stored is None  # a dry run: nothing stored


def test_a_webhook_that_never_answers_fails_the_hook_naming_why(tmp_path: Path) -> None:
    with FakeApiServer() as fake:
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        fake.webhooks.append(
            ValidatingWebhook(NAME, "https://127.0.0.1:9/validate", tmp_path / "none.crt")
        )
        proc = webhook_ready(kubeconfig, "--timeout", "1.5", "--interval", "0.2")
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 1 and stdout == ""
    assert "did not answer within 1.5 s" in stderr and "failed calling webhook" in stderr


def test_an_admitted_probe_is_not_taken_for_a_webhook_that_answers(tmp_path: Path) -> None:
    with FakeApiServer() as fake:  # no webhook registered: the API server admits the probe
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        proc = webhook_ready(kubeconfig, "--timeout", "1", "--interval", "0.2")
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 1 and stdout == ""
    assert "does not judge it yet" in stderr


def test_a_forbidden_probe_fails_at_once_naming_the_rbac_needed(tmp_path: Path) -> None:
    with FakeApiServer() as fake:
        fake.forbid("stunner.l7mp.io", "gatewayconfigs")
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        proc = webhook_ready(kubeconfig, "--timeout", "60")
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 1 and stdout == ""
    assert "needs `create` on gatewayconfigs.stunner.l7mp.io" in stderr
    assert stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("status", "message", "outcome"),
    [
        (201, "", WAIT),
        (400, f'admission webhook "{NAME}" denied the request: spec.userName: ...', READY),
        (500, 'Internal error occurred: failed calling webhook "x": connection refused', WAIT),
        (0, "cannot reach the Kubernetes API: timed out", WAIT),
        (404, "the server could not find the requested resource", WAIT),
        (403, "forbidden", GIVE_UP),
        (422, f'GatewayConfig.stunner.l7mp.io "{PROBE_NAME}" is invalid', GIVE_UP),
    ],
)
def test_each_answer_is_judged(status: int, message: str, outcome: str) -> None:
    assert judge(status, message).outcome == outcome
