"""The XDP offload program (relay.bpf.c's `relay_xdp`) through the kernel.

- BPF_PROG_TEST_RUN on whole frames, both directions, IPv4 and IPv6: the frame that comes out
  is compared byte for byte with one built from the RFCs (tests/support/packets.py); what it
  must leave to stunnerd comes out untouched, and so does a datagram whose checksum is only
  its pseudo-header's (a local sender's, which XDP cannot finish).
- In a network namespace of the test's own with a veth pair to a second one (the client's
  side): the redirect (bpf_fib_lookup's next hop, its Ethernet addresses), a link that dies
  with the process that made it (kill -9), and stunnerd itself with `offload_engine: XDP` on
  its end of the pair, a TURN client and echo peers on the other: the same session gives the
  same datagrams and counters with the offload on and off, and the peer policy battery lets
  nothing reach a peer stunnerd refuses.

The verifier's least-privilege test (CAP_BPF + CAP_NET_ADMIN alone) is test_offload_program's,
for both programs. A machine that refuses bpf(2) skips these with one line naming why.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stunner_api import stun
from stunnerd.offload import bpf, layout, program
from stunnerd.offload.layout import Route
from stunnerd.transport import native
from tests.support.netns import ROOT, VethPair, loopback_up, run_in_new_namespace, veth_pair
from tests.support.packets import checksums_valid, ones_complement_sum, udp_frame
from tests.support.turnclient import Peer, RawClient, free_port, make_config, running_stunner

from .test_offload_program import CHANNEL, MAX_PAYLOAD, V4, V6, bind, channel_data, unavailable

XDP_DROP, XDP_PASS, XDP_REDIRECT = 1, 2, 4
LOOPBACK = 1
TIMEOUT = 5.0  # a bound on waiting for what must arrive, never a pause

SERVER = {"v4": "10.30.0.1/24", "v6": "fd30::1/64"}
CLIENT_SIDE: dict[str, str | list[str]] = {
    "v4": ["10.30.0.2/24", "10.30.0.3/24", "10.30.0.4/24", "10.30.0.5/24"],
    "v6": ["fd30::2/64", "fd30::3/64"],
}
SERVER_HOST, CLIENT_HOST, PEER_HOST, OTHER_PEER_HOST, OUTSIDE_HOST = (
    "10.30.0.1",
    "10.30.0.2",
    "10.30.0.3",
    "10.30.0.4",
    "10.30.0.5",
)
LISTENER = "testns/gw/turn-udp"
CLUSTER = "testns/backend"
SIZES = (0, 1, 2, 3, 4, 160, 1200)


def required() -> None:
    reason = unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the offload program: {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def loaded() -> Iterator[program.LoadedProgram]:
    required()
    prog = program.load(hook="XDP")
    yield prog
    prog.close()


@pytest.fixture
def maps(loaded: program.LoadedProgram) -> Iterator[program.LoadedProgram]:
    yield loaded
    for name in ("from_clients", "from_peers"):
        for key in loaded.maps[name].keys():
            loaded.maps[name].delete(key)


def run(prog: program.LoadedProgram, frame: bytes, ingress: int = LOOPBACK) -> bpf.TestRun:
    return bpf.prog_test_run(prog.fd, frame, ingress_ifindex=ingress, xdp=True)


def looks_partial(frame: bytes) -> bool:
    """Whether the frame's UDP checksum equals its pseudo-header's sum (the program cannot tell
    it from a local sender's partial checksum, and leaves it to stunnerd)."""
    v6 = frame[12:14] == b"\x86\xdd"
    ip = frame[14 : 14 + (40 if v6 else 20)]
    udp = frame[14 + len(ip) :]
    addresses = ip[8:40] if v6 else ip[12:20]
    check = int.from_bytes(udp[6:8], "big")
    pseudo = ones_complement_sum(addresses + b"\x00\x11" + udp[4:6])
    return check != 0 and check == pseudo


def usage(prog: program.LoadedProgram) -> layout.Usage:
    return layout.Usage.unpack(prog.maps["usage"].lookup(layout.SLOT.pack(7)) or b"")


@pytest.mark.parametrize("a", [V4, V6], ids=["ipv4", "ipv6"])
def test_a_clients_channel_data_leaves_as_the_peers_datagram(
    maps: program.LoadedProgram, a: dict[str, tuple[str, int]]
) -> None:
    bind(maps, a)
    before = usage(maps)
    data = bytes(range(256)) * 3 + b"odd"
    out = run(maps, udp_frame(a["client"], a["listener"], channel_data(data), ttl=17))
    assert (out.retval, out.data) == (XDP_PASS, udp_frame(a["relay"], a["peer"], data))
    assert usage(maps).since(before) == layout.Usage(to_peer_packets=1, to_peer_bytes=len(data))


@pytest.mark.parametrize("a", [V4, V6], ids=["ipv4", "ipv6"])
def test_a_peers_datagram_leaves_as_channel_data_to_the_client(
    maps: program.LoadedProgram, a: dict[str, tuple[str, int]]
) -> None:
    bind(maps, a)
    before = usage(maps)
    data = b"media" * 41
    out = run(maps, udp_frame(a["peer"], a["relay"], data, ttl=3))
    expected = udp_frame(a["listener"], a["client"], channel_data(data))
    assert (out.retval, out.data) == (XDP_PASS, expected)
    assert usage(maps).since(before) == layout.Usage(to_client_packets=1, to_client_bytes=len(data))


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(min_value=0, max_value=MAX_PAYLOAD),
    v6=st.booleans(),
    to_client=st.booleans(),
    checksum=st.booleans(),
)
def test_every_payload_size_rewrites_to_the_frame_the_rfcs_give(
    loaded: program.LoadedProgram, size: int, v6: bool, to_client: bool, checksum: bool
) -> None:
    a = V6 if v6 else V4
    checksum = checksum or v6
    bind(loaded, a)
    data = os.urandom(size)
    if to_client:
        frame = udp_frame(a["peer"], a["relay"], data, udp_checksum=checksum)
        expected = udp_frame(a["listener"], a["client"], channel_data(data), udp_checksum=checksum)
    else:
        frame = udp_frame(a["client"], a["listener"], channel_data(data), udp_checksum=checksum)
        expected = udp_frame(a["relay"], a["peer"], data, udp_checksum=checksum)
    out = run(loaded, frame)
    assert (out.retval, out.data) == (XDP_PASS, frame if looks_partial(frame) else expected)
    assert checksums_valid(out.data)


