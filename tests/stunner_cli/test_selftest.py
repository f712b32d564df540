"""`stunner selftest` (the chart's `helm test` pod) against a real stunnerd whose config it reads
from the real CDS: an allocation through each listener's public address over UDP and TCP, and an
echo through the route; a peer no route admits fails it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.cds.server import cds_app
from reconciler.cds.store import ConfigStore
from stunner_api.dataplane import validate_config
from stunner_cli.targets import parse_target
from tests.support import ports
from tests.support.background import Background


def wait_for_tcp(port: int) -> None:
    """Until stunnerd listens on its TCP listener."""
    deadline = time.monotonic() + 10
    while True:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert time.monotonic() < deadline, "stunnerd did not start"
        time.sleep(0.05)


def dataplane_config(udp: int, tcp: int, echo_port: int) -> dict[str, Any]:
    listener = {"address": "127.0.0.1", "public_address": "127.0.0.1", "routes": ["t/echo"]}
    return {
        "version": "v1",
        "admin": {"name": "t/gw", "healthcheck_endpoint": ""},
        "auth": {"type": "static", "credentials": {"username": "u", "password": "p"}},
        "listeners": [
            listener | {"name": "t/gw/udp", "protocol": "TURN-UDP", "port": udp},
            listener | {"name": "t/gw/tcp", "protocol": "TURN-TCP", "port": tcp},
        ],
        "clusters": [{"name": "t/echo", "endpoints": [f"127.0.0.1/32:<{echo_port}-{echo_port}>"]}],
    }


@contextlib.contextmanager
def running(
    background: Background, config: dict[str, Any], tmp_path: Path, tcp: int
) -> Iterator[str]:
    """A stunnerd from `config` (a file, as the chart's pods read theirs from the CDS) and the
    CDS serving that config as t/gw: the CDS URL, once the TURN-TCP port answers."""
    path = tmp_path / "stunnerd.json"
    path.write_text(json.dumps(config))
    stunnerd = subprocess.Popen(
        [sys.executable, "-m", "stunnerd", "-c", str(path)], stderr=subprocess.DEVNULL
    )
    store = ConfigStore()
    store.set("t/gw", validate_config(config))
    host, port = background.serve(cds_app(store))
    try:
        wait_for_tcp(tcp)
        yield f"http://{host}:{port}"
    finally:
        stunnerd.terminate()
        stunnerd.wait(10)
        background.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    background = Background()
    _, echo_port = background.echo()
    udp, tcp = ports.free_port(), ports.free_port()
    config = dataplane_config(udp, tcp, echo_port)
    with running(background, config, tmp_path_factory.mktemp("stunnerd"), tcp) as cds:
        yield {"cds": cds, "echo": echo_port, "ports": (udp, tcp)}


def selftest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stunner_cli", "selftest", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_allocates_and_echoes_through_every_listener(world: dict[str, Any]) -> None:
    done = selftest("--cds-url", world["cds"], "--peer", f"127.0.0.1:{world['echo']}")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "ok   t/gw/udp udp 127.0.0.1",
        "ok   t/gw/tcp tcp 127.0.0.1",
    ]
    assert all("echoed 5/5" in line for line in lines)


def test_allocation_alone_without_a_peer(world: dict[str, Any]) -> None:
    done = selftest("--cds-url", world["cds"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(" allocated " in line for line in done.stdout.splitlines())


def test_a_peer_no_route_admits_fails(world: dict[str, Any]) -> None:
    done = selftest("--cds-url", world["cds"], "--peer", "127.0.0.2:9", "--timeout", "1")
    assert done.returncode == 1
    assert done.stdout.count("FAIL") == 2


@pytest.fixture
def watching() -> Iterator[dict[str, Any]]:
    """A stunnerd following its config on the real CDS (-w), as in a pod, serving a Gateway
    whose listeners have no route yet."""
    background = Background()
    udp, tcp = ports.free_port(), ports.free_port()
    config = dataplane_config(udp, tcp, 0)
    for listener in config["listeners"]:
        listener["routes"] = []
    config["clusters"] = []
    store = ConfigStore()
    store.set("t/gw", validate_config(config))
    host, port = background.serve(cds_app(store))
    cds = f"http://{host}:{port}"
    stunnerd = subprocess.Popen(
        [sys.executable, "-m", "stunnerd", "-w", "-u", "1", "-c", cds, "-i", "t/gw"],
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_tcp(tcp)
        yield {"cds": cds, "store": store, "background": background, "config": config}
    finally:
        stunnerd.terminate()
        stunnerd.wait(10)
        background.close()


def test_its_own_echo_peer_answers_once_the_route_reaches_stunnerd(
    watching: dict[str, Any],
) -> None:
    """What the chart's test pod does: run the echo peer itself (--echo), and wait for the route
    its test hooks create to reach the Gateway's stunnerd."""
    echo = ports.free_port()
    with subprocess.Popen(
        [sys.executable, "-m", "stunner_cli", "selftest", "--cds-url", watching["cds"]]
        + ["--echo", f"127.0.0.1:{echo}", "--gateway", "t/gw", "--timeout", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as test:
        time.sleep(1.5)  # the route arrives after the test has started, as from the hooks
        routed = dataplane_config(*[lc["port"] for lc in watching["config"]["listeners"]], echo)
        store, loop = watching["store"], watching["background"].loop
        loop.call_soon_threadsafe(store.set, "t/gw", validate_config(routed))
        out, err = test.communicate(timeout=60)
    assert test.returncode == 0, out + err
    lines = out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "ok   t/gw/udp udp 127.0.0.1",
        "ok   t/gw/tcp tcp 127.0.0.1",
    ]
    assert all("echoed 5/5" in line for line in lines)


def test_no_route_to_its_own_echo_peer_fails(watching: dict[str, Any]) -> None:
    echo = ports.free_port()
    done = selftest("--cds-url", watching["cds"], "--echo", f"127.0.0.1:{echo}", "--timeout", "1")
    assert done.returncode == 1
    assert done.stdout.count("FAIL") == 2 and "no echo from" in done.stdout


def test_a_named_gateway_the_cds_never_serves_fails(world: dict[str, Any]) -> None:
    done = selftest("--cds-url", world["cds"], "--gateway", "t/absent", "--timeout", "1")
    assert done.returncode == 1
    assert "FAIL t/absent: no TURN-UDP or TURN-TCP listener" in done.stdout
    assert done.stdout.count("ok   ") == 2  # the Gateways it does serve are still tested


@pytest.fixture(scope="module")
def stun_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A STUN-only stunnerd (auth type none) and the CDS serving its config: the CDS URL."""
    background = Background()
    udp, tcp = ports.free_port(), ports.free_port()
    config = dataplane_config(udp, tcp, 9)
    config["auth"] = {"type": "none", "credentials": {}}
    with running(background, config, tmp_path_factory.mktemp("stunnerd"), tcp) as cds:
        yield cds


@pytest.mark.parametrize("echo", [False, True], ids=["alone", "named-with-its-own-echo-peer"])
def test_a_stun_only_gateway_is_tested_with_binding_and_a_refused_allocate(
    stun_only: str, echo: bool
) -> None:
    """No credentials to allocate with and nothing to relay: the selftest checks what the
    Gateway serves (a Binding answer) and what it must refuse (an Allocate, 403), and passes."""
    args = ["--gateway", "t/gw", "--echo", f"127.0.0.1:{ports.free_port()}"] if echo else []
    done = selftest("--cds-url", stun_only, "--timeout", "10", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "ok   t/gw/udp udp 127.0.0.1",
        "ok   t/gw/tcp tcp 127.0.0.1",
    ]
    assert all(
        "STUN only: Binding answered (mapped 127.0.0.1:" in line
        and line.endswith("Allocate refused 403")
        for line in lines
    ), lines


# --- media checks against Services: --target k8s://NS/SVC:PORT -----------------------------------


def test_a_target_names_a_service_and_its_port() -> None:
    target = parse_target("k8s://media/echo-server:9001")
    assert (target.namespace, target.service, target.port) == ("media", "echo-server", 9001)
    assert target.host("cluster.local") == "echo-server.media.svc.cluster.local"
    assert str(target) == "k8s://media/echo-server:9001"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("udp://media/echo:9001", "want k8s://NAMESPACE/SERVICE:PORT"),
        ("k8s://media/echo", "no port (want k8s://NAMESPACE/SERVICE:PORT)"),
        ("k8s://media/echo:0", "port '0' is not 1-65535"),
        ("k8s://media/echo:70000", "port '70000' is not 1-65535"),
        ("k8s://Media/echo:1", "namespace 'Media' is not a Kubernetes name"),
        ("k8s://media/echo.x:1", "service 'echo.x' is not a Kubernetes name"),
        ("k8s://echo:1", "no namespace (want k8s://NAMESPACE/SERVICE:PORT)"),
    ],
)
def test_a_target_that_is_not_one_is_refused_naming_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_target(text)
    done = selftest("--cds-url", "http://127.0.0.1:9", "--target", text)
    assert done.returncode == 2 and says in done.stderr


@pytest.fixture(scope="module")
def resolver(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """`unshare --mount` with an /etc/hosts of our own (the Services' names, as a cluster's DNS
    answers them) and an /etc/resolv.conf asking nobody: the system's own resolver, no network."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a mount namespace of its own needs root and unshare(1)")
    etc = tmp_path_factory.mktemp("etc")
    (etc / "hosts").write_text(
        "127.0.0.1 echo.t.svc.cluster.local\n127.0.0.2 elsewhere.t.svc.cluster.local\n"
    )
    (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    script = (
        f"mount --bind {etc / 'hosts'} /etc/hosts && "
        f'mount --bind {etc / "resolv.conf"} /etc/resolv.conf && exec "$@"'
    )
    return ["unshare", "--mount", "--", "sh", "-c", script, "sh"]


def selftest_resolving(resolver: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*resolver, sys.executable, "-m", "stunner_cli", "selftest", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_service_that_echoes_is_checked_through_every_listener(
    world: dict[str, Any], resolver: list[str]
) -> None:
    target = f"k8s://t/echo:{world['echo']}"
    done = selftest_resolving(resolver, "--cds-url", world["cds"], "--target", target)
    assert done.returncode == 0, done.stdout + done.stderr
    checks = [line for line in done.stdout.splitlines() if target in line]
    udp, tcp = world["ports"]
    peer = f"(127.0.0.1:{world['echo']})"
    assert [line.split(": ")[0] for line in checks] == [
        f"ok   {target} {peer} via t/gw/udp udp 127.0.0.1:{udp}",
        f"ok   {target} {peer} via t/gw/tcp tcp 127.0.0.1:{tcp}",
    ]
    assert all("echoed 5/5" in line for line in checks)


def test_a_service_no_route_admits_or_no_name_resolves_fails(
    world: dict[str, Any], resolver: list[str]
) -> None:
    elsewhere, missing = "k8s://t/elsewhere:9", "k8s://t/missing:9"
    args = ["--cds-url", world["cds"], "--target", elsewhere, "--target", missing]
    done = selftest_resolving(resolver, *args, "--timeout", "1")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert sum(line.startswith(f"FAIL {elsewhere} (127.0.0.2:9) via ") for line in lines) == 2
    (unresolved,) = [line for line in lines if missing in line]
    assert unresolved.startswith(f"FAIL {missing}: cannot resolve missing.t.svc.cluster.local")
