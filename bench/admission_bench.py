"""Admission latency of the STUNner webhook: real gunicorn, real TLS, real AdmissionReview bodies.

    .venv/bin/python bench/admission_bench.py [--requests 500] [--concurrency 4]

Starts the fake Kubernetes API server of the tests (the webhook reads Secrets through the official
client), gunicorn with `webhook/gunicorn.conf.py` over TLS with a self-signed certificate, and
sends AdmissionReview v1 requests over keep-alive HTTPS connections: a valid GatewayConfig, an
invalid one, one whose authRef Secret is read from the API, and a mutate. Prints the latency
percentiles per case and the request rate. A benchmark, not a test: nothing here asserts timing.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stunnerd.certificates import self_signed_certificate  # noqa: E402
from tests.support.fakeapi import FakeApiServer  # noqa: E402


def gateway_config(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "GatewayConfig",
        "metadata": {"name": "bench", "namespace": "stunner", "uid": str(uuid.uuid4())},
        "spec": spec,
    }


def review(obj: dict[str, Any]) -> bytes:
    gvk = {"group": "stunner.l7mp.io", "version": "v1", "kind": "GatewayConfig"}
    gvr = {"group": "stunner.l7mp.io", "version": "v1", "resource": "gatewayconfigs"}
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": "bench",
            "namespace": "stunner",
            "operation": "CREATE",
            "userInfo": {"username": "bench"},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
        },
    }
    return json.dumps(body).encode()


CASES: dict[str, tuple[str, bytes]] = {
    "validate, valid": (
        "/validate",
        review(
            gateway_config(realm="stunner.l7mp.io", authType="static", userName="u", password="p")
        ),
    ),
    "validate, invalid": (
        "/validate",
        review(gateway_config(realm="Not A Realm!", authType="bogus")),
    ),
    "validate, authRef Secret read": (
        "/validate",
        review(
            gateway_config(
                realm="stunner.l7mp.io", authRef={"name": "auth", "namespace": "stunner"}
            )
        ),
    ),
    "mutate": ("/mutate", review(gateway_config(userName="u", password="p"))),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def run_case(port: int, context: ssl.SSLContext, path: str, body: bytes, count: int) -> list[float]:
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    latencies = []
    try:
        for _ in range(count):
            start = time.perf_counter()
            connection.request("POST", path, body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            latencies.append(time.perf_counter() - start)
            if response.status != 200:
                raise RuntimeError(f"{path}: HTTP {response.status}")
    finally:
        connection.close()
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=500, help="requests per case")
    parser.add_argument("--concurrency", type=int, default=4, help="parallel connections")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="admission-bench-") as tmp, FakeApiServer() as api:
        api.seed(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "Opaque",
                "metadata": {"name": "auth", "namespace": "stunner"},
                "data": {
                    k: base64.b64encode(v.encode()).decode()
                    for k, v in {"type": "static", "username": "u", "password": "p"}.items()
                },
            }
        )
        cert_b64, key_b64 = self_signed_certificate("127.0.0.1")
        cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        cert.write_bytes(base64.b64decode(cert_b64))
        key.write_bytes(base64.b64decode(key_b64))
        port = free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(api.write_kubeconfig(Path(tmp) / "kubeconfig")),
            "STUNNER_WEBHOOK_BIND": f"127.0.0.1:{port}",
            "STUNNER_WEBHOOK_CERTFILE": str(cert),
            "STUNNER_WEBHOOK_KEYFILE": str(key),
            "STUNNER_WEBHOOK_WORKERS": str(args.workers),
        }
        env.pop("KUBERNETES_SERVICE_HOST", None)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "-c",
                str(ROOT / "webhook" / "gunicorn.conf.py"),
                "webhook:create_app()",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        context = ssl.create_default_context(cafile=str(cert))
        context.check_hostname = False
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    run_case(port, context, "/validate", CASES["mutate"][1], 1)
                    break
                except (OSError, RuntimeError):
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError("gunicorn did not start") from None
                    time.sleep(0.2)
            load = os.getloadavg()[0]
            lines = [
                f"admission latency, {args.requests} requests per case, "
                f"{args.concurrency} connections, {args.workers} gunicorn workers, "
                f"load average {load:.2f}",
                "",
                "| case | p50 ms | p90 ms | p99 ms | max ms | requests/s |",
                "|---|---|---|---|---|---|",
            ]
            for name, (path, body) in CASES.items():
                per_connection = max(1, args.requests // args.concurrency)
                start = time.perf_counter()
                with ThreadPoolExecutor(args.concurrency) as pool:
                    futures = [
                        pool.submit(run_case, port, context, path, body, per_connection)
                        for _ in range(args.concurrency)
                    ]
                    results = [future.result() for future in futures]
                elapsed = time.perf_counter() - start
                latencies = sorted(x * 1000 for batch in results for x in batch)
                q = statistics.quantiles(latencies, n=100)
                lines.append(
                    f"| {name} | {q[49]:.2f} | {q[89]:.2f} | {q[98]:.2f} | "
                    f"{latencies[-1]:.2f} | {len(latencies) / elapsed:.0f} |"
                )
            sys.stdout.write("\n".join(lines) + "\n")
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
