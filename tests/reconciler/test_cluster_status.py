"""ANCHORS §2.7's status conditions, brought about through the API and read back from it.

One world holds an object for each condition below; the reconciler writes them through the
/status subresources and the test reads them from the fake API server. Render's own tables
(tests/reconciler/test_render_rules.py) cover the logic of every condition; here end to end:

    GatewayClass  Accepted True Accepted; False InvalidParameters
    Gateway       Accepted True Accepted; False Pending (invalid class)
                  Programmed True Programmed (address from spec.addresses); False
                  AddressNotAssigned; False Invalid (a Gateway not rendered)
    Listener      Accepted True Accepted; False UnsupportedProtocol; False PortUnavailable;
                  Unknown Pending (a Gateway not rendered: Go's initial listener status)
                  Conflicted False NoConflicts; True ProtocolConflict
                  ResolvedRefs True ResolvedRefs; False InvalidCertificateRef
    UDPRoute      Accepted True Accepted; False NotAllowedByListeners; False NoMatchingParent;
                  False Pending (a Gateway API UDPRoute masked by a STUNner one)
                  ResolvedRefs True ResolvedRefs; False BackendNotFound; False InvalidKind

Gateway Programmed Unknown Pending ("gateway under processing") is Go's initial status, which
Go sets in memory and overwrites in the same render before its status update; here render
computes every Gateway's final status in the pass that first sees it, and status is written only
from a finished render, so no write ever carries it. A test watches a new Gateway's status from
its creation and finds that every write already says Programmed True or False.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.watch
import pytest

from tests.reconciler import clusterkit as k
from tests.support.fakeapi import FakeApiServer

GW = k.GW
STUNNER = "stunner.l7mp.io/v1"


def _world() -> list[dict[str, Any]]:
    broken = k.gateway_class("broken")
    broken["spec"]["parametersRef"]["name"] = "missing"
    api_route = k.route(name="route") | {"apiVersion": "gateway.networking.k8s.io/v1"}
    foreign = k.route(name="foreign")
    foreign["metadata"]["namespace"] = "elsewhere"
    foreign["spec"]["parentRefs"] = [{"name": "gw", "namespace": k.NS}]
    return [
        broken,
        k.gateway(name="orphaned", gateway_class="broken"),
        k.gateway(name="addressed")
        | {
            "spec": {
                "gatewayClassName": "stunner",
                "listeners": [k.listener()],
                "addresses": [{"type": "IPAddress", "value": "203.0.113.5"}],
            }
        },  # fmt: skip
        k.gateway(k.listener("a", 3478), k.listener("b", 3478), name="conflict"),
        k.gateway(
            k.listener(
                "tls",
                443,
                "TURN-TLS",
                tls={"mode": "Terminate", "certificateRefs": [{"name": "no-such-secret"}]},
            ),
            name="tls",
        ),
        k.gateway(k.listener("web", 80, "HTTP"), name="badproto"),
        # Port 0: outside 1..65535. (A real API server's Gateway CRD schema refuses it before
        # it is stored; the fake stores what it is given, as a cluster without the schema.)
        k.gateway(k.listener("zero", 0), k.listener("udp", 3478), name="badport"),
        k.route(name="orphan", parents=("no-such-gateway",)),
        k.route({"name": "no-such-service"}, name="nobackend"),
        k.route({"group": "", "kind": "Pod", "name": "pod"}, name="badkind"),
        api_route,
        foreign,
    ]


@pytest.fixture(scope="module")
def statuses(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> status, once the reconciler has written them all."""

    async def main() -> dict[tuple[str, str], dict[str, Any]]:
        with FakeApiServer() as fake:
            k.world(fake, *_world())
            async with k.reconciler(fake, tmp_path_factory.mktemp("status")) as running:
                await k.settled(running, fake)
            found: dict[tuple[str, str], dict[str, Any]] = {}
            for api_version, kind, ns, names in (
                (GW, "GatewayClass", "", ("stunner", "broken")),
                (GW, "Gateway", k.NS, ("gw", "orphaned", "addressed", "conflict", "tls")),
                (GW, "Gateway", k.NS, ("badproto", "badport")),
                (STUNNER, "UDPRoute", k.NS, ("route", "orphan", "nobackend", "badkind")),
                (STUNNER, "UDPRoute", "elsewhere", ("foreign",)),
                (GW, "UDPRoute", k.NS, ("route",)),
            ):
                for name in names:
                    obj = fake.get_object(api_version, kind, ns, name)
                    assert obj is not None, (kind, name)
                    key = (f"{kind}.{api_version.partition('/')[0]}", name)
                    found[key] = dict(obj.get("status") or {})
            return found

    return asyncio.run(main())


def _condition(conditions: list[dict[str, Any]], type_: str) -> tuple[str, str]:
    (found,) = [c for c in conditions if c["type"] == type_]
    assert found["observedGeneration"] == 1 and found["lastTransitionTime"]
    return found["status"], found["reason"]


CLASS = "GatewayClass.gateway.networking.k8s.io"
GATEWAY = "Gateway.gateway.networking.k8s.io"
ROUTE = "UDPRoute.stunner.l7mp.io"
API_ROUTE = "UDPRoute.gateway.networking.k8s.io"


