"""stunnerd -w: the daemon takes its config from a watched file or the config discovery service.

We test, with stunnerd as a real subprocess: watch mode starts not ready with no listener; a
config arriving from the CDS makes it ready and serving; an update is applied in place; the zero
config sent when the Gateway is deleted is ignored (a draining pod keeps serving); a watched file
that changes is reconciled, and an invalid rewrite is refused while the old config keeps serving;
a config refused because its port is held by another process (on the host network: the stunnerd
a DaemonSet rollout replaces, draining) is applied once the port is free, with no new config.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

from stunner_api.stun import Class
from tests.cds_server import run_cds_server
from tests.support.turnclient import HOST, RawClient, free_port, make_config

from .conftest import StartStunnerd
from .test_admin import get

WATCH = ("-w", "--grace-period", "5")
NO_NODE_NAME = {"STUNNER_NODENAME": ""}


async def wait_for(predicate, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def allocates(port: int) -> bool:
    client = await RawClient.connect((HOST, port))
    try:
        return (await client.allocate()).message_class == Class.SUCCESS
    except TimeoutError:
        return False
    finally:
        client.close()


async def is_ready(port: int) -> bool:
    try:
        return (await get(f"http://127.0.0.1:{port}/ready"))[0] == 200
    except OSError:  # not listening yet (urllib's URLError is an OSError)
        return False


def test_watch_the_config_discovery_service(stunnerd: StartStunnerd) -> None:
    async def main() -> None:
        health = free_port()
        port, new_port = free_port(), free_port()
        admin = {"healthcheck_endpoint": f"http://127.0.0.1:{health}"}
        async with run_cds_server() as cds:
            process = stunnerd(*WATCH, "-c", cds.address, "-i", "testns/gw", env=NO_NODE_NAME)
            # Not ready until the first real config arrives. The bootstrap's health server
            # is the default one (:8086), so probe the TURN port instead.
            await asyncio.sleep(1.0)
            assert not await allocates(port)
            cds.set_config("testns/gw", make_config(port, [f"{HOST}/32"], admin=admin))
            await wait_for(lambda: allocates(port))
            # The health server of the new config starts beside the listeners, not before them.
            await wait_for(lambda: is_ready(health), timeout=5.0)
            moved = make_config(new_port, [f"{HOST}/32"], admin=admin)
            cds.set_config("testns/gw", moved)
            await wait_for(lambda: allocates(new_port))
            cds.delete("testns/gw")  # the zero config: ignored
            await asyncio.sleep(1.0)
            assert await allocates(new_port)
            assert (await get(f"http://127.0.0.1:{health}/ready"))[0] == 200
            await asyncio.to_thread(process.stop, at_once=True)
            assert process.returncode == 0

    asyncio.run(main())


def test_watch_a_config_file(tmp_path: Path, stunnerd: StartStunnerd) -> None:
    async def main() -> None:
        port, new_port = free_port(), free_port()
        path = tmp_path / "stunnerd.conf"
        path.write_text(make_config(port, [f"{HOST}/32"]).to_json())
        process = stunnerd(*WATCH, "-c", str(path))
        await wait_for(lambda: allocates(port))
        path.write_text(json.dumps({"version": "v1", "listeners": [{"port": 70000}]}))
        await asyncio.sleep(1.0)
        assert await allocates(port)  # the invalid rewrite was refused
        path.write_text(make_config(new_port, [f"{HOST}/32"]).to_json())
        await wait_for(lambda: allocates(new_port))
        stderr = await asyncio.to_thread(process.stop, at_once=True)
        assert "listeners[0]" in stderr  # the refusal names the field
        assert process.returncode == 0

    asyncio.run(main())


def test_a_config_refused_for_a_busy_port_applies_once_the_port_is_free(
    stunnerd: StartStunnerd,
) -> None:
    async def main() -> None:
        port = free_port()
        squatter = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # no SO_REUSEPORT
        squatter.bind((HOST, port))
        async with run_cds_server() as cds:
            cds.set_config("testns/gw", make_config(port, [f"{HOST}/32"], protocols=("TURN-UDP",)))
            process = stunnerd(*WATCH, "-c", cds.address, "-i", "testns/gw", env=NO_NODE_NAME)
            await wait_for(lambda: asyncio.sleep(0.1, result="already in use" in process.stderr))
            squatter.close()  # the draining stunnerd left; the CDS sends nothing new
            await wait_for(lambda: allocates(port))
            stderr = await asyncio.to_thread(process.stop, at_once=True)
        assert "UDP port" in stderr and "already in use" in stderr, stderr
        assert "applied the configuration refused before" in stderr, stderr

    asyncio.run(main())
