"""stunnerd's admin endpoints and lifecycle: health, /status, metrics, SIGTERM drain.

We test: /live always 200; /ready 503 before a real config, 200 after, 503 while terminating
(200 with --force-ready-status), and a zero config does not make it ready; /status carries the
config and per-listener stats with every secret redacted; /metrics uses Go STUNner's names and
counts what happened; a stunnerd process on SIGTERM stops being ready, keeps relaying, and exits 0
once its last allocation is gone (or at once on a second signal).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import ProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from stunner_api.dataplane import StunnerConfig, zero_config
from stunner_api.stun import Class
from stunnerd.process.daemon import Stunner
from stunnerd.surface import admin
from stunnerd.surface.admin import HttpServer
from stunnerd.surface.metrics import format_value, render_metrics
from stunnerd.turn.counters import ClusterCounters, ListenerCounters
from tests.support.turnclient import (
    HOST,
    PASSWORD,
    RawClient,
    free_port,
    make_config,
    running_stunner,
    start_peer,
)

from .conftest import StartStunnerd, StunnerdProcess


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def get(url: str) -> tuple[int, str]:
    return await asyncio.to_thread(http_get, url)


def test_health_ready_and_status_redacted() -> None:
    async def main() -> None:
        port, health_port = free_port(), free_port()
        admin = {"healthcheck_endpoint": f"http://127.0.0.1:{health_port}"}
        config = make_config(port, [f"{HOST}/32"], admin=admin)
        base = f"http://127.0.0.1:{health_port}"
        async with running_stunner(config) as stunner:
            assert await get(f"{base}/live") == (200, "{}")
            status, body = await get(f"{base}/ready")
            assert (status, json.loads(body)) == (200, {"status": 200, "message": "READY"})
            client = await RawClient.connect((HOST, port))
            await client.allocate()
            status, body = await get(f"{base}/status")
            assert status == 200
            assert PASSWORD not in body
            report = json.loads(body)
            assert report["status"] == "READY" and report["allocationCount"] == 1
            assert report["auth"]["credentials"]["password"] == "<SECRET>"
            udp = next(lst for lst in report["listeners"] if lst["protocol"] == "TURN-UDP")
            assert udp["stats"]["rx"]["pkts"] >= 2 and udp["stats"]["tx"]["pkts"] >= 2
            # The kernel offload per listener: off by default, and why.
            assert udp["offload"] == {"on": False, "reason": "admin.offload_engine is None"}
            tcp = next(lst for lst in report["listeners"] if lst["protocol"] == "TURN-TCP")
            assert tcp["offload"] == {
                "on": False,
                "reason": "TURN-TCP: the offload relays TURN-UDP ChannelData only",
            }
            stunner.terminating = True
            status, body = await get(f"{base}/ready")
            assert (status, json.loads(body)["message"]) == (503, "stunnerd not ready")
            assert json.loads((await get(f"{base}/status"))[1])["status"] == "TERMINATING"
            stunner.force_ready = True
            assert (await get(f"{base}/ready"))[0] == 200
            assert (await get(f"{base}/nope"))[0] == 404
            client.close()

    asyncio.run(main())


def test_zero_config_is_not_ready() -> None:
    async def main() -> None:
        stunner = Stunner()
        assert (stunner.ready, stunner.status) == (False, "NOT-READY")
        zero = zero_config()
        await stunner.apply(zero)
        try:
            assert (stunner.ready, stunner.status) == (False, "NOT-READY")
            await stunner.apply(make_config(free_port(), [f"{HOST}/32"]))
            assert (stunner.ready, stunner.status) == (True, "READY")
            await stunner.apply(zero)  # a deletion after a real config: still configured
            assert stunner.ready
        finally:
            await stunner.close()

    asyncio.run(main())


def test_metrics_use_go_stunner_names() -> None:
    async def main() -> None:
        port, metrics_port = free_port(), free_port()
        peer = await start_peer(echo=True)
        admin = {"metrics_endpoint": f"http://127.0.0.1:{metrics_port}/metrics"}
        async with running_stunner(make_config(port, [f"{HOST}/32"], admin=admin)):
            client = await RawClient.connect((HOST, port))
            assert (await client.allocate()).message_class == Class.SUCCESS
            await client.channel_bind(0x4000, (HOST, peer.port))
            for _ in range(3):
                client.send_channel_data(0x4000, b"12345678")
                await asyncio.wait_for(client.channel_data.get(), 2)
            status, text = await get(f"http://127.0.0.1:{metrics_port}/metrics")
            assert status == 200
            samples = dict(
                line.rsplit(" ", 1)
                for line in text.splitlines()
                if line and not line.startswith("#")
            )
            assert samples["stunner_allocations_active"] == "1"
            rx = samples['stunner_listener_packets_total{direction="rx",name="testns/gw/turn-udp"}']
            assert int(rx) >= 2
            assert samples['stunner_listener_connections_total{name="testns/gw/turn-udp"}'] == "1"
            assert "# TYPE stunner_listener_bytes_total counter" in text
            assert float(samples["process_cpu_seconds_total"]) > 0
            cluster = 'name="testns/backend"'
            assert samples[f'stunner_cluster_packets_total{{direction="tx",{cluster}}}'] == "3"
            assert samples[f'stunner_cluster_packets_total{{direction="rx",{cluster}}}'] == "3"
            assert samples[f'stunner_cluster_bytes_total{{direction="rx",{cluster}}}'] == "24"
            udp = 'name="testns/gw/turn-udp"'
            assert samples[f'stunner_listener_offload{{{udp},reason="disabled"}}'] == "0"
            client.close()
        peer.close()

    asyncio.run(main())


def config_file(tmp_path: Path, config: StunnerConfig) -> str:
    path = tmp_path / "stunnerd.json"
    path.write_text(config.to_json())
    return str(path)


def wait_ready(base: str, process: StunnerdProcess) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        assert process.running(), process.stop()
        try:
            if http_get(f"{base}/ready")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("stunnerd never became ready")


def test_sigterm_drains_until_the_last_allocation_is_gone(
    tmp_path: Path, stunnerd: StartStunnerd
) -> None:
    port, health_port = free_port(), free_port()
    admin = {"healthcheck_endpoint": f"http://127.0.0.1:{health_port}"}
    config = make_config(port, [f"{HOST}/32"], admin=admin, protocols=("TURN-UDP",))
    process = stunnerd("-c", config_file(tmp_path, config))
    base = f"http://127.0.0.1:{health_port}"
    wait_ready(base, process)

    async def drain() -> None:
        client = await RawClient.connect((HOST, port))
        assert (await client.allocate()).message_class == Class.SUCCESS
        process.send(signal.SIGTERM)
        await asyncio.sleep(0.5)
        assert process.running(), "exited with an allocation still active"
        assert (await get(f"{base}/ready"))[0] == 503
        assert (await client.refresh(600)).message_class == Class.SUCCESS  # still serving
        assert (await client.refresh(0)).message_class == Class.SUCCESS
        client.close()

    asyncio.run(drain())
    assert process.wait(timeout=5) == 0


def test_second_signal_exits_at_once(tmp_path: Path, stunnerd: StartStunnerd) -> None:
    port = free_port()
    config = make_config(port, [f"{HOST}/32"], protocols=("TURN-UDP",))
    process = stunnerd("-c", config_file(tmp_path, config), "--grace-period", "600")

    async def hold() -> None:
        deadline = time.monotonic() + 15
        while True:
            client = await RawClient.connect((HOST, port))
            try:
                await client.allocate()
                break
            except TimeoutError:
                client.close()  # stunnerd is not up yet
                assert time.monotonic() < deadline
        process.send(signal.SIGTERM)
        await asyncio.sleep(0.3)
        assert process.running()
        process.send(signal.SIGINT)
        client.close()

    asyncio.run(hold())
    assert process.wait(timeout=5) == 0


SIGNALS_ON_THE_WAY_OUT = """
import asyncio, os, signal, sys
from stunnerd.process.serving import serve
from stunnerd.process.daemon import Stunner
from stunner_api.dataplane import StunnerConfig

