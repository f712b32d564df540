"""UDP worker processes (`-u N` on the Python relay path): real worker processes, real sockets
on loopback.

We test: the core count and its cgroup cap; the control channel (ordered JSON frames, a socket
passed across, a broken peer closes it); that clients land in both processes and are relayed,
counted once in /status and the metrics; that a nonce from one process verifies in the other;
that admin.user_quota holds across processes; that a reconcile reaches the workers (routes at
once, a port change frees the old port everywhere); that a killed worker is replaced on the
same sockets while the primary's allocations carry on; and the command line's -u.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import pytest

from stunner_api.dataplane import StunnerConfig
from stunner_api.stun import Class
from stunnerd.process.channel import HEADER, Channel
from stunnerd.process.daemon import Stunner
from stunnerd.process.worker_pool import (
    WorkerPool,
    cgroup_cpu_limit,
    udp_process_count,
    usable_cpus,
)
from stunnerd.surface.admin import render_metrics, status_of
from stunnerd.turn.auth import NonceManager
from stunnerd.turn.ledger import LocalQuota
from tests.support.turnclient import (
    HOST,
    USERNAME,
    RawClient,
    binding_answered,
    error_code,
    free_port,
    make_config,
    start_peer,
)

from .conftest import StartStunnerd


@pytest.fixture(autouse=True)
def python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker processes serve the Python relay path only: on the native path one process runs
    an engine per socket (issue 30; tests/stunnerd/test_native_engines.py)."""
    monkeypatch.setenv("STUNNER_NATIVE", "0")


CLIENTS = 20  # 2 processes: all on one side by chance with probability 2**-19
LISTENER = "testns/gw/turn-udp"


# --- how many processes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpu_max", "cores"),
    [
        ("max 100000", None),
        ("200000 100000", 2.0),
        ("150000 100000", 1.5),
        ("50000 100000", 0.5),
        ("0 100000", None),
        ("garbage", None),
        ("", None),
    ],
)
def test_cgroup_cpu_limit(cpu_max: str, cores: float | None) -> None:
    assert cgroup_cpu_limit(cpu_max) == cores


@pytest.mark.parametrize(
    ("requested", "cpus", "processes"),
    [
        (None, 4, 4),  # default: one per usable CPU, on the native path too (issue 21)
        (None, 1, 1),
        (0, 4, 1),  # 0 disables, as in Go stunnerd
        (1, 4, 1),
        (3, 4, 3),
        (16, 2, 2),  # the operator's default, capped at the cores
    ],
)
def test_udp_process_count(requested: int | None, cpus: int, processes: int) -> None:
    assert udp_process_count(requested, cpus) == processes


def test_usable_cpus_is_within_the_affinity_mask() -> None:
    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))


# --- the control channel -----------------------------------------------------------------------


def test_channel_carries_frames_in_order_with_a_socket() -> None:
    async def main() -> None:
        left, right = socket.socketpair()
        sender, receiver = Channel(left), Channel(right)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind((HOST, 0))
        big = "x" * (1 << 20)  # larger than any socket buffer: written in pieces
        for i in range(50):
            sender.post({"n": i}, udp if i == 25 else None)
        sender.post({"big": big})
        received = [await receiver.receive() for _ in range(51)]
        assert [r.body.get("n") for r in received if r is not None][:50] == list(range(50))
        passed = received[25]
        assert passed is not None and passed.sock is not None
        assert passed.sock.getsockname() == udp.getsockname()  # the very same socket
        assert all(r is not None and r.sock is None for i, r in enumerate(received) if i != 25)
        assert received[50] is not None and received[50].body["big"] == big
        with passed.sock, udp:
            probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            probe.sendto(b"ping", udp.getsockname())
            passed.sock.settimeout(2)
            assert passed.sock.recv(16) == b"ping"
            probe.close()
        sender.close()
        assert await receiver.receive() is None  # the peer closed
        assert await receiver.receive() is None

    asyncio.run(main())