@pytest.mark.parametrize(
    ("kind", "name", "type_", "expected"),
    [
        (CLASS, "stunner", "Accepted", ("True", "Accepted")),
        (CLASS, "broken", "Accepted", ("False", "InvalidParameters")),
        (GATEWAY, "gw", "Accepted", ("True", "Accepted")),
        (GATEWAY, "orphaned", "Accepted", ("False", "Pending")),
        (GATEWAY, "addressed", "Programmed", ("True", "Programmed")),
        (GATEWAY, "gw", "Programmed", ("False", "AddressNotAssigned")),
        (GATEWAY, "orphaned", "Programmed", ("False", "Invalid")),
    ],
)
def test_class_and_gateway_conditions(
    statuses: dict[tuple[str, str], dict[str, Any]],
    kind: str,
    name: str,
    type_: str,
    expected: tuple[str, str],
) -> None:
    assert _condition(statuses[kind, name]["conditions"], type_) == expected


def test_gateway_addresses_come_from_public_address_discovery(
    statuses: dict[tuple[str, str], dict[str, Any]],
) -> None:
    assert statuses[GATEWAY, "addressed"]["addresses"] == [
        {"type": "IPAddress", "value": "203.0.113.5"}
    ]
    assert "addresses" not in statuses[GATEWAY, "gw"]


@pytest.mark.parametrize(
    ("gateway", "listener", "type_", "expected"),
    [
        ("gw", "udp", "Accepted", ("True", "Accepted")),
        ("gw", "udp", "Conflicted", ("False", "NoConflicts")),
        ("gw", "udp", "ResolvedRefs", ("True", "ResolvedRefs")),
        ("badproto", "web", "Accepted", ("False", "UnsupportedProtocol")),
        ("badport", "zero", "Accepted", ("False", "PortUnavailable")),
        ("badport", "udp", "Accepted", ("True", "Accepted")),
        ("orphaned", "udp", "Accepted", ("Unknown", "Pending")),
        ("conflict", "b", "Conflicted", ("True", "ProtocolConflict")),
        ("tls", "tls", "ResolvedRefs", ("False", "InvalidCertificateRef")),
    ],
)
def test_listener_conditions(
    statuses: dict[tuple[str, str], dict[str, Any]],
    gateway: str,
    listener: str,
    type_: str,
    expected: tuple[str, str],
) -> None:
    (entry,) = [e for e in statuses[GATEWAY, gateway]["listeners"] if e["name"] == listener]
    assert _condition(entry["conditions"], type_) == expected


@pytest.mark.parametrize(
    ("kind", "name", "type_", "expected"),
    [
        (ROUTE, "route", "Accepted", ("True", "Accepted")),
        (ROUTE, "route", "ResolvedRefs", ("True", "ResolvedRefs")),
        (ROUTE, "foreign", "Accepted", ("False", "NotAllowedByListeners")),
        (ROUTE, "orphan", "Accepted", ("False", "NoMatchingParent")),
        (ROUTE, "nobackend", "ResolvedRefs", ("False", "BackendNotFound")),
        (ROUTE, "badkind", "ResolvedRefs", ("False", "InvalidKind")),
        (API_ROUTE, "route", "Accepted", ("False", "Pending")),
    ],
)
def test_route_conditions(
    statuses: dict[tuple[str, str], dict[str, Any]],
    kind: str,
    name: str,
    type_: str,
    expected: tuple[str, str],
) -> None:
    (parent,) = statuses[kind, name]["parents"]
    assert parent["controllerName"] == k.CONTROLLER
    assert _condition(parent["conditions"], type_) == expected


def test_no_status_write_says_programmed_unknown(tmp_path: Path) -> None:
    """Every status a new Gateway is given, from the first, says Programmed True or False: the
    initial Unknown Pending is never written (see the module's docstring)."""
    seen: list[dict[str, Any]] = []

    def watch(fake: FakeApiServer, stop: threading.Event) -> None:
        client = fake.api_client()
        api = kubernetes.client.CustomObjectsApi(client)
        watcher = kubernetes.watch.Watch()
        try:
            for event in watcher.stream(
                api.list_namespaced_custom_object,
                "gateway.networking.k8s.io",
                "v1",
                k.NS,
                "gateways",
                field_selector="metadata.name=late",
                timeout_seconds=10,
            ):
                seen.append(dict(event["object"].get("status") or {}))
                if stop.is_set():
                    break
        finally:
            client.close()

    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            stop = threading.Event()
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                watching = threading.Thread(target=watch, args=(fake, stop), daemon=True)
                watching.start()
                await asyncio.sleep(0.2)  # the watch is open before the Gateway exists
                fake.seed(k.gateway(name="late"))
                await k.eventually(lambda: any(s.get("conditions") for s in seen))
                await k.settled(running, fake)
                stop.set()
            watching.join(0.1)  # a daemon thread; the fake's stop ends its stream
        written = [s for s in seen if s.get("conditions")]
        assert written, "the Gateway was given no status"
        for status in written:
            programmed = {c["type"]: c for c in status["conditions"]}["Programmed"]
            assert programmed["status"] in ("True", "False"), programmed
        (first_listener,) = written[0]["listeners"]
        assert {c["type"]: c["status"] for c in first_listener["conditions"]} == {
            "Accepted": "True",
            "Conflicted": "False",
            "ResolvedRefs": "True",
        }

    asyncio.run(main())
