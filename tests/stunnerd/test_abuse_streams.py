"""Issue 15 items 1 and 4: TURN-TCP connections are bounded in time, number and output.

We test, on loopback with short deadlines: a silent connection, one stalled in its first
header and one stalled inside an announced 64 KiB frame are all closed at the deadline; a
connection that got an answer but has no allocation is closed when idle, one with an
allocation is not; connections are capped per source address and in total; with a low
descriptor limit, hundreds of idle TCP connections leave descriptors for UDP allocations
(a real stunnerd); a client that stops reading gets packets dropped and counted past the
high-water mark, and stunnerd's queue toward it stays bounded. Each runs on both relay paths
of TURN-TCP (pure Python, and the native engine: stunnerd/native_tcp.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from stunner_api import stun
from stunner_api.stun import Class, Message, Method
from stunnerd.process.daemon import Stunner
from stunnerd.surface.metrics import render_metrics
from stunnerd.transport.native_tcp import NativeTcpTransport
from stunnerd.transport.transports import TcpConnectionProtocol
from stunnerd.turn.auth import long_term_key
from stunnerd.turn.limits import Limits
from tests.support.turnclient import (
    HOST,
    PASSWORD,
    REALM,
    USERNAME,
    RawClient,
    free_port,
    make_config,
    start_peer,
)

FAST = Limits(stream_deadline=0.4, idle_timeout=0.8)


@contextlib.asynccontextmanager
async def tcp_stunner(port: int, limits: Limits, endpoints: list[str]) -> AsyncIterator[Stunner]:
    stunner = Stunner(limits=limits)
    await stunner.apply(make_config(port, endpoints, protocols=("TURN-TCP",)))
    try:
        yield stunner
    finally:
        await stunner.close()


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Whether the server closes the connection within `seconds` (answers are skipped)."""
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            data = await asyncio.wait_for(reader.read(65536), deadline - time.monotonic())
            if not data:
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return False


async def close_all(
    connections: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]],
) -> None:
    for _, writer in connections:
        writer.close()
    for _, writer in connections:
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def ask(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, message: Message, key: bytes | None
) -> Message:
    writer.write(message.encode(integrity_key=key))
    header = await asyncio.wait_for(reader.readexactly(20), 2)
    body = await reader.readexactly(struct.unpack_from("!H", header, 2)[0])
    return stun.parse_message(header + body)


async def tcp_allocation(
    port: int, peer: tuple[str, int] | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(HOST, port)
    allocate = Message(Method.ALLOCATE, Class.REQUEST)
    allocate.attributes["REQUESTED-TRANSPORT"] = 17
    nonce = (await ask(reader, writer, allocate, None)).attributes["NONCE"]
    key = long_term_key(USERNAME, REALM, PASSWORD)
    signed = {"USERNAME": USERNAME, "REALM": REALM, "NONCE": nonce}
    allocate = Message(Method.ALLOCATE, Class.REQUEST)
    allocate.attributes.update(signed, **{"REQUESTED-TRANSPORT": 17})
    assert (await ask(reader, writer, allocate, key)).message_class == Class.SUCCESS
    if peer is not None:
        bind = Message(Method.CHANNEL_BIND, Class.REQUEST)
        bind.attributes.update(signed, **{"CHANNEL-NUMBER": 0x4000, "XOR-PEER-ADDRESS": peer})
        assert (await ask(reader, writer, bind, key)).message_class == Class.SUCCESS
    return reader, writer


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]
STALLS = (
    b"",  # nothing at all
    b"\x00\x01\x00\x00\x21\x12",  # half a STUN header
    struct.pack("!HHI", 1, 65512, stun.COOKIE) + bytes(112),  # a 64 KiB frame begun
)


@pytest.mark.usefixtures("relay_path")
def test_stalled_and_idle_connections_are_closed_at_their_deadlines() -> None:
    async def main() -> None:
        port = free_port()
        opened: list[Connection] = []
        async with tcp_stunner(port, FAST, [f"{HOST}/32"]):
            try:
                for first_bytes in STALLS:
                    opened.append(await asyncio.open_connection(HOST, port))
                    opened[-1][1].write(first_bytes)
                for reader, _ in opened:
                    assert await closed_within(reader, 1.5)
                # Answered, then silent without an allocation: closed after the idle timeout.
                opened.append(await asyncio.open_connection(HOST, port))
                reader, writer = opened[-1]
                answer = await ask(reader, writer, Message(Method.BINDING, Class.REQUEST), None)
                assert answer.message_class == Class.SUCCESS
                assert not await closed_within(reader, 0.5)
                assert await closed_within(reader, 1.5)
                # With an allocation, silence is the allocation's business.
                opened.append(await tcp_allocation(port))
                assert not await closed_within(opened[-1][0], 1.6)
            finally:
                await close_all(opened)

    asyncio.run(main())


