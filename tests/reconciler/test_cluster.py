"""Cluster mode against the fake API server, through the official client unchanged.

Every kind of write: create (Service, Deployment), update (Service, Deployment), delete
(an invalid Gateway's objects, `disable-managed-dataplane`), status (GatewayClass, Gateway,
UDPRoute); the garbage collector's part when a Gateway goes; the second pass that writes nothing;
what others set on our objects kept; rolls only on Dataplane edits; conditions' transition times;
the event filter (an unrelated Secret renders nothing).
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

from reconciler.apply import MAX_CONDITIONS
from tests.reconciler import clusterkit as k
from tests.support.fakeapi import FakeApiServer

GW = "gateway.networking.k8s.io/v1"


def deployment(fake: FakeApiServer, name: str = "gw") -> dict[str, Any] | None:
    return k.get(fake, "apps/v1", "Deployment", name)


def service(fake: FakeApiServer, name: str = "gw") -> dict[str, Any] | None:
    return k.get(fake, "v1", "Service", name)


def gateway_status(fake: FakeApiServer, name: str = "gw") -> dict[str, Any]:
    obj = k.get(fake, GW, "Gateway", name)
    assert obj is not None
    return dict(obj.get("status") or {})


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions") or [] if c["type"] == type_)


def test_first_pass_writes_everything_and_a_second_pass_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                writes = fake.writes()  # and the Events (this fake serves none: one try)
                assert sorted(m for m, _ in k.object_writes(fake)) == [
                    *("PATCH", "PATCH", "PATCH", "POST", "POST", "POST")
                ]
                gateway = k.get(fake, GW, "Gateway", "gw")
                assert gateway is not None
                account = k.get(fake, "v1", "ServiceAccount", "gw-stunnerd")
                for obj in (deployment(fake), service(fake), account):
                    assert obj is not None
                    (owner,) = obj["metadata"]["ownerReferences"]
                    assert owner["uid"] == gateway["metadata"]["uid"] and owner["controller"]
                route = k.get(fake, "stunner.l7mp.io/v1", "UDPRoute", "route")
                assert route is not None and route["status"]["parents"][0]["conditions"]
                klass = fake.get_object(GW, "GatewayClass", "", "stunner")
                assert klass is not None
                assert condition(klass["status"], "Accepted")["status"] == "True"
                assert "stunner/gw" in running.mode.store.configs
                # A second pass over the unchanged cluster: a render, zero writes.
                renders = running.mode.reconciler.renders
                running.mode.reconciler.trigger()
                await running.rendered(renders + 1)
                await k.settled(running, fake)
                assert fake.writes() == writes

    asyncio.run(main())


def test_others_fields_on_our_objects_are_kept(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                node_port = service(fake)["spec"]["ports"][0]["nodePort"]  # type: ignore[index]

                def theirs(obj: dict[str, Any]) -> None:
                    obj["metadata"]["labels"]["team"] = "media"
                    obj["metadata"]["annotations"]["example.com/owner"] = "ops"
                    obj["spec"]["loadBalancerClass"] = "example.com/lb"

                k.update(fake, "v1", "Service", "gw", theirs)
                k.update(
                    fake,
                    "apps/v1",
                    "Deployment",
                    "gw",
                    lambda d: d["metadata"]["labels"].update({"team": "media"}),
                )
                await k.settled(running, fake)
                before = len(fake.writes())
                # A Gateway edit changes the Service (a second listener, mixed protocol).
                k.edit_gateway(
                    fake,
                    lambda g: (
                        g["spec"]["listeners"].append(k.listener("udp2", 3479)),
                        g["metadata"]
                        .setdefault("annotations", {})
                        .update({"stunner.l7mp.io/service-type": "NodePort"}),
                    ),
                )
                await k.eventually(lambda: len(service(fake)["spec"]["ports"]) == 2)  # type: ignore[index]
                await k.settled(running, fake)
                svc = service(fake)
                assert svc is not None
                assert svc["metadata"]["labels"]["team"] == "media"
                assert svc["metadata"]["annotations"]["example.com/owner"] == "ops"
                assert svc["spec"]["loadBalancerClass"] == "example.com/lb"
                assert svc["spec"]["type"] == "NodePort"
                assert svc["spec"]["ports"][0]["nodePort"] == node_port  # kept
                assert deployment(fake)["metadata"]["labels"]["team"] == "media"  # type: ignore[index]
                methods = [m for m, p in fake.writes()[before:] if "/services/" in p]
                assert methods == ["PUT"]  # one update of the Service, nothing re-created

    asyncio.run(main())


def test_deleting_a_gateway_collects_its_objects_and_zeroes_its_config(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                before = len(fake.writes())
                k.delete(fake, GW, "Gateway", "gw")
                assert deployment(fake) is None and service(fake) is None  # the GC's part
                await k.eventually(lambda: "stunner/gw" not in running.mode.store.configs)
                await k.settled(running, fake)
                # Our part is status (the route's parent is now missing), never a delete. (The
                # watches of different kinds may tell of the Service's deletion before the
                # Gateway's: a Service re-created then has a dangling owner and is collected.)
                assert not [m for m, _ in fake.writes()[before:] if m == "DELETE"]
                assert deployment(fake) is None and service(fake) is None

    asyncio.run(main())


def test_a_gateway_deleted_while_its_render_waits_gets_nothing_written_back(
    tmp_path: Path,
) -> None:
    """The render a Gateway's deletion triggers waits for the throttle (a render just ran);
    the garbage collector's deletion of its Deployment is diffed against the last plan at once,
    and that plan still holds the Gateway. Its objects are not created again (found on the real
    node: the Deployment came back and started pods the collector deleted a moment later)."""

    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path, throttle=0.8) as running:
                await k.settled(running, fake)
                k.set_peer(fake, "10.0.0.9/32")  # a render now: the next one waits 0.8 s
                await k.eventually(
                    lambda: "10.0.0.9/32" in str(running.mode.store.configs["stunner/gw"])
                )
                before = len(fake.writes())
                k.delete(fake, GW, "Gateway", "gw")  # the fake collects what it owned
                await k.eventually(lambda: "stunner/gw" not in running.mode.store.configs)
                await k.settled(running, fake)
                created = [p for m, p in fake.writes()[before:] if m == "POST"]
                assert not created, created
                assert deployment(fake) is None and service(fake) is None

    asyncio.run(main())


def test_disable_managed_dataplane_deletes_the_deployment_and_keeps_the_config(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                k.edit_gateway(
                    fake,
                    lambda g: (
                        g["metadata"]
                        .setdefault("annotations", {})
                        .update({"stunner.l7mp.io/disable-managed-dataplane": "true"})
                    ),
                )
                await k.eventually(lambda: deployment(fake) is None, what="Deployment deleted")
                await k.settled(running, fake)
                assert service(fake) is not None
                assert "stunner/gw" in running.mode.store.configs
                assert ("DELETE", "/apis/apps/v1/namespaces/stunner/deployments/gw") in (
                    fake.writes()
                )

    asyncio.run(main())


def test_an_invalid_gateway_loses_its_objects_and_says_why(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                k.delete(fake, "stunner.l7mp.io/v1", "GatewayConfig", "config")
                await k.eventually(lambda: deployment(fake) is None and service(fake) is None)
                await k.settled(running, fake)
                accepted = condition(gateway_status(fake), "Accepted")
                assert (accepted["status"], accepted["reason"]) == ("False", "Pending")
                # Its listener is no longer said to be accepted: not rendered, it is pending.
                (entry,) = gateway_status(fake)["listeners"]
                assert [(c["type"], c["status"], c["reason"]) for c in entry["conditions"]] == [
                    ("Accepted", "Unknown", "Pending")
                ]
                klass = fake.get_object(GW, "GatewayClass", "", "stunner")
                assert klass is not None
                class_accepted = condition(klass["status"], "Accepted")
                assert class_accepted["reason"] == "InvalidParameters"
                assert "No GatewayConfig found" in class_accepted["message"]
                # Fixed: the objects come back.
                fake.seed(k.gateway_config())
                await k.eventually(lambda: deployment(fake) is not None)

    asyncio.run(main())


def test_dataplane_edits_roll_the_deployment_and_gateway_edits_never_do(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                first = deployment(fake)
                assert first is not None
                before = len(fake.writes())
                k.edit_gateway(
                    fake,
                    lambda g: g["spec"]["listeners"].append(k.listener("tcp", 3478, "TURN-TCP")),
                )
                await k.eventually(
                    lambda: len(running.mode.store.configs["stunner/gw"].listeners) == 2
                )
                await k.settled(running, fake)
                assert not [p for _, p in fake.writes()[before:] if "/deployments/" in p]
                assert deployment(fake) == first  # not even touched
                k.update(
                    fake,
                    "stunner.l7mp.io/v1",
                    "Dataplane",
                    "default",
                    lambda d: d["spec"].update({"image": "l7mp/stunnerd:1.1"}),
                    ns="",
                )
                await k.eventually(
                    lambda: (
                        deployment(fake)["spec"]["template"]["spec"]["containers"][0]["image"]  # type: ignore[index]
                        == "l7mp/stunnerd:1.1"
                    )
                )
                rolled = deployment(fake)
                assert rolled is not None
                assert rolled["metadata"]["generation"] == first["metadata"]["generation"] + 1

    asyncio.run(main())


def test_status_generation_and_transition_times(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            # Another controller's conditions on the Gateway: kept, at most 8 in all.
            gateway = k.get(fake, GW, "Gateway", "gw")
            assert gateway is not None
            theirs = [
                {
                    "type": f"example.com/Other{i}",
                    "status": "True",
                    "reason": "Other",
                    "message": "not ours",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
                for i in range(8)
            ]
            rt = fake.resource_type(GW, "Gateway")
            fake.replace(rt, k.NS, "gw", {**gateway, "status": {"conditions": theirs}}, "status")
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                status = gateway_status(fake)
                types = [c["type"] for c in status["conditions"]]
                assert types[:2] == ["Accepted", "Programmed"]
                assert len(types) == MAX_CONDITIONS and types[2] == "example.com/Other0"
                programmed = condition(status, "Programmed")
                assert programmed["reason"] == "AddressNotAssigned"
                assert programmed["observedGeneration"] == 1
                accepted_time = condition(status, "Accepted")["lastTransitionTime"]
                # A spec edit: observedGeneration follows; no status flip, same time.
                await asyncio.sleep(1.1)  # a new time would differ by at least a second
                k.edit_gateway(fake, lambda g: g["spec"]["listeners"][0].update(
                    {"port": 3480}
                ))  # fmt: skip
                await k.eventually(
                    lambda: condition(gateway_status(fake), "Accepted")["observedGeneration"] == 2
                )
                assert condition(gateway_status(fake), "Accepted")["lastTransitionTime"] == (
                    accepted_time
                )
                # The load balancer gets an address: Programmed flips, its time changes.
                svc = service(fake)
                assert svc is not None
                svc["status"] = {"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}}
                fake.replace(fake.resource_type("v1", "Service"), k.NS, "gw", svc, "status")
                await k.eventually(
                    lambda: condition(gateway_status(fake), "Programmed")["status"] == "True"
                )
                status = gateway_status(fake)
                assert status["addresses"] == [{"type": "IPAddress", "value": "198.51.100.7"}]
                assert (
                    condition(status, "Programmed")["lastTransitionTime"]
                    != (programmed["lastTransitionTime"])
                )
                config = running.mode.store.configs["stunner/gw"]
                assert config.listeners[0].public_address == "198.51.100.7"

    asyncio.run(main())


def test_only_referenced_secrets_render(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            fake.seed(_secret("unrelated"))
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                renders = running.mode.reconciler.renders
                k.update(fake, "v1", "Secret", "unrelated", lambda s: s["data"].update(x="eQ=="))
                fake.seed(k.dataplane() | {"metadata": {"name": "other"}})  # not used: renders
                await k.eventually(lambda: running.mode.reconciler.renders == renders + 1)
                renders = running.mode.reconciler.renders
                k.update(fake, "v1", "Secret", "unrelated", lambda s: s["data"].update(x="eg=="))
                await asyncio.sleep(0.5)
                assert running.mode.reconciler.renders == renders
                # Now a GatewayConfig refers to it: its changes render.
                k.update(
                    fake,
                    "stunner.l7mp.io/v1",
                    "GatewayConfig",
                    "config",
                    lambda c: c["spec"].update({"authRef": {"name": "unrelated"}}),
                )
                await k.eventually(lambda: running.mode.reconciler.renders > renders)
                await k.settled(running, fake)
                renders = running.mode.reconciler.renders
                k.update(fake, "v1", "Secret", "unrelated", lambda s: s["data"].update(x="ew=="))
                await k.eventually(lambda: running.mode.reconciler.renders > renders)

    asyncio.run(main())


def _secret(name: str) -> dict[str, Any]:
    return copy.deepcopy(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": k.NS},
            "type": "Opaque",
            "data": {"x": "eA=="},
        }
    )
