"""`free_port` hands out ports no other process gets by chance: below the kernel's ephemeral
range, where outgoing connections and sockets bound to port 0 (a stunnerd's relay sockets, any
client's) never land, so a port stays free until the test's own server binds it."""

from __future__ import annotations

import socket

from tests.support import ports


def test_ports_come_from_below_the_ephemeral_range_free_and_never_twice() -> None:
    low, high = ports.ephemeral_range()
    assert low - ports.LOWEST >= ports.ROOM  # this machine leaves room: the path under test
    handed = [ports.free_port() for _ in range(50)]
    assert len(set(handed)) == len(handed)
    assert all(ports.LOWEST <= port < low for port in handed), (handed, low)
    for port in handed:  # free for both transports on the wildcard address, as promised
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind(("0.0.0.0", port))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            tcp.bind(("0.0.0.0", port))


def test_the_kernel_places_port_zero_sockets_in_the_range_read() -> None:
    """What the choice rests on: a socket bound to port 0 gets a port of the ephemeral range
    read from /proc (so none of the handed-out ones)."""
    low, high = ports.ephemeral_range()
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        for _ in range(20):
            with socket.socket(socket.AF_INET, kind) as sock:
                sock.bind(("127.0.0.1", 0))
                assert low <= sock.getsockname()[1] <= high
