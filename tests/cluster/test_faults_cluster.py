"""Faults with live calls (issue 32), once per helm major, each a phase on one release (the quick
start's images and install, the example Gateway with its UDP and TCP listener, the echo pod).

During each fault, calls run through the Gateway's LoadBalancer address (tests/cluster/calls.py:
UDP and TURN-TCP, 50 timestamped packets a second each, echoed by the echo pod), and the phase
records calls kept, packets lost, the longest gap and the time until a new call works; the
numbers go to the run's summary (`cluster phases`) and tests/cluster/README.md's fault table.

- A rollout of the Gateway's stunnerd Deployment (``kubectl rollout restart``, what a ``helm
  upgrade`` to a new image does): the calls on the old pod keep relaying until they end (0
  lost), new calls land on the new pod, and the old pod leaves once its calls have ended.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster import calls
from tests.cluster import test_quickstart_cluster as quickstart
from tests.cluster.conftest import MEASURED, Kube, wait_for
from tests.cluster.test_quickstart_cluster import (
    CREDENTIALS,
    GATEWAY,
    GATEWAY_NS,
    Release,
    echo_peer,
    images,
    pod_condition,
    release,
)

# the quick start's fixtures (a release of this module's own)
__all__ = ["echo_peer", "images", "release"]

CALL_SECONDS = 40.0
FAULT_AT = 10.0  # seconds into the calls
UDP_CALLS = 3
TCP_CALLS = 2


@pytest.fixture(scope="module")
def gateway(release: Release) -> Iterator[Release]:
    """The quick start up to a Gateway with its address: installed, the example applied, its
    stunnerd Ready, the LoadBalancer address given."""
    quickstart.test_helm_install_as_the_readme_says(release)
    quickstart.test_apply_the_example_and_its_stunnerd_becomes_ready(release)
    quickstart.test_the_gateway_gets_its_address_and_ice_prints_it(release)
    yield release


def _stunnerd_pods(kube: Kube) -> list[dict[str, Any]]:
    """The Gateway's stunnerd pods, terminating ones too."""
    items: list[dict[str, Any]] = kube.get("pods", "-n", GATEWAY_NS, "-l", "app=stunner")["items"]
    return items


def _ready(pod: dict[str, Any]) -> bool:
    return (pod_condition(pod, "Ready") or {}).get("status") == "True"


def _endpoints(kube: Kube) -> list[tuple[str, bool, bool, bool]]:
    """The Gateway Service's endpoints: (address, ready, serving, terminating)."""
    slices = kube.get(
        "endpointslices", "-n", GATEWAY_NS, "-l", f"kubernetes.io/service-name={GATEWAY}"
    )["items"]
    found = []
    for piece in slices:
        for endpoint in piece.get("endpoints") or []:
            conditions = endpoint.get("conditions", {})
            found.append(
                (
                    endpoint["addresses"][0],
                    bool(conditions.get("ready")),
                    bool(conditions.get("serving")),
                    bool(conditions.get("terminating")),
                )
            )
    return sorted(found)


def _start_calls(
    release: Release, peer: tuple[str, int], seconds: float = CALL_SECONDS
) -> list[asyncio.Task[calls.CallResult]]:
    server = (release.state["address"], 3478)
    loop = asyncio.get_running_loop()
    kinds = ["udp"] * UDP_CALLS + ["tcp"] * TCP_CALLS
    return [
        loop.create_task(calls.call(kind, server, peer, CREDENTIALS, seconds)) for kind in kinds
    ]


def _record(name: str, results: list[calls.CallResult], new_call: float | None) -> None:
    by_kind = {
        kind: calls.summary([r for r in results if r.transport == kind]) for kind in ("udp", "tcp")
    }
    first = "" if new_call is None else f"; a new call worked {new_call:.1f} s after the fault"
    MEASURED[name] = f"UDP {by_kind['udp']}; TCP {by_kind['tcp']}{first}"


# --- a rollout ------------------------------------------------------------------------------


async def _rollout_with_calls(release: Release, peer: tuple[str, int]) -> dict[str, Any]:
    kube = release.kube
    server = (release.state["address"], 3478)
    (old,) = [p for p in _stunnerd_pods(kube) if not p["metadata"].get("deletionTimestamp")]
    old_ip = old["status"]["podIP"]
    running = _start_calls(release, peer)
    await asyncio.sleep(FAULT_AT)
    fault = time.monotonic()
    await asyncio.to_thread(
        kube.ok, "rollout", "restart", f"deployment/{GATEWAY}", "-n", GATEWAY_NS
    )

    def replaced() -> dict[str, Any] | None:
        pods = _stunnerd_pods(kube)
        fresh = [p for p in pods if p["metadata"]["uid"] != old["metadata"]["uid"] and _ready(p)]
        gone = all(p["metadata"]["uid"] != old["metadata"]["uid"] or
                   p["metadata"].get("deletionTimestamp") for p in pods)  # fmt: skip
        return fresh[0] if fresh and gone else None

    new = await asyncio.to_thread(
        wait_for, "a new stunnerd pod Ready, the old one told", replaced, 60
    )
    endpoints = await asyncio.to_thread(_endpoints, kube)
    replaced_after = time.monotonic() - fault
    new_call, probe = await calls.first_working_call("udp", server, peer, CREDENTIALS, within=30)
    results = list(await asyncio.gather(*running))
    ended = time.monotonic()

    def old_gone() -> bool:
        return all(p["metadata"]["uid"] != old["metadata"]["uid"] for p in _stunnerd_pods(kube))

    try:
        await asyncio.to_thread(wait_for, "the old stunnerd pod gone", old_gone, 60)
        old_left: float | None = time.monotonic() - ended
    except AssertionError:
        old_left = None
    return {
        "old_ip": old_ip,
        "new_ip": new["status"]["podIP"],
        "endpoints": endpoints,
        "results": results,
        "probe": probe,
        "replaced_after": replaced_after,
        "new_call": new_call,
        "old_left": old_left,
    }


def test_a_rollout_keeps_live_calls_and_new_calls_land_on_the_new_pod(
    gateway: Release, echo_peer: tuple[str, int]
) -> None:
    result = asyncio.run(_rollout_with_calls(gateway, echo_peer))
    results: list[calls.CallResult] = result["results"]
    _record(f"{gateway.name}: rollout restart", results, None)
    MEASURED[f"{gateway.name}: rollout: new pod Ready"] = (
        f"{result['replaced_after']:.1f} s after the restart; a new call relayed by it "
        f"{result['new_call']:.1f} s later"
    )
    MEASURED[f"{gateway.name}: rollout: endpoints once the new pod was Ready"] = json.dumps(
        result["endpoints"]
    )
    left = result["old_left"]
    MEASURED[f"{gateway.name}: rollout: old pod left after its calls ended"] = (
        "not within 60 s" if left is None else f"{left:.1f} s"
    )
    MEASURED[f"{gateway.name}: rollout: the calls' longest gaps began"] = ", ".join(
        f"{r.transport} {r.gap_at:.1f} s" for r in results
    )
    assert all(r.relayed == result["old_ip"] for r in results), [r.relayed for r in results]
    assert result["probe"].relayed == result["new_ip"], (
        f"a new call relayed by {result['probe'].relayed}, not the new pod {result['new_ip']}"
    )
    broken = [r for r in results if not r.kept or r.lost]
    assert not broken, f"calls on the old pod hurt by the rollout: {broken}"
    assert left is not None, "the old pod stayed after its calls had ended (and deleted theirs)"
