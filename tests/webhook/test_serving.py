"""How the webhook is served: real gunicorn over real TLS, with clients that misbehave.

We test these aspects:
- Idle and trickling connections (TLS ClientHello or HTTP header lines a byte at a time) do not
  stop admission: reviews are answered promptly while 20 + 20 of them are open, and the server
  closes each within its deadlines.
- A review waiting on a slow API server does not hold the others (one worker): the kubernetes
  client's sockets are cooperative under gevent.
- A read-only root file system (a mount namespace where ``/`` is read-only): gunicorn starts,
  serves, and writes nothing under ``$HOME``.
- Bodies: over the size limit (with Content-Length or chunked) -> 413; nested 10^5 deep, not
  JSON, not an AdmissionReview -> 400; an unknown route -> 404; each an AdmissionReview error in
  JSON, never HTML or a traceback, and the webhook keeps serving.
- CIDR settings: a malformed STUNNER_WEBHOOK_POD_CIDRS stops gunicorn with a message naming it;
  unset, the CIDRs come from the API (ServiceCIDRs, Nodes' spec.podCIDRs) and the start-up log
  says which and from where; nothing to be had: a warning that the check is off.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from reconciler.store import Snapshot
from stunner_api.rules import Settings
from tests.support.fakeapi import FakeApiServer
from tests.support.objects import secret
from tests.webhook.conftest import admission_review
from tests.webhook.serving import ROOT, Hostile, Webhook
from webhook import (
    LARGE_BODY_SLOTS,
    LARGE_BODY_WAIT,
    MAX_BODY_BYTES,
    SMALL_BODY_BYTES,
    create_app,
    settings_from_env,
    with_cluster_networks,
)
from webhook.kube import ClusterNetworks, discover_cluster_networks


def gateway_config(**spec: Any) -> dict[str, Any]:
    meta = {"name": "gwcfg", "namespace": "stunner", "uid": str(uuid.uuid4())}
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "GatewayConfig",
        "metadata": meta,
        "spec": spec,
    }


VALID = gateway_config(realm="stunner.l7mp.io", authType="static", userName="u", password="p")


def static_service(*prefixes: str) -> dict[str, Any]:
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "StaticService",
        "metadata": {"name": "static", "namespace": "stunner"},
        "spec": {"prefixes": list(prefixes)},
    }


def node(name: str, *pod_cidrs: str) -> dict[str, Any]:
    spec = {"podCIDR": pod_cidrs[0], "podCIDRs": list(pod_cidrs)} if pod_cidrs else {}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": spec}


def service_cidr(name: str, *cidrs: str) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "ServiceCIDR",
        "metadata": {"name": name},
        "spec": {"cidrs": list(cidrs)},
    }


@pytest.fixture
def kubeconfig(tmp_path: Path, fake: FakeApiServer) -> Path:
    return fake.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    """One server for the tests that only talk to it. Short deadlines (2 s for the handshake
    and each request head, 3 s per request) so that the test sees hostile connections closed."""
    directory = tmp_path_factory.mktemp("webhook")
    with FakeApiServer() as api:
        kubeconfig = api.write_kubeconfig(directory / "kubeconfig")
        with Webhook(directory, kubeconfig, args=["--keep-alive", "2", "--timeout", "3"]) as server:
            yield server


# --- idle and slow connections ----------------------------------------------------------------


def test_idle_and_trickling_connections_do_not_stop_admission(webhook: Webhook) -> None:
    hostile = Hostile(webhook.port, webhook.context, interval=0.1)
    hostile.open(idle=20, hello=10, head=10, body=10)
    try:
        time.sleep(0.3)  # every hostile connection accepted and holding whatever it can
        assert hostile.open_count == 50
        for _ in range(8):
            started = time.monotonic()
            assert (
                webhook.review("/validate", admission_review(VALID), timeout=5)["allowed"] is True
            )
            assert time.monotonic() - started < 1.0, webhook.log()
        # Deadlines: the handshake and each request head within keepalive (2 s here), a
        # request within timeout (3 s here).
        deadline = time.monotonic() + 7
        while hostile.open_count and time.monotonic() < deadline:
            time.sleep(0.1)
        assert hostile.open_count == 0, f"{hostile.open_count} hostile connections still open"
        assert len(hostile.closed) == 50
        heads = hostile.closed_after("idle", "hello", "head")
        assert 1.5 < heads[0] and heads[-1] < 5.0, heads
        bodies = hostile.closed_after("body")
        assert 2.5 < bodies[0] and bodies[-1] < 6.0, bodies
    finally:
        hostile.close()


def test_a_kept_alive_connection_serves_several_reviews(webhook: Webhook) -> None:
    conn = webhook.connection()
    try:
        for _ in range(3):
            body = admission_review(VALID)
            conn.request(
                "POST", "/validate", json.dumps(body), {"Content-Type": "application/json"}
            )
            resp = conn.getresponse()
            assert resp.status == 200
            assert json.loads(resp.read())["response"]["uid"] == body["request"]["uid"]
    finally:
        conn.close()


# --- a read-only root file system -------------------------------------------------------------


def _read_only_root_available() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = [unshare, "-m", "sh", "-c", "mount -o remount,bind,ro / && ! touch /.probe"]
    return subprocess.run(probe, capture_output=True).returncode == 0


@pytest.mark.skipif(not _read_only_root_available(), reason="needs unshare -m and mount (root)")
def test_read_only_root_file_system(tmp_path: Path, kubeconfig: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    server = Webhook(tmp_path, kubeconfig, env={"HOME": str(home), "TMPDIR": str(tmp_path)})
    server.env.pop("XDG_RUNTIME_DIR", None)
    command = server.command
    server.command = lambda: [  # type: ignore[method-assign]
        "unshare",
        "-m",
        "sh",
        "-c",
        'mount -o remount,bind,ro / && exec "$@"',
        "sh",
        *command(),
    ]
    with server:
        assert server.review("/validate", admission_review(VALID))["allowed"] is True
    log = server.log()
    assert "control socket" not in log.lower(), log
    assert "Traceback" not in log, log
    assert list(home.iterdir()) == []


# --- bodies -------------------------------------------------------------------------------------


def _assert_review_error(status: int, body: Any, code: int, text: str) -> None:
    assert isinstance(body, dict), body  # JSON, not an HTML page
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    response = body["response"]
    assert status == code and response["allowed"] is False and response["status"]["code"] == code
    assert text in response["status"]["message"], response
    assert "Traceback" not in json.dumps(body)


def test_bodies_over_the_limit_and_malformed(webhook: Webhook) -> None:
    big = b'{"pad": "' + b"x" * MAX_BODY_BYTES + b'"}'
    _assert_review_error(*webhook.request("POST", "/validate", big), 413, "request body over")

    conn = webhook.connection()
    try:  # chunked: no Content-Length to refuse up front
        conn.putrequest("POST", "/mutate")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        chunk = b"x" * (1 << 20)
        try:
            for _ in range(MAX_BODY_BYTES // len(chunk) + 2):
                conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            conn.send(b"0\r\n\r\n")
        except OSError:
            pass  # the server may answer and close before the whole body is sent
        resp = conn.getresponse()
        _assert_review_error(resp.status, json.loads(resp.read()), 413, "request body over")
    finally:
        conn.close()

    deep = b"[" * 100_000 + b"]" * 100_000
    _assert_review_error(*webhook.request("POST", "/validate", deep), 400, "nests JSON too deeply")
    deep_object = b'{"apiVersion": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001
    _assert_review_error(*webhook.request("POST", "/mutate", deep_object), 400, "too deeply")
    _assert_review_error(*webhook.request("POST", "/validate", b"\xff\xfe"), 400, "not valid JSON")
    _assert_review_error(*webhook.request("POST", "/elsewhere", b"{}"), 404, "")
    assert webhook.review("/validate", admission_review(VALID))["allowed"] is True


def test_a_bug_is_a_json_500_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(Settings(), Snapshot.from_objects([]))

    @app.get("/boom")
    def boom() -> str:
        raise RuntimeError("secret detail")

    client: FlaskClient = app.test_client()
    with caplog.at_level(logging.ERROR, logger="webhook"):
        resp = client.get("/boom")
    _assert_review_error(resp.status_code, resp.get_json(), 500, "internal error")
    assert "secret detail" not in resp.get_data(as_text=True)
    assert "secret detail" in caplog.text  # the operator's log has it


# --- CIDR settings ------------------------------------------------------------------------------


def test_malformed_cidrs_are_refused_naming_the_variable() -> None:
    for variable in ("STUNNER_WEBHOOK_POD_CIDRS", "STUNNER_WEBHOOK_SERVICE_CIDRS"):
        with pytest.raises(ValueError, match=f"{variable}: '10.244.0.0/33' is not a CIDR"):
            settings_from_env({variable: "10.96.0.0/12, 10.244.0.0/33"})
    with pytest.raises(ValueError, match="STUNNER_WEBHOOK_NODE_PORT_RANGE"):
        settings_from_env({"STUNNER_WEBHOOK_NODE_PORT_RANGE": "32767-30000"})
    settings = settings_from_env({"STUNNER_WEBHOOK_POD_CIDRS": " 10.244.1.7/16 ,fd00::/64"})
    assert settings.pod_cidrs == ("10.244.0.0/16", "fd00::/64")


def test_gunicorn_exits_on_a_malformed_cidr(tmp_path: Path, kubeconfig: Path) -> None:
    server = Webhook(tmp_path, kubeconfig, env={"STUNNER_WEBHOOK_POD_CIDRS": "10.244.0.0/33"})
    proc = server.spawn()
    try:
        assert proc.wait(30) != 0
    finally:
        server.stop()
    log = server.log()
    assert "STUNNER_WEBHOOK_POD_CIDRS: '10.244.0.0/33' is not a CIDR" in log
    assert "Traceback" not in log and "Listening at" not in log, log


def test_cidrs_are_discovered_from_the_api(fake: FakeApiServer) -> None:
    fake.seed(service_cidr("kubernetes", "10.96.0.0/12", "fd00:10:96::/112"))
    fake.seed(node("a", "10.244.0.0/24", "fd00:10:244::/64"))
    fake.seed(node("b", "10.244.1.0/24"))
    fake.seed(node("c"))  # no pod CIDR allocated
    api_client = fake.api_client()
    try:
        found = discover_cluster_networks(api_client, timeout=1)
    finally:
        api_client.close()
    assert found == ClusterNetworks(
        pod_cidrs=("10.244.0.0/24", "fd00:10:244::/64", "10.244.1.0/24"),
        service_cidrs=("10.96.0.0/12", "fd00:10:96::/112"),
        problems=(),
    )
    fake.fail_status = 403
    api_client = fake.api_client()
    try:
        denied = discover_cluster_networks(api_client, timeout=1)
    finally:
        api_client.close()
    assert denied.pod_cidrs == denied.service_cidrs == ()
    assert denied.pod_missing == "cannot read the Nodes from the Kubernetes API: HTTP 403 Forbidden"
    assert denied.problems == (
        "cannot read the ServiceCIDRs from the Kubernetes API: HTTP 403 Forbidden",
        "cannot read the Nodes from the Kubernetes API: HTTP 403 Forbidden",
    )


def test_nodes_without_pod_cidrs_leave_a_stated_gap(
    tmp_path: Path, kubeconfig: Path, fake: FakeApiServer
) -> None:
    """Nodes with no spec.podCIDRs (issue 19's cluster): the webhook does not guess the pod
    network. A StaticService it cannot judge is admitted with a warning in the AdmissionReview
    (kubectl prints it) naming the missing fact and the setting; the service network, known,
    is still enforced. With the setting, the same StaticService is refused."""
    fake.seed(service_cidr("kubernetes", "10.96.0.0/12"))
    fake.seed(node("a"))
    (tmp_path / "unset").mkdir()
    (tmp_path / "set").mkdir()
    with Webhook(tmp_path / "unset", kubeconfig, workers=1) as server:
        admitted = server.review("/validate", admission_review(static_service("10.244.0.0/16")))
        assert admitted["allowed"] is True
        assert admitted["warnings"] == [
            "spec.prefixes: not checked against the cluster's pod network: it is unknown (no "
            "Node has spec.podCIDRs); set STUNNER_WEBHOOK_POD_CIDRS (the chart's "
            "webhook.podCIDRs) to the pod CIDRs"
        ]
        refused = server.review("/validate", admission_review(static_service("10.96.0.10/32")))
        assert "overlaps the service network 10.96.0.0/12" in refused["status"]["message"]
        gone = static_service("10.244.0.0/16")
        deleted = admission_review(gone, operation="DELETE", old=gone)
        assert "warnings" not in server.review("/validate", deleted)
    assert "no pod CIDRs, so a StaticService may reach the pod network" in server.log()
    given = {"STUNNER_WEBHOOK_POD_CIDRS": "10.244.0.0/16"}
    with Webhook(tmp_path / "set", kubeconfig, env=given, workers=1) as server:
        refused = server.review("/validate", admission_review(static_service("10.244.0.0/16")))
        assert refused["allowed"] is False and "warnings" not in refused
        assert "overlaps the pod network 10.244.0.0/16" in refused["status"]["message"]


def test_the_environment_wins_and_the_log_says_where_cidrs_came_from(
    caplog: pytest.LogCaptureFixture,
) -> None:
    found = ClusterNetworks(("10.244.0.0/24",), ("10.96.0.0/12",), ())
    calls = []

    def discover() -> ClusterNetworks:
        calls.append(1)
        return found

    given = settings_from_env({"STUNNER_WEBHOOK_SERVICE_CIDRS": "10.100.0.0/16"})
    with caplog.at_level(logging.INFO, logger="webhook"):
        settings = with_cluster_networks(given, discover)
    assert settings.pod_cidrs == ("10.244.0.0/24",)
    assert settings.service_cidrs == ("10.100.0.0/16",)
    assert "guarding pod CIDRs 10.244.0.0/24 (from Nodes' spec.podCIDRs)" in caplog.text
    assert (
        "guarding service CIDRs 10.100.0.0/16 (from STUNNER_WEBHOOK_SERVICE_CIDRS)" in caplog.text
    )
    assert "WARNING" not in caplog.text

    both = settings_from_env(
        {"STUNNER_WEBHOOK_POD_CIDRS": "10.1.0.0/16", "STUNNER_WEBHOOK_SERVICE_CIDRS": "10.2.0.0/16"}
    )
    assert with_cluster_networks(both, discover) == both
    assert len(calls) == 1  # nothing unset: the API is not asked

    caplog.clear()
    nothing = ClusterNetworks((), (), ("cannot read the Nodes from the Kubernetes API: HTTP 403",))
    with caplog.at_level(logging.INFO, logger="webhook"):
        off = with_cluster_networks(Settings(), lambda: nothing)
    assert off.pod_cidrs == off.service_cidrs == ()
    assert "the StaticService backdoor check is off" in caplog.text
    assert "cannot read the Nodes from the Kubernetes API: HTTP 403" in caplog.text


def test_gunicorn_guards_the_discovered_cidrs(
    tmp_path: Path, kubeconfig: Path, fake: FakeApiServer
) -> None:
    fake.seed(service_cidr("kubernetes", "10.96.0.0/12"))
    fake.seed(node("a", "10.244.0.0/24"))
    with Webhook(tmp_path, kubeconfig, workers=1) as server:
        refused = server.review("/validate", admission_review(static_service("10.96.0.10/32")))
        assert refused["allowed"] is False
        assert "overlaps the service network 10.96.0.0/12" in refused["status"]["message"]
        refused = server.review("/validate", admission_review(static_service("10.244.0.0/16")))
        assert "overlaps the pod network 10.244.0.0/24" in refused["status"]["message"]
        assert server.review("/validate", admission_review(static_service("192.0.2.0/24")))[
            "allowed"
        ]
    log = server.log()
    assert "guarding pod CIDRs 10.244.0.0/24 (from Nodes' spec.podCIDRs)" in log
    assert "guarding service CIDRs 10.96.0.0/12 (from ServiceCIDR objects)" in log


def test_the_flask_client_gets_json_errors_too() -> None:
    client = create_app(Settings(), Snapshot.from_objects([])).test_client()
    resp = client.post("/validate", data=b"[" * 100_000, content_type="application/json")
    _assert_review_error(resp.status_code, resp.get_json(), 400, "too deeply")
    resp = client.post("/validate", data=b"x" * (MAX_BODY_BYTES + 1))
    _assert_review_error(resp.status_code, resp.get_json(), 413, "request body over")
    resp = client.get("/validate")
    _assert_review_error(resp.status_code, resp.get_json(), 405, "")
    assert client.post("/validate", json=admission_review(VALID)).status_code == 200


def test_the_gunicorn_master_imports_no_kubernetes_client() -> None:
    """The worker class and the app package load in the master, before gevent patches ssl:
    urllib3 imported there would keep the blocking ssl classes for every API call."""
    probe = (
        "import sys, webhook.serving; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'kubernetes', 'urllib3'}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_slow_api_server_does_not_hold_the_other_reviews(
    tmp_path: Path, kubeconfig: Path, fake: FakeApiServer
) -> None:
    """One worker: while a review waits on the API server, another review is answered, because
    the kubernetes client's socket yields to the other connections (gevent)."""
    fake.seed(secret("auth", type="static", username="u", password="p"))
    reads_the_api = gateway_config(realm="stunner.l7mp.io", authRef={"name": "auth"})
    with Webhook(tmp_path, kubeconfig, workers=1) as server:
        fake.delay = 1.5  # under the webhook's 2 s lookup timeout
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(server.review, "/validate", admission_review(reads_the_api))
            time.sleep(0.3)  # the slow review is waiting on the API server now
            started = time.monotonic()
            assert server.review("/validate", admission_review(VALID))["allowed"] is True
            assert time.monotonic() - started < 0.8
            assert not slow.done()
            assert slow.result(timeout=10)["allowed"] is True


@pytest.mark.parametrize("path", ["/validate", "/mutate"])
def test_an_object_nested_too_deeply_is_refused_with_its_uid(path: str) -> None:
    """Parseable JSON nested deeper than any Kubernetes object: a 400 refusal the apiserver
    shows the user (uid echoed), before a rule or the defaulter recurses into it."""
    client = create_app(Settings(), Snapshot.from_objects([])).test_client()
    for depth in (150, 900):
        obj = gateway_config(realm="stunner.l7mp.io")
        obj["spec"]["realm"] = json.loads("[" * depth + "]" * depth)
        body = admission_review(obj)
        resp = client.post(path, json=body)
        assert resp.status_code == 200
        answer = resp.get_json()["response"]
        assert answer["uid"] == body["request"]["uid"] and answer["allowed"] is False
        assert answer["status"]["code"] == 400
        assert "deeper than 100 levels" in answer["status"]["message"]
    obj = gateway_config(realm="stunner.l7mp.io", userName="u", password="p")
    obj["metadata"]["labels"] = {"a": "b"}
    assert client.post(path, json=admission_review(obj)).get_json()["response"]["allowed"]


def test_large_bodies_are_read_a_few_at_a_time(tmp_path: Path, kubeconfig: Path) -> None:
    """One worker, LARGE_BODY_SLOTS connections trickling large bodies: another large review
    waits LARGE_BODY_WAIT and gets 503, small reviews are answered meanwhile, and once the
    trickling ones are cut (the request deadline, 3 s here) a large review goes through."""
    large = gateway_config(realm="stunner.l7mp.io", userName="u", password="p")
    large["metadata"]["annotations"] = {"example.com/pad": "x" * (SMALL_BODY_BYTES * 2)}
    with Webhook(tmp_path, kubeconfig, workers=1, args=["--timeout", "3"]) as server:
        hostile = Hostile(server.port, server.context, interval=0.1)
        hostile.open(body=LARGE_BODY_SLOTS)
        try:
            time.sleep(0.5)  # each holds a slot, reading its body
            started = time.monotonic()
            status, body = server.request(
                "POST", "/validate", json.dumps(admission_review(large)).encode()
            )
            assert time.monotonic() - started < LARGE_BODY_WAIT + 1.5
            _assert_review_error(status, body, 503, "are being read: retry")
            started = time.monotonic()
            assert server.review("/validate", admission_review(VALID))["allowed"] is True
            assert time.monotonic() - started < 1.0
            deadline = time.monotonic() + 6
            while hostile.open_count and time.monotonic() < deadline:
                time.sleep(0.1)
            assert hostile.open_count == 0
        finally:
            hostile.close()
        assert server.review("/validate", admission_review(large))["allowed"] is True
