"""`stunner explain NS/GW PEER[:PORT]` (issue 23): why a peer is admitted or refused.

We test: offline from manifests (examples/local, rendered as `render` does) a peer in the
StaticService's range and port is admitted via its route (exit 0); the same IP on another port,
an unrouted IP and the cloud metadata address are refused with the rule and the setting that
would allow them (exit 1); a dataplane config file works too, STUN-only included; bad peers and
a missing Gateway name are usage errors (exit 2) and an unknown Gateway says what was rendered;
no credential is printed. Online, through a fake API server and a real CDS, the running config
is explained. A TURN-TCP listener routing to a TCPRoute's cluster also judges the peer as a TCP
allocation's ("<listener> (TCP allocations)": admitted, port outside the range, no route naming a
TCPRoute); a TURN-UDP listener gets no such line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler.cds.server import cds_app
from reconciler.cds.store import ConfigStore
from stunner_api.dataplane import validate_config
from stunner_cli.__main__ import main as stunner
from tests.support.background import Background
from tests.support.fakeapi import FakeApiServer
from tests.support.objects import cds_service

ROOT = Path(__file__).resolve().parents[2]
LOCAL = str(ROOT / "examples" / "local")
GW = "stunner/local-gateway"
SYSTEM = "stunner-system"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = stunner(["explain", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_peer_in_the_static_service_is_admitted(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, GW, "127.0.0.1:9001", "-f", LOCAL)
    assert code == 0
    assert "stunner/local-gateway/udp-listener: admitted via route stunner/echo-route" in out
    assert "endpoint 127.0.0.1/32:<9001-9001>" in out
    assert "pass-1" not in out  # the example's password


@pytest.mark.parametrize(
    ("peer", "rule", "allow"),
    [
        ("127.0.0.1:9", "refused (port-outside-range): port 9 is outside 9001-9001", "port range"),
        ("10.0.0.1", "refused (no-route): no routed cluster names 10.0.0.1", "StaticService"),
        ("169.254.169.254:80", "cloud metadata address", "169.254.0.0/16"),
        ("[::ffff:224.0.0.1]:5", "refused (never-a-peer): 224.0.0.1 is multicast", ""),
    ],
)
def test_a_refused_peer_is_told_the_rule_and_the_setting(
    capsys: pytest.CaptureFixture[str], peer: str, rule: str, allow: str
) -> None:
    code, out, _ = run(capsys, GW, peer, "-f", LOCAL)
    assert code == 1
    assert out.count(rule) == 2, out  # both listeners
    if allow:
        assert "would be allowed by:" in out and allow in out
    else:
        assert "would be allowed by" not in out


def dataplane_config(auth_type: str = "static") -> dict[str, object]:
    return {
        "version": "v1",
        "admin": {"name": "ns/gw"},
        "auth": {"type": auth_type, "credentials": {"username": "u", "password": "p-secret"}},
        "listeners": [
            {"name": "ns/gw/a", "protocol": "TURN-UDP", "port": 3478, "routes": ["ns/media"]},
            {"name": "ns/gw/b", "protocol": "TURN-UDP", "port": 3479, "routes": []},
        ],
        "clusters": [{"name": "ns/media", "type": "STATIC", "endpoints": ["10.0.0.0/8"]}],
    }


def test_a_dataplane_config_file_is_explained(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "stunnerd.json"
    path.write_text(json.dumps(dataplane_config()))
    code, out, _ = run(capsys, "ns/gw", "10.1.2.3:5000", "-f", str(path))
    assert code == 0  # admitted on one listener is enough
    assert "ns/gw/a: admitted via route ns/media" in out
    assert "ns/gw/b: refused (no-routes): the listener routes to no cluster" in out
    assert "p-secret" not in out
    path.write_text(json.dumps(dataplane_config("none")))
    code, out, _ = run(capsys, "ns/gw", "10.1.2.3:5000", "-f", str(path))
    assert code == 1 and out.count("refused (stun-only)") == 2
    code, _, err = run(capsys, "ns/other", "10.1.2.3", "-f", str(path))
    assert code == 1 and "is the config of ns/gw, not ns/other" in err


def test_a_file_is_read_within_the_bounds_of_check_and_render(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Issue 28 #7: `explain -f FILE` read a file whole, whatever its size (100 MB: 1.13 GB
    of RSS after 60 s), and took a dataplane config of any size; now the reader of `check -f`
    and `render -f` (reconciler.files) refuses it unread, and an alias bomb in a few bytes."""
    big = tmp_path / "stunnerd.json"
    big.write_text(json.dumps(dataplane_config()) + "\n" * (4 * 1024 * 1024))
    code, out, err = run(capsys, "ns/gw", "10.1.2.3:5000", "-f", str(big))
    assert code == 1 and out == ""
    assert f"{big}: {big.stat().st_size} bytes, more than the 4 MiB a file may have" in err
    bomb = tmp_path / "bomb.yaml"
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 9)}]" for n in range(1, 9)]
    bomb.write_text("\n".join(levels) + "\n")
    code, out, err = run(capsys, "ns/gw", "10.1.2.3", "-f", str(bomb))
    assert code == 1 and out == "" and "an alias bomb?" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((GW, "bogus", "-f", LOCAL), "'bogus' is not an IP address"),
        ((GW, "10.0.0.1:70000", "-f", LOCAL), "is not 0-65535"),
        (("stunner", "10.0.0.1", "-f", LOCAL), "want NAMESPACE/GATEWAY PEER[:PORT]"),
        (("10.0.0.1", "-f", LOCAL), "want NAMESPACE/GATEWAY PEER[:PORT]"),
    ],
)
def test_usage_errors(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    code, out, err = run(capsys, *args)
    assert code == 2 and message in err and out == ""


def test_an_unknown_gateway_says_what_was_rendered(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "stunner/nosuch", "10.0.0.1", "-f", LOCAL)
    assert code == 1 and "rendered: stunner/local-gateway" in err


def test_online_the_running_config_is_explained(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    store = ConfigStore()
    store.set("ns/gw", validate_config(dataplane_config()))
    background = Background()
    with FakeApiServer() as fake:
        try:
            cds = background.serve(cds_app(store))
            fake.seed(cds_service(SYSTEM))
            fake.proxy(SYSTEM, "services", "stunner-config-discovery", 13478, cds)
            kube = ["--kubeconfig", str(fake.write_kubeconfig(tmp_path / "kubeconfig"))]
            admitted = run(capsys, "ns/gw", "10.1.2.3", *kube)
            refused = run(capsys, "ns/gw", "192.168.0.1:5000", *kube)
        finally:
            background.close()
    assert admitted[0] == 0 and "ns/gw/a: admitted via route ns/media" in admitted[1]
    assert refused[0] == 1 and "ns/gw/a: refused (no-route)" in refused[1]
    assert "p-secret" not in admitted[1] + refused[1]


def tcproute_manifests(tmp_path: Path) -> str:
    """The render case tcproute (a TURN-UDP and a TURN-TCP listener, TCPRoutes) as a folder."""
    render_data = ROOT / "tests" / "data" / "render"
    for name, source in (("common.yaml", "common.yaml"), ("routes.yaml", "tcproute/objects.yaml")):
        (tmp_path / name).write_text((render_data / source).read_text())
    return str(tmp_path)


def test_a_tcp_peer_of_a_tcproute_is_judged_as_a_tcp_allocations_peer(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    manifests = tcproute_manifests(tmp_path)
    code, out, _ = run(capsys, "stunner/tcp-gateway", "10.244.0.21:7881", "-f", manifests)
    assert code == 0, out
    tcp = "stunner/tcp-gateway/tcp-listener (TCP allocations)"
    assert f"{tcp}: admitted via route tcp:stunner/media-tcp" in out, out
    # The UDP allocations' verdict of the same listener: its clusters are TCP.
    assert "stunner/tcp-gateway/tcp-listener: refused (cluster-not-udp)" in out, out
    # The TURN-UDP listener carries no TCP allocations: no such line for it.
    assert "udp-listener (TCP allocations)" not in out
    # Port 9: the UDPRoute of the same name admits it for UDP allocations, not the TCPRoute.
    code, out, _ = run(capsys, "stunner/tcp-gateway", "10.244.0.21:9", "-f", manifests)
    assert "udp-listener: admitted via route stunner/media-tcp" in out, out
    assert f"{tcp}: refused (port-outside-range): port 9 is outside 7881-7881" in out, out
    code, out, _ = run(capsys, "stunner/tcp-gateway", "10.0.0.1:7881", "-f", manifests)
    assert code == 1, out
    assert f"{tcp}: refused (no-route)" in out and "a backend of a TCPRoute" in out, out
