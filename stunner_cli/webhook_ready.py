"""`stunner webhook-ready`: wait until STUNner's admission webhook judges requests the way a
user's `kubectl apply` reaches it, through the API server and the webhook's Service (the chart's
post-install and post-upgrade hook, as cert-manager's startupapicheck is cert-manager's).

Right after `helm install` the webhook's pod can be Ready while the API server cannot reach it
yet (kube-proxy has not programmed its Service, cert-manager has not injected the CA): every
apply is then refused with `failed calling webhook`. This asks the API server to create, as a
dry run (nothing is stored), a GatewayConfig that only the webhook refuses (static
authentication without a user name): the webhook's refusal is the proof that it answers. An
admitted probe means the webhook does not judge it yet (not registered, or failurePolicy Ignore
while it is down): waited for as well.

`judge` is the pure core: one answer of the API server to a verdict."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

from stunner_cli.output import FAILED, OK, err, out

PROBE_NAME = "stunner-webhook-ready-probe"
DENIED = "denied the request"
WAIT, READY, GIVE_UP = "wait", "ready", "give up"


def probe(namespace: str) -> dict[str, Any]:
    """The GatewayConfig the CRD's schema accepts and only the webhook refuses."""
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "GatewayConfig",
        "metadata": {"name": PROBE_NAME, "namespace": namespace},
        "spec": {"authType": "static"},
    }


@dataclass(frozen=True)
class Verdict:
    outcome: str  # WAIT, READY or GIVE_UP
    why: str


def judge(status: int, message: str) -> Verdict:
    """What one answer to the dry-run create says about the webhook."""
    if status in (200, 201):
        return Verdict(
            WAIT,
            "the API server admitted a GatewayConfig the webhook refuses: the webhook does not "
            "judge it yet (not registered, or failurePolicy Ignore while it is down)",
        )
    if DENIED in message:
        return Verdict(READY, message)
    if status in (401, 403):
        return Verdict(
            GIVE_UP,
            f"HTTP {status}: {message} (the hook's ServiceAccount needs `create` on "
            "gatewayconfigs.stunner.l7mp.io in its namespace)",
        )
    if status in (400, 422):
        return Verdict(GIVE_UP, f"HTTP {status}: the API server refused the probe: {message}")
    # 0 (API server unreachable), 404 (the CRD not served yet), 5xx (failed calling webhook).
    return Verdict(WAIT, f"HTTP {status}: {message}" if status else message)


def run_webhook_ready(args: argparse.Namespace) -> int:
    from stunner_cli.kube import Kube

    client = Kube.connect(args.kubeconfig, args.kube_context)
    started = time.monotonic()
    deadline = started + args.timeout
    last = ""
    attempts = 0
    try:
        while True:
            attempts += 1
            verdict = judge(*client.dry_run_create(args.namespace, probe(args.namespace)))
            seconds = time.monotonic() - started
            if verdict.outcome == READY:
                out(
                    f"the webhook judges requests through the API server (after {seconds:.1f} s, "
                    f"{attempts} attempts): {verdict.why}"
                )
                return OK
            if verdict.outcome == GIVE_UP:
                err(f"webhook-ready: {verdict.why}")
                return FAILED
            if verdict.why != last:
                err(f"webhook-ready: waiting ({seconds:.1f} s): {verdict.why}")
                last = verdict.why
            if time.monotonic() + args.interval > deadline:
                err(
                    f"webhook-ready: the webhook did not answer within {args.timeout:g} s "
                    f"({attempts} attempts); last: {verdict.why}"
                )
                return FAILED
            time.sleep(args.interval)
    finally:
        client.close()
