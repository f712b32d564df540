"""Admission under hostile connections: do idle and trickling clients starve the webhook?

    .venv/bin/python bench/webhook_hostile_bench.py [--idle 100] [--trickling 100]
        [--requests 300] [--seconds 12] [--concurrency 4] [--workers 2]

Starts the fake Kubernetes API server of the tests and gunicorn with `webhook/gunicorn.conf.py`
over TLS on loopback, then measures AdmissionReviews (a valid GatewayConfig, each on a new TLS
connection, the way a kube-apiserver opens one when its pool is empty): `--requests` alone,
then for `--seconds` while `--idle` connections send nothing and `--trickling` ones send a byte
every 0.2 s (half a TLS ClientHello, half HTTP header lines after the handshake). Every hostile
connection the server closes (its deadlines) is replaced at once, so the webhook faces that many
all the time.
Prints p50/p90/p99/max per phase, how many hostile connections the server closed and after how
long. Target (issue 10): p99 <= 100 ms with 100 idle + 100 trickling. A benchmark: it asserts
nothing about timing.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import ssl
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.fakeapi import FakeApiServer  # noqa: E402
from tests.webhook.conftest import admission_review  # noqa: E402
from tests.webhook.serving import Hostile, Webhook  # noqa: E402

VALID = {
    "apiVersion": "stunner.l7mp.io/v1",
    "kind": "GatewayConfig",
    "metadata": {"name": "bench", "namespace": "stunner"},
    "spec": {"realm": "stunner.l7mp.io", "authType": "static", "userName": "u", "password": "p"},
}


def measure(server: Webhook, requests: int, concurrency: int) -> list[float]:
    """Milliseconds per review, each on a new connection; a failed one counts as 10 s."""
    body = json.dumps(admission_review(VALID)).encode()
    headers = {"Content-Type": "application/json"}

    def one(_: int) -> float:
        start = time.perf_counter()
        conn = server.connection(timeout=10)
        try:
            conn.request("POST", "/validate", body, headers)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                return 10_000.0
        except OSError:
            return 10_000.0
        finally:
            conn.close()
        return (time.perf_counter() - start) * 1000

    with ThreadPoolExecutor(concurrency) as pool:
        return sorted(pool.map(one, range(requests)))


def attack(port: int, cafile: str, kinds: dict[str, int], stop: Any, results: Any) -> None:
    """The hostile connections, kept (and replaced when closed) until ``stop`` is set; puts
    (opened, closing times, still open) on ``results``."""
    hostile = Hostile(port, ssl.create_default_context(cafile=cafile), interval=0.2, reopen=True)
    try:
        hostile.open(**kinds)
        stop.wait()
        still_open = hostile.open_count
    finally:
        hostile.close()
    results.put((hostile.opened, hostile.closed_after(), still_open))


def row(name: str, latencies: list[float]) -> str:
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return f"| {name} | {q[49]:.2f} | {q[89]:.2f} | {q[98]:.2f} | {latencies[-1]:.2f} |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--idle", type=int, default=100, help="connections that send nothing")
    parser.add_argument("--trickling", type=int, default=100, help="connections sending a byte")
    parser.add_argument("--requests", type=int, default=300, help="reviews alone")
    parser.add_argument(
        "--seconds", type=float, default=12, help="attack phase (past the 5 s deadlines)"
    )
    parser.add_argument("--concurrency", type=int, default=4, help="parallel reviews")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="hostile-bench-") as tmp, FakeApiServer() as api:
        directory = Path(tmp)
        server = Webhook(
            directory, api.write_kubeconfig(directory / "kubeconfig"), workers=args.workers
        )
        server.env["STUNNER_WEBHOOK_POD_CIDRS"] = "10.244.0.0/16"
        server.env["STUNNER_WEBHOOK_SERVICE_CIDRS"] = "10.96.0.0/12"
        with server:
            measure(server, 20, args.concurrency)  # warm up
            alone = measure(server, args.requests, args.concurrency)
            # The attackers run in a process of their own: not competing for this one's GIL.
            stop, results = multiprocessing.Event(), multiprocessing.Queue()
            kinds = {"idle": args.idle, "hello": args.trickling // 2}
            kinds["head"] = args.trickling - kinds["hello"]
            attacker = multiprocessing.Process(
                target=attack, args=(server.port, str(server.ca), kinds, stop, results)
            )
            attacker.start()
            try:
                time.sleep(2.0)  # all connected, each holding what it can
                under_attack: list[float] = []
                ends = time.monotonic() + args.seconds
                while time.monotonic() < ends:
                    under_attack += measure(server, args.requests // 4, args.concurrency)
                under_attack.sort()
            finally:
                stop.set()
                opened, closed, still_open = results.get(timeout=30)
                attacker.join(10)
        lines = [
            f"admission under hostile connections: {args.idle} idle + {args.trickling} "
            f"trickling for {args.seconds:.0f} s, {len(alone)} + {len(under_attack)} reviews on "
            "new TLS connections, "
            f"{args.concurrency} in parallel, {args.workers} gunicorn workers, "
            f"load average {os.getloadavg()[0]:.2f}",
            "",
            "| phase | p50 ms | p90 ms | p99 ms | max ms |",
            "|---|---|---|---|---|",
            row("alone", alone),
            row(f"{args.idle} idle + {args.trickling} trickling", under_attack),
            "",
            f"hostile connections: {opened} opened, {len(closed)} closed by the server "
            + (
                f"(after {closed[0]:.1f}-{closed[-1]:.1f} s), "
                if closed
                else "(none closed: the attack outlasted no deadline), "
            )
            + f"{still_open} open at the end of the attack phase",
        ]
        sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
