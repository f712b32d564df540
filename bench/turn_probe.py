"""A latency probe through a TURN server: what one call feels while the server is under load.

    turn_probe.py --transport udp|tcp|tls --port P --peer-port Q [--rate 50] [--duration S]

One TURN session of its own (Allocate with long-term credentials, a channel bound to the echo
peer at 127.0.0.1:Q, e.g. `turnutils_peer`) sends a 120-byte ChannelData packet every 1/rate
seconds (50 pps: an audio call's packet rate) carrying its sequence number and its send time,
and times each one back from the echo. Prints one JSON object: packets sent, received, lost
(not back within 1 s of the last send), and the round-trip times' p50, p99 and max in ms.

`turn_bench.py` runs it beside coturn's load generator, against each server alike; it raises
the probe's priority (nice -10) where it may, so that what is measured is the server's delay,
not the probe's own wait for a CPU.
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import struct
import sys
import threading
import time
from typing import Any

from stunner_api import stun
from stunner_api.stun import Class, Message, Method
from stunnerd.turn.auth import long_term_key

USER, PASSWORD, REALM = "user", "pass", "stunner.l7mp.io"
CHANNEL = 0x4001
PAYLOAD = 120
STAMP = struct.Struct("!IQ")  # sequence number, send time (ns, CLOCK_MONOTONIC)


class Session:
    """A TURN client over one socket: datagrams for UDP, framed for TCP and TLS."""

    def __init__(self, transport: str, port: int) -> None:
        self.stream = transport != "udp"
        kind = socket.SOCK_STREAM if self.stream else socket.SOCK_DGRAM
        sock = socket.socket(socket.AF_INET, kind)
        sock.settimeout(5.0)
        sock.connect(("127.0.0.1", port))
        if self.stream:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if transport == "tls":
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE  # the bench's self-signed certificate
            sock = context.wrap_socket(sock)
        self.sock = sock
        self.buffer = bytearray()

    def send(self, data: bytes) -> None:
        if self.stream:
            self.sock.sendall(data + b"\0" * (-len(data) % 4))
        else:
            self.sock.send(data)

    def receive(self) -> bytes:
        if not self.stream:
            return self.sock.recv(65536)
        while True:
            length = stun.stream_frame_length(self.buffer)
            if length is not None and len(self.buffer) >= length:
                frame = bytes(self.buffer[:length])
                del self.buffer[:length]
                return frame
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            self.buffer += chunk

    def transact(self, request: Message, key: bytes | None) -> Message:
        self.send(request.encode(integrity_key=key))
        while True:
            reply = stun.parse_message(self.receive())
            if reply.transaction_id == request.transaction_id:
                return reply


def open_channel(session: Session, peer_port: int) -> None:
    """Allocate, then bind CHANNEL to the echo peer; raises on any refusal."""
    attrs: dict[str, Any] = {"REQUESTED-TRANSPORT": 17, "LIFETIME": 600}
    first = session.transact(Message(Method.ALLOCATE, Class.REQUEST, attributes=attrs), None)
    key = long_term_key(USER, REALM, PASSWORD)
    auth = {"USERNAME": USER, "REALM": first.attributes.get("REALM", REALM)}
    auth["NONCE"] = first.attributes.get("NONCE", b"")
    if first.message_class != Class.SUCCESS:
        reply = session.transact(
            Message(Method.ALLOCATE, Class.REQUEST, attributes={**auth, **attrs}), key
        )
        if reply.message_class != Class.SUCCESS:
            raise RuntimeError(f"Allocate refused: {reply.attributes.get('ERROR-CODE')}")
    bind = {**auth, "CHANNEL-NUMBER": CHANNEL, "XOR-PEER-ADDRESS": ("127.0.0.1", peer_port)}
    reply = session.transact(Message(Method.CHANNEL_BIND, Class.REQUEST, attributes=bind), key)
    if reply.message_class != Class.SUCCESS:
        raise RuntimeError(f"ChannelBind refused: {reply.attributes.get('ERROR-CODE')}")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def probe(
    transport: str, port: int, peer_port: int, rate: float, duration: float
) -> dict[str, Any]:
    session = Session(transport, port)
    open_channel(session, peer_port)
    session.sock.settimeout(0.2)
    rtts: list[float] = []
    seen: set[int] = set()
    done = threading.Event()

    def receive() -> None:
        while not done.is_set():
            try:
                frame = session.receive()
            except TimeoutError:
                continue
            except OSError:
                return
            now = time.monotonic_ns()
            if len(frame) >= 4 + STAMP.size and (frame[0] & 0xC0) == 0x40:
                sequence, sent = STAMP.unpack_from(frame, 4)
                if sequence not in seen:
                    seen.add(sequence)
                    rtts.append((now - sent) / 1e6)

    reader = threading.Thread(target=receive, daemon=True)
    reader.start()
    interval = 1.0 / rate
    count = max(1, round(duration * rate))
    start = time.monotonic()
    header = struct.pack("!HH", CHANNEL, PAYLOAD)
    filler = b"\0" * (PAYLOAD - STAMP.size)
    for sequence in range(count):
        delay = start + sequence * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        session.send(header + STAMP.pack(sequence, time.monotonic_ns()) + filler)
    time.sleep(1.0)  # a packet not back a second after the last send is counted lost
    done.set()
    reader.join(timeout=1.0)
    session.sock.close()
    return {
        "sent": count,
        "received": len(rtts),
        "loss_pct": 100.0 * (count - len(rtts)) / count,
        "p50_ms": percentile(rtts, 0.50),
        "p99_ms": percentile(rtts, 0.99),
        "max_ms": max(rtts, default=None),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transport", choices=("udp", "tcp", "tls"), default="udp")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--peer-port", type=int, required=True)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--duration", type=float, default=4.0)
    args = parser.parse_args(argv)
    try:
        result = probe(args.transport, args.port, args.peer_port, args.rate, args.duration)
    except (OSError, RuntimeError, stun.StunError) as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(result) + "\n")
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
