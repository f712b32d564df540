"""Cluster-wide user quotas: three real stunnerd processes, started as the chart starts them
(`stunnerd -w --udp-thread-num=16 -c http://CDS`), watch one Gateway's config on one real CDS
server (reconciler.cds.server) with `user_quota: 2`, each pod on its own loopback address
(`$STUNNER_ADDR`), and the real TURN client (aioice, stunner_client.turn) allocates.

We test: allocations on two pods count together, so the third Allocate gets 486 on every pod;
releasing one (Refresh with lifetime 0) frees a slot on another pod; a Go-style watcher of the
same config (it sends nothing) receives configs only, never a usage frame; with the CDS stopped
each pod falls back to its own count (admits up to the quota on its own); a draining pod (SIGTERM)
keeps reporting, so its allocations still count on the others; `stunner_user_quota_shared` is 1
while a pod is connected and 0 once it counts its own only; each pod counts its refusals in
`stunner_listener_allocations_refused_total` (reasons quota and draining).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

from websockets.asyncio.client import connect

from stunner_api.cds import config_path, usage_key
from stunner_api.dataplane_load import load_config
from stunner_client.turn import error_code, open_allocation
from tests.cds_server import run_cds_server
from tests.support.turnclient import PASSWORD, USERNAME, free_port, make_config

from .conftest import StartStunnerd
from .test_admin import get

ID = "testns/gw"
PODS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
CREDENTIALS = (USERNAME, PASSWORD)


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def allocate(pod: str, port: int) -> Any | int:
    """A held allocation on `pod`, or the error code it was refused with."""
    try:
        return await open_allocation("udp", (pod, port), CREDENTIALS, timeout=3.0)
    except TimeoutError:
        return 0
    except Exception as exc:  # aioice's TransactionFailed
        code = error_code(exc)
        if code is None:
            raise
        return code


async def refused(pod: str, port: int) -> bool:
    """An Allocate on `pod` gets 486 (one that succeeds is released at once)."""
    result = await allocate(pod, port)
    if not isinstance(result, int):
        result.close()
        return False
    return result == 486


class GoWatcher:
    """A watcher as Go's stunnerd is one: it sends nothing, and records every frame."""

    def __init__(self, address: str) -> None:
        self.url = address.replace("http://", "ws://") + config_path(*ID.split("/"))
        self.frames: list[str | bytes] = []

    async def run(self) -> None:
        async with connect(self.url + "?watch=true") as ws:
            async for frame in ws:
                self.frames.append(frame)


