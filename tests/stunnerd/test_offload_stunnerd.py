"""stunnerd with the kernel offload on and off gives the same datagrams and the same counters.

A scripted TURN-UDP session (Allocate, CreatePermission, ChannelBind, ChannelData both ways at
sizes from 0 to 1200 bytes, a rebind, a second channel, a Send indication, a route removed
mid-flow, a channel's expiry, a Refresh to 0) runs against an in-process stunnerd twice
in one network namespace of its own: with `admin.offload_engine: None` and with `TC` on its
loopback interface. What reaches each peer (payload, from the relay address or not) and the
client (every ChannelData and Data indication) must be identical, and so must the
listener's and the cluster's counters; and with TC the kernel must have carried the
ChannelData (its outcome counters), or the comparison would prove nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from stunner_api import stun
from stunnerd.process.daemon import Stunner
from stunnerd.surface.admin import status_of
from stunnerd.transport import native
from tests.support.netns import loopback_up, run_in_new_namespace
from tests.support.turnclient import (
    HOST,
    Peer,
    RawClient,
    free_port,
    make_config,
    running_stunner,
    start_peer,
)

from .test_offload_program import unavailable

PEER_HOST, OTHER_PEER_HOST = "127.0.0.2", "127.0.0.3"
LISTENER = "testns/gw/turn-udp"
CLUSTER = "testns/backend"
TIMEOUT = 5.0  # a bound on waiting for what must arrive, never a pause
SIZES = (0, 1, 2, 3, 4, 160, 1200)


def config(port: int, endpoints: list[str], engine: str) -> Any:
    admin = {"offload_engine": engine, "offload_interfaces": ["lo"] if engine != "None" else []}
    return make_config(port, endpoints, protocols=("TURN-UDP",), admin=admin)


def payload(size: int, tag: int) -> bytes:
    """The same bytes in both runs (the transcripts are compared)."""
    return bytes((i * 7 + size + tag) & 0xFF for i in range(size))


def relayed(datagrams: list[bytes]) -> list[str]:
    """What was relayed to the client: ChannelData and Data indications (their random
    transaction id masked); not the answers (nonces, integrity and ports differ by run)."""
    kept = []
    for datagram in datagrams:
        if stun.is_channel_data(datagram):
            kept.append(datagram.hex())
        elif datagram[:2] == b"\x01\x17":  # a Data indication
            kept.append((datagram[:8] + bytes(12) + datagram[20:]).hex())
    return kept


async def arrived(peer: Peer, count: int) -> None:
    async def wait() -> None:
        while len(peer.received) < count:
            await asyncio.sleep(0.001)

    await asyncio.wait_for(wait(), TIMEOUT)


async def session(engine: str, peers: tuple[Peer, Peer]) -> dict[str, Any]:
    """One scripted session; what the peers and the client got, and the counters."""
    peer, other = peers
    port = free_port()
    endpoints = [f"{PEER_HOST}/32", f"{OTHER_PEER_HOST}/32"]
    async with running_stunner(config(port, endpoints, engine)) as stunner:
        client = await RawClient.connect((HOST, port))
        relay = (await client.allocate()).attributes["XOR-RELAYED-ADDRESS"]
        to_peer, to_other = (PEER_HOST, peer.port), (OTHER_PEER_HOST, other.port)
        assert (await client.create_permission(to_peer, to_other)).message_class.name == "SUCCESS"
        await client.channel_bind(0x4000, to_peer)

        async def round_trip(channel: int, target: Peer, payload: bytes) -> None:
            expected = len(target.received) + 1
            client.send_channel_data(channel, payload)
            await arrived(target, expected)  # echoed back to the client as ChannelData
            if not payload:
                return  # asyncio's sendto sends no empty datagram: the peer cannot echo it
            got = await asyncio.wait_for(client.channel_data.get(), TIMEOUT)
            assert got == (channel, payload)

        for size in SIZES:
            await round_trip(0x4000, peer, payload(size, 0))
        await client.channel_bind(0x4000, to_peer)  # a rebind refreshes it
        await client.channel_bind(0x4001, to_other)
        for size in SIZES:
            await round_trip(0x4000, peer, payload(size, 1))
            await round_trip(0x4001, other, payload(size, 2))
        # A Send indication goes up to stunnerd; the echo comes back as ChannelData.
        client.send_indication(to_peer, b"indicated")
        await arrived(peer, len(peer.received) + 1)
        assert await asyncio.wait_for(client.channel_data.get(), TIMEOUT) == (0x4000, b"indicated")
        # A route change that refuses the first peer: nothing more reaches it.
        await stunner.apply(config(port, [f"{OTHER_PEER_HOST}/32"], engine))
        client.send_channel_data(0x4000, b"refused")
        await round_trip(0x4001, other, b"still admitted")
        await client.refresh(600)  # answered after stunnerd handled (dropped) "refused"
        # The second channel expires (its expiry moved to the past, then the second's sweep):
        # stunnerd forgets it and the kernel with it.
        allocation = next(iter(stunner.listeners[LISTENER].server.allocations.values()))
        allocation.channels[0x4001] = (to_other, time.monotonic() - 1)
        allocation.due = time.monotonic() - 1  # what bind() keeps: the sweep looks at it now
        stunner.listeners[LISTENER].server.sweep()
        client.send_channel_data(0x4001, b"expired")
        await client.refresh(600)
        await client.refresh(0)
        client.send_channel_data(0x4001, b"after the end")
        await client.request(stun.Message(stun.Method.BINDING, stun.Class.REQUEST), sign=False)
        kernel = stunner.core.offload.loaded.outcomes() if stunner.core.offload.active else {}
        transcript = {
            "peer": [(data.hex(), sender == relay) for data, sender in peer.received],
            "other": [(data.hex(), sender == relay) for data, sender in other.received],
            "client": relayed(client.raw),
            "listener": stunner.listener_stats()[LISTENER].to_dict(),
            "cluster": stunner.cluster_counters()[CLUSTER].to_dict(),
            "kernel": kernel,
            "offload": offload_status(stunner),
            "state": stunner.listener_offload()[LISTENER],
            "status": status_of(stunner)["listeners"][0]["offload"],
        }
        client.close()
    return transcript


def offload_status(stunner: Stunner) -> str:
    offload = stunner.core.offload
    return "on" if offload.active else f"off: {offload.reason}"


def differential() -> None:
    """Inside the namespace: the session with the offload off, then on."""
    loopback_up()

    async def main() -> dict[str, dict[str, Any]]:
        runs = {}
        for engine in ("None", "TC"):
            peers = (
                await start_peer(echo=True, host=PEER_HOST),
                await start_peer(echo=True, host=OTHER_PEER_HOST),
            )
            runs[engine] = await session(engine, peers)
            for p in peers:
                p.close()
        return runs

    sys.stdout.write(json.dumps(asyncio.run(main())))


@pytest.mark.skipif(not native.available(), reason=f"native: {native.unavailable_reason()}")
def test_the_same_session_gives_the_same_datagrams_and_counters_with_the_offload() -> None:
    reason = unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the offload program: {reason}")
        pytest.skip(reason)
    runs = json.loads(run_in_new_namespace(__name__, "differential"))
    off, on = runs["None"], runs["TC"]
    assert off["offload"] == "off: admin.offload_engine is None"
    assert on["offload"] == "on"
    assert on["state"] == {
        "on": True,
        "engine": "TC",
        "interfaces": ["lo"],
        "modes": {"lo": "tcx"},
        "code": "tc",
    }
    assert off["state"] == {
        "on": False,
        "reason": "admin.offload_engine is None",
        "code": "disabled",
    }
    # The kernel carried every ChannelData round trip (both ways), the rest went up.
    echoed = 3 * (len(SIZES) - 1)  # every size but 0 comes back
    assert on["kernel"]["relayed_to_peer"] >= 3 * len(SIZES)
    assert on["kernel"]["relayed_to_client"] >= echoed
    for key in ("peer", "other", "client", "cluster"):
        assert on[key] == off[key], key
    # The listener's counters alike, but for the kernel's share of them, which /status shows.
    shares = {k for k in on["listener"] if k.startswith("offloaded_")}
    assert {k: v for k, v in on["listener"].items() if k not in shares} == {
        k: v for k, v in off["listener"].items() if k not in shares
    }
    assert {off["listener"][k] for k in shares} == {0}
    assert on["listener"]["offloaded_rx_packets"] == on["kernel"]["relayed_to_peer"]
    assert on["listener"]["offloaded_tx_packets"] == on["kernel"]["relayed_to_client"]
    assert on["status"]["stats"]["rx"] == {
        "pkts": on["listener"]["offloaded_rx_packets"],
        "bytes": on["listener"]["offloaded_rx_bytes"],
    }
    assert "stats" not in off["status"]
    assert all(from_relay for _, from_relay in on["peer"] + on["other"])
    assert b"refused".hex() not in [data for data, _ in on["peer"]]
    assert b"expired".hex() not in [data for data, _ in on["other"]]
    assert b"after the end".hex() not in [data for data, _ in on["other"]]


async def battery() -> dict[str, Any]:
    """ChannelBinds to every kind of peer the policy refuses, and two it admits; the kernel's
    routes afterwards, and what a peer outside every route got."""
    port = free_port()
    outside = await start_peer(echo=False, host="127.0.0.5")
    async with running_stunner(config(port, ["127.0.0.2/32", "127.0.0.1/32"], "TC")) as stunner:
        client = await RawClient.connect((HOST, port))
        other = await RawClient.connect((HOST, port))
        relay = (await client.allocate()).attributes["XOR-RELAYED-ADDRESS"]
        other_relay = (await other.allocate()).attributes["XOR-RELAYED-ADDRESS"]
        refused = {
            "own listener": (HOST, port),
            "own relay": relay,
            "another allocation's relay": other_relay,
            "outside every route": ("127.0.0.5", outside.port),
            "metadata": ("169.254.169.254", 80),
            "link-local": ("169.254.1.1", 9),
            "unspecified": ("0.0.0.0", 9),
            "broadcast": ("255.255.255.255", 9),
        }
        answers = {}
        for channel, (name, peer) in enumerate(refused.items(), start=0x4000):
            answer = await client.channel_bind(channel, peer)
            answers[name] = answer.attributes.get("ERROR-CODE", (0,))[0]
            client.send_channel_data(channel, b"must not arrive")
        # Admitted by the routes: an ordinary port of stunnerd's own address (decided per
        # packet in user space, never offloaded), and a peer elsewhere (offloaded).
        own_port = await client.channel_bind(0x5000, (HOST, 9))
        admitted = await client.channel_bind(0x5001, ("127.0.0.2", 9))
        client.send_channel_data(0x5001, b"admitted")
        await client.request(stun.Message(stun.Method.BINDING, stun.Class.REQUEST), sign=False)
        maps = stunner.core.offload.loaded.maps
        routes = [int.from_bytes(key[-4:-2], "big") for key in maps["from_clients"].keys()]
        result = {
            "answers": answers,
            "own port": own_port.message_class.name,
            "admitted": admitted.message_class.name,
            "kernel channels": sorted(routes),
            "outside got": len(outside.received),
        }
        for c in (client, other):
            c.close()
    outside.close()
    return result


def policy_battery() -> None:
    loopback_up()
    sys.stdout.write(json.dumps(asyncio.run(battery())))


@pytest.mark.skipif(not native.available(), reason=f"native: {native.unavailable_reason()}")
def test_with_the_offload_nothing_reaches_a_peer_stunnerd_refuses() -> None:
    """The peer policy battery with the offload on: every refused peer is refused (403) as
    without it, the kernel holds a route for the admitted peer only, and stunnerd's own
    address (an ordinary port a route admits) stays with stunnerd's per-packet check."""
    reason = unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the offload program: {reason}")
        pytest.skip(reason)
    result = json.loads(run_in_new_namespace(__name__, "policy_battery"))
    assert set(result["answers"].values()) == {403}, result["answers"]
    assert (result["own port"], result["admitted"]) == ("SUCCESS", "SUCCESS")
    assert result["kernel channels"] == [0x5001]
    assert result["outside got"] == 0