def untouched(prog: program.LoadedProgram, frame: bytes, ingress: int = LOOPBACK) -> None:
    out = run(prog, frame, ingress)
    assert (out.retval, out.data) == (XDP_PASS, frame)


@pytest.mark.parametrize("a", [V4, V6], ids=["ipv4", "ipv6"])
def test_what_the_program_does_not_own_goes_to_stunnerd_untouched(
    maps: program.LoadedProgram, a: dict[str, tuple[str, int]]
) -> None:
    bind(maps, a)
    client, listener, peer, relay = a["client"], a["listener"], a["peer"], a["relay"]
    binding_request = bytes.fromhex("0001000021122a4400112233445566778899aabb")
    untouched(maps, udp_frame(client, listener, binding_request))
    untouched(maps, udp_frame(client, listener, channel_data(b"x", 0x4002)))
    untouched(maps, udp_frame(client, listener, channel_data(b"x") + b"\0\0\0"))  # padded
    untouched(maps, udp_frame(client, listener, channel_data(b"x")[:-1]))  # short
    untouched(maps, udp_frame(client, listener, channel_data(b"x" * (MAX_PAYLOAD + 1))))
    untouched(maps, udp_frame(peer, (relay[0], relay[1] + 1), b"x"))
    untouched(maps, udp_frame(peer, relay, b"x" * (MAX_PAYLOAD + 1)))
    untouched(maps, udp_frame(client, listener, channel_data(b"x")) + bytes(6))  # padding
    untouched(maps, udp_frame(client, listener, channel_data(b"x")), ingress=2)  # not lo
    expired = time.monotonic_ns() - 1
    bind(maps, a, expires_ns=expired)
    untouched(maps, udp_frame(peer, relay, b"x"))


