"""Ports for the servers a test starts on loopback."""

from __future__ import annotations

import socket

_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free for both UDP and TCP on the wildcard address, and never one this process
    was given before: two calls in a row can otherwise get the same port from the kernel (its
    ephemeral choice is random), and a test that moves a listener from one to the other then
    moves it nowhere."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind(("0.0.0.0", 0))
            port: int = udp.getsockname()[1]
            if port in _HANDED_OUT:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
                try:
                    tcp.bind(("0.0.0.0", port))
                except OSError:
                    continue
                _HANDED_OUT.add(port)
                return port
    raise RuntimeError("no free port")