async def engines_session(config_path: str, port: int, health: str) -> dict[str, Any]:
    """Clients spread by the kernel over the two engine threads of one stunnerd process (-u 2,
    issue 30), which has one program: with the process stopped (SIGSTOP) every client's media
    still flows, whichever engine's socket it came in on (the kernel carries it); with the
    process killed (-9), nothing relays for any of them any more."""
    from .conftest import STUNNERD
    from .test_workers import CLIENTS, relayed

    peer = await start_peer(echo=True, host=PEER_HOST)
    process = subprocess.Popen([*STUNNERD, "-c", config_path, "-u", "2", "-l", "all:WARN"])
    try:
        await ready(health, process)
        clients = [await RawClient.connect((HOST, port)) for _ in range(CLIENTS)]
        for client in clients:
            await client.allocate()
            await client.channel_bind(0x4000, (PEER_HOST, peer.port))
            assert await relayed(client, 0x4000, b"first")
        os.kill(process.pid, signal.SIGSTOP)
        while_stopped = [await relayed(c, 0x4000, b"while stopped") for c in clients]
        os.kill(process.pid, signal.SIGCONT)
        process.kill()
        process.wait(TIMEOUT)
        after_kill = [await relayed(c, 0x4000, b"after the kill") for c in clients[:2]]
        for client in clients:
            client.close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(TIMEOUT)
        peer.close()
    return {"while stopped": while_stopped, "after kill": after_kill}


