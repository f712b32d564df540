"""Applying configs to a running stunnerd: in place where possible, all or nothing.

We test: an identical config changes nothing; a route change applies in place, keeps the
allocation, and takes effect on the very next relayed packet; a port change restarts that
listener only; a config that cannot be applied (port in use) is refused whole and the previous
config keeps serving.
"""

from __future__ import annotations

import asyncio
import socket
from functools import partial

import pytest

from stunner_api.dataplane import StunnerConfig
from stunner_api.stun import Class
from stunnerd.process.core import DataplaneCore, Plan
from stunnerd.process.daemon import ApplyError
from stunnerd.transport.listener import Listener
from stunnerd.turn.auth import NonceManager
from stunnerd.turn.ledger import LocalQuota, Reservations
from tests.support.turnclient import (
    HOST,
    RawClient,
    free_port,
    make_config,
    running_stunner,
    start_peer,
)


def test_identical_config_changes_nothing() -> None:
    async def main() -> None:
        port = free_port()
        config = make_config(port, [f"{HOST}/32"])
        async with running_stunner(config) as stunner:
            before = dict(stunner.listeners)
            await stunner.apply(make_config(port, [f"{HOST}/32"]))
            assert stunner.listeners == before

    asyncio.run(main())


def test_route_change_is_in_place_and_checked_per_packet() -> None:
    async def main() -> None:
        peer = await start_peer(echo=True)
        port = free_port()
        async with running_stunner(make_config(port, [f"{HOST}/32"])) as stunner:
            udp_listener = stunner.listeners["testns/gw/turn-udp"]
            client = await RawClient.connect((HOST, port))
            await client.allocate()
            await client.channel_bind(0x4000, (HOST, peer.port))
            client.send_channel_data(0x4000, b"before")
            assert await asyncio.wait_for(client.channel_data.get(), 2) == (0x4000, b"before")

            await stunner.apply(make_config(port, ["10.0.0.0/8"]))  # the peer is no longer in
            assert stunner.listeners["testns/gw/turn-udp"] is udp_listener
            assert stunner.allocation_count == 1
            client.send_channel_data(0x4000, b"after")
            await asyncio.sleep(0.2)
            assert client.channel_data.empty()
            assert [data for data, _ in peer.received] == [b"before"]

            await stunner.apply(make_config(port, [f"{HOST}/32"]))  # and back
            client.send_channel_data(0x4000, b"again")
            assert await asyncio.wait_for(client.channel_data.get(), 2) == (0x4000, b"again")
            client.close()
        peer.close()

    asyncio.run(main())


def test_port_change_restarts_that_listener_only() -> None:
    async def main() -> None:
        port, new_port = free_port(), free_port()
        async with running_stunner(make_config(port, [f"{HOST}/32"])) as stunner:
            tcp_listener = stunner.listeners["testns/gw/turn-tcp"]
            config = make_config(port, [f"{HOST}/32"])
            moved = config.model_copy(
                update={
                    "listeners": [
                        config.listeners[0].model_copy(update={"port": new_port}),
                        config.listeners[1],
                    ]
                }
            )
            await stunner.apply(moved)
            assert stunner.listeners["testns/gw/turn-tcp"] is tcp_listener
            client = await RawClient.connect((HOST, new_port))
            assert (await client.allocate()).message_class == Class.SUCCESS
            client.close()

    asyncio.run(main())


def test_config_that_cannot_be_applied_is_refused_whole() -> None:
    async def main() -> None:
        port = free_port()
        busy = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        busy.bind((HOST, 0))
        busy_port = busy.getsockname()[1]
        original = make_config(port, [f"{HOST}/32"], protocols=("TURN-UDP",))
        async with running_stunner(original) as stunner:
            client = await RawClient.connect((HOST, port))
            await client.allocate()
            bad = make_config(busy_port, ["10.0.0.0/8"], protocols=("TURN-UDP",), user_quota=7)
            with pytest.raises(ApplyError, match="testns/gw/turn-udp"):
                await stunner.apply(bad)
            assert stunner.config == original
            assert stunner.context is not None and stunner.context.user_quota == 0
            # The listener was restarted on its old port, and the old routes still hold.
            fresh = await RawClient.connect((HOST, port))
            assert (await fresh.allocate()).message_class == Class.SUCCESS
            assert stunner.router.permits("testns/gw/turn-udp", HOST)
            fresh.close()
            client.close()
        busy.close()

    asyncio.run(main())


def test_certificate_change_restarts_that_listener_only() -> None:
    from stunnerd.transport.certificates import self_signed_certificate

    async def main() -> None:
        udp_port, tls_port = free_port(), free_port()
        base = make_config(udp_port, [f"{HOST}/32"], protocols=("TURN-UDP",))

        def with_tls(certificate: tuple[str, str]) -> StunnerConfig:
            tls = base.listeners[0].model_copy(
                update={
                    "name": "testns/gw/tls",
                    "protocol": "TURN-TLS",
                    "port": tls_port,
                    "cert": certificate[0],
                    "key": certificate[1],
                }
            )
            return base.model_copy(update={"listeners": [base.listeners[0], tls]})

        async with running_stunner(with_tls(self_signed_certificate("127.0.0.1"))) as stunner:
            udp, tls = stunner.listeners["testns/gw/turn-udp"], stunner.listeners["testns/gw/tls"]
            client = await RawClient.connect((HOST, udp_port))
            await client.allocate()
            await stunner.apply(with_tls(self_signed_certificate("127.0.0.1")))
            assert stunner.listeners["testns/gw/turn-udp"] is udp
            assert stunner.listeners["testns/gw/tls"] is not tls
            assert stunner.allocation_count == 1  # the UDP client's allocation survived
            client.close()

    asyncio.run(main())


