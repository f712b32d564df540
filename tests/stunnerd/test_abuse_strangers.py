"""Issue 20 #6 and #14 on both TURN-UDP relay paths (pure Python and the native engine).

#6: a stranger's (no allocation) STUN messages without MESSAGE-INTEGRITY are rate-limited per
source IP (any port) before they are parsed: one IP flooding unsigned Allocates gets its burst
answered and the rest dropped and counted (reason "rate_limit"), while a client of another IP
allocates, and the flooder's own signed request still goes through. Both paths answer exactly
the same number. #14: ChannelData of length 0 and a Send indication with an empty DATA are
relayed to the peer as a zero-length datagram, as coturn and pion/turn do.
"""

from __future__ import annotations

import asyncio

import pytest

from stunner_api import stun
from stunner_api.stun import Class, Message, Method
from stunnerd.process.daemon import Stunner
from stunnerd.transport.transports import has_integrity
from stunnerd.turn.limits import Limits, RateLimiter
from tests.support.turnclient import HOST, RawClient, start_peer

from .test_abuse_turn import _dropped, run

FLOODER = "127.0.0.2"  # the whole of 127/8 is on lo
HONEST = "127.0.0.3"


async def client_from(ip: str, port: int) -> RawClient:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_datagram_endpoint(
        lambda: RawClient((HOST, port)), local_addr=(ip, 0)
    )
    return client


def unsigned_allocate() -> bytes:
    request = Message(Method.ALLOCATE, Class.REQUEST)
    request.attributes["REQUESTED-TRANSPORT"] = 17
    return request.encode()


def test_one_ip_s_unauthenticated_flood_leaves_other_ips_their_allocations(
    relay_path: str,
) -> None:
    async def scenario(port: int, stunner: Stunner) -> None:
        flooders = [await client_from(FLOODER, port) for _ in range(3)]  # ports vary
        honest = await client_from(HONEST, port)
        try:
            for _ in range(10):
                for flooder in flooders:
                    flooder.send_raw(unsigned_allocate())
            await asyncio.sleep(0.3)
            answered = [len(flooder.raw) for flooder in flooders]
            # A burst of twice the rate for the IP, whatever the ports (its refill over the
            # milliseconds of the flood is far below a token).
            assert sum(answered) == 4, answered
            assert _dropped(stunner, "rate_limit") == 30 - 4
            # Another IP is served in full: its unsigned probe (a 401) and its signed Allocate.
            response = await honest.allocate()
            assert response.message_class == Class.SUCCESS, response.attributes
            # The flooder's signed request carries MESSAGE-INTEGRITY: not the strangers' budget.
            signer = next(f for f in flooders if f.raw)
            signer.learn(stun.parse_message(signer.raw[0]))
            request = Message(Method.ALLOCATE, Class.REQUEST)
            request.attributes["REQUESTED-TRANSPORT"] = 17
            response = await signer.request(request)
            assert response.message_class == Class.SUCCESS, response.attributes
        finally:
            for client in (*flooders, honest):
                client.close()

    run(scenario, Limits(unauthenticated_rate=2))


def test_without_a_limit_every_unsigned_request_is_answered(relay_path: str) -> None:
    async def scenario(port: int, stunner: Stunner) -> None:
        flooder = await client_from(FLOODER, port)
        try:
            for _ in range(30):
                flooder.send_raw(unsigned_allocate())
            await asyncio.sleep(0.3)
            assert len(flooder.raw) == 30
            assert _dropped(stunner, "rate_limit") == 0
        finally:
            flooder.close()

    run(scenario, Limits(unauthenticated_rate=0))


@pytest.mark.parametrize("shape", ["channel_data", "send_indication"])
def test_a_zero_length_payload_is_relayed_as_an_empty_datagram(relay_path: str, shape: str) -> None:
    async def scenario(port: int, stunner: Stunner) -> None:
        peer = await start_peer(echo=False)
        assert peer.transport is not None
        peer_address = peer.transport.get_extra_info("sockname")
        client = await RawClient.connect((HOST, port))
        try:
            assert (await client.allocate()).message_class == Class.SUCCESS
            assert (await client.channel_bind(0x4000, peer_address)).message_class == (
                Class.SUCCESS
            )
            for payload in (b"", b"x", b""):
                if shape == "channel_data":
                    client.send_channel_data(0x4000, payload)
                else:
                    client.send_indication(peer_address, payload)
            for _ in range(100):
                if len(peer.received) == 3:
                    break
                await asyncio.sleep(0.02)
            assert [data for data, _ in peer.received] == [b"", b"x", b""]
        finally:
            client.close()
            peer.transport.close()

    run(scenario)


def test_message_integrity_is_found_by_walking_the_attribute_headers() -> None:
    allocate = Message(Method.ALLOCATE, Class.REQUEST)
    allocate.attributes.update({"REQUESTED-TRANSPORT": 17, "USERNAME": "u", "REALM": "r"})
    assert not has_integrity(allocate.encode())
    assert has_integrity(allocate.encode(integrity_key=b"k" * 16))
    header = allocate.encode()[:20]
    # An attribute whose length overruns the message ends the walk; MESSAGE-INTEGRITY as the
    # value of another attribute is not an attribute.
    assert not has_integrity(header + b"\x80\x22\x00\x08" + b"\x00\x08\x00\x14" + b"\0" * 4)
    assert has_integrity(header + b"\x00\x08\x00\x14")
    assert not has_integrity(header + b"\x00\x06\xff\xff" + b"\x00\x08\x00\x14")


def test_the_bucket_table_forgets_full_buckets_then_starts_afresh_when_all_are_live() -> None:
    now = [0.0]
    limiter = RateLimiter(1.0, clock=lambda: now[0], max_keys=2)
    assert limiter.allow("a") and limiter.allow("b")
    now[0] = 1.0  # both buckets refilled: forgotten for a third key, nothing lost
    assert limiter.allow("c")
    assert (len(limiter), limiter.resets) == (1, 0)
    assert limiter.allow("a")  # now two live buckets
    assert limiter.allow("d")  # no full one to forget: the table starts afresh
    assert (len(limiter), limiter.resets) == (1, 1)
    assert limiter.allow("d") and not limiter.allow("d")  # its burst of 2
