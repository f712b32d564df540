"""`helm stunner ice` for a Gateway with a stunnerd on every node (relay address discovery): one
turn: URI per node public address, by Node name, a node without one left out.

End to end as tests/stunner_cli/test_public_address.py: the reconciler in cluster mode against
the fake API server, its CDS reached through the fake's service proxy (the configs and the
Nodes' public addresses), the CLI as a process.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from stunner_api.vocabulary import NODE_ADDRESS_PLACEHOLDER, RELAY_ADDRESS_DISCOVERY
from tests.reconciler import clusterkit as k
from tests.stunner_cli.test_public_address import add_node, cli_world, stunner

STEP = 30.0


def test_ice_prints_a_uri_per_node_for_a_node_local_gateway(tmp_path: Path) -> None:
    async def main() -> None:
        async with cli_world(tmp_path) as (fake, kubeconfig, view, _):

            def discover(gateway: dict[str, Any]) -> None:
                gateway["metadata"].setdefault("annotations", {})[RELAY_ADDRESS_DISCOVERY] = "true"

            k.update(fake, "gateway.networking.k8s.io/v1", "Gateway", "gw", discover)
            add_node(fake, "n2", ("InternalIP", "10.0.0.2"), ("ExternalIP", "192.0.2.8"))
            add_node(fake, "n1", ("InternalIP", "10.0.0.1"), ("ExternalIP", "192.0.2.7"))
            add_node(fake, "n3", ("InternalIP", "10.0.0.3"))  # no public address
            await k.eventually(
                lambda: (
                    view.config
                    and view.config.listeners[0].address == NODE_ADDRESS_PLACEHOLDER
                    and view.config.listeners[0].public_address == "192.0.2.7"
                ),
                what="the node placeholder and the first node's address in the config",
            )
            loop = asyncio.get_running_loop()
            deadline = loop.time() + STEP
            while True:
                code, out, err = await stunner(kubeconfig, "ice", f"{k.NS}/gw")
                assert code == 0, err
                urls = json.loads(out)["iceServers"][0]["urls"]
                if len(urls) > 1 or loop.time() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert urls == [
                "turn:192.0.2.7:3478?transport=udp",
                "turn:192.0.2.8:3478?transport=udp",
            ]

    asyncio.run(main())