def test_log_levels_follow_every_reconcile_unless_overridden() -> None:
    import logging

    from stunnerd.process.daemon import Stunner
    from stunnerd.surface import logs

    turn = logging.getLogger("stunner.turn")

    async def main() -> None:
        port = free_port()
        async with running_stunner(make_config(port, [f"{HOST}/32"])) as stunner:
            await stunner.apply(
                make_config(port, [f"{HOST}/32"], admin={"loglevel": "all:WARN,turn:DEBUG"})
            )
            assert turn.getEffectiveLevel() == logging.DEBUG
            assert logging.getLogger("stunner.auth").getEffectiveLevel() == logging.WARNING
            await stunner.apply(make_config(port, [f"{HOST}/32"], admin={"loglevel": "all:ERROR"}))
            assert turn.getEffectiveLevel() == logging.ERROR
        overridden = Stunner(log_levels=logs.LevelControl.OVERRIDDEN)
        logs.apply_level_spec("all:INFO")  # what the command does with -l all:INFO
        await overridden.apply(
            make_config(free_port(), [f"{HOST}/32"], admin={"loglevel": "all:ERROR"})
        )
        try:
            assert turn.getEffectiveLevel() == logging.INFO  # -l on the command line wins
        finally:
            await overridden.close()

    try:
        asyncio.run(main())
    finally:
        logs.apply_level_spec(logs.DEFAULT_LEVEL_SPEC)


def test_a_hosted_stunnerd_sets_its_own_scopes_and_leaves_the_hosts_loggers() -> None:
    """A stunnerd run inside another program (the `Stunner` of a host process, as here) applies
    its admin.loglevel to its own scopes' loggers only: the `stunner` logger and the host's
    loggers under it (the reconciler's, the shared stunner_http's) keep the host's levels."""
    import logging

    from stunnerd.surface import logs

    host = logging.getLogger("stunner")
    host_loggers = [logging.getLogger(f"stunner.{name}") for name in ("reconciler", "http")]
    host.setLevel(logging.INFO)
    host_loggers[0].setLevel(logging.DEBUG)

    async def main() -> None:
        port = free_port()
        async with running_stunner(make_config(port, [f"{HOST}/32"])) as stunner:
            spec = "all:ERROR,turn:DEBUG,reconciler:ERROR"
            await stunner.apply(make_config(port, [f"{HOST}/32"], admin={"loglevel": spec}))
            assert logging.getLogger("stunner.turn").getEffectiveLevel() == logging.DEBUG
            for scope in logs.OWN_SCOPES:
                if scope != "turn":
                    level = logging.getLogger(f"stunner.{scope}").getEffectiveLevel()
                    assert level == logging.ERROR, scope
            assert host.level == logging.INFO
            assert host_loggers[0].getEffectiveLevel() == logging.DEBUG
            assert host_loggers[1].getEffectiveLevel() == logging.INFO

    asyncio.run(main())


# --- the dataplane core both processes use ------------------------------------------------------


def core_plan(config: StunnerConfig, rollback: bool) -> Plan:
    return Plan(
        stop=[],
        start={lc.name: partial(Listener, lc) for lc in config.listeners},
        rollback=rollback,
    )


def test_core_without_rollback_serves_what_can_start(caplog: pytest.LogCaptureFixture) -> None:
    """A UDP worker's way: the primary already applied the config, so a listener that cannot
    start is logged and the rest (auth, quota, routes) is applied all the same."""

    async def main() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
            squatter.bind((HOST, 0))
            squatter.listen()
            busy = squatter.getsockname()[1]
            config = make_config(busy, [f"{HOST}/32"], user_quota=7)
            core = DataplaneCore(NonceManager(), LocalQuota(), Reservations(), False)
            try:
                await core.apply(config, core_plan(config, rollback=False))
                assert list(core.listeners) == ["testns/gw/turn-udp"]  # TCP: port taken
                assert core.context is not None and core.context.user_quota == 7
                assert core.router.permits("testns/gw/turn-udp", HOST)
            finally:
                await core.close()
        assert "listener testns/gw/turn-tcp: TCP port" in caplog.text

    asyncio.run(main())


def test_core_with_rollback_refuses_the_whole_config() -> None:
    async def main() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
            squatter.bind((HOST, 0))
            squatter.listen()
            config = make_config(squatter.getsockname()[1], [f"{HOST}/32"], user_quota=7)
            core = DataplaneCore(NonceManager(), LocalQuota(), Reservations(), False)
            try:
                with pytest.raises(ApplyError, match="listener testns/gw/turn-tcp"):
                    await core.apply(config, core_plan(config, rollback=True))
                assert core.listeners == {} and core.context is None
            finally:
                await core.close()

    asyncio.run(main())
