"""Hot reconcile under live traffic (issue 5's matrix, the parts in place).

A client keeps relaying through listener A at a steady rate while, one after another: listener B
is added, changed (port) and removed; the routes change (still admitting the peer); the
credentials change; a config that cannot be applied is pushed. Not one packet may be lost, and
A's allocation must survive every step.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from stunner_api.dataplane import StunnerConfig
from stunnerd.process.daemon import ApplyError
from tests.support.turnclient import (
    HOST,
    RawClient,
    free_port,
    make_config,
    running_stunner,
    start_peer,
)

pytestmark = pytest.mark.usefixtures("relay_path")  # both relay paths: conftest.py


def with_listeners(config: StunnerConfig, *extra: tuple[str, int]) -> StunnerConfig:
    listeners = list(config.listeners)
    for name, port in extra:
        listeners.append(listeners[0].model_copy(update={"name": name, "port": port}))
    return config.model_copy(update={"listeners": listeners})


def test_relaying_survives_every_in_place_change() -> None:
    async def main() -> None:
        peer = await start_peer(echo=True)
        port_a, port_b, port_b2 = free_port(), free_port(), free_port()
        base = make_config(port_a, [f"{HOST}/32"], protocols=("TURN-UDP",))
        async with running_stunner(base) as stunner:
            client = await RawClient.connect((HOST, port_a))
            await client.allocate()
            await client.channel_bind(0x4000, (HOST, peer.port))
            listener_a = stunner.listeners["testns/gw/turn-udp"]
            sent = 0
            stop = asyncio.Event()

            async def traffic() -> None:
                nonlocal sent
                while not stop.is_set():
                    client.send_channel_data(0x4000, b"%06d" % sent)
                    sent += 1
                    await asyncio.sleep(0.002)

            sender = asyncio.create_task(traffic())
            steps = [
                with_listeners(base, ("testns/gw/b", port_b)),  # B added
                with_listeners(base, ("testns/gw/b", port_b2)),  # B changed: restarted alone
                base,  # B removed
                make_config(port_a, [f"{HOST}/32", "10.0.0.0/8"], protocols=("TURN-UDP",)),
                make_config(
                    port_a,
                    [f"{HOST}/32"],
                    protocols=("TURN-UDP",),
                    auth={
                        "type": "static",
                        "realm": "stunner.l7mp.io",
                        "credentials": {"username": "new", "password": "creds"},
                    },
                ),
            ]
            for step in steps:
                await asyncio.sleep(0.1)
                await stunner.apply(step)
                assert stunner.listeners["testns/gw/turn-udp"] is listener_a
            busy = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            busy.bind((HOST, 0))
            with pytest.raises(ApplyError):
                await stunner.apply(with_listeners(base, ("testns/gw/c", busy.getsockname()[1])))
            busy.close()
            await asyncio.sleep(0.1)
            stop.set()
            await sender
            await asyncio.sleep(0.3)
            received = []
            while not client.channel_data.empty():
                received.append(client.channel_data.get_nowait()[1])
            assert len(received) == sent, f"lost {sent - len(received)} of {sent}"
            assert sorted(received) == [b"%06d" % i for i in range(sent)]
            assert stunner.listeners["testns/gw/turn-udp"] is listener_a
            assert stunner.allocation_count == 1
            client.close()
        peer.close()

    asyncio.run(main())


def test_realm_change_restarts_all_listeners() -> None:
    async def main() -> None:
        port = free_port()
        base = make_config(port, [f"{HOST}/32"])
        async with running_stunner(base) as stunner:
            before = dict(stunner.listeners)
            realm = base.auth.model_copy(update={"realm": "other.example.com"})
            await stunner.apply(base.model_copy(update={"auth": realm}))
            assert all(stunner.listeners[name] is not lst for name, lst in before.items())

    asyncio.run(main())