@pytest.mark.parametrize("a", [V4, V6], ids=["ipv4", "ipv6"])
def test_a_partial_checksum_goes_to_stunnerd_untouched(
    maps: program.LoadedProgram, a: dict[str, tuple[str, int]]
) -> None:
    """A local sender's datagram carries only its pseudo-header's sum for the device to finish;
    XDP cannot see that state, so a checksum of exactly that value is stunnerd's."""
    bind(maps, a)
    frame = bytearray(udp_frame(a["peer"], a["relay"], b"from a local sender"))
    at = 14 + (40 if a is V6 else 20)
    pseudo = ones_complement_sum(
        bytes(frame[22:54] if a is V6 else frame[26:34]) + b"\x00\x11" + frame[at + 4 : at + 6]
    )
    frame[at + 6 : at + 8] = pseudo.to_bytes(2, "big")
    before = maps.outcomes()["passed_partial_checksum"]
    untouched(maps, bytes(frame))
    assert maps.outcomes()["passed_partial_checksum"] == before + 1


# What runs inside a network namespace of the test's own (root).


def in_new_namespace(function: str, *args: str) -> str:
    required()
    return run_in_new_namespace(__name__, function, *args)


def forwarding_on() -> None:
    """bpf_fib_lookup answers for IPv6 only where the ingress interface forwards."""
    for family in ("ipv4", "ipv6"):
        with open(f"/proc/sys/net/{family}/conf/all/forwarding", "w") as sysctl:
            sysctl.write("1")


def setup() -> VethPair:
    loopback_up()
    forwarding_on()
    return veth_pair(SERVER, CLIENT_SIDE)


def mac_of(interface: str, namespace: str | None = None) -> bytes:
    command = ["ip", "-j", "link", "show", interface]
    if namespace is not None:
        command = ["nsenter", f"--net={namespace}", *command]
    shown = json.loads(subprocess.run(command, check=True, capture_output=True).stdout)
    return bytes.fromhex(shown[0]["address"].replace(":", ""))


def redirect_out_of_the_interface() -> None:
    """A route towards another host: the rewritten frame leaves by bpf_redirect out of the
    interface bpf_fib_lookup names, with the next hop's Ethernet addresses."""
    pair = setup()
    loaded = program.load(hook="XDP")
    xs = socket.if_nametoindex("xs")
    here, there = mac_of("xs"), mac_of("xc", pair.namespace)
    hosts = {
        "ipv4": ("10.30.0.2", "10.30.0.1", "10.30.0.3"),
        "ipv6": ("fd30::2", "fd30::1", "fd30::3"),
    }
    for family, (client, server, peer) in hosts.items():
        for host in (client, peer):  # their neighbour entries, as stunnerd's own sends make
            subprocess.run(
                ["ip", "neigh", "replace", host, "lladdr", there.hex(":"), "dev", "xs"],
                check=True,
            )
        a = {
            "client": (client, 40000),
            "listener": (server, 3478),
            "relay": (server, 50000),
            "peer": (peer, 9000),
        }
        bind(loaded, a, ifindex=xs)
        for frame, expected in (
            (
                udp_frame(a["client"], a["listener"], channel_data(b"x" * 100)),
                udp_frame(a["relay"], a["peer"], b"x" * 100),
            ),
            (
                udp_frame(a["peer"], a["relay"], b"y" * 99),
                udp_frame(a["listener"], a["client"], channel_data(b"y" * 99)),
            ),
        ):
            out = bpf.prog_test_run(loaded.fd, frame, ingress_ifindex=xs, xdp=True)
            assert out.retval == XDP_REDIRECT, (family, out.retval, loaded.outcomes())
            assert out.data == there + here + expected[12:], family
    loaded.close()
    pair.close()
    sys.stdout.write("redirected\n")


OWNER = """
import sys
from stunnerd.offload import attach, program
loaded = program.load(hook="XDP")
attached = attach.attach_xdp(loaded.fd, "xs")
for line in sys.stdin:
    if line.strip() == "go":
        print(attached.mode, flush=True)
        break
    name, key, value = line.split()
    loaded.maps[name].update(bytes.fromhex(key), bytes.fromhex(value))
sys.stdin.read()  # holds the link until killed
"""


def xdp_attached(interface: str) -> bool:
    shown = subprocess.run(["ip", "-d", "link", "show", interface], capture_output=True, text=True)
    return "prog/xdp" in shown.stdout


