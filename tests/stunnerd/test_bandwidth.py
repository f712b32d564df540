"""Bandwidth caps (issue 29; coturn's max-bps): auth.allocation_bandwidth_limit, on both relay
paths (pure Python and the native engine) of a TURN-UDP and a TURN-TCP listener, over real
sockets on loopback.

Two real TURN clients (two users: TURN REST credentials) of one stunnerd relay ChannelData to one
UDP peer. The capped client sends three times the cap; what reaches the peer, measured over 3 s once
the start's burst has passed, is within 5 % of the cap; the other client, sending half the cap at
the same time, loses nothing (each allocation has its own bucket); every packet the cap refused is
counted as `stunner_listener_dropped_packets{reason="bandwidth"}`. The cap then changes in place (a
new config applied to the same stunnerd, the same allocation): the rate follows the new cap.

The rates are set by pacing the senders; the measure is the peer's (bytes between two arrivals
over the time between them), so a busy machine slows what is sent, not what is measured,
as long as the senders stay above the cap.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stunner_api.ice import ephemeral_password, ephemeral_username
from stunner_api.stun import Class, Message, Method
from stunnerd.process.daemon import Stunner
from stunnerd.surface.metrics import render_metrics
from stunnerd.transport import native
from tests.support.netns import loopback_up, run_in_new_namespace
from tests.support.turnclient import (
    HOST,
    REALM,
    SECRET,
    Peer,
    RawClient,
    RawTcpClient,
    error_code,
    free_port,
    make_config,
    running_stunner,
    start_peer,
)

from .test_offload_program import unavailable as offload_unavailable

CAP = 800_000  # bits per second: 100 kB/s
NEW_CAP = 1_600_000  # 200 kB/s
PAYLOAD = 1000  # bytes of each ChannelData's payload
CHANNEL = 0x4000
WARM_UP = 0.5  # seconds of arrivals left out: the bucket's initial burst (0.2 s of the cap)
WINDOW = 3.0  # seconds measured


def capped_config(port: int, limit: int, protocol: str) -> Any:
    auth = {
        "type": "ephemeral",
        "realm": REALM,
        "credentials": {"secret": SECRET},
        "allocation_bandwidth_limit": limit,
    }
    return make_config(port, ["127.0.0.0/8"], auth=auth, protocols=(protocol,))


def dropped_for_bandwidth(stunner: Stunner, listener: str) -> float:
    """stunner_listener_dropped_packets_total{reason="bandwidth"} of the listener (/metrics)."""
    families = text_string_to_metric_families(render_metrics(stunner))
    family = next(f for f in families if f.name == "stunner_listener_dropped_packets")
    return sum(
        s.value
        for s in family.samples
        if s.labels == {"name": listener, "reason": "bandwidth"} and s.name.endswith("_total")
    )


class Arrivals(Peer):
    """The peer: when each relayed datagram arrived, by the relay address it came from."""

    def __init__(self) -> None:
        super().__init__(echo=False)
        self.times: dict[tuple[str, int], list[float]] = {}

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.times.setdefault((addr[0], addr[1]), []).append(time.monotonic())

    def rate(self, relay: tuple[str, int], since: float) -> float | None:
        """Bytes per second from `relay` over WINDOW seconds starting at its first arrival
        at or after `since`; None until the window is complete."""
        times = [t for t in self.times.get(relay, []) if t >= since]
        if not times or times[-1] - times[0] < WINDOW:
            return None
        last = next(i for i, t in enumerate(times) if t - times[0] >= WINDOW)
        return last * PAYLOAD / (times[last] - times[0])  # packets after the first, in window


def user(user_id: str) -> dict[str, str]:
    """TURN REST credentials of `user_id`, for an hour."""
    username = ephemeral_username(int(time.time()) + 3600, user_id)
    return {"username": username, "password": ephemeral_password(SECRET, username)}


async def peer_arrivals() -> Arrivals:
    loop = asyncio.get_running_loop()
    _, peer = await loop.create_datagram_endpoint(Arrivals, local_addr=(HOST, 0))
    return peer


async def channel_to(client: RawClient, peer_port: int, host: str = HOST) -> tuple[str, int]:
    """Allocate, permit and bind CHANNEL to the peer; the relay address."""
    response = await client.allocate()
    assert error_code(response) is None, response.attributes
    assert error_code(await client.channel_bind(CHANNEL, (host, peer_port))) is None
    relay: tuple[str, int] = response.attributes["XOR-RELAYED-ADDRESS"]
    return relay


async def send_paced(
    client: RawClient, per_second: int, sent: list[int], stop: asyncio.Event
) -> None:
    """ChannelData of PAYLOAD bytes at `per_second` packets a second (in 10 ms ticks, caught up
    after a slow tick), counted in sent[0], until `stop`."""
    payload = bytes(PAYLOAD)
    started = time.monotonic()
    while not stop.is_set():
        due = int((time.monotonic() - started) * per_second) - sent[0]
        for _ in range(max(0, due)):
            client.send_channel_data(CHANNEL, payload)
            sent[0] += 1
        await asyncio.sleep(0.01)


async def wait_until(predicate: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)
    return value


async def measured(peer: Arrivals, relay: tuple[str, int]) -> float:
    since = time.monotonic() + WARM_UP
    return float(await wait_until(lambda: peer.rate(relay, since), timeout=60.0))


@pytest.mark.parametrize("protocol", ["TURN-UDP", "TURN-TCP"])
def test_a_capped_allocation_relays_at_its_cap_and_another_is_unaffected(
    relay_path: str, protocol: str
) -> None:
    client = RawClient if protocol == "TURN-UDP" else RawTcpClient
    listener = f"testns/gw/{protocol.lower()}"

    async def scenario() -> None:
        port = free_port()
        async with running_stunner(capped_config(port, CAP, protocol)) as stunner:
            peer = await peer_arrivals()
            heavy = await client.connect((HOST, port), **user("alice"))
            light = await client.connect((HOST, port), **user("bob"))
            stop = asyncio.Event()
            senders: list[asyncio.Task[None]] = []
            try:
                heavy_relay = await channel_to(heavy, peer.port)
                light_relay = await channel_to(light, peer.port)
                heavy_sent, light_sent = [0], [0]
                rate = CAP / 8
                senders = [
                    asyncio.create_task(
                        send_paced(heavy, int(3 * rate / PAYLOAD), heavy_sent, stop)
                    ),
                    asyncio.create_task(
                        send_paced(light, int(rate / 2 / PAYLOAD), light_sent, stop)
                    ),
                ]
                got = await measured(peer, heavy_relay)
                assert abs(got - rate) <= 0.05 * rate, (relay_path, got, rate)

                # In place: the same stunnerd, the same allocation, a new cap.
                await stunner.apply(capped_config(port, NEW_CAP, protocol))
                got = await measured(peer, heavy_relay)
                new_rate = NEW_CAP / 8
                assert abs(got - new_rate) <= 0.05 * new_rate, (relay_path, got, new_rate)

                stop.set()
                await asyncio.gather(*senders)
                # Every packet accounted for: at the peer, or dropped for its cap.
                await wait_until(lambda: len(peer.times.get(light_relay, [])) == light_sent[0])
                await wait_until(
                    lambda: (
                        len(peer.times.get(heavy_relay, []))
                        + dropped_for_bandwidth(stunner, listener)
                        >= heavy_sent[0] - 5
                    ),
                )
                refused = heavy_sent[0] - len(peer.times[heavy_relay])
                assert refused > heavy_sent[0] / 3, (heavy_sent, refused)
                assert refused - 5 <= dropped_for_bandwidth(stunner, listener) <= refused
            finally:
                stop.set()
                for task in senders:
                    task.cancel()
                heavy.close()
                light.close()
                peer.close()

    asyncio.run(scenario())


# --- the kernel offload declines capped allocations ------------------------------------------


def offloaded_config(port: int, limit: int) -> Any:
    auth = {"type": "ephemeral", "realm": REALM, "credentials": {"secret": SECRET}}
    admin = {"offload_engine": "TC", "offload_interfaces": ["lo"]}
    return make_config(
        port,
        ["127.0.0.2/32"],
        auth={**auth, "allocation_bandwidth_limit": limit},
        protocols=("TURN-UDP",),
        admin=admin,
    )


async def offload_session() -> dict[str, Any]:
    """One allocation with a channel to a peer the offload would carry, under a cap, without
    it, and under it again (in place): the kernel's channels each time, and what the peer got."""
    port = free_port()
    peer = await start_peer(echo=False, host="127.0.0.2")
    kernel: dict[str, list[int]] = {}
    async with running_stunner(offloaded_config(port, CAP)) as stunner:
        client = await RawClient.connect((HOST, port), **user("alice"))

        async def channels(stage: str) -> None:
            client.send_channel_data(CHANNEL, stage.encode())
            # answered after the ChannelData was handled (one client, one socket, in order)
            await client.request(Message(Method.BINDING, Class.REQUEST), sign=False)
            loaded = stunner.core.offload.loaded
            assert loaded is not None, "the offload is on"
            maps = loaded.maps
            kernel[stage] = [int.from_bytes(k[-4:-2], "big") for k in maps["from_clients"].keys()]

        await channel_to(client, peer.port, "127.0.0.2")
        await channels("capped")
        await stunner.apply(offloaded_config(port, 0))
        await channels("uncapped")
        await stunner.apply(offloaded_config(port, CAP))
        await channels("capped again")
        await wait_until(lambda: len(peer.received) == 3, timeout=5.0)
        client.close()
    peer.close()
    return {"kernel": kernel, "peer got": sorted(data.decode() for data, _ in peer.received)}


def offload_declines() -> None:
    loopback_up()
    sys.stdout.write(json.dumps(asyncio.run(offload_session())))


@pytest.mark.skipif(not native.available(), reason=f"native: {native.unavailable_reason()}")
def test_the_kernel_offload_leaves_a_capped_allocation_to_the_engine() -> None:
    """The kernel has no bucket: with the offload on, a capped allocation's channel gets no
    route in the kernel (the native engine relays it, under its cap), gets one once the cap is
    lifted in place, and loses it when the cap comes back; nothing is lost meanwhile."""
    reason = offload_unavailable()
    if reason is not None:
        pytest.skip(reason)
    result = json.loads(run_in_new_namespace(__name__, "offload_declines"))
    assert result["kernel"] == {"capped": [], "uncapped": [CHANNEL], "capped again": []}
    assert result["peer got"] == ["capped", "capped again", "uncapped"]
