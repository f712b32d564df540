"""TURN protocol behaviour of stunnerd over real loopback sockets, request by request.

We test: Binding on UDP and TCP; the long-term credential dance (401 with REALM and NONCE, 400
on missing attributes, 438 on a stale nonce); every RFC 8656 error the server gives (403, 420,
437, 440, 441, 442, 443, 486, 400 on an unknown method); lifetimes; retransmitted requests
answered identically without a second allocation; CreatePermission with several peers (all or
nothing); Send and Data indications and ChannelData in both directions, with the per-packet
peer check on inbound traffic; and that malformed input never stops a listener.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import time
from collections.abc import Awaitable, Callable

import pytest

from stunner_api import stun
from stunner_api.stun import Class, Message, Method
from stunnerd.turn.auth import NonceManager
from stunnerd.turn.ledger import Reservations
from tests.support.turnclient import (
    HOST,
    REALM,
    RawClient,
    error_code,
    free_port,
    make_config,
    running_stunner,
    start_peer,
)

pytestmark = pytest.mark.usefixtures("relay_path")  # both relay paths: conftest.py

Scenario = Callable[[int, RawClient], Awaitable[None]]


def run_with_client(
    scenario: Scenario,
    endpoints: list[str] | None = None,
    user_quota: int = 0,
    nonces: NonceManager | None = None,
) -> None:
    async def main() -> None:
        port = free_port()
        config = make_config(port, endpoints or [f"{HOST}/32"], user_quota=user_quota)
        async with running_stunner(config, nonces=nonces):
            client = await RawClient.connect((HOST, port))
            try:
                await scenario(port, client)
            finally:
                client.close()

    asyncio.run(main())


def test_binding_over_udp_reports_the_client_address() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        response = await client.request(Message(Method.BINDING, Class.REQUEST), sign=False)
        assert response.message_class == Class.SUCCESS
        assert client.transport is not None
        assert response.attributes["XOR-MAPPED-ADDRESS"] == client.transport.get_extra_info(
            "sockname"
        )
        assert "FINGERPRINT" in response.attributes

    run_with_client(scenario)


def test_binding_over_tcp() -> None:
    async def main() -> None:
        port = free_port()
        async with running_stunner(make_config(port, [f"{HOST}/32"])):
            reader, writer = await asyncio.open_connection(HOST, port)
            request = Message(Method.BINDING, Class.REQUEST)
            # Two requests in one write, the second split across writes: framing must hold.
            second = Message(Method.BINDING, Class.REQUEST)
            data = request.encode() + second.encode()
            writer.write(data[:30])
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(data[30:])
            for expected in (request, second):
                header = await asyncio.wait_for(reader.readexactly(20), 2)
                body = await reader.readexactly(struct.unpack("!H", header[2:4])[0])
                response = stun.parse_message(header + body)
                assert response.transaction_id == expected.transaction_id
                assert response.attributes["XOR-MAPPED-ADDRESS"] == writer.get_extra_info(
                    "sockname"
                )
            writer.close()

    asyncio.run(main())


def test_unauthenticated_allocate_gets_401_with_realm_and_nonce() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        request = Message(Method.ALLOCATE, Class.REQUEST)
        request.attributes["REQUESTED-TRANSPORT"] = 17
        response = await client.request(request, sign=False)
        assert error_code(response) == 401
        assert response.attributes["REALM"] == REALM
        assert response.attributes["NONCE"]
        assert "MESSAGE-INTEGRITY" not in response.attributes

    run_with_client(scenario)


def test_integrity_without_username_gets_400() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        await client.allocate()  # learn realm and nonce
        request = Message(Method.REFRESH, Class.REQUEST)
        request.attributes["NONCE"] = client.nonce
        request.attributes["REALM"] = client.realm
        response = await client.request(
            request, sign=False, data=request.encode(integrity_key=client.key)
        )
        assert error_code(response) == 400

    run_with_client(scenario)


def test_allocate_success_and_signed_response() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        response = await client.allocate()
        assert response.message_class == Class.SUCCESS, response.attributes
        ip, relay_port = response.attributes["XOR-RELAYED-ADDRESS"]
        assert ip == HOST and relay_port not in (0, port)
        assert response.attributes["LIFETIME"] == 600
        assert response.check_integrity(client.key)

    run_with_client(scenario)


@pytest.mark.parametrize(("requested", "granted"), [(100, 600), (1200, 1200), (100000, 3600)])
def test_allocation_lifetime_is_clamped(requested: int, granted: int) -> None:
    async def scenario(port: int, client: RawClient) -> None:
        response = await client.allocate(LIFETIME=requested)
        assert response.attributes["LIFETIME"] == granted

    run_with_client(scenario)


def test_stale_nonce_gets_438_with_a_fresh_nonce() -> None:
    # The wall clock to begin with: on the native path the engine issues the first nonce
    # (issue 28), with the real time and this manager's lifetime.
    now = [time.time()]
    nonces = NonceManager(lifetime=60, clock=lambda: now[0])

    async def scenario(port: int, client: RawClient) -> None:
        assert (await client.allocate()).message_class == Class.SUCCESS
        old_nonce = client.nonce
        now[0] += 61  # the nonce expires
        request = Message(Method.REFRESH, Class.REQUEST)
        request.attributes["LIFETIME"] = 600
        response = await client.request(request)
        assert error_code(response) == 438
        assert response.attributes["NONCE"] != old_nonce
        assert response.attributes["REALM"] == REALM
        client.learn(response)
        retry = Message(Method.REFRESH, Class.REQUEST)
        retry.attributes["LIFETIME"] = 600
        assert (await client.request(retry)).message_class == Class.SUCCESS

    run_with_client(scenario, nonces=nonces)


def test_garbage_nonce_gets_438() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        await client.allocate()
        client.nonce = "not-a-nonce-we-issued"
        response = await client.request(Message(Method.REFRESH, Class.REQUEST))
        assert error_code(response) == 438

    run_with_client(scenario)


def test_retransmitted_allocate_gets_the_same_answer() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        first = await client.allocate()
        assert first.message_class == Class.SUCCESS
        again = Message(Method.ALLOCATE, Class.REQUEST, first.transaction_id)
        again.attributes["REQUESTED-TRANSPORT"] = 17
        repeat = await client.request(again)
        assert repeat.attributes == first.attributes
        # A new transaction on the same 5-tuple is an allocation mismatch.
        fresh = await client.allocate()
        assert error_code(fresh) == 437

    run_with_client(scenario)


def test_simultaneous_duplicate_allocates_make_one_allocation() -> None:
    async def main() -> None:
        port = free_port()
        async with running_stunner(make_config(port, [f"{HOST}/32"])) as stunner:
            client = await RawClient.connect((HOST, port))
            await client.allocate()  # learn the nonce; this creates the allocation
            await client.refresh(0)
            request = Message(Method.ALLOCATE, Class.REQUEST)
            request.attributes.update(
                {
                    "REQUESTED-TRANSPORT": 17,
                    "USERNAME": client.username,
                    "REALM": client.realm,
                    "NONCE": client.nonce,
                }
            )
            data = request.encode(integrity_key=client.key)
            for _ in range(3):
                client.send_raw(data)
            response = await client.request(request, data=data)
            assert response.message_class == Class.SUCCESS
            await asyncio.sleep(0.1)
            assert stunner.allocation_count == 1
            client.close()

    asyncio.run(main())


def test_refresh_zero_deletes_the_allocation() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        await client.allocate()
        response = await client.refresh(0)
        assert response.message_class == Class.SUCCESS
        assert response.attributes["LIFETIME"] == 0
        assert error_code(await client.create_permission((HOST, 9))) == 437
        # A new allocation on the same 5-tuple is possible again.
        assert (await client.allocate()).message_class == Class.SUCCESS

    run_with_client(scenario)


def test_requests_without_allocation_get_437() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        assert error_code(await client.refresh(600)) == 437
        assert error_code(await client.channel_bind(0x4000, (HOST, 9))) == 437

    run_with_client(scenario)


def test_tcp_relaying_requested_gets_442() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        response = await client.allocate(**{"REQUESTED-TRANSPORT": 6})
        assert error_code(response) == 442
        assert response.check_integrity(client.key)  # errors after authentication are signed

    run_with_client(scenario)


def test_missing_requested_transport_gets_400() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        await client.allocate()
        await client.refresh(0)
        request = Message(Method.ALLOCATE, Class.REQUEST)
        assert error_code(await client.authenticated(request)) == 400

    run_with_client(scenario)


def test_ipv6_relay_on_an_ipv4_listener_gets_440() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        response = await client.allocate(**{"REQUESTED-ADDRESS-FAMILY": 2})
        assert error_code(response) == 440

    run_with_client(scenario)


def test_peer_of_the_other_family_gets_443() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        await client.allocate()
        assert error_code(await client.create_permission(("::1", 5000))) == 443

    run_with_client(scenario)


def test_reservation_token_gets_508() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        response = await client.allocate(**{"RESERVATION-TOKEN": b"\x00" * 8})
        assert error_code(response) == 508

    run_with_client(scenario)


def test_even_port_with_r_bit_reserves_the_next_port_for_one_token() -> None:
    """RFC 8656 §7.2, §14.6, §14.9: the RTP/RTCP pair coturn's client asks for by default."""

    async def scenario(port: int, client: RawClient) -> None:
        first = await client.allocate(**{"EVEN-PORT": True})
        assert first.message_class == Class.SUCCESS, error_code(first)
        rtp_port = first.attributes["XOR-RELAYED-ADDRESS"][1]
        assert rtp_port % 2 == 0
        token = first.attributes["RESERVATION-TOKEN"]
        assert len(token) == 8
        rtcp = await RawClient.connect((HOST, port))
        second = await rtcp.allocate(**{"RESERVATION-TOKEN": token})
        assert second.message_class == Class.SUCCESS, error_code(second)
        assert second.attributes["XOR-RELAYED-ADDRESS"] == (HOST, rtp_port + 1)
        assert "RESERVATION-TOKEN" not in second.attributes
        third = await RawClient.connect((HOST, port))
        assert error_code(await third.allocate(**{"RESERVATION-TOKEN": token})) == 508  # once
        for other in (rtcp, third):
            other.close()

    run_with_client(scenario)


