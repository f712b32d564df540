"""The offload's policy core and its configuration: which channels stunnerd hands the kernel
(`plan_channels`, table-driven), and what `KernelOffload.configure` says when the offload cannot
run (one WARNING naming what is missing; off by default)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stunnerd.offload import layout
from stunnerd.offload.engine import AllocationRoutes, KernelOffload, Planned, plan_channels
from stunnerd.offload.layout import Route, Usage
from tests.support.turnclient import free_port, make_config

from .conftest import StartStunnerd
from .test_admin import config_file, wait_ready
from .test_offload_program import unavailable

PEER, OTHER = ("10.0.0.2", 5000), ("10.0.0.3", 6000)


def cluster_of(peer: tuple[str, int]) -> str | None:
    return {"10.0.0.2": "media", "10.0.0.3": "other"}.get(peer[0])


@pytest.mark.parametrize(
    ("channels", "permissions", "own", "expected"),
    [
        # a bound channel with a live permission, admitted: until the earliest expiry
        (
            {0x4000: (PEER, 300.0)},
            {"10.0.0.2": 200.0},
            set(),
            {0x4000: Planned(PEER, "media", 200.0)},
        ),
        (
            {0x4000: (PEER, 100.0)},
            {"10.0.0.2": 200.0},
            set(),
            {0x4000: Planned(PEER, "media", 100.0)},
        ),
        # no permission for the channel's peer: not offloaded (stunnerd drops its data)
        ({0x4000: (PEER, 300.0)}, {"10.0.0.3": 200.0}, set(), {}),
        # no route admits the peer
        ({0x4000: (("10.0.0.9", 1), 300.0)}, {"10.0.0.9": 200.0}, set(), {}),
        # one of stunnerd's own addresses: decided per packet in user space
        ({0x4000: (PEER, 300.0)}, {"10.0.0.2": 200.0}, {"10.0.0.2"}, {}),
        # two channels, each its cluster
        (
            {0x4000: (PEER, 300.0), 0x4001: (OTHER, 300.0)},
            {"10.0.0.2": 250.0, "10.0.0.3": 260.0},
            set(),
            {0x4000: Planned(PEER, "media", 250.0), 0x4001: Planned(OTHER, "other", 260.0)},
        ),
    ],
)
def test_only_what_stunnerd_decided_to_relay_is_planned(
    channels: dict[int, tuple[tuple[str, int], float]],
    permissions: dict[str, float],
    own: set[str],
    expected: dict[int, Planned],
) -> None:
    planned = plan_channels(channels, permissions, 1000.0, cluster_of, own.__contains__)
    assert planned == expected


def test_the_allocation_expiry_bounds_every_channel() -> None:
    planned = plan_channels(
        {0x4000: (PEER, 300.0)}, {"10.0.0.2": 200.0}, 50.0, cluster_of, set().__contains__
    )
    assert planned[0x4000].expires_at == 50.0


def test_off_by_default_and_with_none() -> None:
    offload = KernelOffload()
    assert (offload.active, offload.reason_code) == (False, "disabled")
    offload.configure("None", [])
    assert (offload.active, offload.reason) == (False, "admin.offload_engine is None")


def test_an_engine_that_cannot_run_says_which_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reason = unavailable()
    if reason is not None and os.environ.get("CI") != "true":
        pytest.skip(reason)
    offload = KernelOffload()
    with caplog.at_level(logging.WARNING, logger="stunner.offload"):
        offload.configure("XDP", ["nosuch0"])
        offload.configure("None", [])
        offload.configure("XDP", ["nosuch0"])
    assert (offload.active, offload.reason_code) == (False, "interface")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["offload off, relaying in user space: XDP: no interface nosuch0"]


def test_an_unknown_engine_is_named() -> None:
    offload = KernelOffload()
    offload.configure("DPDK", [])
    assert (offload.active, offload.reason_code) == (False, "engine")
    assert offload.reason == "offload engine DPDK is not available (TC, XDP, Auto are)"


def test_an_unknown_interface_is_named(caplog: pytest.LogCaptureFixture) -> None:
    reason = unavailable()
    if reason is not None and os.environ.get("CI") != "true":
        pytest.skip(reason)
    offload = KernelOffload()
    with caplog.at_level(logging.WARNING, logger="stunner.offload"):
        offload.configure("TC", ["nosuch0"])
    assert (offload.active, offload.reason_code, offload.reason) == (
        False,
        "interface",
        "TC: no interface nosuch0",
    )
    assert "offload off, relaying in user space: TC: no interface nosuch0" in caplog.text
    offload.close()


CONFIGURE = """
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(message)s")
from stunnerd.offload.engine import KernelOffload
offload = KernelOffload()
offload.configure("TC", ["lo"])
print("state", offload.active, offload.reason_code)
"""


@pytest.mark.parametrize(
    ("caps", "expected"),
    [
        ("-all,+net_admin", "capability"),  # no CAP_BPF
        ("-all,+bpf", "capability"),  # no CAP_NET_ADMIN: the link is refused
        ("-all,+bpf,+net_admin", None),  # enough
    ],
)
def test_without_a_capability_one_warning_names_it(caps: str, expected: str | None) -> None:
    """Least privilege: CAP_BPF and CAP_NET_ADMIN are enough, and without either stunnerd says
    so once and relays in user space."""
    reason = unavailable()
    if reason is not None and os.environ.get("CI") != "true":
        pytest.skip(reason)
    setpriv, unshare = shutil.which("setpriv"), shutil.which("unshare")
    if setpriv is None or unshare is None or os.geteuid() != 0:
        pytest.skip("needs root, setpriv and unshare (util-linux)")
    child = subprocess.run(
        [
            unshare,
            "--net",
            setpriv,
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            f"--inh-caps={caps}",
            f"--ambient-caps={caps}",
            f"--bounding-set={caps}",
            sys.executable,
            "-c",
            CONFIGURE,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    lines = child.stdout.splitlines()
    if expected is None:
        assert lines == ["state True "], lines
        return
    assert lines[-1] == f"state False {expected}", lines
    warnings = [line for line in lines if line.startswith("WARNING")]
    assert len(warnings) == 1 and "needs CAP_BPF and CAP_NET_ADMIN" in warnings[0], lines
    assert "[Errno" not in warnings[0]
    if caps == "-all,+net_admin":
        assert warnings[0] == (
            "WARNING offload off, relaying in user space: TC: bpf map create: Operation not "
            "permitted: stunnerd needs CAP_BPF and CAP_NET_ADMIN"
        )


class FakeOffload:
    """KernelOffload's side that AllocationRoutes uses, with the maps as dicts and the
    kernel's counters set by hand."""

    def __init__(self) -> None:
        self.maps: dict[str, dict[bytes, bytes]] = {"from_clients": {}, "from_peers": {}}
        self.kernel: dict[int, Usage] = {}  # slot -> what the kernel counted, cumulative
        self.read_at: dict[int, Usage] = {}
        self.next_slot = 0
        self.writes = 0

    def claim(self, routes: object) -> int:
        slot, self.next_slot = self.next_slot, self.next_slot + 1
        self.read_at[slot] = self.kernel.get(slot, Usage())
        return slot

    def read(self, slot: int) -> Usage:
        now = self.kernel.get(slot, Usage())
        used, self.read_at[slot] = now.since(self.read_at[slot]), now
        return used

    def release(self, slot: int) -> Usage:
        used = self.read(slot)
        del self.read_at[slot]
        return used

    def write(self, name: str, key: bytes, value: bytes) -> None:
        self.writes += 1
        self.maps[name][key] = value

    def delete(self, name: str, key: bytes) -> None:
        self.maps[name].pop(key, None)

    def forget(self, routes: object) -> None:
        pass


