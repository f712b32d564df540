"""The stunnerd command line, run as a real subprocess.

We test: --dry-run prints the normalised config with secrets redacted; an invalid config is
refused with the field named and the process does not start; the turn:// shorthand serves STUN
and TURN; the bad-flag paths exit non-zero with a reason; the README's demo passes end to end.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from stunner_api import stun
from stunner_api.stun import Class, Message, Method
from tests.support.turnclient import HOST, RawClient, binding_answered, free_port, make_config

from .conftest import StartStunnerd

STUNNERD = [sys.executable, "-m", "stunnerd"]


def run(
    *args: str, timeout: float = 20, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*STUNNERD, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def test_dry_run_prints_normalised_config_without_secrets(tmp_path: Path) -> None:
    config = tmp_path / "stunnerd.conf"
    config.write_text(
        "version: v1\n"
        "auth: {type: plaintext, credentials: {username: alice, password: 'pa$$w0rd-XYZ'}}\n"
        "listeners: [{name: l, protocol: udp, port: 3478, routes: [c]}]\n"
        "clusters: [{name: c, endpoints: [10.0.0.0/8]}]\n"
    )
    result = run("-c", str(config), "--dry-run")
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed["auth"]["type"] == "static"
    assert printed["listeners"][0]["protocol"] == "TURN-UDP"
    assert "pa$$w0rd-XYZ" not in result.stdout + result.stderr


def test_invalid_config_is_refused_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "stunnerd.conf"
    config.write_text(
        json.dumps(
            {
                "version": "v1",
                "auth": {"type": "static", "credentials": {"username": "u", "password": "p"}},
                "listeners": [{"name": "l", "protocol": "TURN-UDP", "port": 70000}],
            }
        )
    )
    result = run("-c", str(config))
    assert result.returncode == 1
    assert "listeners[0].port" in result.stderr


def test_missing_config_file_is_reported(tmp_path: Path) -> None:
    result = run("-c", str(tmp_path / "nope.conf"))
    assert result.returncode == 1
    assert "cannot read config file" in result.stderr


def test_log_spec_part_go_skips_is_warned_about() -> None:
    """Go's grammar: a part Go skips is skipped, with a warning naming it (not silently)."""
    result = run("-l", "all:LOUD,turn:DEBUG", "--dry-run", "turn://u:p@127.0.0.1:3478")
    assert result.returncode == 0
    assert "skipping unknown level 'LOUD' in 'all:LOUD'" in result.stderr


def test_uri_shorthand_serves_binding_and_stops_on_sigterm(stunnerd: StartStunnerd) -> None:
    port = free_port()
    process = stunnerd("--log-format", "json", f"turn://user:pass@127.0.0.1:{port}?transport=udp")
    request = Message(Method.BINDING, Class.REQUEST)
    response = None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(0.2)
        deadline = time.monotonic() + 15
        while response is None and time.monotonic() < deadline:
            sock.sendto(request.encode(), ("127.0.0.1", port))
            try:
                response = stun.parse_message(sock.recv(2048))
            except TimeoutError:
                continue
        assert response is not None, "stunnerd did not answer"
        assert response.message_class == Class.SUCCESS
        assert response.attributes["XOR-MAPPED-ADDRESS"] == sock.getsockname()
    stderr = process.stop()
    assert process.returncode == 0
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert any("listener default-listener" in line["msg"] for line in lines)
    assert "pass" not in [word.strip("'\",") for line in lines for word in line["msg"].split()]


def test_demo_passes() -> None:
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "stunnerd.demo", "--port", str(port), "--count", "20"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "result: OK" in result.stdout
    assert "20/20 echoed" in result.stdout
    ice = result.stdout.split("RTCPeerConnection configuration):")[1].split("result:")[0]
    servers = json.loads(ice)["iceServers"][0]
    assert servers["urls"] == [
        f"turn:127.0.0.1:{port}?transport=udp",
        f"turn:127.0.0.1:{port}?transport=tcp",
    ]