def test_the_reserved_port_relays_and_is_held_until_claimed() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        first = await client.allocate(**{"EVEN-PORT": True})
        reserved_port = first.attributes["XOR-RELAYED-ADDRESS"][1] + 1
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as squatter:
            with pytest.raises(OSError):
                squatter.bind((HOST, reserved_port))
        rtcp = await RawClient.connect((HOST, port))
        await rtcp.allocate(**{"RESERVATION-TOKEN": first.attributes["RESERVATION-TOKEN"]})
        peer = await start_peer()
        assert (await rtcp.channel_bind(0x4001, (HOST, peer.port))).message_class == Class.SUCCESS
        rtcp.send_channel_data(0x4001, b"rtcp")
        assert await asyncio.wait_for(rtcp.channel_data.get(), 2) == (0x4001, b"rtcp")
        assert peer.received[0][1][1] == reserved_port  # the peer saw the reserved port
        peer.close()
        rtcp.close()

    run_with_client(scenario)


def test_reservation_token_with_even_port_gets_400() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        response = await client.allocate(**{"RESERVATION-TOKEN": b"\x01" * 8, "EVEN-PORT": False})
        assert error_code(response) == 400

    run_with_client(scenario)


def test_an_unknown_token_is_logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(port: int, client: RawClient) -> None:
        with caplog.at_level(logging.INFO, logger="stunner.turn"):
            assert error_code(await client.allocate(**{"RESERVATION-TOKEN": b"x" * 8})) == 508
        assert any(
            r.levelno == logging.INFO and "508" in r.getMessage() and "token" in r.getMessage()
            for r in caplog.records
        )

    run_with_client(scenario)