CLIENT, LISTENER, RELAY = ("127.0.0.9", 40000), ("127.0.0.1", 3478), ("127.0.0.1", 50000)
LOCAL_PEER = ("127.0.0.2", 9000)


def test_an_allocations_routes_follow_stunnerds_plan_and_count_what_the_kernel_relayed() -> None:
    fake = FakeOffload()
    counted: list[tuple[str, Usage]] = []
    routes = AllocationRoutes(fake, CLIENT, LISTENER, RELAY, lambda c, u: counted.append((c, u)))  # type: ignore[arg-type]
    routes.sync({0x4000: Planned(LOCAL_PEER, "media", 100.0)})
    client_key = layout.client_key(CLIENT, LISTENER, 0x4000)
    peer_key = layout.peer_key(LOCAL_PEER, RELAY)
    assert Route.unpack(fake.maps["from_clients"][client_key]) == Route(
        RELAY, LOCAL_PEER, 100 * 10**9, 0, 0
    )
    assert Route.unpack(fake.maps["from_peers"][peer_key]) == Route(
        LISTENER, CLIENT, 100 * 10**9, 0, 0, 0x4000
    )
    writes = fake.writes
    routes.sync({0x4000: Planned(LOCAL_PEER, "media", 100.0)})  # nothing changed
    assert fake.writes == writes
    routes.sync({0x4000: Planned(LOCAL_PEER, "media", 250.0)})  # a refresh: same slot
    assert Route.unpack(fake.maps["from_clients"][client_key]).expires_ns == 250 * 10**9
    fake.kernel[0] = Usage(3, 300, 2, 200)
    routes.collect()
    assert counted == [("media", Usage(3, 300, 2, 200))]
    fake.kernel[0] = Usage(4, 310, 2, 200)
    routes.sync({})  # the permission went: routes gone, the rest counted
    assert fake.maps == {"from_clients": {}, "from_peers": {}}
    assert counted[-1] == ("media", Usage(1, 10, 0, 0))
    routes.sync({0x4001: Planned(LOCAL_PEER, "media", 100.0)})
    routes.close()
    assert fake.maps == {"from_clients": {}, "from_peers": {}}


