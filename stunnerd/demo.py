"""`stunnerd-demo`: run stunnerd locally and relay through it with a real TURN client.

Starts a UDP echo peer on 127.0.0.1, starts `stunnerd` (a subprocess) with a TURN-UDP and a
TURN-TCP listener whose only route admits that echo peer, relays packets through both listeners
with aioice's TURN client, shows that a peer outside the routes is refused, prints the
ICE-server JSON a browser would use, and stops everything it started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from stunner_api.dataplane import validate_config
from stunner_api.ice import IceQuery, ice_config
from stunner_api.vocabulary import DEFAULT_REALM

USERNAME = "user-1"
PASSWORD = "pass-1"


class EchoPeer(asyncio.DatagramProtocol):
    """A media-server stand-in: sends every datagram back where it came from."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.transport.sendto(data, addr)


class Receiver(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.received: dict[bytes, float] = {}
        self.errors: list[Exception] = []

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.received[data] = time.monotonic()

    def error_received(self, exc: Exception) -> None:
        self.errors.append(exc)


def demo_config(address: str, port: int, echo_port: int) -> dict[str, Any]:
    return {
        "version": "v1",
        "admin": {"name": "stunnerd-demo", "loglevel": "all:WARN"},
        "auth": {
            "type": "static",
            "realm": DEFAULT_REALM,
            "credentials": {"username": USERNAME, "password": PASSWORD},
        },
        "listeners": [
            {
                "name": "demo/gateway/udp-listener",
                "protocol": "TURN-UDP",
                "address": address,
                "port": port,
                "routes": ["demo/echo"],
            },
            {
                "name": "demo/gateway/tcp-listener",
                "protocol": "TURN-TCP",
                "address": address,
                "port": port,
                "routes": ["demo/echo"],
            },
        ],
        "clusters": [
            {
                "name": "demo/echo",
                "type": "STATIC",
                "endpoints": [f"{address}/32:<{echo_port}-{echo_port}>"],
            },
        ],
    }


async def relay(
    transport: str,
    server: tuple[str, int],
    peer: tuple[str, int],
    count: int,
    credentials: tuple[str, str] = (USERNAME, PASSWORD),
    wait: float = 2.0,
) -> dict[str, Any]:
    """Send `count` packets to the echo peer through TURN; report what came back within `wait`
    seconds."""
    from aioice.turn import create_turn_endpoint

    username, password = credentials
    turn, receiver = await create_turn_endpoint(
        Receiver, server_addr=server, username=username, password=password, transport=transport
    )
    try:
        relayed = turn.get_extra_info("sockname")
        sent: dict[bytes, float] = {}
        for i in range(count):
            payload = f"{transport}-packet-{i:04d}".encode()
            sent[payload] = time.monotonic()
            turn.sendto(payload, peer)
            await asyncio.sleep(0.01)  # a modest 100 packets/s
        deadline = time.monotonic() + wait
        while len(receiver.received) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        rtts = [receiver.received[p] - t for p, t in sent.items() if p in receiver.received]
        return {
            "transport": transport,
            "relayed_address": relayed,
            "sent": count,
            "received": len(rtts),
            "mean_rtt_ms": round(1000 * sum(rtts) / len(rtts), 2) if rtts else None,
        }
    finally:
        turn.close()


async def refused(
    server: tuple[str, int],
    peer: tuple[str, int],
    credentials: tuple[str, str] = (USERNAME, PASSWORD),
    timeout: float = 3.0,
) -> str:
    """Try to reach a peer no route admits: the ChannelBind must fail with 403."""
    from aioice.turn import create_turn_endpoint

    username, password = credentials
    turn, receiver = await create_turn_endpoint(
        Receiver, server_addr=server, username=username, password=password, transport="udp"
    )
    try:
        turn.sendto(b"should not arrive", peer)
        deadline = time.monotonic() + timeout
        while not receiver.errors and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return str(receiver.errors[0]) if receiver.errors else "no error (unexpected)"
    finally:
        turn.close()


def ice_servers(config: dict[str, Any]) -> dict[str, Any]:
    """What the STUNner auth service's `/ice?service=turn&iceTransportPolicy=relay` answers for
    the demo's config: the very builder the reconciler serves it with."""
    query = IceQuery(ice_transport_policy="relay")
    return ice_config({"demo": validate_config(config)}, query, now=int(time.time()))


async def wait_until_serving(address: str, port: int, proc: subprocess.Popen[bytes]) -> None:
    """Poll with TCP connects until stunnerd accepts, or fail if it exited."""
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"stunnerd exited with code {proc.returncode}")
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection(address, port)
            writer.close()
            return
        await asyncio.sleep(0.1)
    raise RuntimeError("stunnerd did not start listening within 15 s")


async def run(address: str, port: int, count: int) -> int:
    loop = asyncio.get_running_loop()
    echo, _ = await loop.create_datagram_endpoint(EchoPeer, local_addr=(address, 0))
    echo_port = echo.get_extra_info("sockname")[1]
    # Another local peer on a port outside the route's range: packets to it must be dropped.
    other, _ = await loop.create_datagram_endpoint(EchoPeer, local_addr=(address, 0))
    other_port = other.get_extra_info("sockname")[1]

    with tempfile.TemporaryDirectory(prefix="stunnerd-demo-") as tmp:
        config_path = Path(tmp) / "stunnerd.conf"
        config = demo_config(address, port, echo_port)
        config_path.write_text(json.dumps(config, indent=2))
        proc = subprocess.Popen([sys.executable, "-m", "stunnerd", "-c", str(config_path)])
        try:
            await wait_until_serving(address, port, proc)
            server = (address, port)
            print(f"stunnerd (pid {proc.pid}) serving TURN-UDP and TURN-TCP on {address}:{port}")
            print(f"echo peer on {address}:{echo_port}, the only endpoint the route admits\n")
            results = [await relay(t, server, (address, echo_port), count) for t in ("udp", "tcp")]
            for r in results:
                print(
                    f"TURN-{r['transport'].upper()}: relayed via {r['relayed_address']}: "
                    f"{r['received']}/{r['sent']} echoed, mean RTT {r['mean_rtt_ms']} ms"
                )
            outside = await relay("udp", server, (address, other_port), 5)
            print(
                f"peer {address}:{other_port} (port outside the route): "
                f"{outside['received']}/{outside['sent']} came back (dropped by policy)"
            )
            denied = await refused(server, ("127.0.0.2", echo_port))
            print(f"peer 127.0.0.2:{echo_port} (no route): {denied}")
            print("\nICE servers for a browser (RTCPeerConnection configuration):")
            print(json.dumps(ice_servers(config), indent=2))
            ok = (
                all(r["received"] == r["sent"] for r in results)
                and outside["received"] == 0
                and "403" in denied
            )
            print("\nresult:", "OK" if ok else "FAILED")
            return 0 if ok else 1
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            echo.close()
            other.close()


def port_busy(port: int) -> str | None:
    """Why the demo cannot have UDP `port`, or None if it is free."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as exc:
            return f"port {port}/udp is busy ({exc.strerror}); try --port"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("STUNNER_PORT", 3478)))
    parser.add_argument("--count", type=int, default=50, help="packets per transport")
    args = parser.parse_args()
    busy = port_busy(args.port)
    if busy:
        print(busy, file=sys.stderr)
        return 1
    try:
        return asyncio.run(run(args.address, args.port, args.count))
    except RuntimeError as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
