"""Bandwidth caps (issue 29; coturn's max-bps): auth.allocation_bandwidth_limit, on both relay
paths (pure Python and the native engine) of a TURN-UDP and a TURN-TCP listener, over real
sockets on loopback.

Two real TURN clients (two users: TURN REST credentials) of one stunnerd relay ChannelData to one
UDP peer. The capped client sends three times the cap; what reaches the peer, measured over 3 s once
the start's burst has passed, is never more than 5 % above the cap and within 5 % of it (in one of
at most three consecutive windows: a busy machine may starve a sender longer than the burst); the
other client, sending half the cap at the same time, loses nothing (each allocation has its own
bucket); every packet the cap refused is counted as
`stunner_listener_dropped_packets{reason="bandwidth"}`. The cap then changes in place (a new config
applied to the same stunnerd, the same allocation): the rate follows the new cap.

The senders pace themselves and the receivers note arrival times in threads of their own (the
event loop, which runs stunnerd's Python path too, pauses on a busy machine); the measure is
the receiver's: the bytes between two arrivals over the time between them.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stunner_api import stun
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
WINDOWS = 3  # consecutive windows, at most, for one within 5 % of the cap (assert_capped)


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


class Arrivals(threading.Thread):
    """Reads a UDP socket in a thread of its own (the event loop's pauses do not delay the
    clock), noting when each datagram arrived, by its source."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(daemon=True)
        sock.settimeout(0.1)
        self.sock = sock
        self.times: dict[tuple[str, int], list[float]] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                _, addr = self.sock.recvfrom(65536)
            except TimeoutError:
                continue
            self.times.setdefault((addr[0], addr[1]), []).append(time.monotonic())

    @property
    def port(self) -> int:
        port: int = self.sock.getsockname()[1]
        return port

    def count(self, source: tuple[str, int] | None = None) -> int:
        if source is None:
            return sum(len(times) for times in self.times.values())
        return len(self.times.get(source, []))

    def window(self, source: tuple[str, int] | None, since: float) -> tuple[float, float] | None:
        """Bytes per second from `source` (None: any) over WINDOW seconds starting at its first
        arrival at or after `since`, and when the window ended; None until it is complete."""
        if source is None:
            times = sorted(t for each in list(self.times.values()) for t in each if t >= since)
        else:
            times = [t for t in list(self.times.get(source, [])) if t >= since]
        if not times or times[-1] - times[0] < WINDOW:
            return None
        last = next(i for i, t in enumerate(times) if t - times[0] >= WINDOW)
        # the packets after the first, over the time from the first to the last
        return last * PAYLOAD / (times[last] - times[0]), times[last]

    def stop(self) -> None:
        self.stopping.set()
        if self.ident is not None:  # started
            self.join()
        self.sock.close()


class Sender(threading.Thread):
    """Sends `frame` `per_second` times a second, in a thread of its own (2 ms ticks; after a
    pause, at most 0.1 s worth at once), on a duplicate of a socket, until stopped."""

    def __init__(self, sock: socket.socket, frame: bytes, per_second: int, to: Any) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket(fileno=os.dup(sock.fileno()))
        self.sock.settimeout(1.0)  # non-blocking underneath, as the event loop wants it
        self.frame, self.per_second, self.to = frame, per_second, to
        self.sent = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        while not self.stopping.is_set():
            due = int((time.monotonic() - started) * self.per_second) - self.sent
            for _ in range(min(due, self.per_second // 10)):
                if self.to is None:
                    self.sock.sendall(self.frame)
                else:
                    self.sock.sendto(self.frame, self.to)
                self.sent += 1
            time.sleep(0.002)

    def stop(self) -> None:
        self.stopping.set()
        if self.ident is not None:  # started
            self.join()
        self.sock.close()


def client_sender(client: RawClient, per_second: int) -> Sender:
    """ChannelData of PAYLOAD bytes on CHANNEL from the client's own socket (its 5-tuple)."""
    frame = stun.pack_channel_data(CHANNEL, bytes(PAYLOAD), pad=True)
    if isinstance(client, RawTcpClient):
        assert client.writer is not None
        return Sender(client.writer.get_extra_info("socket"), frame, per_second, None)
    assert client.transport is not None
    return Sender(client.transport.get_extra_info("socket"), frame, per_second, client.server)


def user(user_id: str) -> dict[str, str]:
    """TURN REST credentials of `user_id`, for an hour."""
    username = ephemeral_username(int(time.time()) + 3600, user_id)
    return {"username": username, "password": ephemeral_password(SECRET, username)}


def peer_arrivals(host: str = HOST) -> Arrivals:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, 0))
    peer = Arrivals(sock)
    peer.start()
    return peer


