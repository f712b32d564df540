"""`stunner-demo`: the whole system on one machine, from the bundled example's YAML files.

1. Copies `examples/local/` (GatewayClass, GatewayConfig, Dataplane, a Gateway with a TURN-UDP
   and a TURN-TCP listener, a UDPRoute to a StaticService) to a temporary directory, pointing the
   route at a UDP echo peer it starts on 127.0.0.1.
2. Runs local mode on it: the files are rendered to a dataplane config, served on the config
   discovery service, and a stunnerd started for the Gateway picks it up.
3. Asks the auth service for the ICE-server JSON (`/ice`) and prints it.
4. Relays packets to the echo peer through each listener with aioice's TURN client, using those
   credentials.
5. Edits the UDPRoute file (removes its backend): the change reaches the running stunnerd, which
   now refuses the peer; restores the file: the peer is allowed again.

Everything it started is stopped on exit. `--browser` runs the same pipeline for a browser's
WebRTC call instead (reconciler/browser_demo.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from stunner_client.echo import EchoPeer
from stunner_client.probes import port_busy, wait_until_serving
from stunner_client.turn import refused, relay

from .demo_example import EXAMPLE, EXAMPLE_PORT, GATEWAY_ID, local_settings, prepare
from .local import run_local

EDIT_TIMEOUT = 5.0  # seconds an edit may take to reach stunnerd before the demo fails


def without_backend(route_text: str) -> str:
    """The UDPRoute with its rule's backendRefs removed (the route admits nothing)."""
    head, sep, _ = route_text.partition("    - backendRefs:")
    assert sep, "the example's UDPRoute has no backendRefs"
    return head + "    - backendRefs: []\n"


def get_json(url: str) -> Any:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=5) as response:
        return json.loads(response.read())


async def until_refused(
    server: tuple[str, int], peer: tuple[str, int], credentials: tuple[str, str]
) -> tuple[str, float]:
    """Poll with new allocations until the peer is refused; (the error, seconds it took)."""
    start = time.monotonic()
    while time.monotonic() - start < EDIT_TIMEOUT:
        error = await refused(server, peer, credentials, timeout=0.3)
        if "403" in error:
            return error, time.monotonic() - start
    return "still allowed", time.monotonic() - start


async def until_allowed(
    server: tuple[str, int], peer: tuple[str, int], credentials: tuple[str, str]
) -> tuple[int, float]:
    """Poll until packets to the peer come back; (packets echoed, seconds it took)."""
    start = time.monotonic()
    while time.monotonic() - start < EDIT_TIMEOUT:
        result = await relay("udp", server, peer, 3, credentials, wait=1.0)
        if result["received"]:
            return result["received"], time.monotonic() - start
    return 0, time.monotonic() - start


async def run(address: str, port: int, count: int, manifests: Path, verbose: bool) -> int:
    echo = await EchoPeer.bind(address)
    echo_port = echo.port
    peer = (address, echo_port)
    server = (address, port)
    route_file = prepare(manifests, port, echo_port)
    settings = local_settings(manifests, address, verbose)
    try:
        async with run_local(settings) as local:
            await local.rendered(1)
            config = local.store.configs.get(GATEWAY_ID)
            if config is None:
                raise RuntimeError(f"the example rendered no config for {GATEWAY_ID}")
            print(f"manifests in {manifests}: rendered Gateway {GATEWAY_ID}:")
            for listener in config.listeners:
                print(f"  listener {listener.name}: {listener.protocol} port {listener.port}")
            for cluster in config.clusters:
                print(f"  cluster {cluster.name}: {cluster.type} {', '.join(cluster.endpoints)}")
            print(
                f"config discovery service on {local.cds_address}; auth service on "
                f"{local.auth_address}"
            )
            stunnerd = await local.dataplane(GATEWAY_ID)
            await wait_until_serving(address, port, stunnerd)
            print(
                f"stunnerd (pid {stunnerd.pid}) watching {GATEWAY_ID}, serving on "
                f"{address}:{port}; echo peer on {address}:{echo_port}\n"
            )

            query = urllib.parse.urlencode(
                {"service": "turn", "namespace": "stunner", "iceTransportPolicy": "relay"}
            )
            ice = await asyncio.to_thread(get_json, f"{local.auth_address}/ice?{query}")
            print("ICE servers for a browser (GET /ice, the RTCPeerConnection configuration):")
            print(json.dumps(ice, indent=2))
            ice_server = ice["iceServers"][0]
            credentials = (ice_server["username"], ice_server["credential"])

            results = [await relay(t, server, peer, count, credentials) for t in ("udp", "tcp")]
            print()
            for r in results:
                print(
                    f"TURN-{r['transport'].upper()}: relayed via {r['relayed_address']}: "
                    f"{r['received']}/{r['sent']} echoed, mean RTT {r['mean_rtt_ms']} ms"
                )

            original = route_file.read_text()
            route_file.write_text(without_backend(original))
            print(f"\nedited {route_file.name}: removed the route's backend")
            denied, took = await until_refused(server, peer, credentials)
            print(f"  stunnerd refuses peer {address}:{echo_port} after {took:.2f} s: {denied}")
            route_file.write_text(original)
            print(f"restored {route_file.name}")
            echoed, took_back = await until_allowed(server, peer, credentials)
            print(
                f"  stunnerd relays to {address}:{echo_port} again after {took_back:.2f} s "
                f"({echoed}/3 echoed)"
            )
            ok = all(r["received"] == r["sent"] for r in results) and "403" in denied and echoed > 0
            print("\nresult:", "OK" if ok else "FAILED")
            return 0 if ok else 1
    finally:
        await echo.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=EXAMPLE_PORT, help="the listeners' port")
    parser.add_argument("--count", type=int, default=50, help="packets per transport")
    parser.add_argument("-v", "--verbose", action="store_true", help="show the components' logs")
    parser.add_argument(
        "--browser",
        action="store_true",
        help="serve a page that makes a relay-only WebRTC call to an echo media server",
    )
    parser.add_argument(
        "--headless", action="store_true", help="with --browser: call from headless Chromium"
    )
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(name)s %(levelname)s: %(message)s",
    )
    if not EXAMPLE.is_dir():
        print(f"the bundled example is missing ({EXAMPLE}): run from a checkout", file=sys.stderr)
        return 1
    busy = port_busy(args.port)
    if busy:
        print(busy, file=sys.stderr)
        return 1
    manifests = Path(tempfile.mkdtemp(prefix="stunner-demo-"))
    try:
        if args.browser:
            # aiortc and PyAV load only for the browser's call (and would import this module)
            from .browser_demo import run_browser

            return asyncio.run(
                run_browser(args.address, args.port, manifests, args.headless, args.verbose)
            )
        return asyncio.run(run(args.address, args.port, args.count, manifests, args.verbose))
    except (RuntimeError, OSError) as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(manifests, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
