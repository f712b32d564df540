"""The two relay paths of TURN-UDP and TURN-TCP side by side: the pure-Python one
(STUNNER_NATIVE=0) and the native engine (stunnerd/native_udp.py, stunnerd/native_tcp.py).

We test: one scripted client session (STUN requests and their errors, Send and Data
indications of both shapes, ChannelData both ways, unpermitted and forbidden peers, an unbound
channel, Refresh 0) gives the same answers, the same packets and the same counters on both
paths, over UDP and over TCP, and on the native path the engine relayed the media; a route
change that forbids a peer stops its packets in both directions at the next packet after the
reconcile (UDP and TCP), and its dropped packets are logged with the reason once, on both
paths; a compiler that fails makes the build of the extension a warning, not a
failed install; without the extension, TURN-UDP and TURN-TCP keep the Python path.
"""

from __future__ import annotations

import asyncio
import logging
import runpy
from pathlib import Path
from typing import Any

import pytest
from setuptools import Distribution

from stunner_api.stun import Class, Message, Method
from stunnerd.process.daemon import Stunner
from stunnerd.transport import native
from stunnerd.transport.listener import Listener
from stunnerd.transport.native_tcp import NativeTcpTransport
from stunnerd.transport.native_udp import NativeUdpTransport
from stunnerd.transport.transports import TcpTransport, UdpTransport
from tests.support.turnclient import (
    HOST,
    Peer,
    RawClient,
    RawTcpClient,
    error_code,
    free_port,
    make_config,
    running_stunner,
    start_peer,
)

_REASON = native.unavailable_reason()
needs_native = pytest.mark.skipif(
    _REASON is not None and "STUNNER_NATIVE" not in _REASON, reason=f"native relay: {_REASON}"
)
UDP = "testns/gw/turn-udp"
TCP = "testns/gw/turn-tcp"
CLIENTS: dict[str, type[RawClient]] = {UDP: RawClient, TCP: RawTcpClient}
NATIVE = {UDP: NativeUdpTransport, TCP: NativeTcpTransport}
CLUSTER = "testns/backend"
QUIET = 0.2  # how long "nothing more arrives" is watched for


def answer(response: Message) -> tuple[str, str, int | None]:
    return response.method.name, response.message_class.name, error_code(response)


async def received(client: RawClient, peers: dict[int, str]) -> list[Any]:
    """What reached the client since the last call, relayed addresses named."""
    await asyncio.sleep(QUIET)
    got: list[Any] = []
    while not client.channel_data.empty():
        got.append(("channel", *client.channel_data.get_nowait()))
    while not client.indications.empty():
        message = client.indications.get_nowait()
        ip, port = message.attributes["XOR-PEER-ADDRESS"]
        got.append((message.method.name, peers.get(port, port), message.attributes["DATA"]))
    return got


async def session(port: int, admitted: Peer, outside: Peer, listener: str) -> list[Any]:
    """One client's session on `listener` (UDP or TCP), with every observable outcome in
    order."""
    names = {admitted.port: "admitted", outside.port: "outside"}
    to_admitted, to_outside = (HOST, admitted.port), (HOST, outside.port)
    log: list[Any] = []
    client = await CLIENTS[listener].connect((HOST, port))
    log.append(answer(await client.request(Message(Method.BINDING, Class.REQUEST), sign=False)))
    log.append(answer(await client.refresh(600)))  # no allocation yet: 437
    response = await client.allocate()
    log.append(answer(response))
    relayed = response.attributes["XOR-RELAYED-ADDRESS"]
    client.send_indication(to_admitted, b"before the permission")
    client.send_channel_data(0x4000, b"before the channel")
    log.append(await received(client, names))
    log.append(answer(await client.create_permission(to_admitted)))
    log.append(answer(await client.create_permission(("127.0.0.2", 9))))  # no route: 403
    for i in range(20):
        client.send_indication(to_admitted, b"send %02d" % i)  # the plain shape
    unusual = Message(Method.SEND, Class.INDICATION)  # another shape: Python parses it
    unusual.attributes.update(
        {"XOR-PEER-ADDRESS": to_admitted, "DATA": b"via the parser", "SOFTWARE": "t"}
    )
    client.send_raw(unusual.encode())
    log.append(await received(client, names))
    log.append(answer(await client.channel_bind(0x4000, to_admitted)))
    log.append(answer(await client.channel_bind(0x4001, to_admitted)))  # peer bound: 400
    for i in range(30):
        client.send_channel_data(0x4000, b"channel %02d" % i + bytes(i))
    client.send_channel_data(0x4002, b"unbound channel")
    client.send_indication(to_outside, b"port outside the route")
    assert outside.transport is not None
    outside.transport.sendto(b"from outside the route", relayed)
    log.append(await received(client, names))
    log.append(answer(await client.refresh(0)))
    log.append(answer(await client.create_permission(to_admitted)))  # gone: 437
    client.send_channel_data(0x4000, b"after the allocation")
    log.append(await received(client, names))
    log.append(sorted(data for data, _ in admitted.received))
    log.append(sorted(data for data, _ in outside.received))
    client.close()
    return log