def test_a_failed_route_lookup_leaves_the_channel_to_stunnerd(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ChannelBind never fails for the offload: a lookup that fails leaves it in user space
    (and an installed route is removed rather than left stale)."""
    fake = FakeOffload()
    routes = AllocationRoutes(fake, CLIENT, LISTENER, RELAY, lambda c, u: None)  # type: ignore[arg-type]
    routes.sync({0x4000: Planned(LOCAL_PEER, "media", 100.0)})
    assert fake.maps["from_clients"]

    def broken(address: str) -> None:
        raise OSError("netlink: no answer")

    monkeypatch.setattr("stunnerd.offload.netlink.route_to", broken)
    routes.sync({0x4000: Planned(LOCAL_PEER, "media", 200.0)})
    routes.sync({0x4001: Planned(("127.0.0.3", 1), "media", 200.0)})
    assert fake.maps == {"from_clients": {}, "from_peers": {}}


def test_an_object_that_cannot_be_read_is_a_warning_not_a_refused_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    broken = tmp_path / "relay.bpf.o"
    broken.write_bytes(b"\x7fELF not really")
    monkeypatch.setattr("stunnerd.offload.program.OBJECT", broken)
    offload = KernelOffload()
    with caplog.at_level(logging.WARNING, logger="stunner.offload"):
        offload.configure("TC", ["lo"])  # no exception: the config applies
    assert (offload.active, offload.reason_code) == (False, "error")
    assert "offload off, relaying in user space:" in caplog.text


def test_a_peer_of_another_family_stays_in_user_space() -> None:
    fake = FakeOffload()
    routes = AllocationRoutes(fake, CLIENT, LISTENER, RELAY, lambda c, u: None)  # type: ignore[arg-type]
    routes.sync({0x4000: Planned(("::1", 9000), "media", 100.0)})
    assert fake.maps == {"from_clients": {}, "from_peers": {}}


def test_one_warning_per_stunnerd_however_many_udp_processes(
    stunnerd: StartStunnerd, tmp_path: Path, relay_path: str
) -> None:
    """On the Python path each UDP process configures its own offload; the workers tell at DEBUG
    what the primary tells at WARNING, so an operator reads it once. On the native path -u 2 is
    two engine threads in the one process (issue 30): one offload, one warning."""
    port, health = free_port(), free_port()
    admin = {
        "offload_engine": "TC",
        "offload_interfaces": ["nosuch0"],
        "healthcheck_endpoint": f"http://127.0.0.1:{health}",
    }
    config = make_config(port, ["127.0.0.2/32"], protocols=("TURN-UDP",), admin=admin)
    process = stunnerd("-c", config_file(tmp_path, config), "-u", "2", "-l", "all:INFO")
    wait_ready(f"http://127.0.0.1:{health}", process)  # the workers applied it too
    log = process.stop()
    assert ("started 1 UDP worker process(es)" in log) == (relay_path == "python"), log
    assert log.count("offload off, relaying in user space") == 1, log
