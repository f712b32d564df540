"""Issue 28 #6: stateless nonces and the stateless 401, in Python and in the native engine.

The nonce is hex(expiry) and an HMAC over it and a binding (the listener's name, the client's
IP and port), keyed by a secret every process of a stunnerd shares: two managers, or two
engines, with the same secret verify each other's nonces, and nothing else verifies them (a
forged MAC, an expired nonce, another address or listener, another secret). The engine's
nonces are Python's byte for byte, and so is its 401. On real loopback sockets: an engine
answers a stranger's unsigned Allocate itself within its budget, and a stranger's request whose
nonce verifies is handed up through the signed queue, ahead of a full strangers' queue.
"""

from __future__ import annotations

import hmac
import socket
import time
from typing import Any

import pytest

from stunner_api import stun
from stunner_api.stun import Class, Message, Method
from stunnerd.transport import native
from stunnerd.turn.auth import NonceManager, nonce_binding
from stunnerd.turn.limits import Limits
from stunnerd.turn.stateless import UnsignedBudget, unauthorized, unsigned_allocate
from tests.support import flood

from .test_native_relay import Rig, drops, udp, wait_for

SECRET = b"s" * 32
LISTENER = "testns/gw/turn-udp"
REALM = "stunner.l7mp.io"
CLIENT = ("127.0.0.3", 40000)


def needs_native() -> None:
    if not native.available():
        pytest.skip(f"native relay: {native.unavailable_reason()}")


def allocate(signed_with: str | None = None) -> bytes:
    request = Message(Method.ALLOCATE, Class.REQUEST)
    request.attributes["REQUESTED-TRANSPORT"] = 17
    if signed_with is None:
        return request.encode()
    request.attributes.update(USERNAME="user", REALM=REALM, NONCE=signed_with)
    return request.encode(integrity_key=b"k" * 16)  # the engine verifies the nonce, not this


# --- the nonce, in Python ---------------------------------------------------------------------


def test_managers_that_share_the_secret_verify_each_others_nonces() -> None:
    """As a UDP worker process and the primary do: the 401 from one, the retry to another."""
    binding = nonce_binding(LISTENER, CLIENT)
    issued = NonceManager(SECRET).issue(binding)
    assert NonceManager(SECRET).is_valid(issued, binding)
    assert not NonceManager(b"another secret").is_valid(issued, binding)


def test_a_forged_expired_or_misbound_nonce_is_refused() -> None:
    now = [1_800_000_000.0]
    nonces = NonceManager(SECRET, lifetime=600, clock=lambda: now[0])
    binding = nonce_binding(LISTENER, CLIENT)
    issued = nonces.issue(binding)
    assert nonces.is_valid(issued, binding)
    forged = issued[:-1] + ("0" if issued[-1] != "0" else "1")
    longer = f"{int(issued[:16], 16) + 1:016x}" + issued[16:]  # a later expiry, the same MAC
    for bad in (forged, longer, issued.upper(), issued[:-2], "", None):
        assert not nonces.is_valid(bad, binding), bad
    for other in (("127.0.0.3", 40001), ("127.0.0.4", 40000), ("::ffff:127.0.0.4", 40000)):
        assert not nonces.is_valid(issued, nonce_binding(LISTENER, other)), other
    assert not nonces.is_valid(issued, nonce_binding("testns/gw/other", CLIENT))
    now[0] += 600  # its expiry: stale (438)
    assert not nonces.is_valid(issued, binding)


def test_the_mac_is_hmac_sha256_of_the_expiry_and_the_binding() -> None:
    for secret in (b"k", SECRET, b"x" * 64, b"y" * 65, b"z" * 200):  # keys longer than a block
        binding = nonce_binding(LISTENER, CLIENT)
        issued = NonceManager(secret).issue(binding)
        text = issued[:16].encode() + b"\0" + binding
        assert issued[16:] == hmac.digest(secret, text, "sha256")[:16].hex()


def test_the_binding_is_the_listener_the_ip_as_16_bytes_and_the_port() -> None:
    v4 = nonce_binding("l", ("127.0.0.3", 258))
    assert v4 == b"l\0" + bytes(10) + b"\xff\xff" + bytes((127, 0, 0, 3)) + b"\x01\x02"
    assert nonce_binding("l", ("::ffff:127.0.0.3", 258)) == v4  # one client, either socket
    assert nonce_binding("l", ("fe80::1%lo", 1)) == nonce_binding("l", ("fe80::1", 1))