async def main() -> int:
    config = StunnerConfig.model_validate_json(sys.argv[1])
    asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGTERM)
    code = await serve(Stunner(), config)  # the SIGTERM: no allocation to drain, it returns
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # late ones, the loop still open
        os.kill(os.getpid(), sig)
    await asyncio.sleep(0.1)
    print("closed", code)
    return code

sys.exit(asyncio.run(main()))
"""


def test_a_signal_after_the_shutdown_began_changes_nothing() -> None:
    """The order a `SIGTERM; SIGINT` pair takes when the SIGTERM's shutdown runs before the
    SIGINT is even sent (one CPU): the SIGINT lands once `serve` has returned, while the
    process still closes. Forced here: every signal is sent after `serve` returned. The
    process exits 0 all the same (it ended by KeyboardInterrupt, -2, or SIGTERM, -15, when
    `serve` handed the signals back to their defaults: test_cluster_quota failed so)."""
    config = make_config(free_port(), [f"{HOST}/32"], protocols=("TURN-UDP",))
    done = subprocess.run(
        [sys.executable, "-c", SIGNALS_ON_THE_WAY_OUT, config.model_dump_json()],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout.strip() == "closed 0"


# --- exact metrics, read back with prometheus_client's own parser ---------------------------


class FakeCounts:
    """A MetricsView with chosen values: large counters, a worker's share."""

    allocation_count = 3

    def listener_stats(self) -> dict[str, ListenerCounters]:
        return {"ns/gw/udp": ListenerCounters(rx_bytes=2_011_376, tx_bytes=2**60 + 1)}

    def listener_allocations(self) -> dict[str, int]:
        return {"ns/gw/udp": 3}

    def listener_offload(self) -> dict[str, dict[str, object]]:
        return {
            "ns/gw/udp": {"on": True, "engine": "TC", "interfaces": ["eth0"]},
            "ns/gw/tcp": {"on": False, "reason": "TURN-TCP: ...", "code": "protocol"},
        }

    def cluster_counters(self) -> dict[str, ClusterCounters]:
        return {'ns/"odd"\\name': ClusterCounters(tx_packets=123_456_789, rx_bytes=9_876_543)}

    def worker_usage(self) -> tuple[float, int]:
        return 1.25, 1 << 30

    user_quota_shared = True


