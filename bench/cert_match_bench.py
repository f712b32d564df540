"""Cost of checking a Gateway's TLS certificateRef in the admission rules (issue 10, fault 6).

    .venv/bin/python bench/cert_match_bench.py [--runs 300] [--bits 2048]

In process (no HTTP): `validate()` of a Gateway with one TURN-TLS listener whose Secret holds an
RSA certificate and key, read through an in-memory Lookup; and, for the anchor, the same
certificate/key load with cryptography's RSA private-number consistency check (what every
review paid before). Prints p50/p99 in ms per case and the ratio of the p50s. A benchmark, not
a test: nothing here asserts timing.
"""

from __future__ import annotations

import argparse
import base64
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cryptography.hazmat.primitives.asymmetric import rsa  # noqa: E402

from stunner_api.certs import load_pair  # noqa: E402
from stunner_api.rules import Settings, validate  # noqa: E402
from tests.support.pki import key_pem, self_signed  # noqa: E402


class Cluster:
    def __init__(self, secret: dict[str, Any]) -> None:
        self._secret = secret

    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._secret

    def gateway_class(self, name: str) -> dict[str, Any] | None:
        return {"spec": {"controllerName": Settings().controller_name}}

    def gateway(self, namespace: str, name: str) -> dict[str, Any] | None:
        return {"spec": {"gatewayClassName": "stunner-gatewayclass"}}

    def reference_grants(self, namespace: str) -> list[dict[str, Any]]:
        return []

    def gateways(self) -> list[dict[str, Any]]:
        return []

    def gateway_config(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def dataplane(self, name: str) -> dict[str, Any] | None:
        return None

    def may_read_secret(self, namespace: str, name: str) -> bool:
        return False


def percentiles(run: Callable[[], object], runs: int) -> tuple[float, float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        samples.append((time.perf_counter() - start) * 1000)
    cuts = statistics.quantiles(samples, n=100)
    return cuts[49], cuts[98]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--bits", type=int, default=2048)
    args = parser.parse_args()
    key = rsa.generate_private_key(public_exponent=65537, key_size=args.bits)
    cert, pem = self_signed(key), key_pem(key)
    secret = {
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": base64.b64encode(cert).decode(),
            "tls.key": base64.b64encode(pem).decode(),
        },
    }
    tls = {"certificateRefs": [{"name": "tls"}]}
    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "gw", "namespace": "stunner"},
        "spec": {
            "gatewayClassName": "stunner",
            "listeners": [{"name": "tls", "port": 443, "protocol": "TURN-TLS", "tls": tls}],
        },
    }
    lookup, settings = Cluster(secret), Settings()
    assert validate(gateway, None, "CREATE", lookup, settings).allowed
    cases = {
        "validate(TLS Gateway)": lambda: validate(gateway, None, "CREATE", lookup, settings),
        "load_pair, public-key match only": lambda: load_pair(cert, pem, False),
        "load_pair + RSA consistency check (before)": lambda: load_pair(cert, pem, True),
    }
    results = {name: percentiles(run, args.runs) for name, run in cases.items()}
    print(f"RSA-{args.bits}, {args.runs} runs each")  # noqa: T201
    for name, (p50, p99) in results.items():
        print(f"  {name:45s} p50 {p50:7.3f} ms   p99 {p99:7.3f} ms")  # noqa: T201
    before = results["load_pair + RSA consistency check (before)"][0]
    now = results["validate(TLS Gateway)"][0]
    print(f"  whole TLS Gateway validation vs the old key check alone: {now / before:.3f}x")  # noqa: T201


if __name__ == "__main__":
    main()
