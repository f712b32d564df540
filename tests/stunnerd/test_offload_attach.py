"""The offload program attached (tcx ingress) to the loopback interface of a network namespace
the test makes, relaying between real UDP sockets: a client's ChannelData reaches the peer as
the peer's datagram from the relay address, the peer's answer reaches the client as ChannelData
from the listener, and neither the listener nor the relay socket sees them; counted per
allocation. When the process that attached it is killed (-9), nothing relays any more.

Each scenario runs in its own namespace (`unshare --net`, root), so nothing here touches the
machine's own interfaces.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from stunnerd.offload import attach, layout, program
from stunnerd.offload.layout import Route
from tests.support.netns import ROOT, loopback_up, run_in_new_namespace

from .test_offload_program import unavailable

CHANNEL = 0x4001
TIMEOUT = 10.0  # a bound on waiting for a datagram, never a pause

HOSTS = {
    socket.AF_INET: {"client": "127.0.0.2", "server": "127.0.0.1", "peer": "127.0.0.3"},
    socket.AF_INET6: {"client": "::1", "server": "::1", "peer": "::1"},
}


def in_new_namespace(function: str, *args: str) -> str:
    """Runs `function(*args)` of this module in a new network namespace; returns its output."""
    reason = unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the offload program: {reason}")
        pytest.skip(reason)
    return run_in_new_namespace(__name__, function, *args)


# What runs inside the namespace.


def bound(family: int, host: str) -> socket.socket:
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.bind((host, 0))
    s.settimeout(TIMEOUT)
    return s


def address(s: socket.socket) -> tuple[str, int]:
    host, port = s.getsockname()[:2]
    return host, port


def channel_data(data: bytes) -> bytes:
    return CHANNEL.to_bytes(2, "big") + len(data).to_bytes(2, "big") + data


class Sockets:
    """A client, a TURN-UDP listener, an allocation's relay socket and a peer."""

    def __init__(self, family: int) -> None:
        hosts = HOSTS[family]
        self.client = bound(family, hosts["client"])
        self.listener = bound(family, hosts["server"])
        self.relay = bound(family, hosts["server"])
        self.peer = bound(family, hosts["peer"])

    def routes(self) -> list[tuple[str, bytes, bytes]]:
        """The two map entries stunnerd would write for channel CHANNEL (slot 7)."""
        c, li, r, p = (address(s) for s in (self.client, self.listener, self.relay, self.peer))
        expires = time.monotonic_ns() + 60 * 10**9
        return [
            ("from_clients", layout.client_key(c, li, CHANNEL), Route(r, p, expires, 7).pack()),
            (
                "from_peers",
                layout.peer_key(p, r),
                Route(li, c, expires, 7, channel=CHANNEL).pack(),
            ),
        ]

    def nothing_for(self, *sockets: socket.socket) -> None:
        for s in sockets:
            s.setblocking(False)
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            raise AssertionError(f"{address(s)} received {data!r}")


def relay_both_ways(family_name: str) -> None:
    family = getattr(socket, family_name)
    loopback_up()
    loaded = program.load()
    attached = attach.attach_tc(loaded.fd, "lo")
    s = Sockets(family)
    for name, key, value in s.routes():
        loaded.maps[name].update(key, value)
    for size in (0, 1, 160, 1200, 2048):
        data = os.urandom(size)
        s.client.sendto(channel_data(data), address(s.listener))
        got, sender = s.peer.recvfrom(65536)
        assert (got, sender[:2]) == (data, address(s.relay)), (size, got[:8], sender)
        answer = os.urandom(size)
        s.peer.sendto(answer, address(s.relay))
        got, sender = s.client.recvfrom(65536)
        assert (got, sender[:2]) == (channel_data(answer), address(s.listener)), size
    s.nothing_for(s.listener, s.relay)
    used = layout.Usage.unpack(loaded.maps["usage"].lookup(layout.SLOT.pack(7)) or b"")
    total = 0 + 1 + 160 + 1200 + 2048
    assert used == layout.Usage(5, total, 5, total), used
    attached.close()
    loaded.close()
    sys.stdout.write("relayed\n")


OWNER = """
import sys
from stunnerd.offload import attach, program
loaded = program.load()
attached = attach.attach_tc(loaded.fd, "lo")
for line in sys.stdin:
    if line.strip() == "go":
        print("ready", flush=True)
        break
    name, key, value = line.split()
    loaded.maps[name].update(bytes.fromhex(key), bytes.fromhex(value))
sys.stdin.read()  # holds the link until killed
"""


def nothing_relays_after_the_owner_is_killed() -> None:
    loopback_up()
    s = Sockets(socket.AF_INET)
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert owner.stdin is not None and owner.stdout is not None
    for name, key, value in s.routes():
        owner.stdin.write(f"{name} {key.hex()} {value.hex()}\n")
    owner.stdin.write("go\n")
    owner.stdin.flush()
    assert owner.stdout.readline().strip() == "ready"
    s.client.sendto(channel_data(b"while it runs"), address(s.listener))
    assert s.peer.recvfrom(65536)[0] == b"while it runs"
    owner.kill()
    owner.wait()
    s.client.sendto(channel_data(b"after"), address(s.listener))
    got, sender = s.listener.recvfrom(65536)
    assert (got, sender[:2]) == (channel_data(b"after"), address(s.client))
    s.nothing_for(s.peer)
    sys.stdout.write("detached\n")


# The tests.


@pytest.mark.parametrize("family", ["AF_INET", "AF_INET6"])
def test_it_relays_between_real_sockets_both_ways(family: str) -> None:
    assert in_new_namespace("relay_both_ways", family).strip() == "relayed"


def test_a_killed_stunnerd_leaves_nothing_that_relays() -> None:
    assert in_new_namespace("nothing_relays_after_the_owner_is_killed").strip() == "detached"
