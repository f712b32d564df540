"""Shared pieces of the cluster-mode tests: a small world of objects seeded into the fake API
server, and the reconciler running against it with test-sized timings."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from reconciler.cluster import ClusterSettings, Running, run_cluster
from reconciler.kube.api import Api
from reconciler.store import Cache
from tests.support.fakeapi import CORE_TYPES, GATEWAY_TYPES, FakeApiServer, ResourceType

CONTROLLER = "stunner.l7mp.io/gateway-operator"
NS = "stunner"
GW = "gateway.networking.k8s.io/v1"
Obj = dict[str, Any]

FAST = ClusterSettings(
    host="127.0.0.1",
    cds_port=0,
    metrics_address=("127.0.0.1", 0),
    health_address=("127.0.0.1", 0),
    throttle=0.05,
    watch_timeout=5,
    watch_backoff_initial=0.05,
    watch_backoff_max=0.5,
    stale_after=2.0,
    write_backoff_initial=0.1,
    write_backoff_max=1.0,
)


def on_a_real_cluster(kubeconfig: Path, lease_namespace: str, identity: str) -> ClusterSettings:
    """Cluster mode against a real API server (tests/envtest/): leader election on, the CDS on
    an ephemeral loopback port, no metrics or health endpoints, a test-sized throttle."""
    return ClusterSettings(
        kubeconfig=str(kubeconfig),
        host="127.0.0.1",
        cds_port=0,
        metrics_address=None,
        health_address=None,
        throttle=0.05,
        leader_elect=True,
        lease_namespace=lease_namespace,
        identity=identity,
    )


def gateway_class(name: str = "stunner", controller: str = CONTROLLER) -> Obj:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GatewayClass",
        "metadata": {"name": name},
        "spec": {
            "controllerName": controller,
            "parametersRef": {
                "group": "stunner.l7mp.io",
                "kind": "GatewayConfig",
                "name": "config",
                "namespace": NS,
            },
        },
    }


def gateway_config(**spec: Any) -> Obj:
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "GatewayConfig",
        "metadata": {"name": "config", "namespace": NS},
        "spec": {"authType": "static", "userName": "user", "password": "pass-word"} | spec,
    }


def dataplane(**spec: Any) -> Obj:
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "Dataplane",
        "metadata": {"name": "default"},
        "spec": {"image": "l7mp/stunnerd:latest"} | spec,
    }


def listener(name: str = "udp", port: int = 3478, protocol: str = "TURN-UDP", **more: Any) -> Obj:
    return {"name": name, "port": port, "protocol": protocol} | more


def gateway(*listeners: Obj, name: str = "gw", gateway_class: str = "stunner", **meta: Any) -> Obj:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": NS} | meta,
        "spec": {"gatewayClassName": gateway_class, "listeners": list(listeners) or [listener()]},
    }


def static_service(name: str = "peer", prefixes: tuple[str, ...] = ("10.0.0.1/32",)) -> Obj:
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "StaticService",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"prefixes": list(prefixes)},
    }


def route(
    *backends: Obj, name: str = "route", parents: tuple[str, ...] = ("gw",), **spec: Any
) -> Obj:
    refs = list(backends) or [{"group": "stunner.l7mp.io", "kind": "StaticService", "name": "peer"}]
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "UDPRoute",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "parentRefs": [{"name": p} for p in parents],
            "rules": [{"backendRefs": refs}],
        }
        | spec,
    }


def world(fake: FakeApiServer, *extra: Obj) -> None:
    """A GatewayClass of ours, its GatewayConfig, the default Dataplane, Gateway stunner/gw
    (one UDP listener) and a route to a StaticService; then `extra`."""
    for obj in (
        gateway_class(),
        gateway_config(),
        dataplane(),
        static_service(),
        gateway(),
        route(),
        *extra,
    ):
        fake.seed(obj)


def get(fake: FakeApiServer, api_version: str, kind: str, name: str, ns: str = NS) -> Obj | None:
    return fake.get_object(api_version, kind, ns, name)


def update(
    fake: FakeApiServer,
    api_version: str,
    kind: str,
    name: str,
    change: Callable[[Obj], None],
    ns: str = NS,
) -> Obj:  # noqa: E501
    """Change an object as a user would (a PUT through the fake's store)."""
    obj = fake.get_object(api_version, kind, ns, name)
    assert obj is not None, f"{kind} {ns}/{name} missing"
    change(obj)
    rt = fake.resource_type(api_version, kind)
    return fake.replace(rt, ns if rt.namespaced else "", name, obj)


def set_peer(fake: FakeApiServer, prefix: str) -> Obj:
    """A user's edit of the route's backend: the StaticService `peer` now admits `prefix`."""
    return update(
        fake,
        "stunner.l7mp.io/v1",
        "StaticService",
        "peer",
        lambda s: s["spec"].update({"prefixes": [prefix]}),
    )


def scale_dataplane(fake: FakeApiServer, replicas: int) -> Obj:
    """A user's edit of the default Dataplane (it rolls every Deployment: an update)."""
    return update(
        fake,
        "stunner.l7mp.io/v1",
        "Dataplane",
        "default",
        lambda d: d["spec"].update({"replicas": replicas}),
        ns="",
    )


def edit_gateway(fake: FakeApiServer, change: Callable[[Obj], Any], name: str = "gw") -> Obj:
    """A user's edit of a Gateway."""
    return update(fake, GW, "Gateway", name, change)


def delete(fake: FakeApiServer, api_version: str, kind: str, name: str, ns: str = NS) -> None:
    rt = fake.resource_type(api_version, kind)
    fake.delete(rt, ns if rt.namespaced else "", name)


async def eventually(
    check: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> Any:
    """Poll `check` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(interval)


# events.k8s.io/v1 Events, which the fake does not serve unless asked (`with_events`).
EVENT_TYPE = ResourceType("events.k8s.io", "v1", "events", "Event")


def with_events() -> FakeApiServer:
    """A fake API server that also serves events.k8s.io/v1 Events."""
    return FakeApiServer((*CORE_TYPES, *GATEWAY_TYPES, EVENT_TYPE))


def recorded_events(fake: FakeApiServer) -> list[Obj]:
    """The Events stored, oldest first."""
    items = fake.list(EVENT_TYPE, None, {})["items"]
    return sorted(items, key=lambda e: int(e["metadata"]["resourceVersion"]))


def object_writes(fake: FakeApiServer) -> list[tuple[str, str]]:
    """The writes the fake received, the Lease's renewals and the Events left out."""
    return [w for w in fake.writes() if "/leases" not in w[1] and "/events" not in w[1]]


async def settled(running: Running, fake: FakeApiServer, quiet: float = 0.4) -> None:
    """Wait until the reconciler is at rest: it has rendered, it leads (with leader election:
    only the leader writes), and nothing is under way or due (`ClusterMode.idle`: no render
    wanted or running, no pass of writes or its Events), and that held for `quiet` seconds with
    no render started, no object cached and no write sent (but the Lease's) meanwhile. It waits
    for the reconciler's state, not for a time without writes: a render or a Lease slow to come
    on a loaded machine writes nothing for a while, and is no rest. (A write refused for good
    does not keep it from rest: between two retries, which are passes of their own, it is.)"""
    mode = running.mode
    await eventually(lambda: mode.rendered_once, what="first render")
    if mode.elector is not None:
        await eventually(lambda: mode.leading, what="leadership")

    def state() -> tuple[int, int, int] | None:
        if not mode.idle:
            return None
        return len(object_writes(fake)), mode.reconciler.renders, mode.cache.changes

    deadline = time.monotonic() + 15
    seen, since = state(), time.monotonic()
    while seen is None or time.monotonic() - since < quiet:
        assert time.monotonic() < deadline, f"never at rest: {seen}"
        await asyncio.sleep(0.05)
        now = state()
        if now is None or now != seen:
            seen, since = now, time.monotonic()


@contextlib.asynccontextmanager
async def reconciler(
    fake: FakeApiServer, tmp_path: Path, **settings: Any
) -> AsyncIterator[Running]:
    kubeconfig = fake.write_kubeconfig(tmp_path / f"kubeconfig-{time.monotonic_ns()}")
    async with run_cluster(replace(FAST, kubeconfig=str(kubeconfig), **settings)) as running:
        yield running


def relist(api: Api, cache: Cache) -> None:
    """`cache` holding every watched kind as the API server lists it now (none of a kind the
    server does not serve, as the informer caches it: the fake does not serve TCPRoute)."""
    for watched in cache.watched:
        try:
            items, version = api.list(watched, watched.versions[0])
        except ApiException as exc:
            if exc.status != 404:
                raise
            items, version = [], ""
        cache.replace(watched, items, version)