@pytest.mark.usefixtures("relay_path")
def test_connections_are_capped_per_source_and_in_total() -> None:
    async def main() -> None:
        port = free_port()
        opened: list[Connection] = []

        async def connect(source: str = HOST) -> asyncio.StreamReader:
            opened.append(await asyncio.open_connection(HOST, port, local_addr=(source, 0)))
            return opened[-1][0]

        async with tcp_stunner(port, Limits(connections_per_source=3, connections=5), []):
            try:
                kept = [await connect() for _ in range(3)]
                assert await closed_within(await connect(), 1.0)  # the fourth from 127.0.0.1
                kept += [await connect("127.0.0.2"), await connect("127.0.0.3")]
                assert await closed_within(await connect("127.0.0.4"), 1.0)  # sixth in total
                for reader in kept:
                    assert not await closed_within(reader, 0.05)
                opened[0][1].close()
                await asyncio.sleep(0.1)
                assert not await closed_within(await connect(), 0.2)  # room again
            finally:
                await close_all(opened)

    asyncio.run(main())


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


@pytest.mark.usefixtures("relay_path")
def test_idle_tcp_connections_cannot_starve_udp_allocations(tmp_path: Path) -> None:
    """The issue's scenario with a 256-descriptor limit: more idle TCP connections than the
    process has descriptors, then UDP Allocates, which must all succeed."""
    udp_port = free_port()
    config = tmp_path / "stunnerd.json"
    config.write_text(make_config(udp_port, [f"{HOST}/32"]).to_json())
    udp = subprocess.Popen(
        [sys.executable, "-m", "stunnerd", "-u", "1", "--fd-reserve", "64",
         "--connections-per-source", "1000", "--stream-deadline", "30", "-c", str(config)],
        stderr=subprocess.DEVNULL, preexec_fn=_low_fd_limit,
    )  # fmt: skip

    async def main() -> None:
        deadline = time.monotonic() + 15
        while True:
            try:
                probe = await RawClient.connect((HOST, udp_port))
                await probe.request(Message(Method.BINDING, Class.REQUEST), sign=False, timeout=0.5)
                probe.close()
                break
            except (TimeoutError, OSError):
                probe.close()
                assert time.monotonic() < deadline, "stunnerd did not start"
        held = []
        for _ in range(300):  # more than the process has descriptors
            try:
                held.append(socket.create_connection((HOST, udp_port), timeout=2))
            except OSError:
                break
        await asyncio.sleep(0.5)
        clients = [await RawClient.connect((HOST, udp_port)) for _ in range(10)]
        answers = [await client.allocate() for client in clients]
        assert all(a.message_class == Class.SUCCESS for a in answers), [
            a.attributes.get("ERROR-CODE") for a in answers
        ]
        for client in clients:
            client.close()
        for sock in held:
            sock.close()

    try:
        asyncio.run(main())
    finally:
        udp.kill()
        udp.wait()


def test_a_client_that_stops_reading_gets_drops_not_an_unbounded_queue(relay_path: str) -> None:
    high_water = 64 * 1024
    # No latency bound: the high-water mark alone (test_native_tcp covers the bound).
    limits = Limits(stream_high_water=high_water, stream_latency_bound=0)

    async def main() -> None:
        peer = await start_peer(echo=False)
        port = free_port()
        async with tcp_stunner(port, limits, [f"{HOST}/32"]) as s:
            reader, writer = await tcp_allocation(port, (HOST, peer.port))
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            listener = s.listeners["testns/gw/turn-tcp"]
            server = listener.server
            relay = next(iter(server.allocations.values())).relayed_address
            assert peer.transport is not None
            transport = listener.transport
            assert isinstance(transport, NativeTcpTransport) == (relay_path == "native")

            def queued() -> int:
                if isinstance(transport, NativeTcpTransport):
                    assert transport.relays
                    return sum(stream.queued for stream in transport.streams())
                connection = next(iter(transport._connections))  # type: ignore[union-attr]
                assert isinstance(connection, TcpConnectionProtocol)
                assert connection.transport is not None
                return connection.transport.get_write_buffer_size()

            largest = 0
            for _ in range(60):  # 60 x 200 x 1000 B = 12 MB offered, never read
                for _ in range(200):
                    peer.transport.sendto(bytes(1000), relay)
                await asyncio.sleep(0.01)
                largest = max(largest, queued())
            assert s.listener_stats()["testns/gw/turn-tcp"].backpressure_dropped > 0
            assert largest <= high_water + 2048
            metrics = render_metrics(s)
            assert (
                'stunner_listener_dropped_packets_total{name="testns/gw/turn-tcp",reason="backpressure"}'
                in metrics
            )
            writer.close()
        peer.close()

    asyncio.run(main())


