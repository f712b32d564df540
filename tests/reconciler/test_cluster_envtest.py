"""Cluster mode against a real control plane (../shared/TESTING.md, layer 4), envtest-style.

The session's ``control_plane`` (tests/conftest.py; skipped without ``KUBEBUILDER_ASSETS``):
etcd, kube-apiserver and kube-controller-manager on 127.0.0.1 with our CRDs and Gateway API
v1.6.1's. The reconciler runs in cluster mode with leader election, as the admin user, against
the scenarios the fake API server runs (tests/reconciler/test_cluster.py, test_leader.py):

- the first pass creates the Deployment and Service, each owned by the Gateway, takes the Lease,
  and writes the GatewayClass's, Gateway's and route's conditions through /status with the
  object's generation; a second pass over the unchanged cluster writes nothing;
- labels, annotations and fields others set on the Service and Deployment are kept when a
  Gateway edit changes the Service, and the reconciler then settles (no write loop against the
  real API server's defaults);
- a Gateway edit (a listener added) reaches the config and leaves the Deployment untouched
  (same generation); a Dataplane edit (its image) rolls it (generation + 1, the new image);
- ``stunner.l7mp.io/disable-managed-dataplane`` deletes the Deployment, keeps the Service and
  the config; taking it off brings the Deployment back;
- deleting the Gateway: kube-controller-manager's garbage collector deletes its Deployment and
  Service (the reconciler deletes nothing itself).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any

import pytest

from reconciler.cluster import Running, run_cluster
from tests.envtest.controlplane import ControlPlane
from tests.reconciler import clusterkit as k

pytestmark = pytest.mark.envtest

IDENTITY = "envtest-reconciler"
LEASE = "envtest-leader"


def get(plane: ControlPlane, kind: str, name: str, namespace: str = k.NS) -> Any:
    """The object as the API server has it, or None when it does not exist."""
    where = ("-n", namespace) if namespace else ()
    result = plane.kubectl("get", kind, name, *where, "-o", "json")
    if result.returncode != 0:
        assert "NotFound" in result.stderr, result.stderr
        return None
    return json.loads(result.stdout)


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == type_)


async def settled(running: Running, quiet: float = 2.0, within: float = 30) -> None:
    """Until the reconciler has rendered and sent no write for `quiet` seconds."""
    await k.eventually(lambda: running.mode.rendered_once, timeout=within, what="first render")
    count, since, deadline = running.mode.writes_sent, time.monotonic(), time.monotonic() + within
    while time.monotonic() - since < quiet:
        await asyncio.sleep(0.1)
        if running.mode.writes_sent != count:
            count, since = running.mode.writes_sent, time.monotonic()
        assert time.monotonic() < deadline, f"writes never stopped: {running.mode.last_writes}"


def test_cluster_mode_against_a_real_api_server(control_plane: ControlPlane) -> None:
    plane = control_plane
    if (plane.assets / "kube-controller-manager").exists():
        assert not plane.controller_manager_error, plane.controller_manager_error
    plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": k.NS}})
    plane.apply(
        k.gateway_class(),
        k.gateway_config(),
        k.dataplane(),
        # Outside the service network (10.0.0.0/24): the webhook, registered when tests/envtest
        # ran first, refuses a StaticService reaching inside the cluster, as the fake's 10.0.0.1.
        k.static_service(prefixes=("192.0.2.1/32",)),
        k.gateway(),
        k.route(),
    )

    async def main() -> None:
        settings = replace(
            k.on_a_real_cluster(plane.admin_kubeconfig, k.NS, IDENTITY),
            lease_name=LEASE,
            lease_duration=4,
            renew_deadline=3,
            retry_period=0.5,
        )
        async with run_cluster(settings) as running:
            await first_pass(plane, running)
            await others_fields_kept(plane, running)
            await only_dataplane_edits_roll(plane, running)
            await disable_managed_dataplane(plane, running)
            await garbage_collected(plane, running)

    asyncio.run(main())


async def first_pass(plane: ControlPlane, running: Running) -> None:
    deployment = await k.eventually(lambda: get(plane, "deployment", "gw"), timeout=30)
    service = await k.eventually(lambda: get(plane, "service", "gw"), timeout=30)
    gateway = get(plane, "gateway", "gw")
    for obj in (deployment, service):
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("Gateway", gateway["metadata"]["uid"])
        assert owner["controller"] is True
    lease = get(plane, "lease", LEASE)
    assert lease is not None and lease["spec"]["holderIdentity"] == IDENTITY
    await settled(running)
    # Status through /status: conditions with the generation they speak of.
    gateway = get(plane, "gateway", "gw")
    accepted = condition(gateway, "Accepted")
    assert accepted["status"] == "True", gateway["status"]
    assert accepted["observedGeneration"] == gateway["metadata"]["generation"]
    assert condition(gateway, "Programmed")["reason"] == "AddressNotAssigned"  # no LB here
    klass = get(plane, "gatewayclass", "stunner", namespace="")
    assert condition(klass, "Accepted")["status"] == "True"
    route = get(plane, "udproutes.stunner.l7mp.io", "route")
    assert route["status"]["parents"][0]["conditions"], route["status"]
    assert "stunner/gw" in running.mode.store.configs
    # A second pass over the unchanged cluster: a render, zero writes.
    sent, renders = running.mode.writes_sent, running.mode.reconciler.renders
    running.mode.reconciler.trigger()
    await asyncio.wait_for(running.rendered(renders + 1), 10)
    await settled(running)
    assert running.mode.writes_sent == sent, running.mode.last_writes


async def others_fields_kept(plane: ControlPlane, running: Running) -> None:
    for args in (
        ("label", "service", "gw", "team=media"),
        ("annotate", "service", "gw", "example.com/owner=ops"),
        ("label", "deployment", "gw", "team=media"),
    ):
        result = plane.kubectl(*args, "-n", k.NS)
        assert result.returncode == 0, result.stderr
    await settled(running)
    patch = {
        "metadata": {"annotations": {"stunner.l7mp.io/service-type": "NodePort"}},
        "spec": {"listeners": [k.listener(), k.listener("udp2", 3479)]},
    }
    result = plane.kubectl(
        "patch", "gateway", "gw", "-n", k.NS, "--type=merge", "-p", json.dumps(patch)
    )
    assert result.returncode == 0, result.stderr

    def service_changed() -> bool:
        spec = get(plane, "service", "gw")["spec"]
        return bool(spec["type"] == "NodePort" and len(spec["ports"]) == 2)

    await k.eventually(service_changed, timeout=30, what="the Service follows the Gateway")
    await settled(running)
    service = get(plane, "service", "gw")
    assert service["metadata"]["labels"]["team"] == "media"
    assert service["metadata"]["annotations"]["example.com/owner"] == "ops"
    assert all(port.get("nodePort") for port in service["spec"]["ports"])  # the server's
    assert get(plane, "deployment", "gw")["metadata"]["labels"]["team"] == "media"
    # Settled against the real server's defaults: another pass writes nothing.
    sent, renders = running.mode.writes_sent, running.mode.reconciler.renders
    running.mode.reconciler.trigger()
    await asyncio.wait_for(running.rendered(renders + 1), 10)
    await settled(running)
    assert running.mode.writes_sent == sent, running.mode.last_writes


def patch(
    plane: ControlPlane, kind: str, name: str, change: dict[str, Any], ns: str = k.NS
) -> None:
    where = ("-n", ns) if ns else ()
    result = plane.kubectl("patch", kind, name, *where, "--type=merge", "-p", json.dumps(change))
    assert result.returncode == 0, result.stderr


async def only_dataplane_edits_roll(plane: ControlPlane, running: Running) -> None:
    first = get(plane, "deployment", "gw")
    listeners = [k.listener(), k.listener("udp2", 3479), k.listener("tcp", 3478, "TURN-TCP")]
    patch(plane, "gateway", "gw", {"spec": {"listeners": listeners}})
    await k.eventually(
        lambda: len(running.mode.store.configs["stunner/gw"].listeners) == 3, timeout=30
    )
    await settled(running)
    same = get(plane, "deployment", "gw")
    assert same["metadata"]["generation"] == first["metadata"]["generation"]
    assert same["spec"]["template"] == first["spec"]["template"]
    patch(plane, "dataplane", "default", {"spec": {"image": "l7mp/stunnerd:1.1"}}, ns="")

    def rolled() -> Any:
        deployment = get(plane, "deployment", "gw")
        image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        return image == "l7mp/stunnerd:1.1" and deployment

    deployment = await k.eventually(rolled, timeout=30, what="the Deployment rolled")
    assert deployment["metadata"]["generation"] == first["metadata"]["generation"] + 1
    await settled(running)


async def disable_managed_dataplane(plane: ControlPlane, running: Running) -> None:
    disable = "stunner.l7mp.io/disable-managed-dataplane"
    patch(plane, "gateway", "gw", {"metadata": {"annotations": {disable: "true"}}})
    await k.eventually(lambda: get(plane, "deployment", "gw") is None, timeout=30)
    await settled(running)
    assert get(plane, "service", "gw") is not None
    assert "stunner/gw" in running.mode.store.configs
    patch(plane, "gateway", "gw", {"metadata": {"annotations": {disable: None}}})
    await k.eventually(lambda: get(plane, "deployment", "gw"), timeout=30)
    await settled(running)


async def garbage_collected(plane: ControlPlane, running: Running) -> None:
    if not (plane.assets / "kube-controller-manager").exists():
        return  # the README says: without it, nothing collects garbage
    result = plane.kubectl("delete", "gateway", "gw", "-n", k.NS)
    assert result.returncode == 0, result.stderr
    await k.eventually(
        lambda: get(plane, "deployment", "gw") is None and get(plane, "service", "gw") is None,
        timeout=60,
        interval=0.5,
        what="the garbage collector deletes the Gateway's Deployment and Service",
    )
    await k.eventually(lambda: "stunner/gw" not in running.mode.store.configs, timeout=10)
    await settled(running)
    assert get(plane, "deployment", "gw") is None and get(plane, "service", "gw") is None
