"""Cluster mode with Gateway API's TCPRoute, whose CRD (experimental channel) the chart does not
ship, against the fake API server.

We test these aspects:
- Without the CRD the reconciler runs and renders; that TCPRoute is not served is logged once,
  however often it looks again.
- Once the CRD is served (the fake registers the kind, as applying tests/data/crds/tcproutes.yaml
  would), a TCPRoute is found without a restart: its cluster of protocol TCP reaches the config
  of its Gateway's TURN-TCP listener, and its status is written (Accepted, ResolvedRefs).
- A TCPRoute naming the TURN-UDP listener is not accepted there: NotAllowedByListeners, saying
  why.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from tests.reconciler import clusterkit as k
from tests.support.fakeapi import CORE_TYPES, GATEWAY_TYPES, TCP_ROUTE_TYPES, FakeApiServer

TCP_API = "gateway.networking.k8s.io/v1alpha2"


def tcp_route(name: str, section: str) -> dict[str, Any]:
    return {
        "apiVersion": TCP_API,
        "kind": "TCPRoute",
        "metadata": {"name": name, "namespace": k.NS},
        "spec": {
            "parentRefs": [{"name": "gw", "sectionName": section}],
            "rules": [
                {
                    "backendRefs": [
                        {
                            "group": "stunner.l7mp.io",
                            "kind": "StaticService",
                            "name": "peer",
                            "port": 5432,
                        }
                    ]
                }
            ],
        },
    }


def conditions(fake: FakeApiServer, name: str) -> dict[str, tuple[str, str, str]]:
    route = k.get(fake, TCP_API, "TCPRoute", name) or {}
    parents = (route.get("status") or {}).get("parents") or [{}]
    return {
        c["type"]: (c["status"], c["reason"], c["message"])
        for c in parents[0].get("conditions") or []
    }


def test_tcproute_is_watched_once_served(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="stunner.kube")
    tcp_gateway = k.gateway(k.listener(), k.listener("tcp", 3479, "TURN-TCP"))

    async def main() -> None:
        with FakeApiServer(CORE_TYPES + GATEWAY_TYPES) as fake:
            k.world(fake)
            k.update(fake, k.GW, "Gateway", "gw", lambda gw: gw.update(spec=tcp_gateway["spec"]))
            async with k.reconciler(fake, tmp_path, not_served_retry=0.1) as running:
                await k.settled(running, fake)
                looks = lambda: sum(  # noqa: E731
                    1 for method, path in list(fake.requests) if "/tcproutes" in path
                )
                await k.eventually(lambda: looks() >= 4, what="TCPRoute looked for again")
                said = [r for r in caplog.records if "TCPRoute" in r.getMessage()]
                assert [r.levelno for r in said] == [logging.INFO], [r.getMessage() for r in said]
                assert "is not served (versions v1alpha2)" in said[0].getMessage()
                config = running.mode.store.configs["stunner/gw"]
                assert [c.protocol for c in config.clusters] == ["UDP"]

                for rt in TCP_ROUTE_TYPES:
                    fake.register(rt)
                fake.seed(tcp_route("db", "tcp"))
                fake.seed(tcp_route("on-udp", "udp"))

                def tcp_cluster() -> Any:
                    config = running.mode.store.configs["stunner/gw"]
                    return config.cluster("tcp:stunner/db")

                await k.eventually(tcp_cluster, what="the TCPRoute's cluster rendered")
                await k.eventually(lambda: conditions(fake, "db"), what="the TCPRoute's status")
                await k.eventually(lambda: conditions(fake, "on-udp"), what="on-udp's status")

                config = running.mode.store.configs["stunner/gw"]
                cluster = config.cluster("tcp:stunner/db")
                assert cluster is not None and cluster.protocol == "TCP"
                assert cluster.endpoints == ["10.0.0.1/32:<5432-5432>"]
                routes = {lst.protocol: lst.routes for lst in config.listeners}
                # The UDPRoute names no section: both listeners carry it.
                tcp = ["stunner/route", "tcp:stunner/db"]
                assert routes == {"TURN-UDP": ["stunner/route"], "TURN-TCP": tcp}
                assert config.cluster("tcp:stunner/on-udp") is None
                accepted = conditions(fake, "db")
                assert accepted["Accepted"][:2] == ("True", "Accepted")
                assert accepted["ResolvedRefs"][:2] == ("True", "ResolvedRefs")
                refused = conditions(fake, "on-udp")["Accepted"]
                assert refused[:2] == ("False", "NotAllowedByListeners")
                assert "a TURN-UDP listener carries no TCP allocations" in refused[2]
                assert any("watching TCPRoute" in r.getMessage() for r in caplog.records)

    asyncio.run(asyncio.wait_for(main(), 60))
