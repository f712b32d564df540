"""The native engine's budget for strangers' unauthenticated STUN (issue 20 #6), on real
loopback sockets: per source IP (any port), dropped and counted in the engine before Python
sees it; other IPs and signed messages go up; the bucket refills; the table of source IPs is
bounded; and one source IP holds at most its share of the strangers' queue.
"""

from __future__ import annotations

import socket
import time

import pytest

from stunner_api.stun import Class, Message, Method
from stunnerd.transport import native

from .test_native_relay import Rig, drops, udp, wait_for

pytestmark = pytest.mark.skipif(
    not native.available(), reason=f"native relay: {native.unavailable_reason()}"
)

FLOODER = "127.0.0.2"  # the whole of 127/8 is on lo
HONEST = "127.0.0.3"


def allocate(signed: bool = False) -> bytes:
    request = Message(Method.ALLOCATE, Class.REQUEST)
    request.attributes["REQUESTED-TRANSPORT"] = 17
    if signed:  # MESSAGE-INTEGRITY is looked for, not verified: Python verifies it
        request.attributes.update(USERNAME="user", REALM="realm", NONCE="nonce")
        return request.encode(integrity_key=b"k" * 16)
    return request.encode()


def handed_up_from(rig: Rig, count: int) -> list[str]:
    wait_for(lambda: rig.engine.counters().handed_up >= count, f"{count} handed up")
    return [up.address[0].removeprefix("::ffff:") for up in rig.engine.drain(1000)]


def send_all(sockets: list[socket.socket], rig: Rig, data: bytes, each: int) -> None:
    for _ in range(each):
        for sock in sockets:
            sock.sendto(data, rig.server)


def test_a_flooding_ip_is_dropped_in_the_engine_and_others_are_handed_up() -> None:
    rig = Rig(stranger_rate=1.0)  # a burst of 2 per source IP
    flooders = [udp(host=FLOODER) for _ in range(3)]  # one IP, three ports
    honest = udp(host=HONEST)
    try:
        send_all(flooders, rig, allocate(), 5)
        drops(rig, unauthenticated_rate=15 - 2)
        assert handed_up_from(rig, 2) == [FLOODER, FLOODER]
        honest.sendto(allocate(), rig.server)
        flooders[0].sendto(allocate(signed=True), rig.server)  # signed: not this budget
        rig.send(allocate())  # the client with an allocation: never a stranger
        assert sorted(handed_up_from(rig, 5)) == sorted([HONEST, FLOODER, "127.0.0.1"])
        drops(rig, unauthenticated_rate=13)
        counters = rig.engine.counters()
        assert counters.stranger_ips == 2 and counters.bucket_resets == 0
    finally:
        for sock in (*flooders, honest):
            sock.close()
        rig.close()


def test_the_bucket_refills_at_its_rate() -> None:
    rig = Rig(stranger_rate=1.0)
    flooder = udp(host=FLOODER)
    try:
        send_all([flooder], rig, allocate(), 4)
        drops(rig, unauthenticated_rate=2)
        assert len(handed_up_from(rig, 2)) == 2
        time.sleep(1.05)  # one token back (a lower bound: a slower machine only adds tokens)
        send_all([flooder], rig, allocate(), 1)
        assert handed_up_from(rig, 3) == [FLOODER]
    finally:
        flooder.close()
        rig.close()


def test_the_table_of_source_ips_is_bounded() -> None:
    """Full: its full buckets are forgotten (nothing is lost); all live: it starts afresh."""
    rig = Rig(stranger_rate=1000.0, stranger_ips=2)  # a bucket is full again 1 ms after use
    senders = [udp(host=f"127.0.0.{i}") for i in (4, 5, 6)]
    try:
        for sender in senders[:2]:
            sender.sendto(allocate(), rig.server)
        handed_up_from(rig, 2)
        time.sleep(0.01)
        senders[2].sendto(allocate(), rig.server)
        handed_up_from(rig, 3)
        counters = rig.engine.counters()
        assert (counters.stranger_ips, counters.bucket_resets) == (1, 0)
    finally:
        for sender in senders:
            sender.close()
        rig.close()
    rig = Rig(stranger_rate=1.0, stranger_ips=2)  # a used bucket stays live for a second
    senders = [udp(host=f"127.0.0.{i}") for i in (4, 5, 6)]
    try:
        for sender in senders:
            sender.sendto(allocate(), rig.server)
        handed_up_from(rig, 3)
        counters = rig.engine.counters()
        assert (counters.stranger_ips, counters.bucket_resets) == (1, 1)
        drops(rig)
    finally:
        for sender in senders:
            sender.close()
        rig.close()


def test_one_source_ip_holds_at_most_its_share_of_the_strangers_queue() -> None:
    rig = Rig(queue_limit=64, per_source=4)  # no rate: the queue share alone
    flooders = [udp(host=FLOODER) for _ in range(2)]
    honest = udp(host=HONEST)
    try:
        send_all(flooders, rig, allocate(signed=True), 10)  # signed: past any budget
        drops(rig, queue_full=20 - 4)
        honest.sendto(allocate(), rig.server)
        assert handed_up_from(rig, 5) == [FLOODER] * 4 + [HONEST]
        flooders[0].sendto(allocate(), rig.server)  # drained: its share is back
        assert handed_up_from(rig, 6) == [FLOODER]
    finally:
        for sock in (*flooders, honest):
            sock.close()
        rig.close()


def test_bad_stranger_limits_are_refused() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        with pytest.raises(ValueError, match="stranger_rate"):
            native.NativeRelay(sock, stranger_rate=-1)
        with pytest.raises(ValueError, match="stranger_ips"):
            native.NativeRelay(sock, stranger_ips=0)