async def channel_to(client: RawClient, peer_port: int, host: str = HOST) -> tuple[str, int]:
    """Allocate, permit and bind CHANNEL to the peer; the relay address."""
    response = await client.allocate()
    assert error_code(response) is None, response.attributes
    assert error_code(await client.channel_bind(CHANNEL, (host, peer_port))) is None
    relay: tuple[str, int] = response.attributes["XOR-RELAYED-ADDRESS"]
    return relay


async def wait_until(predicate: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)
    return value


async def assert_capped(arrivals: Arrivals, source: tuple[str, int] | None, rate: float) -> None:
    """Consecutive windows of arrivals from `source`: none above the cap by more than 5 %, and
    one of at most WINDOWS within 5 % of it (a window in which the machine starved a sender or
    stunnerd for longer than the burst falls short: the bucket cannot hold the time lost)."""
    since = time.monotonic() + WARM_UP
    rates: list[float] = []
    while len(rates) < WINDOWS:
        got, since = await wait_until(functools.partial(arrivals.window, source, since), 60.0)
        rates.append(got)
        assert got <= 1.05 * rate, (rates, rate)
        if got >= 0.95 * rate:
            return
    raise AssertionError(f"below the cap by more than 5 % in every window: {rates}, cap {rate}")


@pytest.mark.parametrize("protocol", ["TURN-UDP", "TURN-TCP"])
def test_a_capped_allocation_relays_at_its_cap_and_another_is_unaffected(
    relay_path: str, protocol: str
) -> None:
    client = RawClient if protocol == "TURN-UDP" else RawTcpClient
    listener = f"testns/gw/{protocol.lower()}"
    rate, new_rate = CAP / 8, NEW_CAP / 8  # bytes per second

    async def scenario() -> None:
        port = free_port()
        async with running_stunner(capped_config(port, CAP, protocol)) as stunner:
            peer = peer_arrivals()
            heavy = await client.connect((HOST, port), **user("alice"))
            light = await client.connect((HOST, port), **user("bob"))
            senders: list[Sender] = []
            try:
                heavy_relay = await channel_to(heavy, peer.port)
                light_relay = await channel_to(light, peer.port)
                senders = [
                    client_sender(heavy, int(3 * rate / PAYLOAD)),
                    client_sender(light, int(rate / 2 / PAYLOAD)),
                ]
                for sender in senders:
                    sender.start()
                await assert_capped(peer, heavy_relay, rate)

                # In place: the same stunnerd, the same allocation, a new cap.
                await stunner.apply(capped_config(port, NEW_CAP, protocol))
                await assert_capped(peer, heavy_relay, new_rate)

                for sender in senders:
                    sender.stop()
                heavy_sent, light_sent = senders[0].sent, senders[1].sent
                # Every packet accounted for: at the peer, or dropped for its cap.
                await wait_until(lambda: peer.count(light_relay) == light_sent)
                await wait_until(
                    lambda: (
                        peer.count(heavy_relay) + dropped_for_bandwidth(stunner, listener)
                        >= heavy_sent - 5
                    ),
                )
                refused = heavy_sent - peer.count(heavy_relay)
                assert refused > heavy_sent / 3, (heavy_sent, refused)
                assert refused - 5 <= dropped_for_bandwidth(stunner, listener) <= refused
            finally:
                for sender in senders:
                    sender.stop()
                heavy.close()
                light.close()
                peer.stop()

    asyncio.run(scenario())


def test_what_peers_send_a_capped_allocation_is_capped_too(relay_path: str) -> None:
    """The other direction: a peer sends three times the cap to a capped allocation's relay
    address; what reaches the client (ChannelData), over 3 s, is within 5 % of the cap, and
    the rest is counted as dropped for bandwidth."""
    listener = "testns/gw/turn-udp"

    async def scenario() -> None:
        port = free_port()
        async with running_stunner(capped_config(port, CAP, "TURN-UDP")) as stunner:
            peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            peer.bind((HOST, 0))
            client = await RawClient.connect((HOST, port), **user("alice"))
            sender: Sender | None = None
            arrivals: Arrivals | None = None
            try:
                relay = await channel_to(client, peer.getsockname()[1])
                # From here the client's socket is read by a thread (its clock is steadier).
                assert client.transport is not None
                cast(asyncio.ReadTransport, client.transport).pause_reading()
                own = client.transport.get_extra_info("socket")
                arrivals = Arrivals(socket.socket(fileno=os.dup(own.fileno())))
                arrivals.start()
                sender = flood = Sender(peer, bytes(PAYLOAD), int(3 * CAP / 8 / PAYLOAD), relay)
                flood.start()
                await assert_capped(arrivals, None, CAP / 8)
                flood.stop()
                received = arrivals
                await wait_until(
                    lambda: (
                        received.count() + dropped_for_bandwidth(stunner, listener)
                        >= flood.sent - 5
                    )
                )
                assert dropped_for_bandwidth(stunner, listener) > flood.sent / 3
            finally:
                if sender is not None:
                    sender.stop()
                if arrivals is not None:
                    arrivals.stop()
                client.close()
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
