"""Cost of the host-network port clash rule at admission (issue 23): the webhook app (Flask test
client, no TLS) judging a Gateway whose lookups go to the fake API server through the official
client, as in a cluster.

    .venv/bin/python bench/host_ports_bench.py [--others 50] [--runs 300]

Cases: a Gateway whose pods have their own network (the rule asks for its class, GatewayConfig
and Dataplane), and a host-network Gateway beside `--others` other host-network Gateways (the
rule also lists every Gateway); each with the rule table as it is and without the host-network
rules. Prints p50/p99 in ms. A benchmark, not a test: nothing here asserts timing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stunner_api.rules import RULES, Settings  # noqa: E402
from stunner_api.rules import gateway as rules  # noqa: E402
from tests.support.fakeapi import FakeApiServer  # noqa: E402
from tests.webhook.conftest import admission_review  # noqa: E402
from tests.webhook.test_host_ports import gateway, seed_world  # noqa: E402
from webhook import create_app  # noqa: E402
from webhook.kube import KubeLookup  # noqa: E402


def measure(client: Any, review: dict[str, Any], runs: int) -> tuple[float, float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        answer = client.post("/validate", json=review)
        samples.append((time.perf_counter() - start) * 1000)
        assert answer.status_code == 200
    cuts = statistics.quantiles(samples, n=100)
    return cuts[49], cuts[98]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--others", type=int, default=50)
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    with FakeApiServer() as fake:
        seed_world(fake)
        for i in range(args.others):
            fake.seed(gateway(f"g{i}", "media", "host", ("UDP", 4000 + i)))
        lookup = KubeLookup(fake.api_client(), timeout=2.0)
        client = create_app(Settings(), lookup).test_client()
        cases = {
            "own-network Gateway": admission_review(gateway("x", "stunner", "pods", ("UDP", 1))),
            f"host-network Gateway, {args.others + 1} others": admission_review(
                gateway("x", "stunner", "host", ("UDP", 3479))
            ),
        }
        new = (rules.gateway_host_ports, rules.gateway_relay_address_discovery)
        table = list(RULES["Gateway"])
        for label, rule_set in (("with", table), ("without", [r for r in table if r not in new])):
            RULES["Gateway"] = rule_set
            for case, review in cases.items():
                p50, p99 = measure(client, review, args.runs)
                line = f"{case}, {label} the host-network rules: p50 {p50:.2f} ms, p99 {p99:.2f} ms"
                print(line)  # noqa: T201
        RULES["Gateway"] = table
        lookup.close()


if __name__ == "__main__":
    main()