def counters(stunner: Stunner) -> dict[str, Any]:
    return {
        "listeners": {name: c.to_dict() for name, c in stunner.listener_stats().items()},
        "clusters": {name: c.to_dict() for name, c in stunner.cluster_counters().items()},
        "active": stunner.allocation_count,
    }


async def run_session(
    monkeypatch: pytest.MonkeyPatch, path: str, name: str = UDP
) -> tuple[Any, Any, Any]:
    monkeypatch.setenv("STUNNER_NATIVE", "1" if path == "native" else "0")
    admitted, outside = await start_peer(echo=True), await start_peer(echo=True)
    port = free_port()
    config = make_config(port, [f"{HOST}/32:<{admitted.port}-{admitted.port}>"])
    async with running_stunner(config) as stunner:
        listener = stunner.listeners[name]
        transport = listener.transport
        assert isinstance(transport, NATIVE[name]) == (path == "native")
        log = await session(port, admitted, outside, name)
        await asyncio.sleep(QUIET)
        engine = (
            transport.listener_counters()
            if isinstance(transport, NativeUdpTransport | NativeTcpTransport)
            else None
        )
        result = counters(stunner)
    admitted.close()
    outside.close()
    return log, result, engine


@needs_native
@pytest.mark.parametrize("name", [UDP, TCP])
def test_one_session_gives_the_same_answers_packets_and_counters_on_both_paths(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    async def main() -> None:
        python_log, python_counters, _ = await run_session(monkeypatch, "python", name)
        native_log, native_counters, engine = await run_session(monkeypatch, "native", name)
        assert native_log == python_log
        assert native_counters == python_counters
        # The session did what it says: 21 Send indications and 30 ChannelData echoed back.
        assert len(python_log[6]) == 21 and len(python_log[9]) == 30
        counted = python_counters["listeners"][name]
        assert counted["dropped"] >= 4 and counted["allocations_total"] == 1
        cluster = python_counters["clusters"][CLUSTER]
        assert cluster["tx_packets"] == cluster["rx_packets"] == 51
        # ... and on the native path the engine carried the media, not Python.
        assert engine is not None
        assert engine.rx_packets >= 45 and engine.tx_packets >= 45

    asyncio.run(main())


@pytest.mark.usefixtures("relay_path")
@pytest.mark.parametrize("name", [UDP, TCP])
def test_a_route_change_that_forbids_a_peer_stops_its_packets_at_once(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """...and the peer's dropped packets, both ways, are logged with the reason (the words a
    refused CreatePermission gets), once for the peer, whichever path drops them."""

    async def main() -> int:
        peer = await start_peer(echo=False)
        port = free_port()
        protocols = ("TURN-UDP",) if name == UDP else ("TURN-TCP",)
        config = make_config(port, [f"{HOST}/32"], protocols=protocols)
        async with running_stunner(config) as stunner:
            client = await CLIENTS[name].connect((HOST, port))
            relayed = (await client.allocate()).attributes["XOR-RELAYED-ADDRESS"]
            assert (await client.channel_bind(0x4000, (HOST, peer.port))).message_class == (
                Class.SUCCESS
            )
            assert peer.transport is not None
            for i in range(5):  # the verdicts are cached, both directions
                client.send_channel_data(0x4000, b"up %d" % i)
                peer.transport.sendto(b"down %d" % i, relayed)
            await asyncio.sleep(QUIET)
            assert len(peer.received) == 5 and client.channel_data.qsize() == 5
            before = stunner.listener_stats()[name]
            dropped, forbidden = before.dropped, before.forbidden_dropped
            # The route now admits another address only; no packet may pass after apply.
            await stunner.apply(make_config(port, ["127.0.0.2/32"], protocols=protocols))
            for i in range(5):
                client.send_channel_data(0x4000, b"late up %d" % i)
                peer.transport.sendto(b"late down %d" % i, relayed)
            await asyncio.sleep(QUIET)
            assert len(peer.received) == 5 and client.channel_data.qsize() == 5
            after = stunner.listener_stats()[name]  # counted as forbidden, on either path
            assert (after.forbidden_dropped, after.dropped) == (forbidden + 10, dropped)
            # And a route admitting it again lets the same channel through.
            await stunner.apply(config)
            client.send_channel_data(0x4000, b"readmitted")
            await asyncio.sleep(QUIET)
            assert peer.received[-1][0] == b"readmitted"
            client.close()
        peer.close()
        return peer.port

    with caplog.at_level(logging.INFO, logger="stunner"):
        peer_port = asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records if "packets of peer" in r.getMessage()]
    assert len(lines) == 1, lines  # ten packets dropped, one line
    prefix = f"listener {name}: packets of peer {HOST}:{peer_port} dropped: loopback-or-link-local:"
    assert lines[0].startswith(prefix), lines
    assert "(allowed by: a STATIC endpoint inside 127.0.0.0/8" in lines[0], lines


def test_a_compiler_that_fails_makes_the_extension_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """setup.py's extension is optional: `pip install` goes on without it (CC=false here)."""
    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)  # the extension's sources are relative to the project
    monkeypatch.setenv("CC", "false")
    extensions = runpy.run_path(str(repo / "setup.py"), run_name="setup_py")["extensions"]
    assert [e.name for e in extensions] == ["stunnerd._relay"]
    build = Distribution({"name": "build-test", "ext_modules": extensions})
    command = build.get_command_obj("build_ext")
    command.build_lib, command.build_temp = str(tmp_path / "lib"), str(tmp_path / "tmp")
    command.ensure_finalized()
    command.run()  # no exception: the build goes on
    assert not list(tmp_path.rglob("*.so"))
    assert 'building extension "stunnerd._relay" failed' in capfd.readouterr().err


