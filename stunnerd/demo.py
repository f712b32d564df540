"""`stunnerd-demo`: run stunnerd locally and relay through it with a real TURN client.

Starts a UDP echo peer on 127.0.0.1, starts `stunnerd` (a subprocess) with a TURN-UDP and a
TURN-TCP listener whose only route admits that echo peer, relays packets through both listeners
with aioice's TURN client, shows that a peer outside the routes is refused, prints the
ICE-server JSON a browser would use, and stops everything it started. The echo peer and the
TURN client are stunner_client's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stunner_api.dataplane import validate_config
from stunner_api.ice import IceQuery, ice_config
from stunner_api.vocabulary import DEFAULT_REALM
from stunner_client.echo import EchoPeer
from stunner_client.probes import port_busy, wait_until_serving
from stunner_client.turn import refused, relay

USERNAME = "user-1"
PASSWORD = "pass-1"
CREDENTIALS = (USERNAME, PASSWORD)


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


def ice_servers(config: dict[str, Any]) -> dict[str, Any]:
    """What the STUNner auth service's `/ice?service=turn&iceTransportPolicy=relay` answers for
    the demo's config: the very builder the reconciler serves it with."""
    query = IceQuery(ice_transport_policy="relay")
    return ice_config({"demo": validate_config(config)}, query, now=int(time.time()))


async def run(address: str, port: int, count: int) -> int:
    echo = await EchoPeer.bind(address)
    echo_port = echo.port
    # Another local peer on a port outside the route's range: packets to it must be dropped.
    other = await EchoPeer.bind(address)
    other_port = other.port

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
            results = [
                await relay(t, server, (address, echo_port), count, CREDENTIALS)
                for t in ("udp", "tcp")
            ]
            for r in results:
                print(
                    f"TURN-{r['transport'].upper()}: relayed via {r['relayed_address']}: "
                    f"{r['received']}/{r['sent']} echoed, mean RTT {r['mean_rtt_ms']} ms"
                )
            outside = await relay("udp", server, (address, other_port), 5, CREDENTIALS)
            print(
                f"peer {address}:{other_port} (port outside the route): "
                f"{outside['received']}/{outside['sent']} came back (dropped by policy)"
            )
            denied = await refused(server, ("127.0.0.2", echo_port), CREDENTIALS)
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
            await echo.aclose()
            await other.aclose()


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