def test_turns_shorthand_serves_tls_with_a_self_signed_certificate(
    stunnerd: StartStunnerd,
) -> None:
    import ssl

    port = free_port()
    uri = f"turns://user:pass@127.0.0.1:{port}?transport=tcp"
    dry = run("--dry-run", uri)
    assert dry.returncode == 0, dry.stderr
    listener = json.loads(dry.stdout)["listeners"][0]
    assert listener["protocol"] == "TURN-TLS" and listener["port"] == port
    assert "BEGIN" not in dry.stdout  # cert and key are redacted
    process = stunnerd(uri)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # self-signed: we check the certificate's SAN below
    deadline = time.monotonic() + 15
    while True:
        try:
            raw = socket.create_connection(("127.0.0.1", port), timeout=1)
            break
        except OSError:
            assert time.monotonic() < deadline, "stunnerd did not start"
            time.sleep(0.1)
    with context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        from cryptography import x509

        san = x509.load_der_x509_certificate(der).extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        )
        assert "127.0.0.1" in [str(ip) for ip in san.value.get_values_for_type(x509.IPAddress)]
        request = Message(Method.BINDING, Class.REQUEST)
        tls.sendall(request.encode())
        header = tls.recv(20)
        body = tls.recv(int.from_bytes(header[2:4], "big"))
        response = stun.parse_message(header + body)
        assert response.transaction_id == request.transaction_id
        assert response.message_class == Class.SUCCESS
    assert process.stop() is not None


# --- a new user's first hour ------------------------------------------------------------------


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("stunnerd ")


def test_no_arguments_says_what_it_tried_and_how_to_give_a_config() -> None:
    result = run("-u", "1", env={"STUNNER_CONFIG_ORIGIN": ""})
    assert result.returncode == 1
    assert "no configuration given" in result.stderr
    assert "http://localhost:13478" in result.stderr  # what it tried
    assert "-c FILE" in result.stderr and "turn://" in result.stderr  # what to do instead


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    config = tmp_path / "broken.yaml"
    config.write_text("version: v1\nauth: {type: static\nlisteners: []\n")
    result = run("-c", str(config), "--dry-run")
    assert result.returncode == 1
    assert f"{config}: could not parse config: YAML parse error: line 3, column 1" in result.stderr
    assert "<unicode string>" not in result.stderr
    assert "JSON" not in result.stderr


def test_a_busy_port_is_named_with_its_holder() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as squatter:
        squatter.bind((HOST, 0))
        port = squatter.getsockname()[1]
        result = run("-u", "1", f"turn://user:pass@127.0.0.1:{port}?transport=udp")
    assert result.returncode == 1
    assert f"UDP port {port} is already in use (held by process {os.getpid()} (" in result.stderr


def test_sighup_rereads_the_config_file(tmp_path: Path, stunnerd: StartStunnerd) -> None:
    first, second = free_port(), free_port()
    config = tmp_path / "stunnerd.json"
    config.write_text(make_config(first, ["127.0.0.1/32"], protocols=("TURN-UDP",)).to_json())
    process = stunnerd("-u", "1", "-c", str(config))
    assert binding_answered(first)
    config.write_text("version: v1\nauth: {type: static\n")  # broken: ignored, logged
    process.send(signal.SIGHUP)
    time.sleep(0.5)
    assert process.running() and binding_answered(first, timeout=2)
    config.write_text(make_config(second, ["127.0.0.1/32"], protocols=("TURN-UDP",)).to_json())
    process.send(signal.SIGHUP)
    assert binding_answered(second)
    assert process.running()
    stderr = process.stop()
    assert process.returncode == 0
    assert "SIGHUP: configuration not reloaded (running configuration unchanged)" in stderr
    assert stderr.count("SIGHUP: re-reading the config") == 2


def test_the_listener_start_is_logged_once_with_workers(stunnerd: StartStunnerd) -> None:
    port = free_port()
    process = stunnerd("-u", "2", f"turn://user:pass@127.0.0.1:{port}?transport=udp")
    assert binding_answered(port)
    time.sleep(0.5)  # the worker has applied the config by now
    stderr = process.stop()
    assert stderr.count("listener default-listener (TURN-UDP) serving on port") == 1, stderr