async def ready(health: str, process: subprocess.Popen[bytes]) -> None:
    """Until stunnerd's readiness endpoint answers 200 (it applied the config)."""
    deadline = time.monotonic() + 15 * TIMEOUT
    while True:
        assert process.poll() is None, "stunnerd exited"
        assert time.monotonic() < deadline, "stunnerd never became ready"
        try:
            with urllib.request.urlopen(f"{health}/ready", timeout=TIMEOUT) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        await asyncio.sleep(0.1)


def with_engines() -> None:
    loopback_up()
    port, health = free_port(), f"http://127.0.0.1:{free_port()}"
    admin = {"offload_engine": "TC", "offload_interfaces": ["lo"], "healthcheck_endpoint": health}
    settings = make_config(port, [f"{PEER_HOST}/32"], protocols=("TURN-UDP",), admin=admin)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "stunnerd.json"
        path.write_text(settings.to_json())
        result = asyncio.run(engines_session(str(path), port, health))
    sys.stdout.write(json.dumps(result))


@pytest.mark.skipif(not native.available(), reason=f"native: {native.unavailable_reason()}")
def test_one_program_serves_every_engine_and_a_killed_process_leaves_nothing() -> None:
    reason = unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the offload program: {reason}")
        pytest.skip(reason)
    result = json.loads(run_in_new_namespace(__name__, "with_engines"))
    assert all(result["while stopped"]), result
    assert not any(result["after kill"]), result
