"""Relay address discovery trusts nothing (security issue 28, finding 4), with real sockets.

A scripted STUN server on loopback answers a real daemon's question with each of the red
team's answers (0.0.0.0, 127.0.0.53, 224.0.0.1, 255.255.255.255, link-local, reserved, an IPv4
answer for IPv6 listeners), at start and at a re-check: stunnerd neither binds nor advertises
it, logs one WARNING for the kind however often it comes, and keeps serving Allocates at its
own address. An answer from another source (port or address) never reaches it: its socket is
connected to the server. A changed answer needs a second, agreeing one. And an acceptable
answer that is an address of this host is advertised, never bound (in a network namespace of
the test's own, whose loopback is given such an address).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from stunnerd.process.daemon import Stunner
from stunnerd.process.relay_discovery import RelayDiscovery, host_broadcasts, refusal
from tests.stunnerd.test_relay_discovery import ID, POD, adopted, config, discovery_log, relayed
from tests.support.ports import free_port
from tests.support.stunserver import FakeStunServer
from tests.support.turnclient import PASSWORD

POD6 = "::1"
GOOD = "203.0.113.7"
GOOD6 = "2001:db8::7"
NAME = f"{ID}/udp"
ROOT = Path(__file__).resolve().parents[2]
OWN = "10.99.0.1"  # an address of this host, in the network namespace of the test below
NOT_V6 = "not an IPv6 address, the listeners' family"

ATTACKS = [  # (the pod address, the STUN server's answer, how the refusal names it)
    (POD, "0.0.0.0", "an unspecified address"),
    (POD, "127.0.0.53", "a loopback address"),
    (POD, "224.0.0.1", "a multicast address"),
    (POD, "255.255.255.255", "a broadcast address"),
    (POD, "169.254.169.254", "a link-local address"),
    (POD, "240.0.0.1", "a reserved address"),
    (POD6, "203.0.113.7", NOT_V6),
    (POD6, "::ffff:203.0.113.7", NOT_V6),
    (POD6, "fe80::1", "a link-local address"),
    (POD6, "ff02::1", "a multicast address"),
]


@contextlib.asynccontextmanager
async def discovering(
    server: FakeStunServer, pod: str, timeouts: Sequence[float] = (0.5,)
) -> AsyncIterator[tuple[Stunner, RelayDiscovery, int]]:
    """A daemon with a TURN-UDP listener at `pod` that asks `server` (questions back to back)."""
    discovery = RelayDiscovery(
        server.address, pod, timeouts=timeouts, retry_after=0.01, recheck_after=0.01
    )
    stunner = Stunner(relay_discovery=discovery)
    port = free_port()
    try:
        await stunner.apply(config(pod, port))
        yield stunner, discovery, port
    finally:
        await stunner.close()
        server.close()


@pytest.mark.parametrize("phase", ["at start", "at a re-check"])
@pytest.mark.parametrize(("pod", "answer", "kind"), ATTACKS, ids=[a[1] for a in ATTACKS])
def test_a_refused_answer_is_neither_bound_nor_advertised(
    caplog: pytest.LogCaptureFixture, pod: str, answer: str, kind: str, phase: str
) -> None:
    kept = (GOOD6 if ":" in pod else GOOD) if phase == "at a re-check" else pod

    async def main() -> None:
        server = await FakeStunServer.start(pod)
        server.say(kept if phase == "at a re-check" else answer)
        async with discovering(server, pod) as (stunner, discovery, port):
            if phase == "at a re-check":
                await adopted(server, discovery, kept)
                server.say(answer)
            await server.requests_reach(server.requests + 4)  # three answers taken, at least
            assert server.answered.count(answer) >= 3
            assert discovery.discovered == (kept if phase == "at a re-check" else None)
            assert stunner.config is not None
            assert [lc.address for lc in stunner.config.listeners] == [kept]
            assert stunner.listeners[NAME].server.bind_ip == pod
            assert await relayed(pod, port) == kept

    warnings = discovery_log(caplog, logging.WARNING, main)
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("relay address discovery: STUN server ")
    assert warnings[0].endswith(
        f" answered {answer}, {kind}: refused, the relay address stays {kept}"
    )
    assert not any(PASSWORD in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("source", ["another port", "another address"])
def test_an_answer_from_another_source_never_reaches_it(
    caplog: pytest.LogCaptureFixture, source: str
) -> None:
    """Every request is answered with the right transaction id, but from a socket that is not
    the server's: the kernel drops it (the question's socket is connected), so the server
    counts as silent."""

    async def main() -> None:
        server = await FakeStunServer.start(POD)
        host, port = server.sockname
        await server.forge_from(*((host, 0) if source == "another port" else ("127.0.0.3", port)))
        server.say("198.51.100.66")
        async with discovering(server, POD, timeouts=(0.1, 0.1)) as (stunner, discovery, lport):
            await server.requests_reach(6)  # three questions of two requests, all answered
            assert server.answered == ["198.51.100.66"] * server.requests
            assert discovery.discovered is None
            assert stunner.listeners[NAME].server.bind_ip == POD
            assert await relayed(POD, lport) == POD

    warnings = discovery_log(caplog, logging.WARNING, main)
    assert len(warnings) == 1, warnings
    assert (
        ": no answer to 2 Binding requests (from 127.0.0.2); the relay address stays"
        in (warnings[0])
    )


@pytest.mark.parametrize("phase", ["at start", "at a re-check"])
def test_a_single_changed_answer_changes_nothing(
    caplog: pytest.LogCaptureFixture, phase: str
) -> None:
    """One answer of another address, then the old one again: never handed out, never a
    restart; logged as one WARNING. At start the first answer needs its confirmation too."""
    other = "198.51.100.9"

    async def main() -> None:
        server = await FakeStunServer.start(POD)
        server.say(GOOD if phase == "at a re-check" else other, GOOD)
        async with discovering(server, POD) as (stunner, discovery, port):
            await adopted(server, discovery, GOOD)
            listener = stunner.listeners[NAME]
            if phase == "at a re-check":
                server.say(other, GOOD)
            await server.requests_reach(server.requests + 4)
            assert server.answered.count(other) == 1
            assert discovery.discovered == GOOD
            assert stunner.listeners[NAME] is listener  # not restarted since
            assert await relayed(POD, port) == GOOD

    logged = discovery_log(caplog, logging.INFO, main)
    stays = GOOD if phase == "at a re-check" else POD
    unconfirmed = (
        f" answered {other}, then {GOOD}: a change needs two agreeing answers, the relay "
        f"address stays {stays}"
    )
    adoption = f" sees {POD} as {GOOD}, twice: the relay address of the listeners at {POD}"
    expected = [adoption, unconfirmed] if phase == "at a re-check" else [unconfirmed, adoption]
    assert len(logged) == 2, logged
    for message, ending in zip(logged, expected, strict=True):
        assert ending in message, logged
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in warnings] == [m for m in logged if unconfirmed in m]


async def own_address_scenario() -> None:
    """In a network namespace whose loopback also has 10.99.0.1: the STUN server answers that
    address of this host (an acceptable, private one); stunnerd advertises it and still binds
    the pod address, where Allocates keep coming."""
    server = await FakeStunServer.start(POD)
    server.say(OWN)
    async with discovering(server, POD) as (stunner, discovery, port):
        await adopted(server, discovery, OWN)
        assert stunner.listeners[NAME].server.bind_ip == POD
        assert await relayed(POD, port) == OWN


def test_an_answer_that_is_an_address_of_this_host_is_advertised_not_bound() -> None:
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True)
    if probe.returncode != 0 or shutil.which("ip") is None:
        pytest.skip(f"no network namespace here (unshare: {probe.stderr.strip()})")
    run = (
        "import asyncio; from tests.stunnerd.test_relay_discovery_trust import "
        "own_address_scenario as s; asyncio.run(s())"
    )
    script = f"ip link set lo up && ip addr add {OWN}/32 dev lo && exec {sys.executable} -c '{run}'"
    done = subprocess.run(
        ["unshare", "--net", "sh", "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("answer", "family", "refused"),
    [
        ("203.0.113.7", 4, None),  # documentation, but unicast: as good as any public address
        ("198.51.100.9", 4, None),
        ("10.0.0.3", 4, None),  # RFC 1918: a STUN server inside a private network sees it
        ("192.168.1.20", 4, None),
        ("100.64.0.7", 4, None),  # RFC 6598 (carrier-grade NAT)
        ("2001:db8::7", 6, None),
        ("fd00::2", 6, None),  # a unique local address, IPv6's private one
        ("0.0.0.0", 4, "an unspecified address"),
        ("0.1.2.3", 4, "an unspecified address"),  # 0.0.0.0/8, "this network"
        ("::", 6, "an unspecified address"),
        ("127.0.0.53", 4, "a loopback address"),
        ("::1", 6, "a loopback address"),
        ("169.254.0.1", 4, "a link-local address"),
        ("fe80::1", 6, "a link-local address"),
        ("239.255.255.250", 4, "a multicast address"),
        ("ff02::1", 6, "a multicast address"),
        ("255.255.255.255", 4, "a broadcast address"),
        ("192.0.2.255", 4, "a broadcast address"),  # this host's subnet's (given below)
        ("240.0.0.1", 4, "a reserved address"),
        ("100::1", 6, "a reserved address"),  # the discard-only block
        ("fec0::1", 6, "a reserved address"),  # site-local, deprecated
        ("2001:db8::7", 4, "not an IPv4 address, the listeners' family"),
        ("203.0.113.7", 6, NOT_V6),
        ("::ffff:10.0.0.3", 6, NOT_V6),  # IPv4-mapped: an IPv4 address
    ],
)
def test_what_an_answer_may_be(answer: str, family: int, refused: str | None) -> None:
    broadcasts = {ipaddress.IPv4Address("192.0.2.255")}
    assert refusal(answer, family, broadcasts) == refused


def test_the_broadcast_addresses_of_this_host_come_from_its_interfaces() -> None:
    """lo's 127.0.0.1/8 gives 127.255.255.255; no /31 or /32 network gives one."""
    broadcasts = host_broadcasts()
    assert ipaddress.IPv4Address("127.255.255.255") in broadcasts
    assert all(b.version == 4 for b in broadcasts)