def nothing_attached_after_the_owner_is_killed() -> None:
    pair = setup()
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind((SERVER_HOST, 3478))
    relay = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    relay.bind((SERVER_HOST, 0))
    with pair.inside():
        client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        client.bind((CLIENT_HOST, 0))
        peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        peer.bind((PEER_HOST, 0))
    for s in (listener, relay, client, peer):
        s.settimeout(TIMEOUT)
    c, p, r = client.getsockname(), peer.getsockname(), relay.getsockname()
    expires = time.monotonic_ns() + 60 * 10**9
    xs = socket.if_nametoindex("xs")
    routes = [
        (
            "from_peers",
            layout.peer_key(p, r),
            Route((SERVER_HOST, 3478), c, expires, 7, xs, CHANNEL),
        ),
    ]
    listener.sendto(b"an answer first", c)  # the client's neighbour entry, as stunnerd's make
    assert client.recvfrom(65536)[0] == b"an answer first"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    assert owner.stdin is not None and owner.stdout is not None
    for name, key, value in routes:
        owner.stdin.write(f"{name} {key.hex()} {value.pack().hex()}\n")
    owner.stdin.write("go\n")
    owner.stdin.flush()
    mode = owner.stdout.readline().strip()
    assert xdp_attached("xs")
    peer.sendto(b"while it runs", r)
    got, sender = client.recvfrom(65536)
    assert (got, sender) == (channel_data(b"while it runs"), (SERVER_HOST, 3478))
    owner.kill()
    owner.wait()
    assert not xdp_attached("xs")
    peer.sendto(b"after", r)
    assert relay.recvfrom(65536) == (b"after", p)
    pair.close()
    sys.stdout.write(f"detached {mode}\n")


def test_a_route_elsewhere_is_redirected_with_the_next_hops_addresses() -> None:
    assert in_new_namespace("redirect_out_of_the_interface").strip() == "redirected"


def test_a_killed_owner_leaves_nothing_attached() -> None:
    """The link lives as long as its descriptor: kill -9 the process, and the interface holds
    no XDP program and the relay socket gets the peer's datagram again."""
    assert (
        in_new_namespace("nothing_attached_after_the_owner_is_killed").strip() == "detached driver"
    )


# stunnerd with offload_engine XDP on its end of the veth pair.


def config(port: int, endpoints: list[str], engine: str) -> Any:
    admin = {"offload_engine": engine, "offload_interfaces": ["xs"] if engine != "None" else []}
    return make_config(port, endpoints, protocols=("TURN-UDP",), address=SERVER_HOST, admin=admin)


async def peer_there(pair: VethPair, host: str, echo: bool = True) -> Peer:
    with pair.inside():
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((host, 0))
    loop = asyncio.get_running_loop()
    _, peer = await loop.create_datagram_endpoint(lambda: Peer(echo), sock=sock)
    return peer


async def client_there(pair: VethPair, port: int) -> RawClient:
    with pair.inside():
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((CLIENT_HOST, 0))
    loop = asyncio.get_running_loop()
    _, client = await loop.create_datagram_endpoint(
        lambda: RawClient((SERVER_HOST, port)), sock=sock
    )
    return client


async def arrived(peer: Peer, count: int) -> None:
    async def wait() -> None:
        while len(peer.received) < count:
            await asyncio.sleep(0.001)

    await asyncio.wait_for(wait(), TIMEOUT)


def payload(size: int, tag: int) -> bytes:
    return bytes((i * 7 + size + tag) & 0xFF for i in range(size))