def test_the_first_ctrl_c_says_that_a_second_one_exits_now(stunnerd: StartStunnerd) -> None:
    port = free_port()
    process = stunnerd("-u", "1", f"turn://user:pass@127.0.0.1:{port}?transport=udp")

    async def hold() -> None:
        assert await asyncio.to_thread(binding_answered, port)
        client = await RawClient.connect(("127.0.0.1", port), username="user", password="pass")
        assert (await client.allocate()).message_class == Class.SUCCESS
        process.send(signal.SIGINT)
        await asyncio.sleep(0.5)
        assert process.running()  # draining
        process.send(signal.SIGINT)
        client.close()

    asyncio.run(hold())
    assert process.wait(timeout=5) == 0
    assert "SIGINT: draining 1 allocation(s)" in process.stderr
    assert "press Ctrl-C again to exit now" in process.stderr
    assert "SIGINT again: exiting now" in process.stderr


def test_dry_run_fails_on_an_unknown_key_or_a_missing_cluster(tmp_path: Path) -> None:
    config = tmp_path / "stunnerd.yaml"
    config.write_text(
        "version: v1\n"
        "auth: {type: static, credentials: {username: u, password: p}}\n"
        "listeners: [{name: l, protocol: udp, port: 3478, rout: [c]},"
        " {name: m, protocol: udp, port: 3479, routes: [gone]}]\n"
        "clusters: [{name: c, endpoints: [10.0.0.0/8]}]\n"
    )
    result = run("-c", str(config), "--dry-run")
    assert result.returncode == 1
    assert json.loads(result.stdout)["listeners"][0]["name"] == "l"  # still printed
    assert 'listeners[0].rout: unknown key, ignored (did you mean "routes"?)' in result.stderr
    assert 'cluster "gone" is not defined' in result.stderr


def test_an_unknown_key_is_a_warning_at_start(tmp_path: Path, stunnerd: StartStunnerd) -> None:
    port = free_port()
    config = tmp_path / "stunnerd.json"
    data = json.loads(make_config(port, ["127.0.0.1/32"], protocols=("TURN-UDP",)).to_json())
    data["listeners"][0]["rout"] = data["listeners"][0].pop("routes")
    config.write_text(json.dumps(data))
    process = stunnerd("-u", "1", "-c", str(config))
    assert binding_answered(port)
    stderr = process.stop()
    assert "WARNING" in stderr and 'did you mean "routes"?' in stderr


# Loaded only for a TLS/DTLS listener (cryptography, pyOpenSSL: ~12 MiB of RSS), an admin
# endpoint (aiohttp: ~10 MiB), a metrics scrape (prometheus_client) or a CDS watch (websockets).
DEFERRED_MODULES = (
    *("cryptography", "OpenSSL", "stunnerd.transport.certificates", "stunnerd.transport.dtls"),
    *("aiohttp", "prometheus_client", "websockets"),
)
LOADED_BY_A_PLAIN_STUNNERD = """
import asyncio, json, sys
import stunnerd.process.cli
from stunnerd.process.daemon import Stunner
from stunner_api.dataplane import StunnerConfig

async def serve() -> None:
    stunner = Stunner()
    await stunner.apply(StunnerConfig.model_validate_json(sys.argv[1]))
    try:
        assert stunner.ready, "the listeners did not come up"
    finally:
        await stunner.close()

asyncio.run(serve())
print(json.dumps(sorted(sys.modules)))
"""


