"""The offload program (stunnerd/offload/relay.bpf.c) through the kernel: its verifier, with the
least privilege stunnerd asks for (CAP_BPF and CAP_NET_ADMIN, as an unprivileged user), and
its rewrite, run on whole frames with BPF_PROG_TEST_RUN, both directions, IPv4 and IPv6: the
frame that comes out is compared byte for byte with one built here from the RFCs (addresses,
ports, lengths, a fresh TTL, every checksum), and what the program must leave to stunnerd
comes out untouched.

A machine whose kernel refuses bpf(2) skips these with one line naming why; CI (root, a BPF
kernel, clang installed by hack/test.sh) must run them, so there a missing object fails.
"""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from setuptools import Distribution

from stunnerd.offload import bpf, layout, program
from stunnerd.offload.layout import Route
from tests.support.packets import checksums_valid, udp_frame

TC_ACT_OK, TC_ACT_REDIRECT, TCX_NEXT = 0, 7, -1
LOOPBACK = 1
MAX_PAYLOAD = 2048

V4 = {
    "client": ("127.0.0.2", 40000),
    "listener": ("127.0.0.1", 3478),
    "relay": ("127.0.0.1", 50000),
    "peer": ("127.0.0.3", 9000),
}
V6 = {
    "client": ("fd00::2", 40000),
    "listener": ("fd00::1", 3478),
    "relay": ("fd00::1", 50000),
    "peer": ("fd00::3", 9000),
}
CHANNEL = 0x4001


def unavailable() -> str | None:
    """Why the program cannot be loaded here, or None."""
    if not program.OBJECT.exists():
        return f"{program.OBJECT.name} was not built (no clang with the BPF target at install)"
    try:
        program.load().close()
    except bpf.BpfError as exc:
        return f"the kernel refuses the offload program: {exc}"
    return None


@pytest.fixture(scope="module")
def loaded() -> Iterator[program.LoadedProgram]:
    reason = unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the offload program: {reason}")
        pytest.skip(reason)
    prog = program.load()
    yield prog
    prog.close()


@pytest.fixture
def maps(loaded: program.LoadedProgram) -> Iterator[program.LoadedProgram]:
    """The program with empty route maps for each test."""
    yield loaded
    for name in ("from_clients", "from_peers"):
        for key in loaded.maps[name].keys():
            loaded.maps[name].delete(key)


def later(seconds: float = 60) -> int:
    return time.monotonic_ns() + int(seconds * 1e9)


def channel_data(data: bytes, channel: int = CHANNEL) -> bytes:
    return channel.to_bytes(2, "big") + len(data).to_bytes(2, "big") + data


def bind(prog: program.LoadedProgram, a: dict[str, tuple[str, int]], **route: int) -> None:
    """A bound channel both ways, as stunnerd would install it (slot 7)."""
    expires = route.pop("expires_ns", later())
    prog.maps["from_clients"].update(
        layout.client_key(a["client"], a["listener"], CHANNEL),
        Route(a["relay"], a["peer"], expires, 7, **route).pack(),
    )
    prog.maps["from_peers"].update(
        layout.peer_key(a["peer"], a["relay"]),
        Route(a["listener"], a["client"], expires, 7, channel=CHANNEL, **route).pack(),
    )


def usage(prog: program.LoadedProgram) -> layout.Usage:
    return layout.Usage.unpack(prog.maps["usage"].lookup(layout.SLOT.pack(7)) or b"")


def run(prog: program.LoadedProgram, frame: bytes) -> bpf.TestRun:
    return bpf.prog_test_run(prog.fd, frame, ingress_ifindex=LOOPBACK)


