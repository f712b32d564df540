"""The stunnerd command line, run as a real subprocess.

We test: --dry-run prints the normalised config with secrets redacted; an invalid config is
refused with the field named and the process does not start; the turn:// shorthand serves STUN
and TURN; the bad-flag paths exit non-zero with a reason; the README's demo passes end to end.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from stunnerd import stun
from stunnerd.stun import Class, Message, Method

from .turnclient import free_port

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


def test_uri_shorthand_serves_binding_and_stops_on_sigterm() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [*STUNNERD, "--log-format", "json", f"turn://user:pass@127.0.0.1:{port}?transport=udp"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
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
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0
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


def test_turns_shorthand_serves_tls_with_a_self_signed_certificate() -> None:
    import ssl

    port = free_port()
    uri = f"turns://user:pass@127.0.0.1:{port}?transport=tcp"
    dry = run("--dry-run", uri)
    assert dry.returncode == 0, dry.stderr
    listener = json.loads(dry.stdout)["listeners"][0]
    assert listener["protocol"] == "TURN-TLS" and listener["port"] == port
    assert "BEGIN" not in dry.stdout  # cert and key are redacted
    proc = subprocess.Popen([*STUNNERD, uri], stderr=subprocess.DEVNULL)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # self-signed: we check the certificate's SAN below
    try:
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
    finally:
        proc.terminate()
        proc.wait(timeout=10)
