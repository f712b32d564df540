"""STUN-only listeners (issue 23): auth type `none` (GatewayConfig `stunMode: true`).

On both relay paths (pure Python and the native engine) over UDP and TCP, and over TLS, with
real sockets on loopback: a Binding request is answered with XOR-MAPPED-ADDRESS and no
credentials; every TURN request (Allocate signed or not, Refresh, CreatePermission, ChannelBind,
Connect, a method nobody knows) gets 403 from its header alone, without REALM or NONCE, and no
allocation exists afterwards; Send indications and ChannelData are dropped unanswered; each
refusal is counted in `stunner_listener_dropped_packets_total{reason="stun_only"}`; the 403s
spend the client's error budget (--error-rate) like any error answer; switching the mode on
drops the allocations made before; and a real stunnerd process with UDP workers counts the same
in its /metrics.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import struct
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from stunner_api import stun
from stunner_api.dataplane import validate_config
from stunner_api.restart import ListenerChange, listener_changes
from stunner_api.stun import Class, Message, Method
from stunnerd.process.daemon import Stunner
from stunnerd.surface.metrics import render_metrics
from stunnerd.turn.limits import Limits
from stunnerd.turn.server import STUN_ONLY_REASON
from tests.support.turnclient import (
    HOST,
    REALM,
    RawClient,
    binding_answered,
    error_code,
    free_port,
    make_config,
    running_stunner,
)

from .conftest import StartStunnerd
from .test_abuse_turn import run
from .test_tls_dtls import ca_file, tls_config

STUN_ONLY = {"type": "none", "realm": REALM, "credentials": {}}
UDP_LISTENER = "testns/gw/turn-udp"
TCP_LISTENER = "testns/gw/turn-tcp"


def refused(stunner: Stunner, listener: str = UDP_LISTENER, reason: str = "stun_only") -> float:
    """stunner_listener_dropped_packets_total of `listener` for `reason`, as /metrics says."""
    families = text_string_to_metric_families(render_metrics(stunner))
    family = next(f for f in families if f.name == "stunner_listener_dropped_packets")
    return sum(s.value for s in family.samples if s.labels == {"name": listener, "reason": reason})


def turn_requests() -> list[Message]:
    """One request of every TURN method, with the attributes a real client would put in."""
    allocate = Message(Method.ALLOCATE, Class.REQUEST)
    allocate.attributes["REQUESTED-TRANSPORT"] = 17
    refresh = Message(Method.REFRESH, Class.REQUEST)
    refresh.attributes["LIFETIME"] = 600
    permission = Message(Method.CREATE_PERMISSION, Class.REQUEST)
    permission.attributes["XOR-PEER-ADDRESS"] = (HOST, 9)
    bind = Message(Method.CHANNEL_BIND, Class.REQUEST)
    bind.attributes.update({"CHANNEL-NUMBER": 0x4000, "XOR-PEER-ADDRESS": (HOST, 9)})
    connect = Message(Method.CONNECT, Class.REQUEST)
    connect.attributes["XOR-PEER-ADDRESS"] = (HOST, 9)
    return [allocate, refresh, permission, bind, connect]


UNKNOWN_METHOD = 0x0FF  # no STUN usage defines it


def message_type(method: int, message_class: int) -> int:
    """RFC 8489 §5: the method's bits around the class bits C0 and C1."""
    return (method & 0xF) | ((method & 0x70) << 1) | ((method & 0xF80) << 2) | message_class


def method_of(data: bytes) -> int:
    value = struct.unpack_from("!H", data)[0]
    return (value & 0xF) | ((value & 0xE0) >> 1) | ((value & 0x3E00) >> 2)


def ask_unknown_method(port: int) -> bytes:
    """A request of UNKNOWN_METHOD from a plain socket (RawClient parses every answer, and our
    parser refuses a method it does not know); the raw answer."""
    request = struct.pack("!HHI", message_type(UNKNOWN_METHOD, Class.REQUEST), 0, stun.COOKIE)
    request += bytes(range(12))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(2)
        sock.sendto(request, (HOST, port))
        answer = sock.recv(2048)
    assert answer[8:20] == request[8:20]  # the transaction id
    return answer


def assert_forbidden(answer: Message, method: Method) -> None:
    assert (answer.method, answer.message_class) == (method, Class.ERROR)
    assert answer.attributes["ERROR-CODE"] == (403, STUN_ONLY_REASON)
    # Nothing to authenticate with: no REALM or NONCE (a 401 would carry them), no signature.
    assert not {"REALM", "NONCE", "MESSAGE-INTEGRITY"} & answer.attributes.keys()


