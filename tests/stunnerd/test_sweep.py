"""The once-a-second sweep passes by what has nothing due (issue 30): an allocation keeps the
earliest time anything of it expires (`Allocation.due`: its own lifetime, its permissions', its
channels'), so the sweep's cost is the allocations with something due, not all of them; the
response cache is swept from its oldest entry up to the first one still valid."""

from __future__ import annotations

import socket
import time
from collections import defaultdict

from stunnerd.turn.allocation import Allocation, Downstream, ListenerScope
from stunnerd.turn.auth import Authenticator
from stunnerd.turn.counters import ClusterCounters, ListenerCounters
from stunnerd.turn.router import Router
from stunnerd.turn.server import ServerContext, TurnServer

PEER = ("192.0.2.7", 5000)


def allocation(lifetime: int = 600) -> Allocation:
    scope = ListenerScope("ns/gw/udp", Router(), ListenerCounters(), defaultdict(ClusterCounters))
    downstream = Downstream(("192.0.2.1", 40000), lambda data: None, stream=False)
    return Allocation(scope, downstream, "user", "user", socket.AF_INET, lifetime)


def test_an_allocation_is_due_at_its_earliest_expiry_and_not_before() -> None:
    now = time.monotonic()
    held = allocation(600)
    assert now + 599 < held.due <= time.monotonic() + 600
    held.permit(PEER[0], now + 300)
    held.bind(0x4000, PEER, now + 200)
    assert held.due == now + 200
    held.permit("192.0.2.8", now + 400)  # a later expiry does not move it
    assert held.due == now + 200
    assert held.expire(now + 199) is False
    assert (held.permissions, held.channels) == (
        {PEER[0]: now + 300, "192.0.2.8": now + 400},
        {0x4000: (PEER, now + 200)},
    )
    assert held.expire(now + 200) is False  # the channel goes; next due: the first permission
    assert held.channels == {} and held.channel_by_peer == {}
    assert held.due == now + 300
    assert held.expire(now + 350) is False
    assert held.permissions == {"192.0.2.8": now + 400}
    assert held.due == now + 400
    held.refresh(0)  # a shorter lifetime is due at once
    assert held.due <= time.monotonic()
    assert held.expire(time.monotonic()) is True


def test_the_response_cache_is_swept_up_to_its_first_valid_entry() -> None:
    context = ServerContext(Authenticator("none", "realm", {}), Router())
    server = TurnServer("ns/gw/udp", "127.0.0.1", context)
    now = time.monotonic()
    server._responses.update(
        {
            (("192.0.2.1", 1), b"a" * 12): (now - 2, b"old"),
            (("192.0.2.1", 1), b"b" * 12): (now - 1, b"old"),
            (("192.0.2.1", 1), b"c" * 12): (now + 40, b"new"),
        }
    )
    server.sweep()
    assert list(server._responses) == [(("192.0.2.1", 1), b"c" * 12)]
