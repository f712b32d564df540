"""Issue 28 #6 on both relay paths: a flood of unauthenticated Allocates from many spoofed sources
no longer shuts new clients out.

A real stunnerd process (two UDP processes, SO_REUSEPORT) is flooded with unsigned Allocates
from 20,000 source IPs (tests/support/flood.py: the source of each datagram set with
IP_PKTINFO), each source too rare for any per-source budget. Before, a stranger's unsigned
Allocate was answered from the process's error budget (`--error-rate-total`), which such a flood
spends at once, so new clients' first Allocates went unanswered; the test lowers that budget
to 20/s so that a flood a test can send (a few thousand a second) spends it as surely as the
red team's 84,000/s spent the default 5,000. Now such an Allocate is answered with a stateless
401 (its nonce an HMAC over its expiry and the client's address) within the unsigned budgets
(`--unauthenticated-rate` per source IP, `--unauthenticated-rate-total` per process), in the
native engine on that path, and the signed retry verifies in any process. During the flood:
aioice allocates and relays through stunnerd, so do clients of our own from five other IPs,
and so does coturn's turnutils_uclient where it is installed. What is asserted is that they
succeed, not how fast.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from stunner_api.stun import Class, Message, Method
from stunnerd.process.daemon import Stunner
from stunnerd.transport import transports
from stunnerd.transport.transports import READ_BATCH
from stunnerd.turn.limits import Limits
from tests.support import flood
from tests.support.turnclient import (
    HOST,
    PASSWORD,
    USERNAME,
    RawClient,
    binding_answered,
    free_port,
    make_config,
    start_peer,
)

from .conftest import StartStunnerd
from .test_abuse_turn import allocated, run
from .test_turn_aioice import relay_through

UCLIENT = shutil.which("turnutils_uclient")
FLOOD_RATE = 4000  # datagrams/s: 200x the error budget the test gives each process
FLOOD_SECONDS = 90  # at most; the test stops it when its clients are done
RETRANSMISSIONS = 7  # RFC 8489 §6.2.1 (Rc), from 0.5 s doubling: 31.5 s, then it gives up


async def transact(client: RawClient, message: Message, ip: str) -> Message:
    """`message` sent with RFC 8489 retransmissions (500 ms, doubling) until answered."""
    wait = 0.5
    for _ in range(RETRANSMISSIONS):
        try:
            return await client.request(message, sign=client.nonce is not None, timeout=wait)
        except TimeoutError:
            wait *= 2
    raise AssertionError(f"{message.method.name} from {ip} never answered")


async def allocate_from(ip: str, port: int) -> Message:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_datagram_endpoint(
        lambda: RawClient((HOST, port)), local_addr=(ip, 0)
    )
    try:
        request = Message(Method.ALLOCATE, Class.REQUEST)
        request.attributes["REQUESTED-TRANSPORT"] = 17
        client.learn(await transact(client, request, ip))  # 401: REALM and NONCE
        signed = Message(Method.ALLOCATE, Class.REQUEST)
        signed.attributes["REQUESTED-TRANSPORT"] = 17
        return await transact(client, signed, ip)
    finally:
        client.close()


async def uclient(port: int, peer_port: int) -> str:
    """turnutils_uclient from its own IP: one allocation, 20 messages to an echo peer."""
    assert UCLIENT is not None
    process = await asyncio.create_subprocess_exec(
        UCLIENT, "-u", USERNAME, "-w", PASSWORD, "-p", str(port), "-e", HOST,
        "-r", str(peer_port), "-n", "20", "-m", "1", "-c", "-L", "127.0.0.4", HOST,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        output, _ = await asyncio.wait_for(process.communicate(), 60)
    except TimeoutError:
        process.kill()
        output, _ = await process.communicate()
    return output.decode(errors="replace")


@pytest.mark.usefixtures("relay_path")  # both relay paths: conftest.py
def test_new_clients_allocate_during_a_spoofed_unsigned_allocate_flood(
    stunnerd: StartStunnerd, tmp_path: Path
) -> None:
    port = free_port()
    config = tmp_path / "stunnerd.json"
    config.write_text(make_config(port, [f"{HOST}/32"], protocols=("TURN-UDP",)).to_json())
    server = stunnerd("-c", str(config), "-u", "2", "--error-rate-total", "20", "-l", "all:WARN")
    assert binding_answered(port), server.stop()
    flooder = flood.start(port, FLOOD_RATE, FLOOD_SECONDS)

    async def main() -> dict[str, Any]:
        peer = await start_peer()
        try:
            honest = [allocate_from(f"127.0.0.{10 + i}", port) for i in range(5)]
            relayed = asyncio.wait_for(relay_through(port, "udp", (HOST, peer.port), 5), 60)
            coturn = [uclient(port, peer.port)] if UCLIENT is not None else []
            results = await asyncio.gather(*honest, relayed, *coturn)
        finally:
            peer.close()
        return {"honest": results[:5], "aioice": results[5], "uclient": results[6:]}

    try:
        outcome = asyncio.run(main())
    finally:
        flooder.terminate()
        flooder.communicate(timeout=10)
        log = server.stop(at_once=True)  # SIGINT ends the drain of the allocations made
    assert server.running() is False
    for answer in outcome["honest"]:
        assert answer.message_class == Class.SUCCESS, (answer.attributes, log[-2000:])
    assert outcome["aioice"], "aioice relayed nothing"  # it allocated: its echoes came back
    for text in outcome["uclient"]:
        received = re.findall(r"tot_recv_msgs=(\d+)", text)
        assert received and int(received[-1]) > 0, text[-2000:]


def test_the_python_path_sheds_strangers_unsigned_requests_while_it_is_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Python path: a process that cannot answer a flood in full (here: its event loop held
    while 1,000 unsigned Allocates from as many IPs queue on the listener socket; 4 full
    batches make it behind here, where 16 do by default) drops
    strangers' unsigned messages unanswered once it has found full batches waiting
    transports.SHED_AFTER times in a row, until the socket is empty, instead of answering
    every one before it reaches what comes after; an established client's request queued
    behind them is served."""
    monkeypatch.setenv("STUNNER_NATIVE", "0")
    monkeypatch.setattr(transports, "SHED_AFTER", 4)  # fewer than a small receive buffer holds

    async def scenario(port: int, stunner: Stunner) -> None:
        client = await allocated(port)
        request = Message(Method.REFRESH, Class.REQUEST)
        request.attributes["LIFETIME"] = 600
        flooder = flood.burst(port, 1000)  # the event loop is held meanwhile
        try:
            refreshed = await client.request(request, timeout=10)
            assert refreshed.message_class == Class.SUCCESS
            answers = 0
            while True:
                try:
                    flooder.recv(2048)
                except BlockingIOError:
                    break
                answers += 1
            # Answered: the first SHED_AFTER batches, before the process knew it was behind.
            assert answers == 4 * READ_BATCH, answers
            # The rest dropped unanswered (all of it, unless the kernel's receive buffer, 4 MiB
            # where net.core.rmem_max allows, held fewer).
            shed = stunner.listeners["testns/gw/turn-udp"].stats().rate_limited
            assert 0 < shed <= 1000 - answers
        finally:
            flooder.close()
            client.close()

    run(scenario, Limits(error_rate_total=0))