def test_binding_is_answered_and_every_turn_request_refused_over_udp(relay_path: str) -> None:
    async def scenario(port: int, stunner: Stunner) -> None:
        client = await RawClient.connect((HOST, port))
        try:
            assert client.transport is not None
            binding = await client.request(Message(Method.BINDING, Class.REQUEST), sign=False)
            assert binding.message_class == Class.SUCCESS
            assert binding.attributes["XOR-MAPPED-ADDRESS"] == client.transport.get_extra_info(
                "sockname"
            )
            requests = turn_requests()
            for request in requests:  # unsigned
                assert_forbidden(await client.request(request, sign=False), request.method)
            # Signed as a TURN client with credentials would sign them: the same 403, no
            # nonce check (this nonce was never issued) and no key lookup.
            client.realm, client.nonce = REALM, "0" * 48
            for request in turn_requests():
                assert_forbidden(await client.request(request), request.method)
            unknown = await asyncio.to_thread(ask_unknown_method, port)
            assert method_of(unknown) == UNKNOWN_METHOD
            assert len(unknown) == 48  # small: it goes to an address nobody verified
            assert struct.unpack_from("!H", unknown)[0] & 0x0110 == Class.ERROR
            assert unknown[20:28] == struct.pack(
                "!HHHBB", 0x0009, 4 + len(STUN_ONLY_REASON), 0, 4, 3
            )
            # Indications and ChannelData are dropped unanswered.
            client.send_indication((HOST, 9), b"media")
            client.send_channel_data(0x4000, b"media")
            answered = len(client.raw)
            last = await client.request(Message(Method.BINDING, Class.REQUEST), sign=False)
            assert last.message_class == Class.SUCCESS
            assert len(client.raw) == answered + 1  # the Binding's answer alone
            assert stunner.allocation_count == 0
            assert all(not lst.server.allocations for lst in stunner.listeners.values())
            # 11 requests answered 403 and the Send indication; ChannelData is not a STUN
            # message: a stranger's, dropped as invalid as always (in the engine on the native
            # path), never reaching the TURN server.
            assert refused(stunner) == 2 * len(requests) + 1 + 1
            assert refused(stunner, reason="invalid") == 1
            assert refused(stunner, reason="rate_limit") == 0
        finally:
            client.close()

    run(scenario, auth=STUN_ONLY)


async def ask_tcp(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes
) -> Message:
    writer.write(data)
    header = await asyncio.wait_for(reader.readexactly(20), 2)
    body = await reader.readexactly(struct.unpack_from("!H", header, 2)[0])
    return stun.parse_message(header + body)


def test_binding_is_answered_and_turn_refused_over_tcp(relay_path: str) -> None:
    async def scenario(port: int, stunner: Stunner) -> None:
        reader, writer = await asyncio.open_connection(HOST, port)
        try:
            binding = await ask_tcp(reader, writer, Message(Method.BINDING, Class.REQUEST).encode())
            assert binding.attributes["XOR-MAPPED-ADDRESS"] == writer.get_extra_info("sockname")
            for request in turn_requests():
                assert_forbidden(await ask_tcp(reader, writer, request.encode()), request.method)
            # Dropped, unanswered (8 bytes: over TCP, ChannelData is padded to 4).
            writer.write(stun.pack_channel_data(0x4000, b"media..."))
            again = await ask_tcp(reader, writer, Message(Method.BINDING, Class.REQUEST).encode())
            assert again.message_class == Class.SUCCESS
            assert stunner.allocation_count == 0
            assert refused(stunner, TCP_LISTENER) == len(turn_requests())
        finally:
            writer.close()

    run(scenario, auth=STUN_ONLY)


def test_stun_over_tls_is_answered_and_turn_refused(tmp_path: Path) -> None:
    """STUN over TLS (RFC 8489 §6.2.3): a STUN-only TURN-TLS listener answers Binding."""

    async def scenario() -> None:
        port = free_port()
        data = json.loads(tls_config([("TURN-TLS", port)], [f"{HOST}/32"]).to_json())
        data["auth"] = STUN_ONLY
        context = ssl.create_default_context(cafile=ca_file(tmp_path))
        async with running_stunner(validate_config(data)) as stunner:
            reader, writer = await asyncio.open_connection(HOST, port, ssl=context)
            try:
                binding = Message(Method.BINDING, Class.REQUEST).encode()
                answer = await ask_tcp(reader, writer, binding)
                assert answer.attributes["XOR-MAPPED-ADDRESS"] == writer.get_extra_info("sockname")
                allocate = turn_requests()[0]
                assert_forbidden(await ask_tcp(reader, writer, allocate.encode()), Method.ALLOCATE)
                assert stunner.allocation_count == 0
                assert refused(stunner, "testns/gw/turn-tls") == 1
            finally:
                writer.close()

    asyncio.run(scenario())


