"""Local mode end to end: YAML files -> render -> CDS -> a real stunnerd -> a real TURN client.

We test, on a copy of the bundled example: the rendered config reaches a stunnerd started for the
Gateway, which relays through its UDP and TCP listeners (aioice) with the credentials /ice hands
out; an edit of the UDPRoute file reaches the running stunnerd (the peer is refused, then allowed
again); a new Gateway file starts a second stunnerd and removing it drains that one; everything
stops on exit. Also the command line: cluster mode is refused, a missing directory is an error,
and SIGTERM stops the reconciler and its stunnerds; and the README's first command passes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from reconciler.demo import until_allowed, until_refused, without_backend
from reconciler.demo_example import prepare
from reconciler.local import LocalSettings, run_local
from stunner_client.echo import EchoPeer
from stunner_client.probes import wait_until_serving
from stunner_client.turn import relay
from tests.support.ports import free_port

HOST = "127.0.0.1"
GATEWAY_ID = "stunner/local-gateway"


def serving(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((HOST, port)) == 0


async def get_json(url: str) -> Any:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200, await response.text()
        return await response.json()


def test_manifests_to_a_running_stunnerd_and_an_edit_reaching_it(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    output = (tmp_path / "stunnerd.log").open("wb")

    async def main() -> None:
        echo = await EchoPeer.bind(HOST)
        peer = echo.address
        port, second_port = free_port(), free_port()
        route = prepare(manifests, port, peer[1])
        settings = LocalSettings(
            manifests,
            cds_port=0,
            auth_port=0,
            poll_interval=0.05,
            start_dataplanes=True,
            dataplane_args=("--udp-thread-num", "1"),
            dataplane_output=output,
        )
        try:
            async with run_local(settings) as local:
                assert local.dataplanes is not None
                first = await local.dataplane(GATEWAY_ID)
                await wait_until_serving(HOST, port, first)

                ice = await get_json(
                    f"{local.auth_address}/ice?service=turn&iceTransportPolicy=relay"
                )
                [server] = ice["iceServers"]
                assert server["urls"] == [
                    f"turn:{HOST}:{port}?transport=udp",
                    f"turn:{HOST}:{port}?transport=tcp",
                ]
                assert ice["iceTransportPolicy"] == "relay"
                credentials = (server["username"], server["credential"])
                for transport in ("udp", "tcp"):
                    result = await relay(transport, (HOST, port), peer, 10, credentials)
                    assert result["received"] == 10, result

                original = route.read_text()
                route.write_text(without_backend(original))
                denied, _ = await until_refused((HOST, port), peer, credentials)
                assert "403" in denied
                route.write_text(original)
                echoed, _ = await until_allowed((HOST, port), peer, credentials)
                assert echoed > 0

                # A second Gateway: its own stunnerd; removed: that stunnerd drains and exits.
                gateway = (manifests / "gateway.yaml").read_text()
                second = gateway.replace("local-gateway", "second-gateway").replace(
                    f"port: {port}", f"port: {second_port}"
                )
                (manifests / "second.yaml").write_text(second)
                second_id = "stunner/second-gateway"
                second_proc = await local.dataplane(second_id)
                await wait_until_serving(HOST, second_port, second_proc)
                # Both stunnerds ask for http://:8086: each has its own loopback port instead.
                ports = local.dataplanes.admin_ports
                assert ports[GATEWAY_ID][0] != ports[second_id][0]
                for id in (GATEWAY_ID, second_id):
                    assert await get_json(f"http://{HOST}:{ports[id][0]}/live") == {}
                (manifests / "second.yaml").unlink()
                await asyncio.to_thread(second_proc.wait, 10)  # no allocations: exits at once
                assert second_proc.returncode == 0
                assert sorted(local.dataplanes.processes) == [GATEWAY_ID]
                assert first.poll() is None  # the first Gateway's stunnerd kept running
            assert first.poll() == 0  # stopped on exit
            assert not serving(port)
        finally:
            await echo.aclose()

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        output.close()
    log = (tmp_path / "stunnerd.log").read_text()
    assert "pass-1" not in log
    assert "cannot start the health-check server" not in log


def reconciler_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "reconciler", *args]


def test_cli_refuses_cluster_mode_and_a_missing_directory(tmp_path: Path) -> None:
    result = subprocess.run(reconciler_command(), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "cluster mode" in result.stderr and "--manifests DIR" in result.stderr
    missing = tmp_path / "nowhere"
    result = subprocess.run(
        reconciler_command("--manifests", str(missing)), capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert f"--manifests {missing}: not a directory" in result.stderr


def test_cli_runs_local_mode_and_stops_its_stunnerds_on_sigterm(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    port = free_port()
    prepare(manifests, port, 9)
    log = (tmp_path / "reconciler.log").open("wb")
    proc = subprocess.Popen(
        reconciler_command(
            "--manifests",
            str(manifests),
            "--cds-port",
            "0",
            "--auth-port",
            "0",
            "--start-dataplanes",
            "--udp-thread-num",
            "1",
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # signals to the reconciler reach only it
    )
    try:
        deadline = time.monotonic() + 20
        while not serving(port):
            assert proc.poll() is None, "the reconciler exited"
            assert time.monotonic() < deadline, "no stunnerd served the Gateway"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert not serving(port)  # its stunnerd is gone too
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    text = (tmp_path / "reconciler.log").read_text()
    assert "started stunnerd for stunner/local-gateway" in text
    assert "pass-1" not in text


def test_the_demo_passes() -> None:
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "reconciler.demo", "--port", str(port), "--count", "10"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "result: OK" in result.stdout
    assert result.stdout.count("10/10 echoed") == 2
    assert "403 - Forbidden" in result.stdout
    ice_text = result.stdout.split("RTCPeerConnection configuration):")[1].split("TURN-UDP")[0]
    ice = json.loads(ice_text)
    assert ice["iceServers"][0]["urls"] == [
        f"turn:{HOST}:{port}?transport=udp",
        f"turn:{HOST}:{port}?transport=tcp",
    ]
