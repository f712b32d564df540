"""`stunner selftest`: the chart's `helm test`. For every Gateway config the CDS serves, through
each TURN-UDP and TURN-TCP listener's public address: allocate with a real TURN client, and,
given an echo peer a route admits, relay a few packets to it and back."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request

from stunner_api.cds import CONFIGS_PATH
from stunner_api.dataplane import validate_config
from stunner_api.ice import credentials

TRANSPORTS = {"TURN-UDP": "udp", "TURN-TCP": "tcp"}


def _peer(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def _probe(
    transport: str, server: tuple[str, int], creds: tuple[str, str], peer: str, timeout: float
) -> str:
    from stunnerd.demo import relay

    if peer:
        result = await asyncio.wait_for(
            relay(transport, server, _peer(peer), 5, creds, wait=timeout), timeout + 5
        )
        if not result["received"]:
            raise RuntimeError(f"allocated {result['relayed_address']}, no echo from {peer}")
        return f"echoed {result['received']}/{result['sent']} via {result['relayed_address']}"
    from aioice.turn import create_turn_endpoint

    turn, _ = await asyncio.wait_for(
        create_turn_endpoint(
            asyncio.DatagramProtocol,
            server_addr=server,
            username=creds[0],
            password=creds[1],
            transport=transport,
        ),
        timeout,
    )
    try:
        return f"allocated {turn.get_extra_info('sockname')}"
    finally:
        turn.close()


def selftest(cds_url: str, peer: str, timeout: float) -> int:
    with urllib.request.urlopen(cds_url.rstrip("/") + CONFIGS_PATH, timeout=timeout) as answer:
        items = json.load(answer).get("items", [])
    configs = [validate_config(item) for item in items]
    failures = tested = 0
    for config in configs:
        creds = credentials(config.auth, "helm-test", 3600, int(time.time()))
        for listener in config.listeners:
            transport = TRANSPORTS.get(listener.protocol)
            if transport is None or not listener.public_address:
                continue
            server = (listener.public_address, listener.public_port or listener.port)
            where = f"{listener.name} {transport} {server[0]}:{server[1]}"
            tested += 1
            try:
                line = asyncio.run(_probe(transport, server, creds, peer, timeout))
                sys.stdout.write(f"ok   {where}: {line}\n")
            except Exception as e:
                failures += 1
                sys.stdout.write(f"FAIL {where}: {e}\n")
    if not tested:
        sys.stdout.write("FAIL no TURN-UDP or TURN-TCP listener with a public address\n")
        return 1
    return 1 if failures else 0