# --- the 401 and the budgets, in Python -------------------------------------------------------


def test_the_stateless_401_is_the_codec_s_401() -> None:
    request = allocate()
    nonce = NonceManager(SECRET).issue(nonce_binding(LISTENER, CLIENT))
    expected = Message(Method.ALLOCATE, Class.ERROR, request[8:20])
    expected.attributes.update({"ERROR-CODE": (401, "Unauthenticated"), "REALM": REALM})
    expected.attributes["NONCE"] = nonce
    assert unauthorized(request, REALM, nonce) == expected.encode(fingerprint=True)


def test_which_unsigned_requests_are_answered_without_state() -> None:
    request = Message(Method.ALLOCATE, Class.REQUEST)
    request.attributes["REQUESTED-TRANSPORT"] = 17
    plain, data = request.encode(fingerprint=False), request.encode()
    assert unsigned_allocate(plain, 64) and unsigned_allocate(data, 64)
    assert not unsigned_allocate(data[:-1] + bytes([data[-1] ^ 1]), 64)  # a bad FINGERPRINT
    longer = (len(data) - 20 + 4).to_bytes(2, "big")
    assert not unsigned_allocate(data[:2] + longer + data[4:] + b"\0\x22\0\0", 64)  # not last
    assert not unsigned_allocate(allocate(signed_with="n" * 48), 64)  # MESSAGE-INTEGRITY
    assert not unsigned_allocate(Message(Method.BINDING, Class.REQUEST).encode(), 64)
    assert not unsigned_allocate(plain[:-4], 64)  # the length does not match
    assert not unsigned_allocate(plain[:2] + b"\x00\x0c" + plain[4:] + b"\0\x22\0\x10", 64)
    assert unsigned_allocate(data, 2) and not unsigned_allocate(data, 1)  # with FINGERPRINT


def test_the_unsigned_budgets_are_per_source_ip_then_per_process() -> None:
    now = [0.0]
    budget = UnsignedBudget(
        Limits(unauthenticated_rate=1, unauthenticated_rate_total=3), 16, clock=lambda: now[0]
    )
    assert budget.admit(("127.0.0.2", 1)) and budget.admit(("127.0.0.2", 2))  # its burst: 2
    assert not budget.admit(("127.0.0.2", 3))
    # The process's burst of 6: 2 spent, 4 left for the others, whatever their source.
    assert [budget.admit((f"127.64.0.{i}", 9)) for i in range(6)] == [True] * 4 + [False] * 2
    now[0] += 1.0  # a second: three tokens back
    assert [budget.admit((f"127.65.0.{i}", 9)) for i in range(4)] == [True] * 3 + [False]


# --- the engine -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "client", [("127.0.0.3", 40000), ("::ffff:127.0.0.3", 40000), ("2001:db8::7", 1)]
)
def test_the_engine_s_nonces_are_python_s(client: tuple[str, int]) -> None:
    needs_native()
    from stunnerd import _relay

    now = time.time()
    nonces = NonceManager(SECRET, lifetime=600, clock=lambda: now)
    binding = nonce_binding(LISTENER, client)
    name = LISTENER.encode()
    issued = _relay.issue_nonce(SECRET, 600.0, name, client, now)
    assert issued == nonces.issue(binding)
    assert _relay.nonce_valid(SECRET, 600.0, name, client, nonces.issue(binding), now)
    forged = issued[:-1] + ("0" if issued[-1] != "0" else "1")
    assert not _relay.nonce_valid(SECRET, 600.0, name, client, forged, now)
    assert not _relay.nonce_valid(SECRET, 600.0, name, (client[0], 2), issued, now)
    assert not _relay.nonce_valid(SECRET, 600.0, b"other", client, issued, now)
    assert not _relay.nonce_valid(b"other secret", 600.0, name, client, issued, now)
    assert not _relay.nonce_valid(SECRET, 600.0, name, client, issued, now + 600)  # expired


def answering_rig(**engine: Any) -> Rig:
    rig = Rig(**engine)
    rig.engine.answer_unsigned(SECRET, 600.0, LISTENER, REALM)
    return rig