def test_the_403s_spend_the_error_budget(relay_path: str) -> None:
    """--error-rate 2 (bursts of 4): of ten Allocates from one client four are answered 403,
    the rest are dropped as rate_limit; another client's Binding is still answered."""

    async def scenario(port: int, stunner: Stunner) -> None:
        flooder = await RawClient.connect((HOST, port))
        other = await RawClient.connect((HOST, port))
        try:
            allocate = turn_requests()[0]
            for _ in range(10):
                allocate.transaction_id = Message(Method.ALLOCATE, Class.REQUEST).transaction_id
                flooder.send_raw(allocate.encode())
            binding = await other.request(Message(Method.BINDING, Class.REQUEST), sign=False)
            assert binding.message_class == Class.SUCCESS
            for _ in range(100):  # every packet counted and the answers read
                if refused(stunner) + refused(stunner, reason="rate_limit") == 10 and (
                    len(flooder.raw) >= 4
                ):
                    break
                await asyncio.sleep(0.02)
            assert len(flooder.raw) == 4
            assert (refused(stunner), refused(stunner, reason="rate_limit")) == (4, 6)
            assert stunner.allocation_count == 0
        finally:
            flooder.close()
            other.close()

    run(scenario, Limits(error_rate=2), auth=STUN_ONLY)


def test_switching_stun_mode_on_drops_the_allocations_made_before() -> None:
    async def scenario(port: int, stunner: Stunner) -> None:
        assert stunner.config is not None
        client = await RawClient.connect((HOST, port))
        try:
            assert (await client.allocate()).message_class == Class.SUCCESS
            assert stunner.allocation_count == 1
            data = json.loads(stunner.config.to_json())
            data["auth"] = STUN_ONLY
            stun_only = validate_config(data)
            changes = listener_changes(stunner.config, stun_only)
            assert set(changes.values()) == {ListenerChange.RESTARTED}  # what `diff` predicts
            await stunner.apply(stun_only)
            assert stunner.allocation_count == 0
            refresh = turn_requests()[1]
            assert_forbidden(await client.request(refresh), Method.REFRESH)
        finally:
            client.close()

    run(scenario)


def scrape(port: int) -> dict[tuple[str, str], float]:
    """stunner_listener_dropped_packets_total by (listener, reason) from a /metrics endpoint."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except urllib.error.URLError:  # not serving yet: it starts after the listeners
        return {}
    family = next(
        f
        for f in text_string_to_metric_families(text)
        if f.name == "stunner_listener_dropped_packets"
    )
    return {(s.labels["name"], s.labels["reason"]): s.value for s in family.samples}


def test_a_stunnerd_process_with_udp_workers_refuses_and_counts(
    tmp_path: Path, stunnerd: StartStunnerd, relay_path: str
) -> None:
    port, metrics_port = free_port(), free_port()
    config = json.loads(make_config(port, [f"{HOST}/32"], auth=STUN_ONLY).to_json())
    config["admin"]["metrics_endpoint"] = f"http://{HOST}:{metrics_port}/metrics"
    path = tmp_path / "stunnerd.json"
    path.write_text(json.dumps(config))
    process = stunnerd("-u", "2", "-c", str(path))
    assert binding_answered(port)
    answers: list[Any] = []
    for _ in range(6):  # six source ports: spread over the worker processes
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind((HOST, 0))
            sock.settimeout(5)
            sock.sendto(turn_requests()[0].encode(), (HOST, port))
            answers.append(error_code(stun.parse_message(sock.recv(2048))))
    assert answers == [403] * 6
    # The workers report their counters every second: wait for all six (at most 10 s).
    for _ in range(100):
        dropped = scrape(metrics_port)
        if dropped.get((UDP_LISTENER, "stun_only")) == 6:
            break
        time.sleep(0.1)
    assert dropped[(UDP_LISTENER, "stun_only")] == 6
    assert dropped[(UDP_LISTENER, "rate_limit")] == 0
    assert process.running()
    process.stop()
