"""Admission latency of the STUNner webhook: real gunicorn, real TLS, real AdmissionReview bodies.

    .venv/bin/python bench/admission_bench.py [--requests 500] [--concurrency 4] [--workers 2]

Starts the fake Kubernetes API server of the tests (the webhook reads Secrets and GatewayClasses
through the official client), gunicorn with `webhook/gunicorn.conf.py` over TLS, and sends
AdmissionReview v1 requests over keep-alive HTTPS connections: a valid GatewayConfig, an invalid
one, one whose authRef Secret is read from the API, a mutate, and a Gateway with a TURN-TLS
listener whose certificateRef is a kubernetes.io/tls Secret with an RSA-2048 key (the webhook
reads the GatewayClass and the Secret and checks that certificate and key match). Prints the
latency percentiles per case and the request rate. A benchmark, not a test: nothing here asserts
timing. Target (issue 10): the TLS Gateway's p99 <= 20 ms at 2 workers.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import ssl
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.fakeapi import FakeApiServer  # noqa: E402
from tests.support.objects import gateway_class, secret  # noqa: E402
from tests.webhook.conftest import admission_review  # noqa: E402
from tests.webhook.serving import Webhook, tls_secret  # noqa: E402


def gateway_config(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "GatewayConfig",
        "metadata": {"name": "bench", "namespace": "stunner", "uid": str(uuid.uuid4())},
        "spec": spec,
    }


def tls_gateway() -> dict[str, Any]:
    ref = {"kind": "Secret", "namespace": "stunner", "name": "turn-tls"}
    listener = {
        "name": "tls",
        "port": 443,
        "protocol": "TURN-TLS",
        "tls": {"certificateRefs": [ref]},
    }
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "bench", "namespace": "stunner"},
        "spec": {"gatewayClassName": "stunner-gatewayclass", "listeners": [listener]},
    }


def body(obj: dict[str, Any]) -> bytes:
    return json.dumps(admission_review(obj)).encode()


CASES: dict[str, tuple[str, bytes]] = {
    "validate, valid": (
        "/validate",
        body(
            gateway_config(realm="stunner.l7mp.io", authType="static", userName="u", password="p")
        ),
    ),
    "validate, invalid": (
        "/validate",
        body(gateway_config(realm="Not A Realm!", authType="bogus")),
    ),
    "validate, authRef Secret read": (
        "/validate",
        body(
            gateway_config(
                realm="stunner.l7mp.io", authRef={"name": "auth", "namespace": "stunner"}
            )
        ),
    ),
    "mutate": ("/mutate", body(gateway_config(userName="u", password="p"))),
    "validate, Gateway with a TLS certificateRef": ("/validate", body(tls_gateway())),
}


def seed(api: FakeApiServer) -> None:
    api.seed(secret("auth", type="static", username="u", password="p"))
    api.seed(tls_secret("turn-tls", "stunner"))
    api.seed(gateway_class("stunner-gatewayclass"))


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
        seed(api)
        directory = Path(tmp)
        kubeconfig = api.write_kubeconfig(directory / "kubeconfig")
        server = Webhook(directory, kubeconfig, workers=args.workers)
        # The checks below need no CIDRs: say so, so that the start-up does not ask the API.
        server.env["STUNNER_WEBHOOK_POD_CIDRS"] = "10.244.0.0/16"
        server.env["STUNNER_WEBHOOK_SERVICE_CIDRS"] = "10.96.0.0/12"
        with server:
            port, context = server.port, server.context
            for name, (path, payload) in CASES.items():  # each case answers as meant
                answer = server.review(path, json.loads(payload))
                if answer["allowed"] == ("invalid" in name):
                    raise RuntimeError(f"{name}: unexpected answer {answer}")
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
                q = statistics.quantiles(latencies, n=100, method="inclusive")
                lines.append(
                    f"| {name} | {q[49]:.2f} | {q[89]:.2f} | {q[98]:.2f} | "
                    f"{latencies[-1]:.2f} | {len(latencies) / elapsed:.0f} |"
                )
            sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
