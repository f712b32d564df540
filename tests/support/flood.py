"""A flood of unauthenticated Allocates from many source addresses, for tests (issue 28 #6).

    python -m tests.support.flood PORT RATE SECONDS [SOURCES [KIND]]

Sends 28-byte unsigned Allocate requests (REQUESTED-TRANSPORT UDP, a fresh transaction id each)
to 127.0.0.1:PORT, each from the next of SOURCES source IPs (127.64.0.0 on; default 20,000),
at most RATE per second for SECONDS at most, then stops by itself and prints one JSON object:
datagrams sent, answers received. The source IP of each datagram is set with IP_PKTINFO on one
socket (no privilege: the whole of 127/8 is on lo), so the server sees as many sources as a
spoofed flood shows it, and their answers come back to this one socket, where they are counted.
Loopback only. `start()` runs it as a child process (its own CPU, not the test's event loop).
KIND `client-hello` sends the same DTLS ClientHello without a cookie instead (a TURN-DTLS
listener's flood); SOURCES 1 is a flood from one source. KIND `connect` opens TCP connections
instead (RATE a second, SOURCES source IPs in turn, each bound as the source), each closed
unread once HOLD more have opened after it: a connect flood on a server's listen queue.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable

IP_PKTINFO = 8  # linux/in.h (the socket module does not name it)
BASE = 0x7F400000  # 127.64.0.0
BATCH = 64
UNDER_WAY = 1000  # datagrams sent before the flood says it is under way


def _pktinfo(index: int) -> list[tuple[int, int, bytes]]:
    source = struct.pack("!I", BASE + index)
    return [(socket.IPPROTO_IP, IP_PKTINFO, struct.pack("@i4s4s", 0, source, bytes(4)))]


_HEAD = struct.pack("!HHI", 0x0003, 8, 0x2112A442)
_TAIL = struct.pack("!HHI", 0x0019, 4, 17 << 24)


def burst(port: int, count: int, datagram: Callable[[], bytes] | None = None) -> socket.socket:
    """`count` unsigned Allocates (or what `datagram` makes) to 127.0.0.1:PORT at once, each
    from a source IP of its own (127.64.0.0 on); the socket their answers come back to (the
    caller closes it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # room for every answer
    sock.bind(("0.0.0.0", 0))
    for index in range(count):
        data = datagram() if datagram is not None else _HEAD + os.urandom(12) + _TAIL
        sock.sendmsg([data], _pktinfo(index), 0, ("127.0.0.1", port))
    sock.setblocking(False)
    return sock


def client_hello() -> bytes:
    """A first DTLS ClientHello of pyOpenSSL's client, without a cookie."""
    from OpenSSL import SSL

    conn = SSL.Connection(SSL.Context(SSL.DTLS_METHOD))
    conn.set_connect_state()
    try:
        conn.do_handshake()
    except SSL.WantReadError:
        pass
    hello: bytes = conn.bio_read(65536)
    return hello


def flood(
    port: int, rate: float, seconds: float, sources: int, kind: str = "allocate"
) -> dict[str, int]:
    hello = client_hello() if kind == "client-hello" else None
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", 0))
    sock.setblocking(False)
    head, tail = _HEAD, _TAIL
    ancillary = [_pktinfo(i) for i in range(sources)]
    target = ("127.0.0.1", port)
    sent = answers = 0
    told = False
    start = time.monotonic()
    while (now := time.monotonic()) < start + seconds:
        if not told and sent >= UNDER_WAY:
            sys.stdout.write("flooding\n")  # start() waits for this line
            sys.stdout.flush()
            told = True
        for _ in range(BATCH):
            try:
                datagram = hello or head + os.urandom(12) + tail
                sock.sendmsg([datagram], ancillary[sent % sources], 0, target)
            except (BlockingIOError, ConnectionRefusedError):
                continue
            sent += 1
        while True:
            try:
                sock.recv(2048)
            except (BlockingIOError, ConnectionRefusedError):
                break
            answers += 1
        ahead = start + sent / rate - now
        if ahead > 0:
            time.sleep(ahead)
    sock.close()
    return {"sent": sent, "answers": answers}


HOLD = 512  # `connect`: connections the flood keeps open at once (past a per-source cap of 256)


def connect_flood(port: int, rate: float, seconds: float, sources: int) -> dict[str, int]:
    import collections

    held: collections.deque[socket.socket] = collections.deque()
    sent = 0
    told = False
    start = time.monotonic()
    while (now := time.monotonic()) < start + seconds:
        if not told and sent >= UNDER_WAY // 10:
            sys.stdout.write("flooding\n")
            sys.stdout.flush()
            told = True
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.bind((socket.inet_ntoa(struct.pack("!I", BASE + sent % sources)), 0))
            sock.connect_ex(("127.0.0.1", port))
        except OSError:
            sock.close()
            time.sleep(0.001)  # out of ports or descriptors for a moment
            continue
        held.append(sock)
        if len(held) > HOLD:
            held.popleft().close()
        sent += 1
        ahead = start + sent / rate - now
        if ahead > 0:
            time.sleep(ahead)
    for sock in held:
        sock.close()
    return {"sent": sent, "answers": 0}


def start(
    port: int, rate: float, seconds: float, sources: int = 20000, kind: str = "allocate"
) -> subprocess.Popen[str]:
    """The flood as a child process, once it has sent UNDER_WAY datagrams (stop it with
    `.terminate()`; it stops by itself after `seconds`)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.flood", str(port), str(rate), str(seconds),
         str(sources), kind],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert process.stdout is not None
    if process.stdout.readline() != "flooding\n":
        process.kill()
        raise RuntimeError(f"the flood did not start: {process.wait()}")
    return process


if __name__ == "__main__":
    port, rate, seconds = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    count = int(sys.argv[4]) if len(sys.argv) > 4 else 20000
    kind = sys.argv[5] if len(sys.argv) > 5 else "allocate"
    seconds = min(seconds, 120.0)
    if kind == "connect":
        outcome = connect_flood(port, rate, seconds, count)
    else:
        outcome = flood(port, rate, seconds, count, kind)
    sys.stdout.write(json.dumps(outcome) + "\n")