def test_pending_dtls_handshakes_are_capped_per_source_and_in_total() -> None:
    """Handshakes that echo the cookie and then go silent hold a session each, up to the cap
    per source address (127.0.0.1) and in total (the other sources)."""
    from OpenSSL import SSL

    from .test_tls_dtls import dtls_protocol, tls_config

    async def abandoned_handshake(port: int, source: str) -> bool:
        """Whether the server started a session (answered the cookie with a ServerHello)."""
        loop = asyncio.get_running_loop()
        conn = SSL.Connection(SSL.Context(SSL.DTLS_METHOD))
        conn.set_connect_state()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            sock.bind((source, 0))
            for _ in range(2):  # the ClientHello, then again with the cookie
                with contextlib.suppress(SSL.WantReadError):
                    conn.do_handshake()
                await loop.sock_sendto(sock, conn.bio_read(65536), (HOST, port))
                try:
                    answer = await asyncio.wait_for(loop.sock_recv(sock, 65536), 0.5)
                except TimeoutError:
                    return False
                conn.bio_write(answer)
            return answer[13] == 2  # ServerHello

    async def main() -> None:
        port = free_port()
        stunner = Stunner(limits=Limits(dtls_pending_per_source=3, dtls_pending=5))
        await stunner.apply(tls_config([("TURN-DTLS", port)], [f"{HOST}/32"]))
        try:
            protocol = dtls_protocol(stunner)
            started = [await abandoned_handshake(port, HOST) for _ in range(5)]
            assert started == [True] * 3 + [False] * 2
            others = [await abandoned_handshake(port, f"127.0.0.{n}") for n in (2, 3, 4)]
            assert others == [True, True, False]
            assert protocol.pending == 5 and len(protocol.sessions) == 5
        finally:
            await stunner.close()

    asyncio.run(main())


@pytest.mark.usefixtures("relay_path")
def test_a_connection_closed_while_its_allocate_is_made_leaves_no_allocation(
    relay_path: str,
) -> None:
    """A TURN-TCP client sends its Allocate and closes at once: the allocation made meanwhile
    goes with the connection (RFC 8656 §3.1) instead of holding the user's quota until it
    expires, so with a quota of 1 the same user allocates again on a new connection."""

    async def main() -> None:
        port = free_port()
        stunner = Stunner(limits=FAST)
        config = make_config(port, [f"{HOST}/32"], protocols=("TURN-TCP",), user_quota=1)
        await stunner.apply(config)
        try:
            server = stunner.listeners["testns/gw/turn-tcp"].server
            for _ in range(3):
                reader, writer = await asyncio.open_connection(HOST, port)
                allocate = Message(Method.ALLOCATE, Class.REQUEST)
                allocate.attributes["REQUESTED-TRANSPORT"] = 17
                nonce = (await ask(reader, writer, allocate, None)).attributes["NONCE"]
                allocate = Message(Method.ALLOCATE, Class.REQUEST)
                allocate.attributes.update(
                    {"USERNAME": USERNAME, "REALM": REALM, "NONCE": nonce},
                    **{"REQUESTED-TRANSPORT": 17},
                )
                writer.write(
                    allocate.encode(integrity_key=long_term_key(USERNAME, REALM, PASSWORD))
                )
                writer.close()  # the request and the FIN in one go
                await writer.wait_closed()
                for _ in range(100):
                    if not server.allocations and not server._opening:
                        break
                    await asyncio.sleep(0.02)
                assert not server.allocations, "the allocation outlived its connection"
            reader, writer = await tcp_allocation(port)  # the quota of 1 is free again
            writer.close()
        finally:
            await stunner.close()

    asyncio.run(main())