def test_a_reservation_expires() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((HOST, 0))
        reservations = Reservations(lifetime=0.05)
        reservations.hold(b"token-01", sock)
        time.sleep(0.1)
        assert reservations.take(b"token-01") is None
        assert sock.fileno() == -1  # closed: the port is free again


def test_even_port_is_even() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        response = await client.allocate(**{"EVEN-PORT": False})
        assert response.message_class == Class.SUCCESS
        assert response.attributes["XOR-RELAYED-ADDRESS"][1] % 2 == 0

    run_with_client(scenario)


def test_other_username_on_the_allocation_gets_441() -> None:
    async def main() -> None:
        port = free_port()
        auth = {"type": "ephemeral", "realm": REALM, "credentials": {"secret": "s3cret"}}
        async with running_stunner(make_config(port, [f"{HOST}/32"], auth=auth)):
            from stunner_api.ice import ephemeral_password, ephemeral_username

            alice = ephemeral_username(int(time.time()) + 600, "alice")
            client = await RawClient.connect(
                (HOST, port), username=alice, password=ephemeral_password("s3cret", alice)
            )
            assert (await client.allocate()).message_class == Class.SUCCESS
            bob = ephemeral_username(int(time.time()) + 600, "bob")
            client.username, client.password = bob, ephemeral_password("s3cret", bob)
            assert error_code(await client.refresh(600)) == 441
            client.close()

    asyncio.run(main())


