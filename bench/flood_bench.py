"""Flood benchmark: a legitimate TURN session while one source floods the server, stunnerd
side by side with coturn in one run (issue 15 item 12).

For each flood and server: a flooder process sends from one source IP (127.0.0.2; the whole of
127/8 is on lo), bounded in rate and time, either random bytes (`garbage`) or unauthenticated
28-byte Allocate requests, each with a new transaction id, from one source port (`allocate`)
or from 256 source ports in turn (`allocate-ports`, issue 20 #6: the ip:port error budget
never catches it); meanwhile a client that allocated before the flood (from 127.0.0.3) relays
ChannelData through a channel to an echo peer every 20 ms (loss and RTT), and a new client
tries an allocation every 250 ms, each from its own source IP (127.0.0.10 on) with RFC 8489
retransmissions for at most 3 s (allocations that succeed / tried). The flooder counts what it
gets back (reflection: bytes answered per byte sent). stunnerd runs at `-u 1` and at its
default process count; coturn with its defaults (one relay thread per CPU).

    .venv/bin/python bench/flood_bench.py                      # the three floods, 4 s each
    .venv/bin/python bench/flood_bench.py --rate 160000 --duration 6 --json out.json

With `--uclient`, coturn's own test client also runs during each flood, from 127.0.0.4 (as the
issue-20 red team did): `turnutils_uclient` relays 100 messages through the server to a
`turnutils_peer`; the row says whether it got through within UCLIENT_TIMEOUT and its loss.

`spoofed` (issue 28 #6, not in the default set: it needs root or CAP_NET_RAW) is the same
unsigned Allocate flood from `--sources` source addresses in turn (200,000 by default, 127.64.0.0
on, one port each), written as whole IPv4 packets on a raw socket by bench/spoof_flood.c
(compiled into the run's temporary directory); its answers go to the spoofed addresses, where a
filtered raw socket of the flooder counts them (the reflection). `--new-clients N` spreads N new
allocations evenly over each flood instead of one every 0.25 s.

Needs coturn's `turnserver` (`apt-get install -y coturn`). Loopback only; the flood lasts
`--duration` seconds at most `--rate` datagrams per second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from turn_bench import REALM, Server, cpu_seconds, reply_to  # noqa: E402
from turn_bench import _AllocClient as Endpoint  # noqa: E402  (a socket and its replies)

from stunner_api.stun import Class, Message, Method  # noqa: E402
from stunnerd.turn.auth import long_term_key  # noqa: E402

USER, PASSWORD = "user", "pass"
KEY = long_term_key(USER, REALM, PASSWORD)
FLOODS = ("garbage", "allocate", "allocate-ports", "spoofed")
SPOOFED_SOURCES = 200_000  # `spoofed`: source addresses of the flood, 127.64.0.0 on (issue 28 #6)
FLOOD_IP = "127.0.0.2"  # the flooder's source IP; the honest clients' are others
SESSION_IP = "127.0.0.3"
FLOOD_PORTS = 256  # source ports of `allocate-ports`
SEND_INTERVAL = 0.02  # the session's ChannelData: 50 packets/s
ALLOCATION_INTERVAL = 0.25
ALLOCATION_TIMEOUT = 3.0
CHANNEL = 0x4000
UCLIENT_IP = "127.0.0.4"
UCLIENT_TIMEOUT = 25.0
HERE = Path(__file__).resolve().parent


# --- the flooder (a separate process) --------------------------------------------------------


def drain(sock: socket.socket) -> tuple[int, int]:
    """Datagrams and bytes waiting on a non-blocking socket, read."""
    count = size = 0
    while True:
        try:
            reply = sock.recv(2048)
        except BlockingIOError:
            return count, size
        count += 1
        size += len(reply)


def flood(kind: str, port: int, rate: int, duration: float) -> None:
    """Send `kind` datagrams to 127.0.0.1:port for `duration` s at most `rate`/s; print what
    was sent and received as JSON."""
    socks = []
    for _ in range(FLOOD_PORTS if kind == "allocate-ports" else 1):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((FLOOD_IP, 0))
        sock.setblocking(False)
        socks.append(sock)
    rng = random.Random(15)
    if kind == "garbage":
        pool = [rng.randbytes(rng.randint(20, 200)) for _ in range(4096)]
    else:
        transport = struct.pack("!HHI", 0x0019, 4, 17 << 24)
        pool = [
            struct.pack("!HHI", 0x0003, len(transport), 0x2112A442) + rng.randbytes(12) + transport
            for _ in range(4096)
        ]
    target = ("127.0.0.1", port)
    sent = sent_bytes = received = received_bytes = rounds = 0
    start = time.monotonic()
    end = start + duration
    burst = max(1, rate // 1000)
    while (now := time.monotonic()) < end:
        for data in pool[sent % 4096 : sent % 4096 + burst]:
            try:
                socks[sent % len(socks)].sendto(data, target)
            except BlockingIOError:
                continue
            sent += 1
            sent_bytes += len(data)
        rounds += 1
        got, got_bytes = drain(socks[rounds % len(socks)])  # one port's replies per round
        received += got
        received_bytes += got_bytes
        ahead = start + sent / rate - now
        if ahead > 0:
            time.sleep(ahead)
    seconds = time.monotonic() - start
    for sock in socks:
        got, got_bytes = drain(sock)
        received += got
        received_bytes += got_bytes
    sys.stdout.write(
        json.dumps(
            {
                "sent": sent,
                "sent_bytes": sent_bytes,
                "received": received,
                "received_bytes": received_bytes,
                "seconds": seconds,
            }  # fmt: skip
        )
    )


# --- the legitimate client -------------------------------------------------------------------


class Echo(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        assert self.transport is not None
        self.transport.sendto(data, addr)


async def endpoint(**kwargs: Any) -> Endpoint:
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_datagram_endpoint(Endpoint, **kwargs)
    return proto


async def transact(
    client: Endpoint,
    request: Message,
    key: bytes | None,
    limit: float,
    replies: asyncio.Queue[bytes] | None = None,
) -> Message:
    """RFC 8489 retransmissions (500 ms, doubling) until `limit` seconds have passed; the
    answer is read from `replies` (the client's own queue by default)."""
    assert client.transport is not None
    data = request.encode(integrity_key=key)
    give_up = time.monotonic() + limit
    wait = 0.5
    answers = client.replies if replies is None else replies
    while time.monotonic() < give_up:
        client.transport.sendto(data)
        reply = await reply_to(answers, request, min(give_up, time.monotonic() + wait))
        wait *= 2
        if reply is not None:
            return reply
    raise TimeoutError("no reply")


async def signed(
    client: Endpoint, method: Method, attrs: dict[str, Any], limit: float
) -> Message | None:
    """A request with long-term credentials after the 401 dance; None on failure."""
    try:
        first = await transact(
            client, Message(method, Class.REQUEST, attributes=attrs), None, limit
        )
        nonce = first.attributes.get("NONCE")
        if first.message_class == Class.SUCCESS or nonce is None:
            return first
        auth = {"USERNAME": USER, "REALM": first.attributes.get("REALM", REALM), "NONCE": nonce}
        request = Message(method, Class.REQUEST, attributes={**auth, **attrs})
        return await transact(client, request, KEY, limit)
    except TimeoutError:
        return None


async def allocate(port: int, ip: str, limit: float = ALLOCATION_TIMEOUT) -> Endpoint | None:
    client = await endpoint(remote_addr=("127.0.0.1", port), local_addr=(ip, 0))
    answer = await signed(client, Method.ALLOCATE, {"REQUESTED-TRANSPORT": 17}, limit)
    if answer is None or answer.message_class != Class.SUCCESS:
        assert client.transport is not None
        client.transport.close()
        return None
    return client


async def session(
    port: int, duration: float, flood_started: asyncio.Event, new_clients: int | None = None
) -> dict[str, Any]:
    """An allocation made before the flood relays ChannelData to an echo peer while it lasts and
    sends a signed Refresh or ChannelBind (in turn); new allocations are tried as often, every
    ALLOCATION_INTERVAL (or `new_clients` of them, spread evenly over the flood)."""
    loop = asyncio.get_running_loop()
    _, peer = await loop.create_datagram_endpoint(Echo, local_addr=("127.0.0.1", 0))
    assert peer.transport is not None
    peer_address = peer.transport.get_extra_info("sockname")
    client = await allocate(port, SESSION_IP, 10.0)
    if client is None:
        raise RuntimeError("the session's allocation failed before the flood")
    # Permission and channel, then echo everything the peer receives.
    bind = await signed(
        client,
        Method.CHANNEL_BIND,
        {"CHANNEL-NUMBER": CHANNEL, "XOR-PEER-ADDRESS": peer_address},
        10.0,
    )
    if bind is None or bind.message_class != Class.SUCCESS:
        raise RuntimeError("the session's ChannelBind failed before the flood")

    rtts: list[float] = []
    sent = 0
    answers: asyncio.Queue[bytes] = asyncio.Queue()  # the session's STUN answers
    auth: dict[str, Any] = {}  # USERNAME, REALM and NONCE once a 401 told them

    async def receive() -> None:
        while True:
            data = await client.replies.get()
            if len(data) >= 12 and data[:2] == CHANNEL.to_bytes(2, "big"):
                stamp = struct.unpack_from("!d", data, 4)[0]
                rtts.append(time.monotonic() - stamp)
            elif data[:1] and data[0] & 0xC0 == 0:
                answers.put_nowait(data)

    async def request(number: int) -> float | None:
        """A signed Refresh (even `number`) or ChannelBind of the session's channel (odd):
        seconds until its success, or None."""
        if number % 2:
            method = Method.CHANNEL_BIND
            attrs = {"CHANNEL-NUMBER": CHANNEL, "XOR-PEER-ADDRESS": peer_address}
        else:
            method, attrs = Method.REFRESH, {"LIFETIME": 600}
        began = time.monotonic()
        for _ in range(2):  # a 401 or a stale nonce (438) is retried once with the new nonce
            message = Message(method, Class.REQUEST, attributes={**auth, **attrs})
            try:
                answer = await transact(
                    client, message, KEY if auth else None, ALLOCATION_TIMEOUT, answers
                )
            except TimeoutError:
                return None
            if answer.message_class == Class.SUCCESS:
                return time.monotonic() - began
            if "NONCE" in answer.attributes:
                realm = answer.attributes.get("REALM", REALM)
                auth.update(USERNAME=USER, REALM=realm, NONCE=answer.attributes["NONCE"])
        return None

    receiver = loop.create_task(receive())
    attempts: list[asyncio.Task[Endpoint | None]] = []
    requests: list[asyncio.Task[float | None]] = []
    await flood_started.wait()
    start = time.monotonic()
    next_allocation = start
    interval = ALLOCATION_INTERVAL if new_clients is None else duration / new_clients
    assert client.transport is not None
    while (now := time.monotonic()) < start + duration:
        payload = struct.pack("!d", now) + bytes(92)
        client.transport.sendto(struct.pack("!HH", CHANNEL, len(payload)) + payload)
        sent += 1
        if now >= next_allocation and (new_clients is None or len(attempts) < new_clients):
            ip = f"127.0.0.{10 + len(attempts) % 240}"  # a new source IP each time
            attempts.append(loop.create_task(allocate(port, ip)))
            requests.append(loop.create_task(request(len(requests))))
            next_allocation += interval
        await asyncio.sleep(SEND_INTERVAL)
    results = await asyncio.gather(*attempts)
    answered = [t for t in await asyncio.gather(*requests) if t is not None]
    await asyncio.sleep(0.5)  # stragglers
    receiver.cancel()
    for made in [client, peer, *results]:
        if made is not None and made.transport is not None:
            made.transport.close()
    received = len(rtts)
    return {
        "sent": sent,
        "received": received,
        "loss_pct": 100.0 * (sent - received) / sent if sent else None,
        "rtt_median_ms": 1000 * statistics.median(rtts) if rtts else None,
        "rtt_p95_ms": 1000 * sorted(rtts)[int(0.95 * (received - 1))] if rtts else None,
        "allocations_ok": sum(1 for r in results if r is not None),
        "allocations_tried": len(results),
        "requests_ok": len(answered),
        "requests_tried": len(requests),
        "request_p95_ms": 1000 * sorted(answered)[int(0.95 * (len(answered) - 1))]
        if answered
        else None,
    }


# --- one run ---------------------------------------------------------------------------------


async def uclient(server_port: int, peer_port: int) -> dict[str, Any]:
    """coturn's turnutils_uclient through the server to turnutils_peer: whether it got through
    within UCLIENT_TIMEOUT, and its loss (100 messages, 20 ms apart)."""
    began = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        "turnutils_uclient", "-u", USER, "-w", PASSWORD, "-p", str(server_port),
        "-e", "127.0.0.1", "-r", str(peer_port), "-n", "100", "-m", "1", "-L", UCLIENT_IP,
        "127.0.0.1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(process.communicate(), UCLIENT_TIMEOUT)
    except TimeoutError:
        process.kill()
        out, _ = await process.communicate()
    text = out.decode(errors="replace")
    match = re.search(r"Total lost packets \d+ \(([\d.]+)%\)", text)
    return {
        "uclient_ran": match is not None,
        "uclient_loss_pct": float(match.group(1)) if match else None,
        "uclient_s": time.monotonic() - began,
    }


def run(
    server: Server,
    label: str,
    kind: str,
    rate: int,
    duration: float,
    flooders: int = 1,
    uclient_peer: int | None = None,
    new_clients: int | None = None,
    spoofer: Path | None = None,
    sources: int = SPOOFED_SOURCES,
) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        started = asyncio.Event()
        measuring = asyncio.get_running_loop().create_task(
            session(server.port, duration, started, new_clients)
        )
        await asyncio.sleep(1.0)  # the session is set up before the flood
        cpu0 = cpu_seconds(server.pid)
        if kind == "spoofed":
            assert spoofer is not None
            argv = [str(spoofer), str(server.port), str(rate // flooders), str(duration),
                    str(sources)]  # fmt: skip
        else:
            argv = [sys.executable, __file__, "--flood-worker", kind, "--port", str(server.port),
                    "--rate", str(rate // flooders), "--duration", str(duration)]  # fmt: skip
        processes = [
            await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
            for _ in range(flooders)
        ]
        started.set()
        coturn_client = None
        if uclient_peer is not None:
            coturn_client = asyncio.get_running_loop().create_task(
                uclient(server.port, uclient_peer)
            )
        outs = [(await process.communicate())[0] for process in processes]
        result = await measuring
        if coturn_client is not None:
            result.update(await coturn_client)
        stats = [json.loads(out) for out in outs]
        sent_bytes = sum(s["sent_bytes"] for s in stats)
        result.update(
            server=label, flood=kind, cpu_s=cpu_seconds(server.pid) - cpu0,
            flood_pps=sum(s["sent"] / s["seconds"] for s in stats),
            reflection=sum(s["received_bytes"] for s in stats) / max(1, sent_bytes),
            load1=os.getloadavg()[0],
        )  # fmt: skip
        return result

    return asyncio.run(main())


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| flood | server | flood pps | session loss % | RTT median ms | RTT p95 ms "
        "| allocations ok/tried | session requests ok/tried | request p95 ms "
        "| reflection B/B | server CPU s | load1 | uclient loss % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "uclient_ran" not in r:
            coturn_client = "-"
        elif r["uclient_ran"]:
            coturn_client = f"{r['uclient_loss_pct']:.1f} ({r['uclient_s']:.0f} s)"
        else:
            coturn_client = f"never got through ({r['uclient_s']:.0f} s)"
        lines.append(
            f"| {r['flood']} | {r['server']} | {r['flood_pps']:.0f} | {fmt(r['loss_pct'], '.1f')} "
            f"| {fmt(r['rtt_median_ms'], '.2f')} | {fmt(r['rtt_p95_ms'], '.2f')} "
            f"| {r['allocations_ok']}/{r['allocations_tried']} "
            f"| {r['requests_ok']}/{r['requests_tried']} | {fmt(r['request_p95_ms'], '.1f')} "
            f"| {r['reflection']:.3f} "
            f"| {r['cpu_s']:.2f} | {r['load1']:.2f} | {coturn_client} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--floods",
        default=",".join(FLOODS[:3]),
        help="garbage,allocate,allocate-ports,spoofed (spoofed: needs root or CAP_NET_RAW)",
    )
    parser.add_argument(
        "--sources",
        type=int,
        default=SPOOFED_SOURCES,
        help="source addresses of the spoofed flood (127.64.0.0 on, one port each)",
    )
    parser.add_argument(
        "--new-clients",
        type=int,
        help="new allocations tried during each flood, spread evenly over it (default: one "
        "every 0.25 s)",
    )
    parser.add_argument(
        "--servers",
        default="stunnerd,stunnerd-py,stunnerd-py-u1,coturn",
        help="stunnerd (native relay path), stunnerd-py (STUNNER_NATIVE=0), a -uN suffix for N "
        "UDP processes (-u1: one), coturn",
    )
    parser.add_argument("--rate", type=int, default=160000, help="flood datagrams/s at most")
    parser.add_argument("--duration", type=float, default=4.0, help="seconds of flood per run")
    parser.add_argument(
        "--flooders",
        type=int,
        default=1,
        help="flooder processes sharing --rate, all from the one source IP (a busy machine "
        "may not give one process the CPU for the rate)",
    )
    parser.add_argument(
        "--uclient",
        action="store_true",
        help="also run coturn's turnutils_uclient (to a turnutils_peer) during each flood",
    )
    parser.add_argument("--json", type=Path, help="write the rows here too")
    parser.add_argument("--flood-worker", choices=FLOODS[:3], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.flood_worker:
        flood(args.flood_worker, args.port, args.rate, min(args.duration, 60.0))
        return 0
    servers = args.servers.split(",")
    if "coturn" in servers and shutil.which("turnserver") is None:
        sys.stderr.write("turnserver not found: apt-get install -y coturn (or --servers)\n")
        return 2
    rows: list[dict[str, Any]] = []
    peer_port = peer = None
    if args.uclient:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(("127.0.0.1", 0))
            peer_port = probe.getsockname()[1]
        peer = subprocess.Popen(
            ["turnutils_peer", "-L", "127.0.0.1", "-p", str(peer_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    with tempfile.TemporaryDirectory(prefix="flood-bench-") as tmp:
        spoofer = None
        if "spoofed" in args.floods.split(","):
            spoofer = Path(tmp) / "spoof_flood"
            subprocess.run(
                ["gcc", "-O2", "-std=gnu11", str(HERE / "spoof_flood.c"), "-o", str(spoofer)],
                check=True,
            )
        for kind in args.floods.split(","):
            for label in servers:
                suffix = re.search(r"-u(\d+)$", label)
                name = label.removesuffix(suffix.group(0)) if suffix else label
                udp_threads = int(suffix.group(1)) if suffix else None
                server = Server(name, Path(tmp), udp_threads, abuse_limits=True)
                server.start()
                try:
                    rows.append(
                        run(
                            server,
                            label,
                            kind,
                            args.rate,
                            args.duration,
                            args.flooders,
                            peer_port,
                            args.new_clients,
                            spoofer,
                            args.sources,
                        )  # fmt: skip
                    )
                finally:
                    server.stop()
                sys.stderr.write(table(rows[-1:]).splitlines()[-1] + "\n")
    if peer is not None:
        peer.terminate()
        peer.wait()
    print(f"load average at the end: {os.getloadavg()}, {os.cpu_count()} CPUs")  # noqa: T201
    print(table(rows))  # noqa: T201
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
