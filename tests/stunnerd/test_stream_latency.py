"""Issue 21: over TURN-TCP a relayed packet is dropped, never queued for seconds, once what waits
toward the client is older than --stream-latency-bound; answers are never dropped for it.

A real stunnerd listener on loopback (both relay paths), a real UDP peer and a TCP client that
stops reading after its allocation: the peer sends 300 packets over 1.5 s, then the client
reads again and sends a Refresh. With a 0.2 s bound at most half of the packets reach it (those
within the bound when they could be written) and the rest are dropped and counted as "latency";
without a bound every one arrives. Either way the answer to its Refresh arrives.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from stunner_api import stun
from stunner_api.stun import Class, Message, Method
from stunnerd.surface.metrics import render_metrics
from stunnerd.turn.limits import Limits
from tests.support.turnclient import HOST, free_port, start_peer

from .test_abuse_streams import tcp_allocation, tcp_stunner

PACKETS, INTERVAL, SIZE = 300, 0.005, 1000


async def read_until_answer(
    reader: asyncio.StreamReader, transaction_id: bytes
) -> tuple[Message, int]:
    """Frames from the stream until the answer to `transaction_id`, and how many ChannelData
    frames came before it."""
    buffer = bytearray()
    media = 0
    while True:
        length = stun.stream_frame_length(buffer)
        if length is not None and len(buffer) >= length:
            frame = bytes(buffer[:length])
            del buffer[:length]
            if (frame[0] & 0xC0) == 0x40:
                media += 1
                continue
            message = stun.parse_message(frame)
            if message.transaction_id == transaction_id:
                return message, media
            continue
        chunk = await asyncio.wait_for(reader.read(65536), 10)
        assert chunk, "the server closed the connection"
        buffer += chunk


@pytest.mark.parametrize("bound", [0.2, 0.0])
def test_a_stalled_reader_gets_late_packets_dropped_and_answers_kept(
    bound: float, relay_path: str
) -> None:
    async def main() -> None:
        peer = await start_peer(echo=False)
        port = free_port()
        limits = Limits(stream_latency_bound=bound)
        async with tcp_stunner(port, limits, [f"{HOST}/32"]) as stunner:
            reader, writer = await tcp_allocation(port, (HOST, peer.port))
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            writer.transport.pause_reading()  # type: ignore[attr-defined]
            server = stunner.listeners["testns/gw/turn-tcp"].server
            relay = next(iter(server.allocations.values())).relayed_address
            assert peer.transport is not None
            for _ in range(PACKETS):
                peer.transport.sendto(bytes(SIZE), relay)
                await asyncio.sleep(INTERVAL)
            # The client reads again: its Refresh is answered behind whatever was queued (the
            # Python path drops late packets as they come, the engine as the socket drains).
            # A full-size receive buffer again: with 4 KiB the window never opens by an MSS
            # (64 KiB on loopback), so the server could send only at its zero-window probes.
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            writer.transport.resume_reading()  # type: ignore[attr-defined]
            refresh = Message(Method.REFRESH, Class.REQUEST)  # unsigned: answered with a 401
            writer.write(refresh.encode())
            answer, media = await read_until_answer(reader, refresh.transaction_id)
            assert (answer.method, answer.message_class) == (Method.REFRESH, Class.ERROR)
            counters = stunner.listener_stats()["testns/gw/turn-tcp"]
            late = counters.latency_dropped
            assert counters.backpressure_dropped == 0
            if bound:
                assert late >= PACKETS // 2, (late, media)
                assert media <= PACKETS // 2, (late, media)
                metric = (
                    'stunner_listener_dropped_packets_total{name="testns/gw/turn-tcp",'
                    f'reason="latency"}} {late}'
                )
                assert metric in render_metrics(stunner)
            else:
                assert (late, media) == (0, PACKETS)
            writer.close()
        peer.close()

    asyncio.run(main())