def test_channel_closes_on_a_broken_frame() -> None:
    async def main() -> None:
        left, right = socket.socketpair()
        receiver = Channel(right)
        with left:
            body = b"[1, 2]"  # valid JSON, but not an object
            left.sendall(HEADER.pack(len(body), 0) + body)
            assert await asyncio.wait_for(receiver.receive(), 2) is None
            assert receiver.closed
        left2, right2 = socket.socketpair()
        receiver2 = Channel(right2)
        with left2:
            left2.sendall(HEADER.pack(1 << 30, 0))  # absurd length
            assert await asyncio.wait_for(receiver2.receive(), 2) is None
        left3, right3 = socket.socketpair()
        receiver3 = Channel(right3)
        with left3:
            left3.sendall(HEADER.pack(2, 1) + b"{}")  # says a socket is attached; none is
            assert await asyncio.wait_for(receiver3.receive(), 2) is None

    asyncio.run(main())


# --- a primary with one worker -----------------------------------------------------------------


@contextlib.asynccontextmanager
async def pooled_stunner(config: StunnerConfig, size: int = 1) -> AsyncIterator[Stunner]:
    pool = WorkerPool(size, os.urandom(32), LocalQuota(), "all:WARN")
    await pool.start()
    stunner = Stunner(nonces=NonceManager(pool.secret), workers=pool)
    try:
        await stunner.apply(config)
        yield stunner
    finally:
        await stunner.close()
    assert all(w.process.returncode is not None for w in pool.workers.values())


def own_allocations(stunner: Stunner) -> int:
    return len(stunner.listeners[LISTENER].server.allocations)


async def eventually(condition: object, timeout: float = 5.0) -> None:
    """Wait for `condition()` (worker counters arrive once a second)."""
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.1)


async def relayed(client: RawClient, channel: int, payload: bytes) -> bool:
    client.send_channel_data(channel, payload)
    try:
        got = await asyncio.wait_for(client.channel_data.get(), 1.0)
    except TimeoutError:
        return False
    return got == (channel, payload)


async def connected_clients(port: int, peer_port: int, count: int = CLIENTS) -> list[RawClient]:
    clients = [await RawClient.connect((HOST, port)) for _ in range(count)]
    for client in clients:
        response = await client.allocate()
        assert response.message_class == Class.SUCCESS, error_code(response)
        bound = await client.channel_bind(0x4000, (HOST, peer_port))
        assert bound.message_class == Class.SUCCESS, error_code(bound)
    return clients


def test_clients_land_in_both_processes_and_are_counted_once() -> None:
    async def main() -> None:
        port, peer = free_port(), await start_peer()
        config = make_config(port, [f"{HOST}/32"], protocols=("TURN-UDP",))
        async with pooled_stunner(config) as stunner:
            clients = await connected_clients(port, peer.port)
            for i, client in enumerate(clients):
                assert await relayed(client, 0x4000, b"media-%d" % i)
            assert 0 < own_allocations(stunner) < CLIENTS  # the worker holds the rest
            await eventually(lambda: stunner.allocation_count == CLIENTS)
            await eventually(lambda: stunner.listener_stats()[LISTENER].rx_packets >= 3 * CLIENTS)
            stats = stunner.listener_stats()[LISTENER]
            assert stats.allocations_total == CLIENTS
            assert status_of(stunner)["allocationCount"] == CLIENTS
            listener_status = status_of(stunner)["listeners"][0]["stats"]
            assert listener_status["rx"]["pkts"] == stats.rx_packets
            metrics = render_metrics(stunner)
            assert "stunner_allocations_active 20\n" in metrics
            assert f'stunner_listener_connections_total{{name="{LISTENER}"}} 20\n' in metrics
            cluster_tx = stunner.cluster_counters()["testns/backend"].tx_packets
            assert cluster_tx == CLIENTS  # one relayed packet per client, wherever it landed
            for client in clients:
                client.close()
        peer.close()

    asyncio.run(main())


def test_a_nonce_from_one_process_verifies_in_the_other() -> None:
    async def main() -> None:
        port = free_port()
        config = make_config(port, [f"{HOST}/32"], protocols=("TURN-UDP",))
        async with pooled_stunner(config) as stunner:
            first = await RawClient.connect((HOST, port))
            assert (await first.allocate()).message_class == Class.SUCCESS
            others = [await RawClient.connect((HOST, port)) for _ in range(CLIENTS)]
            for client in others:
                client.realm, client.nonce = first.realm, first.nonce  # no 401 round trip
                response = await client.allocate()
                assert response.message_class == Class.SUCCESS, error_code(response)
            assert 0 < own_allocations(stunner) < CLIENTS + 1
            for client in [first, *others]:
                client.close()

    asyncio.run(main())


