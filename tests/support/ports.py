"""Ports for the servers a test starts on loopback.

They come from below the kernel's ephemeral range (net.ipv4.ip_local_port_range), where nothing
on the machine gets a port unless it asks for that very one. A port is free when it is handed
out, but its server may bind it only seconds later (a stunnerd subprocess starting on a loaded
machine); a port of the ephemeral range (as `bind(0)` gave before) could meanwhile go to any
process's outgoing connection or relay socket, which the kernel places there at random, and the
server's bind then fails (the likely cause of a helm-test run beside other tests whose TURN
listener's port refused connections for 60 s). Where the ephemeral range leaves too little room
below it, the ports come from the kernel's ephemeral choice as before.

Under pytest-xdist (`-n N`), each worker takes the ports of its own residue modulo N, so two
workers never hand out the same port (each one's memory of ports handed out is its own).
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

_HANDED_OUT: set[int] = set()
LOWEST = 10000  # below: the well-known services' neighbourhood
ROOM = 4096  # ports below the ephemeral range worth choosing from; fewer: the kernel chooses
EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_RANDOM = random.Random()  # our own: a test seeding the global one must not make two runs agree


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where it cannot be read)."""
    try:
        low, high = EPHEMERAL.read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _free_for_both(port: int) -> bool:
    """Whether `port` binds for UDP and TCP on the wildcard address now."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        try:
            udp.bind(("0.0.0.0", port))
        except OSError:
            return False
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            try:
                tcp.bind(("0.0.0.0", port))
            except OSError:
                return False
    return True


def _worker_share() -> tuple[int, int]:
    """(this xdist worker's index, the number of workers); (0, 1) outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if name.startswith("gw") and name[2:].isdigit() and count.isdigit() and int(count) > 0:
        return int(name[2:]) % int(count), int(count)
    return 0, 1


def _kernel_choice() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("0.0.0.0", 0))
        port: int = udp.getsockname()[1]
    return port


def free_port() -> int:
    """A port free for both UDP and TCP on the wildcard address, below the ephemeral range, and
    never one this process was given before: two calls in a row can otherwise get the same
    port, and a test that moves a listener from one to the other then moves it nowhere."""
    low = ephemeral_range()[0]
    below = low - LOWEST >= ROOM
    mine, workers = _worker_share()
    for _ in range(200):
        port = _RANDOM.randrange(LOWEST, low) if below else _kernel_choice()
        if below:
            port -= (port - mine) % workers
        if port < LOWEST or port % workers != mine % workers:
            continue
        if port not in _HANDED_OUT and _free_for_both(port):
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free port")