async def session(pair: VethPair, engine: str) -> dict[str, Any]:
    """ChannelBind, ChannelData both ways at every size, a second channel, a route change that
    refuses the first peer, a Refresh to 0: what the peers and the client got, the counters."""
    from .test_offload_stunnerd import relayed

    peer, other = await peer_there(pair, PEER_HOST), await peer_there(pair, OTHER_PEER_HOST)
    port = free_port()
    endpoints = [f"{PEER_HOST}/32", f"{OTHER_PEER_HOST}/32"]
    async with running_stunner(config(port, endpoints, engine)) as stunner:
        client = await client_there(pair, port)
        relay = (await client.allocate()).attributes["XOR-RELAYED-ADDRESS"]
        to_peer, to_other = (PEER_HOST, peer.port), (OTHER_PEER_HOST, other.port)
        assert (await client.create_permission(to_peer, to_other)).message_class.name == "SUCCESS"
        await client.channel_bind(0x4000, to_peer)
        await client.channel_bind(0x4001, to_other)

        async def round_trip(channel: int, target: Peer, data: bytes) -> None:
            expected = len(target.received) + 1
            client.send_channel_data(channel, data)
            await arrived(target, expected)
            if data:
                got = await asyncio.wait_for(client.channel_data.get(), TIMEOUT)
                assert got == (channel, data)

        for round_ in range(2):
            for size in SIZES:
                await round_trip(0x4000, peer, payload(size, round_))
                await round_trip(0x4001, other, payload(size, round_ + 2))
        await stunner.apply(config(port, [f"{OTHER_PEER_HOST}/32"], engine))
        client.send_channel_data(0x4000, b"refused")
        await round_trip(0x4001, other, b"still admitted")
        await client.refresh(600)
        await client.refresh(0)
        client.send_channel_data(0x4001, b"after the end")
        await client.request(stun.Message(stun.Method.BINDING, stun.Class.REQUEST), sign=False)
        offload = stunner.core.offload
        result = {
            "peer": [(d.hex(), s == relay) for d, s in peer.received],
            "other": [(d.hex(), s == relay) for d, s in other.received],
            "client": relayed(client.raw),
            "listener": stunner.listener_stats()[LISTENER].to_dict(),
            "cluster": stunner.cluster_counters()[CLUSTER].to_dict(),
            "kernel": offload.loaded.outcomes() if offload.loaded is not None else {},
            "state": stunner.listener_offload()[LISTENER],
        }
        client.close()
    peer.close()
    other.close()
    return result


def differential() -> None:
    pair = setup()

    async def main() -> dict[str, Any]:
        return {engine: await session(pair, engine) for engine in ("None", "XDP")}

    runs = asyncio.run(main())
    pair.close()
    sys.stdout.write(json.dumps(runs))


@pytest.mark.skipif(not native.available(), reason=f"native: {native.unavailable_reason()}")
def test_the_same_session_gives_the_same_datagrams_and_counters_with_xdp() -> None:
    runs = json.loads(in_new_namespace("differential"))
    off, on = runs["None"], runs["XDP"]
    assert on["state"] == {
        "on": True,
        "engine": "XDP",
        "interfaces": ["xs"],
        "modes": {"xs": "driver"},
        "code": "xdp_driver",
    }
    assert off["state"]["code"] == "disabled"
    # The kernel carried most of it (a peer's first datagram goes up until its neighbour
    # entry exists: stunnerd's own send makes it).
    assert on["kernel"]["relayed_to_peer"] >= 2 * 2 * len(SIZES) - 2, on["kernel"]
    assert on["kernel"]["relayed_to_client"] >= 2 * 2 * (len(SIZES) - 1) - 2, on["kernel"]
    assert on["kernel"]["passed_partial_checksum"] == 0
    for key in ("peer", "other", "client", "cluster"):
        assert on[key] == off[key], key
    shares = {k for k in on["listener"] if k.startswith("offloaded_")}
    assert {k: v for k, v in on["listener"].items() if k not in shares} == {
        k: v for k, v in off["listener"].items() if k not in shares
    }
    assert on["listener"]["offloaded_rx_packets"] == on["kernel"]["relayed_to_peer"]
    assert on["listener"]["offloaded_tx_packets"] == on["kernel"]["relayed_to_client"]
    assert all(from_relay for _, from_relay in on["peer"] + on["other"])
    assert b"refused".hex() not in [data for data, _ in on["peer"]]
    assert b"after the end".hex() not in [data for data, _ in on["other"]]