def test_without_the_extension_turn_udp_and_tcp_relay_in_python(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An install where the extension did not build keeps today's path, with a warning."""
    monkeypatch.delenv("STUNNER_NATIVE", raising=False)
    monkeypatch.setattr("stunnerd.transport.native._relay", None)
    monkeypatch.setattr(
        "stunnerd.transport.native._IMPORT_ERROR", "No module named 'stunnerd._relay'"
    )
    monkeypatch.setattr("stunnerd.transport.listener._told", set())

    async def main() -> None:
        peer = await start_peer(echo=True)
        port = free_port()
        config = make_config(port, [f"{HOST}/32"])
        with caplog.at_level(logging.WARNING, "stunner.listener"):
            async with running_stunner(config) as stunner:
                listener: Listener = stunner.listeners[UDP]
                assert type(listener.transport) is UdpTransport
                assert type(stunner.listeners[TCP].transport) is TcpTransport
                client = await RawClient.connect((HOST, port))
                await client.allocate()
                await client.channel_bind(0x4000, (HOST, peer.port))
                client.send_channel_data(0x4000, b"in python")
                assert await asyncio.wait_for(client.channel_data.get(), 2) == (
                    0x4000,
                    b"in python",
                )
                client.close()
        peer.close()
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == [
            "TURN-UDP and TURN-TCP relay in Python: the extension stunnerd._relay is not built "
            "(No module named 'stunnerd._relay')"
        ]

    asyncio.run(main())