def test_unauthenticated_rate_total_is_the_whole_stunnerds(
    stunnerd: StartStunnerd, tmp_path: Path, relay_path: str
) -> None:
    """--unauthenticated-rate-total bounds the whole stunnerd, not each process (red team
    finding C: with -u 2 a burst from 1,000 sources drew twice the answers the flag allows).
    Each of the two UDP processes (Python path) or engine threads (native path, all started
    with the listener, before it answers) keeps a bucket of half the rate: a burst of
    unsigned Allocates from as many source IPs (each within its own budget) draws at most the
    flag's burst (2R) plus what the buckets refill (R per second) until the last answer."""
    rate = 20
    port = free_port()
    config = tmp_path / "stunnerd.json"
    config.write_text(make_config(port, [f"{HOST}/32"], protocols=("TURN-UDP",)).to_json())
    server = stunnerd(
        "-c", str(config), "-u", "2", "--unauthenticated-rate-total", str(rate), "-l", "all:INFO"
    )  # fmt: skip
    assert binding_answered(port), server.stop()
    deadline = time.monotonic() + 30
    while relay_path == "python" and "started 1 UDP worker" not in server.stderr:
        assert server.running() and time.monotonic() < deadline, server.stderr
        time.sleep(0.05)  # both processes read their sockets
    start = time.monotonic()
    sock = flood.burst(port, 1000)
    answers, last = 0, start
    try:
        sock.settimeout(2.0)  # the end of the answers: two seconds without one
        while True:
            try:
                sock.recv(2048)
            except TimeoutError:
                break
            answers, last = answers + 1, time.monotonic()
    finally:
        sock.close()
        server.stop(at_once=True)
    allowed = 2 * rate + rate * (last - start) + 2  # +2: the readiness Bindings' tokens
    assert 0 < answers <= allowed, (answers, allowed)


def test_the_python_path_judges_a_forged_nonce_as_unsigned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Red team finding D: on the Python path a stranger's request with MESSAGE-INTEGRITY was
    parsed in full and answered (438) whatever its nonce, so a flood of forged signatures from
    spoofed sources passed the unsigned budgets. Now its nonce (an HMAC) is checked first, one
    HMAC before any parse; one that does not verify spends the unsigned budgets like an unsigned
    message: a burst of 500 forged Allocates from as many source IPs draws at most the
    `--unauthenticated-rate-total` burst (2R) plus its refill (R a second)."""
    monkeypatch.setenv("STUNNER_NATIVE", "0")
    rate = 10

    def forged() -> bytes:
        request = Message(Method.ALLOCATE, Class.REQUEST)
        request.attributes["REQUESTED-TRANSPORT"] = 17
        request.attributes.update(USERNAME=USERNAME, REALM="stunner.l7mp.io", NONCE="0" * 48)
        return request.encode(integrity_key=b"k" * 16)

    async def scenario(port: int, stunner: Stunner) -> None:
        loop = asyncio.get_running_loop()
        start = time.monotonic()
        sock = flood.burst(port, 500, forged)
        answers, last = 0, start
        try:
            while True:  # the end of the answers: two seconds without one
                try:
                    await asyncio.wait_for(loop.sock_recv(sock, 2048), 2.0)
                except TimeoutError:
                    break
                answers, last = answers + 1, time.monotonic()
        finally:
            sock.close()
        allowed = 2 * rate + rate * (last - start)
        assert answers <= allowed, (answers, allowed)
        shed = stunner.listeners["testns/gw/turn-udp"].stats().rate_limited
        assert shed >= 500 - answers - 2, shed  # dropped unparsed (or lost by the kernel)
        # An honest client still allocates: its signed retry's nonce verifies.
        honest = await allocated(port)
        honest.close()

    run(scenario, Limits(unauthenticated_rate_total=rate, error_rate_total=0))
