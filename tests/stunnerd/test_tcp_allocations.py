"""RFC 6062 TCP allocations over real sockets: coturn's own client in its TCP-relay mode
(`turnutils_uclient -T`: two clients whose allocations connect to each other), and a raw
client against a TCP echo backend on loopback: Allocate (REQUESTED-TRANSPORT 6), Connect
(CONNECTION-ID), ConnectionBind on a new connection, ConnectionAttempt for a peer that connects
to the relayed address; the peer policy (only routed TCP clusters admit TCP peers: 403), 447 for
a peer that refuses, the cap on peer connections (508), and the ConnectionBind deadline.
Both relay paths of TURN-TCP (conftest.py `relay_path`), and TURN-TLS.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from stunner_api import stun
from stunner_api.dataplane_load import load_config
from stunner_api.stun import Class, Message, Method
from stunnerd.process.daemon import Stunner
from stunnerd.transport import certificates
from stunnerd.transport.native_tcp import NativeTcpTransport
from stunnerd.turn.limits import Limits
from tests.support.turnclient import (
    HOST,
    PASSWORD,
    REALM,
    USERNAME,
    RawClient,
    RawTcpClient,
    error_code,
    free_port,
)

UCLIENT = shutil.which("turnutils_uclient")
CERT, KEY = certificates.self_signed_certificate(HOST)
STEP = 20.0  # seconds a test waits for a condition before it fails


def config(
    port: int,
    protocol: str = "TURN-TCP",
    clusters: dict[str, str] | None = None,
    endpoint: str = f"{HOST}/32",
    admin: dict[str, str] | None = None,
) -> Any:
    """One listener routing to the clusters given as name -> protocol (by default one TCP
    cluster), each naming `endpoint`."""
    clusters = clusters if clusters is not None else {"ns/tcp": "TCP"}
    listener: dict[str, Any] = {
        "name": "ns/gw/listener",
        "protocol": protocol,
        "address": HOST,
        "port": port,
        "routes": list(clusters),
    }
    if protocol == "TURN-TLS":
        listener.update(cert=CERT, key=KEY)
    return load_config(
        json.dumps(
            {
                "version": "v1",
                "admin": {
                    "name": "t",
                    "loglevel": "all:INFO",
                    "healthcheck_endpoint": "",
                    **(admin or {}),
                },
                "auth": {
                    "type": "static",
                    "realm": REALM,
                    "credentials": {"username": USERNAME, "password": PASSWORD},
                },
                "listeners": [listener],
                "clusters": [
                    {"name": n, "type": "STATIC", "protocol": p, "endpoints": [endpoint]}
                    for n, p in clusters.items()
                ],
            }
        )
    )


@asynccontextmanager
async def stunnerd(
    protocol: str = "TURN-TCP",
    clusters: dict[str, str] | None = None,
    admin: dict[str, str] | None = None,
    **limits: Any,
) -> AsyncIterator[tuple[Stunner, int]]:
    port = free_port()
    stunner = Stunner(limits=Limits(**limits))
    await stunner.apply(config(port, protocol, clusters, admin=admin))
    try:
        yield stunner, port
    finally:
        await stunner.close()


@asynccontextmanager
async def echo_backend() -> AsyncIterator[tuple[int, list[tuple[str, int]]]]:
    """A TCP echo server on loopback; yields its port and where its connections came from."""
    sources: list[tuple[str, int]] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sources.append(writer.get_extra_info("peername")[:2])
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, HOST, 0)
    try:
        yield server.sockets[0].getsockname()[1], sources
    finally:
        server.close()


async def tcp_allocation(port: int) -> RawClient:
    client = await RawTcpClient.connect((HOST, port))
    response = await client.allocate(**{"REQUESTED-TRANSPORT": 6})
    assert response.message_class == Class.SUCCESS, response.attributes
    return client


async def connect(client: RawClient, peer: tuple[str, int]) -> Message:
    request = Message(Method.CONNECT, Class.REQUEST)
    request.attributes["XOR-PEER-ADDRESS"] = peer
    return await client.request(request, timeout=STEP)


async def read_frame(reader: asyncio.StreamReader) -> Message:
    header = await reader.readexactly(stun.HEADER_LENGTH)
    length = struct.unpack_from("!H", header, 2)[0]
    return stun.parse_message(header + await reader.readexactly(length))


async def connection_bind(
    control: RawClient, port: int, connection_id: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Message]:
    """A new data connection, bound with the control connection's credentials and nonce."""
    reader, writer = await asyncio.open_connection(HOST, port)
    request = Message(Method.CONNECTION_BIND, Class.REQUEST)
    request.attributes.update(
        {
            "CONNECTION-ID": connection_id,
            "USERNAME": control.username,
            "REALM": control.realm,
            "NONCE": control.nonce,
        }
    )
    writer.write(request.encode(integrity_key=control.key))
    response = await asyncio.wait_for(read_frame(reader), STEP)
    return reader, writer, response


