"""`stunner ice` and `stunner status` before and after a Gateway's Service has a public address.

End to end, with no cluster: the reconciler in cluster mode against the fake API server renders
the Gateway and creates its Service (a LoadBalancer, which the fake gives node ports and no
ingress: a cluster with no load-balancer controller); its CDS is reached through the fake's
service proxy; a stunnerd /status (stunnerd.surface.admin's own) serves the config the CDS serves;
the CLI runs as a process, as `helm stunner` runs it.

- No Node has an address: `ice` prints no ICE configuration (it would say 0.0.0.0), says on
  stderr what is missing for which Gateway and listener, and exits 1; `status` says pending.
- A Node with only an InternalIP appears (kubeadm, kind, bare metal): the reconciler's node
  fallback puts the node's address and the nodePort in the config, the Gateway's status says
  the same address, `ice` prints it and `status` shows it.
- A STUN-only Gateway (GatewayConfig stunMode): `ice` prints its `stun:` URI, no credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from reconciler.cds.access import Account
from stunner_api.dataplane import StunnerConfig
from stunner_cli.cluster import READER_ACCOUNT
from stunnerd.surface.admin import status_of
from tests.reconciler import clusterkit as k
from tests.support.fakeapi import FakeApiServer
from tests.support.objects import cds_service

CDS_NAMESPACE = "stunner-system"
NODE_ADDRESS = "192.0.2.7"  # TEST-NET-1: never dialled, only printed


class DataplaneView:
    """What stunnerd.surface.admin's /status reads, over the config the reconciler's CDS serves
    now."""

    def __init__(self, configs: Mapping[str, StunnerConfig]) -> None:
        self.configs = configs
        self.ready = True
        self.status = "READY"
        self.allocation_count = 0

    @property
    def config(self) -> StunnerConfig | None:
        return self.configs.get(f"{k.NS}/gw")

    def listener_stats(self) -> dict[str, Any]:
        return {}

    def listener_offload(self) -> dict[str, Any]:
        return {}


async def stunner(kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "stunner_cli",
        *args,
        "--kubeconfig",
        str(kubeconfig),
        "-n",
        CDS_NAMESPACE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return int(proc.returncode or 0), out.decode(), err.decode()


def add_node(fake: FakeApiServer, name: str, *addresses: tuple[str, str]) -> None:
    """A Node joins and its kubelet reports its addresses (a status write, as in a cluster)."""
    fake.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    status = {"status": {"addresses": [{"type": t, "address": a} for t, a in addresses]}}
    rt = fake.resource_type("v1", "Node")
    fake.patch(rt, "", name, "application/merge-patch+json", status, subresource="status")


@contextlib.asynccontextmanager
async def cli_world(
    tmp_path: Path, **gateway_config: Any
) -> AsyncIterator[tuple[FakeApiServer, Path, DataplaneView, int]]:
    """The world (its GatewayConfig's spec updated with `gateway_config`) reconciled, the CDS
    and a stunnerd /status behind the fake's proxies: (fake, kubeconfig, the /status view, the
    Gateway's UDP nodePort)."""
    with FakeApiServer() as fake:
        k.world(fake)
        if gateway_config:
            k.update(
                fake,
                "stunner.l7mp.io/v1",
                "GatewayConfig",
                "config",
                lambda obj: obj["spec"].update(gateway_config),
            )
        fake.seed(cds_service(CDS_NAMESPACE))
        fake.seed(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "gw-abc",
                    "namespace": k.NS,
                    "labels": {
                        "app": "stunner",
                        "stunner.l7mp.io/related-gateway-name": "gw",
                    },
                },
            }
        )
        # As the chart installs it: the CLI reads the CDS as the reader account.
        reader = {"name": READER_ACCOUNT, "namespace": CDS_NAMESPACE}
        fake.seed({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": reader})
        readers = frozenset({Account(CDS_NAMESPACE, READER_ACCOUNT)})
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        async with k.reconciler(fake, tmp_path, cds_readers=readers) as running:
            await k.settled(running, fake)
            host, _, port = running.cds_address.removeprefix("http://").rpartition(":")
            fake.proxy(
                CDS_NAMESPACE, "services", "stunner-config-discovery", 13478, (host, int(port))
            )
            pod = web.Application()
            view = DataplaneView(running.mode.store.configs)

            async def status(_: web.Request) -> web.Response:
                return web.json_response(status_of(view))  # type: ignore[arg-type]

            pod.router.add_get("/status", status)
            runner = web.AppRunner(pod)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            pod_port = runner.addresses[0][1]
            fake.proxy(k.NS, "pods", "gw-abc", 8086, ("127.0.0.1", pod_port))
            try:
                service = await k.eventually(
                    lambda: k.get(fake, "v1", "Service", "gw"), what="the Gateway's Service"
                )
                assert service is not None and service["spec"]["type"] == "LoadBalancer"
                yield fake, kubeconfig, view, service["spec"]["ports"][0]["nodePort"]
            finally:
                await runner.cleanup()


def test_ice_and_status_before_and_after_a_node_address(tmp_path: Path) -> None:
    async def main() -> None:
        async with cli_world(tmp_path) as (fake, kubeconfig, view, node_port):
            # No node address: no ICE configuration, what is missing on stderr, exit 1.
            code, out, err = await stunner(kubeconfig, "ice", f"{k.NS}/gw")
            assert code == 1 and out == "", (out, err)
            assert (
                f"{k.NS}/gw: listener udp has no public address: its Service "
                f"{k.NS}/gw (LoadBalancer) has no public address yet (no LoadBalancer "
                f"ingress, nodePort {node_port} but no Node with an address: "
                "ExternalIP/ExternalDNS/InternalIP)"
            ) in err
            assert "0.0.0.0" in err and "Traceback" not in err
            code, out, err = await stunner(kubeconfig, "ice")  # every Gateway: the same
            assert code == 1 and f"{k.NS}/gw: listener udp" in err
            code, out, err = await stunner(kubeconfig, "status")
            assert code == 0, err
            assert f"listeners: [{k.NS}/gw/udp=TURN-UDP public=pending]" in out

            # A node with only an InternalIP: the config, the status and `ice` agree.
            add_node(fake, "n1", ("Hostname", "n1"), ("InternalIP", NODE_ADDRESS))
            await k.eventually(
                lambda: view.config and view.config.listeners[0].public_address,
                what="the node's address in the config",
            )
            code, out, err = await stunner(kubeconfig, "ice", f"{k.NS}/gw")
            assert code == 0, err
            (server,) = json.loads(out)["iceServers"]
            assert server["urls"] == [f"turn:{NODE_ADDRESS}:{node_port}?transport=udp"]
            gateway = await k.eventually(
                lambda: (
                    (g := k.get(fake, k.GW, "Gateway", "gw"))
                    and (g.get("status") or {}).get("addresses")
                    and g
                ),
                what="the Gateway's status.addresses",
            )
            assert gateway["status"]["addresses"] == [{"type": "IPAddress", "value": NODE_ADDRESS}]
            programmed = next(
                c for c in gateway["status"]["conditions"] if c["type"] == "Programmed"
            )
            assert programmed["status"] == "True"
            code, out, err = await stunner(kubeconfig, "status")
            assert code == 0, err
            assert (f"listeners: [{k.NS}/gw/udp=TURN-UDP public={NODE_ADDRESS}:{node_port}]") in out

    asyncio.run(main())


def test_ice_prints_stun_uris_for_a_stun_only_gateway(tmp_path: Path) -> None:
    """GatewayConfig stunMode: `helm stunner ice` prints a `stun:` URI and no credentials (the
    world's static ones are not handed out: no TURN request would accept them)."""

    async def main() -> None:
        async with cli_world(tmp_path, stunMode=True) as (fake, kubeconfig, view, node_port):
            add_node(fake, "n1", ("Hostname", "n1"), ("ExternalIP", NODE_ADDRESS))
            await k.eventually(
                lambda: view.config and view.config.listeners[0].public_address,
                what="the node's address in the config",
            )
            code, out, err = await stunner(kubeconfig, "ice", f"{k.NS}/gw")
            assert code == 0, err
            assert json.loads(out) == {
                "iceServers": [{"urls": [f"stun:{NODE_ADDRESS}:{node_port}"]}],
                "iceTransportPolicy": "all",
            }
            assert "pass-word" not in out

    asyncio.run(main())
