"""TURN-UDP on the native path with several engines in one process (issue 30): `-u N` (by
default one per usable CPU) binds N sockets in one SO_REUSEPORT group and runs an engine, with
its thread, on each, all in the one stunnerd process: one interpreter answers every request
(no second process waking for its share of them, no quota round trips between processes), and
the media has a relay thread per CPU, as coturn runs. Real sockets on loopback, real clients.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from stunner_api.stun import Class
from stunnerd.process.daemon import Stunner
from stunnerd.process.worker_pool import usable_cpus
from stunnerd.surface.admin import render_metrics, status_of
from stunnerd.transport import native
from stunnerd.transport.native_udp import NativeUdpTransport
from tests.support.turnclient import (
    HOST,
    RawClient,
    binding_answered,
    error_code,
    free_port,
    make_config,
    start_peer,
)

from .conftest import StartStunnerd

pytestmark = pytest.mark.skipif(
    not native.available(), reason=f"native relay: {native.unavailable_reason()}"
)

CLIENTS = 20  # 2 engines: all on one side by chance with probability 2**-19
LISTENER = "testns/gw/turn-udp"


def test_clients_land_on_every_engine_of_one_process_and_are_counted_once() -> None:
    async def main() -> None:
        port, peer = free_port(), await start_peer()
        config = make_config(port, [f"{HOST}/32"], protocols=("TURN-UDP",))
        stunner = Stunner(udp_engines=2)
        try:
            await stunner.apply(config)
            transport = stunner.listeners[LISTENER].transport
            assert isinstance(transport, NativeUdpTransport)
            assert len(transport.relays) == 2
            clients = [await RawClient.connect((HOST, port)) for _ in range(CLIENTS)]
            for i, client in enumerate(clients):
                response = await client.allocate()
                assert response.message_class == Class.SUCCESS, error_code(response)
                bound = await client.channel_bind(0x4000, (HOST, peer.port))
                assert bound.message_class == Class.SUCCESS, error_code(bound)
                client.send_channel_data(0x4000, b"media-%d" % i)
                got = await asyncio.wait_for(client.channel_data.get(), 5.0)
                assert got == (0x4000, b"media-%d" % i)
            # Each engine relayed some of them: the kernel spread the clients over the group.
            # (what an engine sent to clients, less the 401s it answered unsigned Allocates with)
            counted = [relay.counters() for relay in transport.relays]
            relayed = [each.tx_packets - each.answered for each in counted]
            assert all(count > 0 for count in relayed), relayed
            assert sum(relayed) == CLIENTS
            assert stunner.allocation_count == CLIENTS
            stats = stunner.listener_stats()[LISTENER]
            assert stats.allocations_total == CLIENTS
            assert stats.tx_packets >= CLIENTS  # the relayed ones and Python's answers
            assert status_of(stunner)["allocationCount"] == CLIENTS
            metrics = render_metrics(stunner)
            assert "stunner_allocations_active 20\n" in metrics
            assert stunner.cluster_counters()["testns/backend"].tx_packets == CLIENTS
            for client in clients:
                client.close()
        finally:
            await stunner.close()
            peer.close()

    asyncio.run(main())


def children_of(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as children:
        return [int(p) for p in children.read().split()]


def test_the_cli_runs_an_engine_per_cpu_in_one_process(
    stunnerd: StartStunnerd, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STUNNER_NATIVE", "1")
    port = free_port()
    process = stunnerd(
        "-u", "16", "-l", "all:INFO", f"turn://user1:secret@127.0.0.1:{port}?transport=udp"
    )
    assert binding_answered(port)
    threads = len(os.listdir(f"/proc/{process.proc.pid}/task"))
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:  # no worker process comes (they would within ~1 s)
        assert children_of(process.proc.pid) == []
        time.sleep(0.1)
    stderr = process.stop(signal.SIGTERM, timeout=20)
    assert process.returncode == 0, stderr
    cpus = usable_cpus()
    if cpus < 16:
        assert f"--udp-thread-num=16: using {cpus} engine thread(s)" in stderr
    assert threads >= 1 + min(cpus, 16)  # the loop's thread and an engine thread per CPU