def test_user_quota_gets_486() -> None:
    async def main() -> None:
        port = free_port()
        async with running_stunner(make_config(port, [f"{HOST}/32"], user_quota=1)):
            first = await RawClient.connect((HOST, port))
            second = await RawClient.connect((HOST, port))
            assert (await first.allocate()).message_class == Class.SUCCESS
            assert error_code(await second.allocate()) == 486
            await first.refresh(0)  # the quota frees with the allocation
            assert (await second.allocate()).message_class == Class.SUCCESS
            first.close()
            second.close()

    asyncio.run(main())


def test_unknown_comprehension_required_attribute_gets_420() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        request = Message(Method.BINDING, Class.REQUEST)
        body = request.encode(fingerprint=False)
        body += struct.pack("!HH", 0x7ABC, 4) + b"\x00" * 4
        body = body[:2] + struct.pack("!H", len(body) - 20) + body[4:]
        response = await client.request(request, sign=False, data=body)
        assert error_code(response) == 420
        assert response.attributes["UNKNOWN-ATTRIBUTES"] == (0x7ABC,)
        # A comprehension-optional unknown attribute is simply ignored.
        request = Message(Method.BINDING, Class.REQUEST)
        body = request.encode(fingerprint=False) + struct.pack("!HH", 0x8ABC, 0)
        body = body[:2] + struct.pack("!H", len(body) - 20) + body[4:]
        response = await client.request(request, sign=False, data=body)
        assert response.message_class == Class.SUCCESS

    run_with_client(scenario)


def test_unknown_method_gets_400_with_that_method() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        tid = os.urandom(12)
        data = struct.pack("!HHI", 0x0020, 0, stun.COOKIE) + tid  # method 0x020, a request
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        client.raw.clear()
        client.send_raw(data)
        for _ in range(100):
            if client.raw:
                future.set_result(client.raw[0])
                break
            await asyncio.sleep(0.01)
        raw = await asyncio.wait_for(future, 1)
        assert struct.unpack("!H", raw[:2])[0] == 0x0020 | 0x0110
        assert raw[8:20] == tid
        assert struct.unpack("!HH", raw[20:24]) == (0x0009, 4 + len(b"Bad Request: unknown method"))
        assert raw[26:28] == b"\x04\x00"  # class 4, number 0

    run_with_client(scenario)


def test_create_permission_is_all_or_nothing() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        await client.allocate()
        # 127.0.0.1 is admitted, 127.0.0.3 is not: nothing is installed.
        response = await client.create_permission((HOST, 5000), ("127.0.0.3", 5000))
        assert error_code(response) == 403
        response = await client.create_permission((HOST, 5000), (HOST, 5001))
        assert response.message_class == Class.SUCCESS

    run_with_client(scenario, endpoints=[f"{HOST}/32"])


def test_channel_bind_rules() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        await client.allocate()
        assert error_code(await client.channel_bind(0x3FFF, (HOST, 5000))) == 400
        assert error_code(await client.channel_bind(0x8000, (HOST, 5000))) == 400
        assert (await client.channel_bind(0x4000, (HOST, 5000))).message_class == Class.SUCCESS
        # Refreshing the same binding is fine; rebinding either side elsewhere is not.
        assert (await client.channel_bind(0x4000, (HOST, 5000))).message_class == Class.SUCCESS
        assert error_code(await client.channel_bind(0x4000, (HOST, 5001))) == 400
        assert error_code(await client.channel_bind(0x4001, (HOST, 5000))) == 400
        assert error_code(await client.channel_bind(0x4002, ("127.0.0.9", 5000))) == 403

    run_with_client(scenario, endpoints=[f"{HOST}/32"])


def test_send_and_data_indications_both_ways() -> None:
    async def main() -> None:
        peer = await start_peer(echo=True)
        port = free_port()
        async with running_stunner(make_config(port, [f"{HOST}/32"])):
            client = await RawClient.connect((HOST, port))
            response = await client.allocate()
            relayed = response.attributes["XOR-RELAYED-ADDRESS"]
            # Without a permission the data is discarded.
            client.send_indication((HOST, peer.port), b"too early")
            await asyncio.sleep(0.1)
            assert peer.received == []
            assert (
                await client.create_permission((HOST, peer.port))
            ).message_class == Class.SUCCESS
            client.send_indication((HOST, peer.port), b"hello peer")
            indication = await asyncio.wait_for(client.indications.get(), 2)
            assert indication.method == Method.DATA
            assert indication.attributes["DATA"] == b"hello peer"
            assert indication.attributes["XOR-PEER-ADDRESS"] == (HOST, peer.port)
            assert peer.received[0] == (b"hello peer", relayed)
            # An unusual shape (SOFTWARE too) leaves the fast path for the full parser: relayed
            # all the same.
            unusual = Message(Method.SEND, Class.INDICATION)
            unusual.attributes.update(
                {"XOR-PEER-ADDRESS": (HOST, peer.port), "DATA": b"via the parser", "SOFTWARE": "t"}
            )
            client.send_raw(unusual.encode())
            indication = await asyncio.wait_for(client.indications.get(), 2)
            assert indication.attributes["DATA"] == b"via the parser"
            client.close()
        peer.close()

    asyncio.run(main())