def test_a_turn_udp_and_tcp_stunnerd_loads_no_tls_or_admin_server_machinery() -> None:
    # make_config turns the health check off; the metrics endpoint is off by default.
    config = make_config(free_port(), [f"{HOST}/32"], protocols=("TURN-UDP", "TURN-TCP"))
    assert config.admin.metrics_endpoint == "" and config.admin.healthcheck_endpoint == ""
    done = subprocess.run(
        [sys.executable, "-c", LOADED_BY_A_PLAIN_STUNNERD, config.model_dump_json()],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert "stunnerd.transport.transports" in loaded  # the daemon did build its listeners
    deferred = [m for m in loaded if m.split(".")[0] in DEFERRED_MODULES or m in DEFERRED_MODULES]
    assert deferred == []


def _answers_live(port: int, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/live", timeout=5) as answer:
                assert answer.status == 200
                return
        except urllib.error.URLError:
            assert time.monotonic() < deadline, f"no health-check server on {port}"
            time.sleep(0.1)


def test_health_address_moves_the_endpoint_and_a_taken_port_is_one_clear_line(
    stunnerd: StartStunnerd,
) -> None:
    """Issue 20 #13: several stunnerds on one host (local mode) each get their own health
    address; one whose port is taken says so in one line and keeps serving TURN. Once the port
    is free its health server binds (a host-network rollout: the pod it replaces held it)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        port, health = free_port(), free_port()
        moved = stunnerd("--health-address", f"127.0.0.1:{health}", f"turn://u:p@127.0.0.1:{port}")
        blocked_port = free_port()
        blocked = stunnerd(
            "--health-address", f"127.0.0.1:{taken}", f"turn://u:p@127.0.0.1:{blocked_port}"
        )
        assert binding_answered(port) and binding_answered(blocked_port)
        # The health server starts once the UDP worker processes serve too: wait for it, and
        # for the blocked one to have found its port taken.
        _answers_live(health)
        deadline = time.monotonic() + 10
        while "cannot start the health-check server" not in blocked.stderr:
            assert time.monotonic() < deadline, blocked.stderr
            time.sleep(0.05)
    _answers_live(taken)  # the holder is gone: the blocked stunnerd binds its port now
    stderr = blocked.stop()
    moved.stop()
    lines = [line for line in stderr.splitlines() if "cannot start" in line]
    assert len(lines) == 1, stderr
    assert f"on http://127.0.0.1:{taken}:" in lines[0] and "in use" in lines[0]
    assert "runs without it" in lines[0] and "Traceback" not in stderr
    assert "health-check server's port is free now" in stderr
    assert blocked.returncode == 0


def _sigterm_while_loading(prefix: list[str]) -> subprocess.CompletedProcess[str]:
    """stunnerd (behind `prefix`) loading its config from a CDS that takes the connection and
    never answers, so it is past its imports and not yet serving; SIGTERM then, to the process
    that is stunnerd (the prefix's child when there is a prefix)."""
    with socket.socket() as cds:
        cds.bind((HOST, 0))
        cds.listen()
        process = subprocess.Popen(
            [*prefix, *STUNNERD, "-c", f"{HOST}:{cds.getsockname()[1]}"],
            stderr=subprocess.PIPE,
            text=True,
        )
        cds.settimeout(20)
        connection, _ = cds.accept()
        with connection:
            target = process.pid
            if prefix:
                children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
                target = int(children.read_text().split()[0])
            os.kill(target, signal.SIGTERM)
            try:
                _, stderr = process.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                _, stderr = process.communicate()
                raise AssertionError(f"still running 10 s after SIGTERM:\n{stderr}") from None
    return subprocess.CompletedProcess(process.args, process.returncode, "", stderr)


def test_a_sigterm_before_serving_exits_at_once() -> None:
    """Before it serves, stunnerd exits on SIGTERM by its own handler (status 143), not by the
    signal's default action, which the kernel never takes for PID 1 (a container's stunnerd):
    there such a SIGTERM was lost and the pod hung for its whole termination grace period."""
    done = _sigterm_while_loading([])
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert "SIGTERM before serving: exiting" in done.stderr and "Traceback" not in done.stderr


def test_a_sigterm_before_serving_ends_stunnerd_as_pid_1() -> None:
    """As a container runs it: stunnerd is PID 1 of its own PID namespace (unshare, root)."""
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "true"], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        pytest.skip(f"no PID namespace here (unshare: {probe.stderr.strip()})")
    done = _sigterm_while_loading(["unshare", "--pid", "--fork", "--kill-child"])
    assert done.returncode == 128 + signal.SIGTERM, done.stderr  # unshare passes it on
    assert "SIGTERM before serving: exiting" in done.stderr and "Traceback" not in done.stderr