def test_user_quota_holds_across_processes() -> None:
    async def main() -> None:
        port = free_port()
        config = make_config(port, [f"{HOST}/32"], protocols=("TURN-UDP",), user_quota=3)
        async with pooled_stunner(config) as stunner:
            clients = [await RawClient.connect((HOST, port)) for _ in range(CLIENTS)]
            codes = [error_code(await client.allocate()) for client in clients]
            assert codes.count(None) == 3 and codes.count(486) == CLIENTS - 3
            assert stunner.users.counts == {USERNAME: 3}
            # Let one allocation go (in whichever process holds it): one more fits.
            winner = clients[codes.index(None)]
            assert (await winner.refresh(0)).message_class == Class.SUCCESS
            await eventually(lambda: stunner.users.counts == {USERNAME: 2})
            late = await RawClient.connect((HOST, port))
            assert error_code(await late.allocate()) is None
            for client in [*clients, late]:
                client.close()

    asyncio.run(main())


def test_a_reservation_token_is_honoured_in_either_process() -> None:
    """An RTP/RTCP pair is two 5-tuples: the kernel may hash them to different processes."""

    async def main() -> None:
        port = free_port()
        config = make_config(port, [f"{HOST}/32"], protocols=("TURN-UDP",))
        async with pooled_stunner(config) as stunner:
            clients = []
            for _ in range(CLIENTS // 2):
                rtp, rtcp = (
                    await RawClient.connect((HOST, port)),
                    await RawClient.connect((HOST, port)),
                )
                first = await rtp.allocate(**{"EVEN-PORT": True})
                assert first.message_class == Class.SUCCESS, error_code(first)
                token = first.attributes["RESERVATION-TOKEN"]
                second = await rtcp.allocate(**{"RESERVATION-TOKEN": token})
                assert second.message_class == Class.SUCCESS, error_code(second)
                relayed_port = second.attributes["XOR-RELAYED-ADDRESS"][1]
                assert relayed_port == first.attributes["XOR-RELAYED-ADDRESS"][1] + 1
                clients += [rtp, rtcp]
            assert 0 < own_allocations(stunner) < CLIENTS  # both processes took part
            assert len(stunner.reservations) == 0  # every reserved socket was handed over
            for client in clients:
                client.close()

    asyncio.run(main())


def test_a_route_change_reaches_the_workers_before_apply_returns() -> None:
    async def main() -> None:
        port, peer = free_port(), await start_peer()
        config = make_config(port, [f"{HOST}/32"], protocols=("TURN-UDP",))
        async with pooled_stunner(config) as stunner:
            clients = await connected_clients(port, peer.port)
            await stunner.apply(make_config(port, ["10.0.0.0/8"], protocols=("TURN-UDP",)))
            before = len(peer.received)
            for client in clients:
                client.send_channel_data(0x4000, b"blocked")
            await asyncio.sleep(1.0)
            assert len(peer.received) == before  # no process let it through
            assert all(client.channel_data.empty() for client in clients)
            await stunner.apply(config)
            for client in clients:
                assert await relayed(client, 0x4000, b"allowed again")
            for client in clients:
                client.close()
        peer.close()

    asyncio.run(main())


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as probe:
        probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        try:
            probe.bind(("::", port))
        except OSError:
            return False
    return True


def test_a_port_change_frees_the_old_port_in_every_process() -> None:
    async def main() -> None:
        old_port, new_port, peer = free_port(), free_port(), await start_peer()
        async with pooled_stunner(
            make_config(old_port, [f"{HOST}/32"], protocols=("TURN-UDP",))
        ) as stunner:
            for client in await connected_clients(old_port, peer.port, count=4):
                client.close()
            await stunner.apply(make_config(new_port, [f"{HOST}/32"], protocols=("TURN-UDP",)))
            assert port_is_free(old_port)
            assert not port_is_free(new_port)
            clients = await connected_clients(new_port, peer.port)
            assert 0 < own_allocations(stunner) < CLIENTS
            for client in clients:
                assert await relayed(client, 0x4000, b"on the new port")
                client.close()
        assert port_is_free(new_port)
        peer.close()

    asyncio.run(main())


def test_a_busy_port_is_refused_even_with_reuse_port() -> None:
    async def main() -> None:
        port = free_port()
        # Another process's SO_REUSEPORT socket on the port: joining its group would quietly
        # split the traffic with it.
        squatter = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        squatter.bind((HOST, port))
        with squatter:
            pool = WorkerPool(1, os.urandom(32), LocalQuota(), "all:WARN")
            await pool.start()
            stunner = Stunner(nonces=NonceManager(pool.secret), workers=pool)
            try:
                with pytest.raises(Exception, match="in use"):
                    await stunner.apply(make_config(port, [f"{HOST}/32"], protocols=("TURN-UDP",)))
            finally:
                await stunner.close()

    asyncio.run(main())


def test_a_killed_worker_is_replaced_on_the_same_sockets() -> None:
    async def main() -> None:
        port, peer = free_port(), await start_peer()
        config = make_config(port, [f"{HOST}/32"], protocols=("TURN-UDP",))
        async with pooled_stunner(config) as stunner:
            assert stunner.workers is not None
            clients = await connected_clients(port, peer.port)
            ours = [c for c in clients if c.transport is not None and _held_by_primary(stunner, c)]
            theirs = [c for c in clients if c not in ours]
            assert ours and theirs
            worker = stunner.workers.workers[0]
            old_pid = worker.process.pid
            os.kill(old_pid, signal.SIGKILL)
            await eventually(lambda: stunner.workers.workers[0].process.pid != old_pid, 10)
            await eventually(lambda: stunner.workers.workers[0].synced > 0, 10)
            for client in ours:  # the primary's allocations carry on
                assert await relayed(client, 0x4000, b"still here")
            for client in theirs:  # lost with the worker: a new one answers 437, not silence
                response = await client.refresh(600)
                assert error_code(response) == 437
            fresh = await connected_clients(port, peer.port)
            for client in fresh:
                assert await relayed(client, 0x4000, b"after the restart")
            await eventually(lambda: stunner.allocation_count == len(ours) + CLIENTS)
            for client in [*clients, *fresh]:
                client.close()
        peer.close()

    asyncio.run(main())


def _held_by_primary(stunner: Stunner, client: RawClient) -> bool:
    assert client.transport is not None
    local = client.transport.get_extra_info("sockname")
    remotes = stunner.listeners[LISTENER].server.allocations
    return any(r[1] == local[1] for r in remotes)


# --- the command line ------------------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    path = f"/proc/{pid}/task/{pid}/children"
    with open(path) as children:
        return [int(p) for p in children.read().split()]


def test_cli_starts_workers_and_takes_them_down_on_sigterm(stunnerd: StartStunnerd) -> None:
    port = free_port()
    expected_workers = min(2, usable_cpus()) - 1
    process = stunnerd(
        "-u", "16", "-l", "all:INFO", f"turn://user1:secret@127.0.0.1:{port}?transport=udp"
    )
    deadline = time.monotonic() + 20
    while len(children_of(process.proc.pid)) < expected_workers:
        assert time.monotonic() < deadline, "no worker process"
        time.sleep(0.1)
    workers = children_of(process.proc.pid)
    assert binding_answered(port)  # whichever process gets the probe
    stderr = process.stop(signal.SIGTERM, timeout=20)
    assert process.returncode == 0, stderr
    cpus = usable_cpus()
    if cpus < 16:
        assert f"--udp-thread-num=16: using {cpus} process(es)" in stderr
    for pid in workers:
        assert not os.path.exists(f"/proc/{pid}") or _is_zombie_or_gone(pid)


def _is_zombie_or_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_cli_refuses_a_negative_thread_count() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "stunnerd", "-u", "-1", "turn://u:p@127.0.0.1:3478"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert result.returncode == 2
    assert "must not be negative" in result.stderr