def test_user_quota_holds_across_stunnerd_pods(stunnerd: StartStunnerd) -> None:
    async def main() -> None:
        port, metrics = free_port(), free_port()
        # Every pod gets the same config, as the pods of one Gateway do, and binds its own
        # address ($STUNNER_ADDR: the pod IP in a cluster, a loopback address here).
        admin = {"metrics_endpoint": f"http://127.0.0.1:{metrics}/metrics"}
        config = make_config(
            port, ["127.0.0.1/32"], protocols=("TURN-UDP",), user_quota=2, admin=admin
        )
        text = config.to_json().replace('"address":"127.0.0.1"', '"address":"$STUNNER_ADDR"')
        assert "$STUNNER_ADDR" in text
        held: list[Any] = []
        async with run_cds_server() as cds:
            cds.set_config(ID, text)
            go = GoWatcher(cds.address)
            go_task = asyncio.create_task(go.run())
            pods = [
                stunnerd(
                    *("-w", "--udp-thread-num=16", "--grace-period", "60"),
                    *("-c", cds.address, "-i", ID, "--metrics-address", f"{pod}:{metrics}"),
                    env={"STUNNER_ADDR": pod, "STUNNER_NODENAME": ""},
                )
                for pod in PODS
            ]
            # Every pod serves, and reports (an empty table at first).
            for pod in PODS:
                await wait_for(lambda pod=pod: _serves(pod, port))  # type: ignore[misc]
            await wait_for(lambda: _true(cds.store.usage.reporters(ID) == 3))
            await wait_for(lambda: _true(cds.store.usage.total(ID) == {}))  # probes released
            assert await shared(PODS[0], metrics) == 1

            # Two allocations, on two pods, count together: the third is refused everywhere.
            # (Retried: the CDS tells the pods that the probes' allocations are gone within a
            # report interval of its sums changing.)
            for pod in PODS[:2]:
                held.append(await _admitted(pod, port))
            await wait_for(lambda: _true(cds.store.usage.total(ID) == {USERNAME: 2}))
            for pod in PODS:
                await wait_for(lambda pod=pod: refused(pod, port))  # type: ignore[misc]
            # ... and counted (a UDP worker's counters reach the metrics within a second).
            for pod in PODS:
                await wait_for(lambda pod=pod: _counted(pod, metrics, "quota"))  # type: ignore[misc]

            # Releasing one (aioice's close: a Refresh with lifetime 0) frees a slot elsewhere.
            held.pop(0).close()
            await wait_for(lambda: _true(cds.store.usage.total(ID) == {USERNAME: 1}))
            third = await _admitted(PODS[2], port)
            held.append(third)
            await wait_for(lambda: _true(cds.store.usage.total(ID) == {USERNAME: 2}))
            await wait_for(lambda: refused(PODS[0], port))

            # A draining pod (SIGTERM) keeps its watch: its allocation still counts elsewhere.
            pods[1].send(signal.SIGTERM)
            await wait_for(lambda: _true("SIGTERM: draining 1 allocation" in pods[1].stderr))
            assert await allocate(PODS[1], port) == 508  # draining: "try another server"
            await wait_for(lambda: _counted(PODS[1], metrics, "draining"))
            for _ in range(5):
                await asyncio.sleep(0.2)
                assert cds.store.usage.total(ID) == {USERNAME: 2}
                assert await refused(PODS[0], port)

            # The Go-style watcher got configs only, no usage frame.
            assert go.frames, "the Go-style watcher got no config"
            assert all(usage_key(f) is None for f in go.frames), go.frames
            assert all(load_config(f).admin.user_quota == 2 for f in go.frames)
            go_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await go_task

        # The CDS is gone: each pod counts its own allocations only (and says so).
        await wait_for(lambda: _equals(shared(PODS[0], metrics), 0))
        # Pod 1 holds none (its allocation was released), pod 3 one: 2 and 1 more are
        # admitted (pod 2 is draining).
        for pod, more in ((PODS[0], 2), (PODS[2], 1)):
            for _ in range(more):
                held.append(await _admitted(pod, port))
            assert await refused(pod, port), f"{pod} admitted past its own count"
        assert await allocate(PODS[1], port) == 508
        for allocation in held:
            allocation.close()
        await asyncio.sleep(0.5)  # the releases go out
        for process in pods:
            log = await asyncio.to_thread(process.stop, at_once=True)
            assert "the CDS is unreachable; counting this pod's allocations only" in log
            assert process.returncode == 0, log

    asyncio.run(main())


async def _true(value: bool) -> bool:
    return value


async def _equals(value: Awaitable[object], expected: object) -> bool:
    return await value == expected


async def shared(pod: str, metrics: int) -> float | None:
    """The pod's stunner_user_quota_shared gauge."""
    status, text = await get(f"http://{pod}:{metrics}/metrics")
    assert status == 200, text
    found = re.search(r"^stunner_user_quota_shared (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


async def _counted(pod: str, metrics: int, reason: str) -> bool:
    """The pod's stunner_listener_allocations_refused_total for `reason` is above 0."""
    status, text = await get(f"http://{pod}:{metrics}/metrics")
    assert status == 200, text
    family = "stunner_listener_allocations_refused_total"
    found = re.search(rf'^{family}{{name="{ID}/[^"]+",reason="{reason}"}} (\S+)$', text, re.M)
    return found is not None and float(found.group(1)) > 0


async def _serves(pod: str, port: int) -> bool:
    result = await allocate(pod, port)
    if isinstance(result, int):
        return False
    result.close()
    return True


async def _admitted(pod: str, port: int) -> Any:
    """An allocation on `pod`, retried while the pod has not heard of the change yet."""
    deadline = time.monotonic() + 10.0
    while True:
        result = await allocate(pod, port)
        if not isinstance(result, int):
            return result
        assert time.monotonic() < deadline, f"{pod} keeps refusing: {result}"
        await asyncio.sleep(0.1)