async def closed(reader: asyncio.StreamReader) -> bool:
    """Whether the connection ends (EOF, or a reset: a close with unread data sends one)."""
    try:
        return await asyncio.wait_for(reader.read(), STEP) == b""
    except ConnectionResetError:
        return True


def closed_port() -> int:
    """A loopback TCP port nothing listens on (bound, then let go)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 60))


# ---- coturn's client -----------------------------------------------------------------------


def run_uclient_tcp_relay(port: int, *flags: str) -> Awaitable[str]:
    async def main() -> str:
        assert UCLIENT is not None
        process = await asyncio.create_subprocess_exec(
            UCLIENT,
            "-T",
            *flags,
            *("-u", USERNAME, "-w", PASSWORD, "-p", str(port), "-n", "20", "-m", "2", "-z", "5"),
            HOST,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(process.communicate(), 40)
        text = output.decode(errors="replace")
        assert process.returncode == 0, text
        return text

    return main()


@pytest.mark.skipif(UCLIENT is None, reason="coturn's turnutils_uclient is absent")
@pytest.mark.parametrize("protocol", ["TURN-TCP", "TURN-TLS"])
def test_uclient_tcp_relay_mode_relays_every_message(relay_path: str, protocol: str) -> None:
    if protocol == "TURN-TLS" and relay_path == "native":
        pytest.skip("TURN-TLS is served by the Python path only")

    async def main() -> None:
        async with stunnerd(protocol) as (stunner, port):
            if protocol == "TURN-TCP" and relay_path == "native":
                transport = stunner.listeners["ns/gw/listener"].transport
                assert isinstance(transport, NativeTcpTransport)
            flags = ["-S"] if protocol == "TURN-TLS" else []
            text = await run_uclient_tcp_relay(port, *flags)
            assert "2 connections are completed" in text, text
            assert re.search(r"tot_send_msgs=40, tot_recv_msgs=40", text), text
            assert "Total lost packets 0 " in text, text
            # The relayed bytes are counted in the cluster's families, both ways.
            counters = stunner.cluster_counters()["ns/tcp"]
            assert counters.tx_bytes >= 4000 and counters.rx_bytes >= 4000, counters

    run(main)


# ---- a raw client and a TCP echo backend ---------------------------------------------------


def test_connect_and_connection_bind_relay_to_a_tcp_echo_backend(relay_path: str) -> None:
    async def main() -> None:
        async with stunnerd() as (stunner, port), echo_backend() as (backend, sources):
            control = await tcp_allocation(port)
            response = await connect(control, (HOST, backend))
            assert response.message_class == Class.SUCCESS, response.attributes
            connection_id = response.attributes["CONNECTION-ID"]
            relayed = stunner.listeners["ns/gw/listener"].server.allocations
            (allocation,) = relayed.values()
            # The backend sees the connection come from the relayed transport address.
            assert sources == [allocation.relayed_address]
            reader, writer, bound = await connection_bind(control, port, connection_id)
            assert bound.message_class == Class.SUCCESS, bound.attributes
            payload = bytes(range(256)) * 64
            writer.write(payload)
            assert await asyncio.wait_for(reader.readexactly(len(payload)), STEP) == payload
            counters = stunner.cluster_counters()["ns/tcp"]
            assert counters.tx_bytes == counters.rx_bytes == len(payload)
            # A second bind of the same CONNECTION-ID: it is spent.
            _, other, again = await connection_bind(control, port, connection_id)
            assert error_code(again) == 400
            other.close()
            # The allocation's end closes its data connection.
            await control.refresh(0)
            assert await closed(reader)
            writer.close()
            control.close()

    run(main)


def test_a_route_change_closes_the_peer_connections_it_no_longer_admits(relay_path: str) -> None:
    async def main() -> None:
        async with stunnerd() as (stunner, port), echo_backend() as (backend, _):
            control = await tcp_allocation(port)
            response = await connect(control, (HOST, backend))
            reader, writer, bound = await connection_bind(
                control, port, response.attributes["CONNECTION-ID"]
            )
            assert bound.message_class == Class.SUCCESS, bound.attributes
            writer.write(b"before")
            assert await asyncio.wait_for(reader.readexactly(6), STEP) == b"before"
            # The same cluster, narrowed to a port range without the backend's port.
            other = 1 if backend != 1 else 2
            await stunner.apply(config(port, endpoint=f"{HOST}/32:<{other}-{other}>"))
            assert await closed(reader)
            stats = stunner.listeners["ns/gw/listener"].server.stats
            assert stats.forbidden_dropped == 1
            writer.close()
            control.close()

    run(main)


def test_tls_connect_and_connection_bind_relay_to_a_tcp_echo_backend() -> None:
    """TURN-TLS: the control and data connections are TLS, the peer connection plain TCP."""

    async def main() -> None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        async with stunnerd("TURN-TLS") as (_, port), echo_backend() as (backend, _sources):
            control = await RawTcpClient.connect_tls((HOST, port), context)
            response = await control.allocate(**{"REQUESTED-TRANSPORT": 6})
            assert response.message_class == Class.SUCCESS, response.attributes
            response = await connect(control, (HOST, backend))
            connection_id = response.attributes["CONNECTION-ID"]
            data_reader, data_writer = await asyncio.open_connection(HOST, port, ssl=context)
            request = Message(Method.CONNECTION_BIND, Class.REQUEST)
            request.attributes.update(
                {
                    "CONNECTION-ID": connection_id,
                    "USERNAME": USERNAME,
                    "REALM": control.realm,
                    "NONCE": control.nonce,
                }
            )
            data_writer.write(request.encode(integrity_key=control.key))
            bound = await asyncio.wait_for(read_frame(data_reader), STEP)
            assert bound.message_class == Class.SUCCESS, bound.attributes
            data_writer.write(b"over TLS")
            assert await asyncio.wait_for(data_reader.readexactly(8), STEP) == b"over TLS"
            data_writer.close()
            control.close()

    run(main)


def test_connect_to_a_peer_no_tcp_cluster_admits_gets_403(relay_path: str) -> None:
    async def main() -> None:
        # A UDP cluster naming the backend admits it for UDP allocations, not TCP ones.
        clusters = {"ns/tcp": "TCP", "ns/udp-other": "UDP"}
        async with stunnerd(clusters=clusters) as (_, port), echo_backend() as (backend, sources):
            control = await tcp_allocation(port)
            assert error_code(await connect(control, ("127.0.0.2", backend))) == 403
            assert sources == []
            control.close()
        async with stunnerd(clusters={"ns/udp": "UDP"}) as (_, port):
            client = await RawTcpClient.connect((HOST, port))
            response = await client.allocate(**{"REQUESTED-TRANSPORT": 6})
            assert error_code(response) == 403  # the listener routes to no TCP cluster
            client.close()

    run(main)


def test_connect_never_reaches_stunnerd_itself_under_a_cluster_covering_its_address(
    relay_path: str,
) -> None:
    """A TCP cluster naming stunnerd's own address (a pod CIDR does) admits no Connect to its
    listener or to its HTTP servers (health check, metrics): 403, and nothing connects."""

    async def main() -> None:
        health, metrics = free_port(), free_port()
        admin = {
            "healthcheck_endpoint": f"http://{HOST}:{health}",
            "metrics_endpoint": f"http://{HOST}:{metrics}/metrics",
        }
        async with stunnerd(admin=admin) as (stunner, port):
            assert {stunner.health.bound_port, stunner.metrics.bound_port} == {health, metrics}
            control = await tcp_allocation(port)
            for own in (health, metrics, port):
                assert error_code(await connect(control, (HOST, own))) == 403, own
            async with echo_backend() as (backend, sources):  # the cluster does admit others
                assert (await connect(control, (HOST, backend))).message_class == Class.SUCCESS
            control.close()

    run(main)


def test_connect_to_a_closed_port_gets_447(relay_path: str) -> None:
    async def main() -> None:
        async with stunnerd() as (_, port):
            control = await tcp_allocation(port)
            assert error_code(await connect(control, (HOST, closed_port()))) == 447
            control.close()

    run(main)


def test_peer_connections_per_allocation_are_capped(relay_path: str) -> None:
    async def main() -> None:
        async with stunnerd(max_peer_connections=2) as (_, port):
            async with echo_backend() as (one, _), echo_backend() as (two, _):
                async with echo_backend() as (three, sources):
                    control = await tcp_allocation(port)
                    assert "CONNECTION-ID" in (await connect(control, (HOST, one))).attributes
                    assert "CONNECTION-ID" in (await connect(control, (HOST, two))).attributes
                    assert error_code(await connect(control, (HOST, three))) == 508
                    assert error_code(await connect(control, (HOST, one))) == 446
                    assert sources == []
                    control.close()

    run(main)


def test_an_inbound_peer_gets_a_connection_attempt_and_is_closed_unbound(relay_path: str) -> None:
    async def main() -> None:
        async with stunnerd(peer_connection_timeout=2.0) as (stunner, port):
            control = await tcp_allocation(port)
            (allocation,) = stunner.listeners["ns/gw/listener"].server.allocations.values()
            relayed = (HOST, allocation.relayed_address[1])
            # Without a permission the peer's connection is closed at once, unannounced.
            reader, writer = await asyncio.open_connection(*relayed)
            assert await closed(reader)
            writer.close()
            assert control.indications.empty()
            # With one: a ConnectionAttempt with its address and a CONNECTION-ID.
            permitted = await control.create_permission((HOST, 0))
            assert permitted.message_class == Class.SUCCESS
            reader, writer = await asyncio.open_connection(*relayed)
            writer.write(b"held until bound")
            attempt = await asyncio.wait_for(control.indications.get(), STEP)
            assert attempt.method == Method.CONNECTION_ATTEMPT
            assert attempt.attributes["XOR-PEER-ADDRESS"] == writer.get_extra_info("sockname")
            assert attempt.attributes["CONNECTION-ID"] > 0
            # Not bound within the (shortened) timeout: closed.
            assert await closed(reader)
            writer.close()
            # Bound in time, what it sent meanwhile arrives on the data connection.
            reader, writer = await asyncio.open_connection(*relayed)
            writer.write(b"held until bound")
            attempt = await asyncio.wait_for(control.indications.get(), STEP)
            connection_id = attempt.attributes["CONNECTION-ID"]
            data_reader, data_writer, bound = await connection_bind(control, port, connection_id)
            assert bound.message_class == Class.SUCCESS, bound.attributes
            assert await asyncio.wait_for(data_reader.readexactly(16), STEP) == b"held until bound"
            data_writer.write(b"back")
            assert await asyncio.wait_for(reader.readexactly(4), STEP) == b"back"
            # The data connection's close closes the peer's.
            data_writer.close()
            assert await closed(reader)
            writer.close()
            control.close()

    run(main)


def test_tcp_allocation_refuses_channels_and_tcp_only_attributes(relay_path: str) -> None:
    async def main() -> None:
        async with stunnerd() as (_, port):
            control = await tcp_allocation(port)
            assert error_code(await control.channel_bind(0x4000, (HOST, 9))) == 400
            control.close()
            # One relayed address: no even port, no dual allocation (ADDITIONAL-ADDRESS-FAMILY).
            for attribute, value in (("EVEN-PORT", False), ("ADDITIONAL-ADDRESS-FAMILY", 2)):
                client = await RawTcpClient.connect((HOST, port))
                response = await client.allocate(**{"REQUESTED-TRANSPORT": 6, attribute: value})
                assert error_code(response) == 400, attribute
                client.close()

    run(main)