def test_inbound_packets_are_checked_per_packet() -> None:
    async def main() -> None:
        admitted = await start_peer(echo=False)
        outside = await start_peer(echo=False)
        port = free_port()
        endpoint = f"{HOST}/32:<{admitted.port}-{admitted.port}>"
        async with running_stunner(make_config(port, [endpoint])):
            client = await RawClient.connect((HOST, port))
            relayed = (await client.allocate()).attributes["XOR-RELAYED-ADDRESS"]
            assert (
                await client.channel_bind(0x4000, (HOST, admitted.port))
            ).message_class == Class.SUCCESS
            assert outside.transport is not None and admitted.transport is not None
            # Same IP (the permission covers it), but a port outside the route's range.
            outside.transport.sendto(b"sneaky", relayed)
            admitted.transport.sendto(b"welcome", relayed)
            channel, payload = await asyncio.wait_for(client.channel_data.get(), 2)
            assert (channel, payload) == (0x4000, b"welcome")
            await asyncio.sleep(0.1)
            assert client.channel_data.empty() and client.indications.empty()
            # And ChannelData from the client reaches the bound peer.
            client.send_channel_data(0x4000, b"to the peer")
            await asyncio.sleep(0.1)
            assert admitted.received == [(b"to the peer", relayed)]
            client.close()
        admitted.close()
        outside.close()

    asyncio.run(main())


MALFORMED = [
    b"",
    b"\x00",
    b"\x00\x01\x00\x00",  # truncated header
    b"\x00\x01\x00\x08" + struct.pack("!I", stun.COOKIE) + os.urandom(12),  # length > data
    b"\x00\x01\x00\x00" + b"\xde\xad\xbe\xef" + os.urandom(12),  # bad cookie
    b"\xc0" + os.urandom(40),  # neither STUN nor ChannelData
    b"\x40\x00\xff\xff" + b"x" * 10,  # ChannelData without allocation, bad length
    os.urandom(1500),
    b"\x00" * 65000,
]


def test_malformed_packets_leave_the_udp_listener_serving() -> None:
    async def scenario(port: int, client: RawClient) -> None:
        await client.allocate()
        good = Message(Method.BINDING, Class.REQUEST).encode()
        bad_fingerprint = good[:-1] + bytes([good[-1] ^ 0xFF])
        for data in [*MALFORMED, bad_fingerprint]:
            client.send_raw(data)
        # A request with a bad MESSAGE-INTEGRITY is refused, not crashing anything.
        refresh = Message(Method.REFRESH, Class.REQUEST)
        refresh.attributes.update(
            {"USERNAME": client.username, "REALM": client.realm, "NONCE": client.nonce}
        )
        assert (
            error_code(
                await client.request(refresh, data=refresh.encode(integrity_key=b"wrong key"))
            )
            == 401
        )
        response = await client.request(Message(Method.BINDING, Class.REQUEST), sign=False)
        assert response.message_class == Class.SUCCESS
        assert (await client.refresh(600)).message_class == Class.SUCCESS

    run_with_client(scenario)


def test_tcp_garbage_closes_only_that_connection() -> None:
    async def main() -> None:
        port = free_port()
        async with running_stunner(make_config(port, [f"{HOST}/32"])):
            bad_reader, bad_writer = await asyncio.open_connection(HOST, port)
            good_reader, good_writer = await asyncio.open_connection(HOST, port)
            bad_writer.write(b"\xff" * 64)
            assert await asyncio.wait_for(bad_reader.read(), 2) == b""  # closed by the server
            request = Message(Method.BINDING, Class.REQUEST)
            good_writer.write(request.encode())
            header = await asyncio.wait_for(good_reader.readexactly(20), 2)
            assert header[8:20] == request.transaction_id
            good_writer.close()
            bad_writer.close()

    asyncio.run(main())