@pytest.mark.parametrize("hook", ["TC", "XDP"])
def test_the_verifier_accepts_it_with_cap_bpf_and_cap_net_admin_alone(hook: str) -> None:
    """The least privilege: an unprivileged user with CAP_BPF and CAP_NET_ADMIN only (no
    CAP_SYS_ADMIN, no CAP_PERFMON: the verifier's stricter rules) loads either program."""
    reason = unavailable()
    if reason is not None and os.environ.get("CI") != "true":
        pytest.skip(reason)
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv (util-linux) to drop to CAP_BPF + CAP_NET_ADMIN")
    caps = "-all,+bpf,+net_admin"
    child = subprocess.run(
        [
            setpriv,
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            f"--inh-caps={caps}",
            f"--ambient-caps={caps}",
            f"--bounding-set={caps}",
            sys.executable,
            "-c",
            f"from stunnerd.offload import program; program.load(hook={hook!r}); "
            "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr[-4000:]
    assert int(child.stdout.strip(), 16) == (1 << 12) | (1 << 39)  # NET_ADMIN, BPF


@pytest.mark.parametrize("a", [V4, V6], ids=["ipv4", "ipv6"])
def test_a_clients_channel_data_leaves_as_the_peers_datagram(
    maps: program.LoadedProgram, a: dict[str, tuple[str, int]]
) -> None:
    bind(maps, a)
    before = usage(maps)
    data = bytes(range(256)) * 3 + b"odd"
    out = run(maps, udp_frame(a["client"], a["listener"], channel_data(data), ttl=17))
    assert out.retval == TC_ACT_OK
    assert out.data == udp_frame(a["relay"], a["peer"], data)
    assert usage(maps).since(before) == layout.Usage(to_peer_packets=1, to_peer_bytes=len(data))


@pytest.mark.parametrize("a", [V4, V6], ids=["ipv4", "ipv6"])
def test_a_peers_datagram_leaves_as_channel_data_to_the_client(
    maps: program.LoadedProgram, a: dict[str, tuple[str, int]]
) -> None:
    bind(maps, a)
    before = usage(maps)
    data = b"media" * 41
    out = run(maps, udp_frame(a["peer"], a["relay"], data, ttl=3))
    assert out.retval == TC_ACT_OK
    assert out.data == udp_frame(a["listener"], a["client"], channel_data(data))
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
    """Odd and even lengths, empty to MAX_PAYLOAD, both ways, both families; an IPv4 datagram
    without a UDP checksum (0) leaves without one."""
    a = V6 if v6 else V4
    checksum = checksum or v6  # IPv6 always has one
    bind(loaded, a)
    data = os.urandom(size)
    if to_client:
        frame = udp_frame(a["peer"], a["relay"], data, udp_checksum=checksum)
        expected = udp_frame(a["listener"], a["client"], channel_data(data), udp_checksum=checksum)
    else:
        frame = udp_frame(a["client"], a["listener"], channel_data(data), udp_checksum=checksum)
        expected = udp_frame(a["relay"], a["peer"], data, udp_checksum=checksum)
    out = run(loaded, frame)
    assert (out.retval, out.data) == (TC_ACT_OK, expected)
    assert checksums_valid(out.data)


@pytest.mark.parametrize("a", [V4, V6], ids=["ipv4", "ipv6"])
def test_a_route_with_an_interface_is_redirected_out_of_it(
    maps: program.LoadedProgram, a: dict[str, tuple[str, int]]
) -> None:
    bind(maps, a, ifindex=LOOPBACK)
    out = run(maps, udp_frame(a["client"], a["listener"], channel_data(b"x" * 100)))
    assert (out.retval, out.data) == (TC_ACT_REDIRECT, udp_frame(a["relay"], a["peer"], b"x" * 100))


def untouched(prog: program.LoadedProgram, frame: bytes, ingress: int = LOOPBACK) -> None:
    out = bpf.prog_test_run(prog.fd, frame, ingress_ifindex=ingress)
    assert (out.retval, out.data) == (TCX_NEXT, frame)


@pytest.mark.parametrize("a", [V4, V6], ids=["ipv4", "ipv6"])
def test_what_the_program_does_not_own_goes_to_stunnerd_untouched(
    maps: program.LoadedProgram, a: dict[str, tuple[str, int]]
) -> None:
    bind(maps, a)
    client, listener, peer, relay = a["client"], a["listener"], a["peer"], a["relay"]
    binding_request = bytes.fromhex("0001000021122a4400112233445566778899aabb")
    untouched(maps, udp_frame(client, listener, binding_request))
    untouched(maps, udp_frame(client, listener, channel_data(b"x", 0x4002)))  # another channel
    untouched(maps, udp_frame(client, listener, channel_data(b"x") + b"\0\0\0"))  # padded
    untouched(maps, udp_frame(client, listener, channel_data(b"x")[:-1] + b""))  # short
    untouched(
        maps,
        udp_frame(("127.0.0.9", 1) if a is V4 else ("fd00::9", 1), listener, channel_data(b"x")),
    )  # another client
    untouched(maps, udp_frame(client, listener, channel_data(b"x" * (MAX_PAYLOAD + 1))))
    untouched(maps, udp_frame(peer, (relay[0], relay[1] + 1), b"x"))  # another relay port
    untouched(maps, udp_frame(peer, relay, b"x" * (MAX_PAYLOAD + 1)))
    # A local destination from an interface other than the loopback: the stack would refuse
    # the rewritten packet's local source there.
    untouched(maps, udp_frame(client, listener, channel_data(b"x")), ingress=2)


def test_an_ipv4_fragment_goes_to_stunnerd_untouched(maps: program.LoadedProgram) -> None:
    bind(maps, V4)
    frame = bytearray(udp_frame(V4["client"], V4["listener"], channel_data(b"x" * 40)))
    frame[20:22] = b"\x20\x00"  # more fragments (the header checksum does not matter here)
    untouched(maps, bytes(frame))


@pytest.mark.parametrize("a", [V4, V6], ids=["ipv4", "ipv6"])
def test_a_route_past_its_expiry_is_stunnerds_again(
    maps: program.LoadedProgram, a: dict[str, tuple[str, int]]
) -> None:
    """The kernel stops at the expiry stunnerd wrote, even if stunnerd is late to remove it."""
    bind(maps, a, expires_ns=time.monotonic_ns() - 1)
    before = maps.outcomes()["passed_expired"]
    untouched(maps, udp_frame(a["client"], a["listener"], channel_data(b"x")))
    untouched(maps, udp_frame(a["peer"], a["relay"], b"x"))
    assert maps.outcomes()["passed_expired"] == before + 2


def test_a_route_of_the_other_family_is_not_taken(maps: program.LoadedProgram) -> None:
    """An IPv4 client's channel to an IPv6 peer (RFC 6156) stays in user space."""
    maps.maps["from_clients"].update(
        layout.client_key(V4["client"], V4["listener"], CHANNEL),
        Route(V6["relay"], V6["peer"], later(), 7).pack(),
    )
    untouched(maps, udp_frame(V4["client"], V4["listener"], channel_data(b"x")))


def test_the_loader_refuses_an_object_whose_maps_differ_from_the_layout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not program.OBJECT.exists():
        pytest.skip("the object was not built")
    monkeypatch.setitem(layout.KEY_AND_VALUE, "from_peers", (40, 60))
    with pytest.raises(program.ObjectError, match="from_peers has key/value sizes 40/64"):
        program.load()


def test_an_install_without_clang_goes_on_without_the_offload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """setup.py compiles the program with clang's BPF target; without one (BPF_CLANG=false
    here) the build warns, names why, and goes on (stunnerd then relays without it)."""
    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)  # the sources are relative to the project
    monkeypatch.setenv("BPF_CLANG", "false")
    setup_py = runpy.run_path(str(repo / "setup.py"), run_name="setup_py")
    build = Distribution({"name": "build-test", "ext_modules": []})
    command = setup_py["OffloadBuild"](build)
    command.build_lib, command.build_temp = str(tmp_path / "lib"), str(tmp_path / "tmp")
    command.ensure_finalized()
    command.run()  # no exception: the build goes on
    assert not list(tmp_path.rglob("*.o"))
    assert "the kernel offload was not built (stunnerd relays without it)" in capfd.readouterr().err