def test_the_engine_answers_a_stranger_s_unsigned_allocate_itself() -> None:
    needs_native()
    rig = answering_rig()
    stranger = udp(host="127.0.0.3")
    try:
        request = allocate()
        stranger.sendto(request, rig.server)
        answer, source = stranger.recvfrom(2048)
        assert source == rig.server
        message = stun.parse_message(answer)
        nonce = message.attributes["NONCE"]
        assert answer == unauthorized(request, REALM, nonce)  # Python's 401, byte for byte
        binding = nonce_binding(LISTENER, stranger.getsockname())
        assert NonceManager(SECRET).is_valid(nonce, binding)  # Python verifies it
        # the engine counts its send after the datagram left: the client can be first
        wait_for(lambda: rig.engine.counters().tx_packets == 1, "the 401 counted")
        counters = rig.engine.counters()
        assert (counters.answered, counters.handed_up) == (1, 0)
        assert (counters.rx_packets, counters.tx_packets) == (1, 1)
        rig.engine.stop_answering()  # STUN-only mode: Python answers (403)
        stranger.sendto(request, rig.server)
        assert [up.data for up in rig.handed_up()] == [request]
    finally:
        stranger.close()
        rig.close()


def test_past_the_engine_s_budget_unsigned_messages_are_dropped() -> None:
    needs_native()
    rig = answering_rig(unsigned_rate=1.0)  # a burst of 2 for every source together
    strangers = [udp(host=f"127.0.0.{10 + i}") for i in range(5)]
    try:
        for stranger in strangers:
            stranger.sendto(allocate(), rig.server)
        drops(rig, unauthenticated_total=3)
        assert rig.engine.counters().answered == 2
    finally:
        for stranger in strangers:
            stranger.close()
        rig.close()


def test_two_engines_share_nonces_and_a_signed_request_skips_a_full_strangers_queue() -> None:
    """The 401 from one engine (one UDP process), the signed retry to another: its nonce
    verifies there and it goes up through the signed queue, while unsigned Bindings from
    strangers fill the strangers' queue (dropped: queue_full); a forged nonce does not."""
    needs_native()
    first, second = answering_rig(), answering_rig(queue_limit=8)
    stranger = udp(host="127.0.0.3")
    flooders = [udp(host="127.0.0.2") for _ in range(4)]
    try:
        stranger.sendto(allocate(), first.server)
        nonce = stun.parse_message(stranger.recvfrom(2048)[0]).attributes["NONCE"]
        binding = Message(Method.BINDING, Class.REQUEST).encode()
        for _ in range(5):
            for flooder in flooders:
                flooder.sendto(binding, second.server)
        drops(second, queue_full=20 - 8)
        forged = nonce[:-1] + ("0" if nonce[-1] != "0" else "1")
        stranger.sendto(allocate(signed_with=forged), second.server)
        drops(second, queue_full=20 - 8 + 1)
        signed = allocate(signed_with=nonce)
        stranger.sendto(signed, second.server)
        wait_for(lambda: second.engine.counters().handed_up == 8 + 1, "the signed request")
        first_up = second.engine.drain(1)
        assert [(up.address[0], up.data) for up in first_up] == [("::ffff:127.0.0.3", signed)]
        assert second.engine.counters().drops["queue_full"] == 13
    finally:
        for sock in (stranger, *flooders):
            sock.close()
        first.close()
        second.close()


def test_a_realm_too_long_for_the_engine_is_refused() -> None:
    needs_native()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        relay = native.NativeRelay(sock)
        try:
            with pytest.raises(ValueError, match="realm of at most 128 bytes"):
                relay.answer_unsigned(SECRET, 600.0, LISTENER, "r" * 129)
        finally:
            relay.close()


def test_the_engine_sheds_unsigned_messages_while_it_is_behind() -> None:
    """1,000 unsigned Allocates from as many IPs wait on the listener socket when the engine's
    thread starts: it answers the first 8 full reads of 32 (`shed_after`, 32 by default),
    then, behind, drops the rest as "shed" until a read finds fewer than 32 (the socket is
    empty): those it answers again (Python's path: SHED_AFTER)."""
    needs_native()
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    listener.bind(("127.0.0.1", 0))
    flooder = flood.burst(listener.getsockname()[1], 1000)
    relay = native.NativeRelay(listener, unsigned_rate=0.0, shed_after=8)
    try:
        relay.answer_unsigned(SECRET, 600.0, LISTENER, REALM)
        relay.start()
        wait_for(
            lambda: relay.counters().answered + relay.counters().drops["shed"] >= 1000 - 10,
            "the backlog read",
        )
        counters = relay.counters()
        assert 8 * 32 <= counters.answered < 9 * 32, counters.answered
        assert counters.drops["shed"] > 0  # the rest, unless the kernel dropped some
    finally:
        relay.close()
        listener.close()
        flooder.close()
