"""Issue 21: over TURN-TCP a relayed packet is dropped, never queued for seconds, once what waits
toward the client is older than --stream-latency-bound; answers are never dropped for it.

A real stunnerd listener on loopback, a real UDP peer and a TCP client that stops reading after
its allocation: the peer sends 300 packets over 1.5 s. With a 0.2 s bound, only about the first
0.2 s of them (and what the client's small receive buffer took) is queued, the rest is dropped
and counted as "latency"; without a bound every one is queued. Either way, when the client
reads again, the answer to its Refresh arrives behind what was queued.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from stunnerd import stun
from stunnerd.limits import Limits
from stunnerd.metrics import render_metrics
from stunnerd.stun import Class, Message, Method
from tests.support.turnclient import HOST, free_port, start_peer

from .test_abuse_streams import tcp_allocation, tcp_stunner

PACKETS, INTERVAL, SIZE = 300, 0.005, 1000


async def read_until_answer(reader: asyncio.StreamReader, transaction_id: bytes) -> Message:
    """Frames from the stream until the answer to `transaction_id` (relayed data skipped)."""
    buffer = bytearray()
    while True:
        length = stun.stream_frame_length(buffer)
        if length is not None and len(buffer) >= length:
            frame = bytes(buffer[:length])
            del buffer[:length]
            if (frame[0] & 0xC0) != 0x40:
                message = stun.parse_message(frame)
                if message.transaction_id == transaction_id:
                    return message
            continue
        chunk = await asyncio.wait_for(reader.read(65536), 10)
        assert chunk, "the server closed the connection"
        buffer += chunk


@pytest.mark.parametrize("bound", [0.2, 0.0])
def test_a_stalled_reader_gets_late_packets_dropped_and_answers_kept(bound: float) -> None:
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
            sent_before = server.stats.tx_packets
            for _ in range(PACKETS):
                peer.transport.sendto(bytes(SIZE), relay)
                await asyncio.sleep(INTERVAL)
            relayed = server.stats.tx_packets - sent_before
            late = server.stats.latency_dropped
            assert server.stats.backpressure_dropped == 0
            if bound:
                assert late >= PACKETS // 2, (late, relayed)
                assert relayed <= PACKETS // 2, (late, relayed)
                metric = (
                    'stunner_listener_dropped_packets_total{name="testns/gw/turn-tcp",'
                    f'reason="latency"}} {late}'
                )
                assert metric in render_metrics(stunner)
            else:
                assert (late, relayed) == (0, PACKETS)
            # The client reads again: its Refresh is answered, behind whatever was queued.
            writer.transport.resume_reading()  # type: ignore[attr-defined]
            refresh = Message(Method.REFRESH, Class.REQUEST)  # unsigned: answered with a 401
            writer.write(refresh.encode())
            answer = await read_until_answer(reader, refresh.transaction_id)
            assert (answer.method, answer.message_class) == (Method.REFRESH, Class.ERROR)
            writer.close()
        peer.close()

    asyncio.run(main())