async def battery(pair: VethPair) -> dict[str, Any]:
    port = free_port()
    outside = await peer_there(pair, OUTSIDE_HOST, echo=False)
    admitted_peer = await peer_there(pair, PEER_HOST, echo=False)
    async with running_stunner(
        config(port, [f"{PEER_HOST}/32", f"{SERVER_HOST}/32"], "XDP")
    ) as stunner:
        client, other = await client_there(pair, port), await client_there(pair, port)
        relay = (await client.allocate()).attributes["XOR-RELAYED-ADDRESS"]
        other_relay = (await other.allocate()).attributes["XOR-RELAYED-ADDRESS"]
        refused = {
            "own listener": (SERVER_HOST, port),
            "own relay": relay,
            "another allocation's relay": other_relay,
            "outside every route": (OUTSIDE_HOST, outside.port),
            "metadata": ("169.254.169.254", 80),
            "link-local": ("169.254.1.1", 9),
            "unspecified": ("0.0.0.0", 9),
            "broadcast": ("255.255.255.255", 9),
        }
        answers = {}
        for channel, (name, peer) in enumerate(refused.items(), start=0x4000):
            answer = await client.channel_bind(channel, peer)
            answers[name] = answer.attributes.get("ERROR-CODE", (0,))[0]
            client.send_channel_data(channel, b"must not arrive")
        own_port = await client.channel_bind(0x5000, (SERVER_HOST, 9))
        admitted = await client.channel_bind(0x5001, (PEER_HOST, admitted_peer.port))
        client.send_channel_data(0x5001, b"admitted")  # up: no neighbour entry yet
        await arrived(admitted_peer, 1)  # stunnerd's send made it
        client.send_channel_data(0x5001, b"admitted")  # the kernel's
        await arrived(admitted_peer, 2)
        await client.request(stun.Message(stun.Method.BINDING, stun.Class.REQUEST), sign=False)
        loaded = stunner.core.offload.loaded
        assert loaded is not None
        routes = [int.from_bytes(key[-4:-2], "big") for key in loaded.maps["from_clients"].keys()]
        result = {
            "answers": answers,
            "own port": own_port.message_class.name,
            "admitted": admitted.message_class.name,
            "kernel channels": sorted(routes),
            "kernel relayed": loaded.outcomes()["relayed_to_peer"],
            "outside got": len(outside.received),
        }
        for c in (client, other):
            c.close()
    outside.close()
    admitted_peer.close()
    return result


def policy_battery() -> None:
    pair = setup()
    result = asyncio.run(battery(pair))
    pair.close()
    sys.stdout.write(json.dumps(result))


@pytest.mark.skipif(not native.available(), reason=f"native: {native.unavailable_reason()}")
def test_with_xdp_nothing_reaches_a_peer_stunnerd_refuses() -> None:
    result = json.loads(in_new_namespace("policy_battery"))
    assert set(result["answers"].values()) == {403}, result["answers"]
    assert (result["own port"], result["admitted"]) == ("SUCCESS", "SUCCESS")
    assert result["kernel channels"] == [0x5001]
    assert result["kernel relayed"] >= 1
    assert result["outside got"] == 0


def auto_and_busy() -> None:
    from stunnerd.offload import attach
    from stunnerd.offload.engine import KernelOffload

    pair = setup()
    seen: dict[str, Any] = {}
    offload = KernelOffload()
    offload.configure("Auto", ["xs"])
    seen["auto"] = (offload.engine, offload.modes)
    offload.close()
    offload.configure("XDP", ["xs"])
    seen["xdp"] = (offload.engine, offload.modes)
    second = KernelOffload()  # another process's, as a UDP worker's would be
    second.configure("XDP", ["xs"])
    seen["second"] = (second.reason_code, second.reason)
    offload.close()

    def no_tcx(prog_fd: int, interface: str) -> attach.Attachment:
        raise bpf.BpfError("link create", errno.EINVAL)  # as a kernel before 6.6 answers

    attach.attach_tc = no_tcx
    fallback = KernelOffload()
    fallback.configure("Auto", ["xs"])
    seen["auto without tcx"] = (fallback.engine, fallback.modes)
    fallback.close()
    pair.close()
    sys.stdout.write(json.dumps(seen))


def test_auto_is_tc_first_then_xdp_and_a_busy_interface_is_named() -> None:
    """Auto takes TC where tcx attaches, XDP where it does not (Go STUNner's order); XDP runs
    one program per interface, so a second one (another UDP process's) is refused, named."""
    seen = json.loads(in_new_namespace("auto_and_busy"))
    assert seen["auto"] == ["TC", {"xs": "tcx"}]
    assert seen["xdp"] == ["XDP", {"xs": "driver"}]
    code, reason = seen["second"]
    assert code == "busy"
    assert reason.startswith("XDP: bpf link create: Device or resource busy: the interface holds")
    assert seen["auto without tcx"] == ["XDP", {"xs": "driver"}]