def parsed_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_are_exact() -> None:
    text = render_metrics(FakeCounts())
    assert 'stunner_listener_bytes_total{direction="rx",name="ns/gw/udp"} 2011376\n' in text
    assert f'stunner_listener_bytes_total{{direction="tx",name="ns/gw/udp"}} {2**60 + 1}\n' in text
    samples = parsed_samples(text)
    rx = ("stunner_listener_bytes_total", (("direction", "rx"), ("name", "ns/gw/udp")))
    assert samples[rx] == 2_011_376
    cluster = ("stunner_cluster_packets_total", (("direction", "tx"), ("name", 'ns/"odd"\\name')))
    assert samples[cluster] == 123_456_789
    assert samples[("stunner_allocations_active", ())] == 3
    offload = "stunner_listener_offload"
    assert samples[(offload, (("name", "ns/gw/udp"), ("reason", "")))] == 1
    assert samples[(offload, (("name", "ns/gw/tcp"), ("reason", "protocol")))] == 0
    offloaded = (
        "stunner_listener_offloaded_packets_total",
        (("direction", "rx"), ("name", "ns/gw/udp")),
    )
    assert samples[offloaded] == 0
    # The start time has every digit: it equals prometheus_client's own reading.
    own = {s.name: s.value for f in ProcessCollector(registry=None).collect() for s in f.samples}
    assert samples[("process_start_time_seconds", ())] == own["process_start_time_seconds"]
    assert abs(samples[("process_start_time_seconds", ())] - time.time()) < 24 * 3600
    # CPU and memory count the workers too.
    assert samples[("process_resident_memory_bytes", ())] >= (1 << 30)
    assert samples[("process_cpu_seconds_total", ())] >= 1.25


def test_metrics_have_the_python_exporter_families() -> None:
    families = {f.name for f in text_string_to_metric_families(render_metrics(FakeCounts()))}
    for name in (
        "process_cpu_seconds",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_start_time_seconds",
        "process_open_fds",
        "process_max_fds",
        "python_info",
        "python_gc_collections",
        "python_gc_objects_collected",
    ):
        assert name in families


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (2_011_376, "2011376"),
        (2_011_376.0, "2011376"),
        (1795439324.92, "1795439324.92"),
        (0.1, "0.1"),
        (2**60 + 1, str(2**60 + 1)),
        (float("inf"), "+Inf"),
    ],
)
def test_format_value(value: float, text: str) -> None:
    assert format_value(value) == text


# --- the HTTP server: bounds ------------------------------------------------------------------


async def started_server(monkeypatch: pytest.MonkeyPatch, deadline: float) -> HttpServer:
    monkeypatch.setattr(admin, "HEADER_DEADLINE", deadline)
    server = HttpServer("test", lambda _path: {"/live": lambda: (200, "text/plain", b"ok")})
    await server.start("http://127.0.0.1:0", 0)
    return server


def test_an_oversized_request_line_is_refused_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        server = await started_server(monkeypatch, 5.0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET /" + b"a" * 200_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), 5)
            assert answer.split(b"\r\n")[0].endswith(b" 400 Bad Request"), answer[:80]
            writer.close()
            assert (await get(f"http://127.0.0.1:{server.port}/live")) == (200, "ok")
        finally:
            await server.stop()

    with caplog.at_level(logging.DEBUG):
        asyncio.run(main())
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_a_trickled_header_is_cut_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        server = await started_server(monkeypatch, 0.6)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            started = time.monotonic()
            writer.write(b"GET /live HTTP/1.1\r\n")

            async def trickle() -> None:
                for i in range(40):  # one header line every 0.1 s: 4 s if never cut
                    await asyncio.sleep(0.1)
                    if writer.is_closing():
                        return
                    writer.write(b"X-Slow-%d: y\r\n" % i)

            trickler = asyncio.get_running_loop().create_task(trickle())
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, nothing answered
            assert time.monotonic() - started < 2.0
            trickler.cancel()
            writer.close()
        finally:
            await server.stop()

    asyncio.run(main())


def test_a_second_request_on_a_kept_alive_connection_has_the_same_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def main() -> None:
        server = await started_server(monkeypatch, 0.6)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
            started = time.monotonic()
            writer.write(b"GET /live HTTP/1.1\r\n")  # and never the rest
            assert await asyncio.wait_for(reader.read(), 3) == b""
            assert time.monotonic() - started < 2.0
            writer.close()
        finally:
            await server.stop()

    asyncio.run(main())


def test_past_the_connection_cap_a_connection_is_closed_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 20 #2: at most MAX_CONNECTIONS at once (2 here); the next is closed at once and
    counted, and a probe is answered again when one goes."""
    monkeypatch.setattr(admin, "MAX_CONNECTIONS", 2)

    async def main() -> None:
        server = await started_server(monkeypatch, 30.0)
        try:
            held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
            for _ in range(100):
                if server.stats is not None and server.stats.open == 2:
                    break
                await asyncio.sleep(0.02)
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            assert await asyncio.wait_for(reader.read(), 5) == b""  # not after 30 s
            writer.close()
            assert server.stats is not None and server.stats.refused == 1
            held[0][1].close()
            for _ in range(100):
                if server.stats.open == 1:
                    break
                await asyncio.sleep(0.02)
            assert (await get(f"http://127.0.0.1:{server.port}/live")) == (200, "ok")
            held[1][1].close()
        finally:
            await server.stop()

    asyncio.run(main())
