"""Leader-only CDS (issue 31): two `stunner-reconciler` processes with `--cds-leader-only` (the
chart's with more than one replica) against the fake API server, and a real stunnerd watching
the CDS through a forwarder that, as the CDS Service does, sends each new connection to a
replica whose /readyz answers 200.

We test: only the leader is ready, and the standby answers the CDS 503 with Retry-After (no
watch, so no usage report, lands there: the leader alone counts the cluster-wide quotas); the
leader is killed (SIGKILL, no release): the standby leads within a lease duration and two retry
periods, stunnerd's watch reconnects to it through the forwarder with no restart, and a Gateway
edit made afterwards reaches stunnerd (it allocates on the new port).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from stunner_api.vocabulary import CDS_TOKEN_AUDIENCE, HEALTH_CHECK_PORT
from tests.reconciler import clusterkit as k
from tests.support.fakeapi import FakeApiServer
from tests.support.ports import free_port
from tests.support.turnclient import PASSWORD, USERNAME

from .conftest import StartStunnerd
from .test_cli_watch import NO_NODE_NAME, WATCH, allocates, wait_for

LEASE = {"lease-duration": 3.0, "renew-deadline": 2.0, "retry-period": 0.5}
TAKEOVER = LEASE["lease-duration"] + 2 * 1.2 * LEASE["retry-period"]  # the elector's jitter: 1.2


class Replica:
    """One `stunner-reconciler` process in cluster mode, leader-only CDS."""

    def __init__(self, kubeconfig: Path, name: str, log: Path) -> None:
        self.cds, self.health, self.metrics = free_port(), free_port(), free_port()
        timings = [arg for key, v in LEASE.items() for arg in (f"--leader-election-{key}", f"{v}s")]
        self.log = log
        with log.open("w") as stderr:
            self.proc = subprocess.Popen(  # noqa: S603
                [
                    sys.executable,
                    "-m",
                    "reconciler",
                    f"--kubeconfig={kubeconfig}",
                    "--leader-elect",
                    "--cds-leader-only",
                    "--leader-election-namespace=stunner-system",
                    *timings,
                    f"--config-discovery-address=127.0.0.1:{self.cds}",
                    f"--health-probe-bind-address=127.0.0.1:{self.health}",
                    f"--metrics-bind-address=127.0.0.1:{self.metrics}",
                    "--throttle-timeout=50ms",
                ],
                stderr=stderr,
                env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
            )

    def get(self, port: int, path: str, token: str = "") -> tuple[int, str, dict[str, str]]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                return response.status, response.read().decode(), dict(response.headers)
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.read().decode(), dict(exc.headers)
        except OSError:
            return 0, "", {}

    def ready(self) -> bool:
        return self.get(self.health, "/readyz")[0] == 200

    def gauge(self, name: str) -> float:
        _, text, _ = self.get(self.metrics, "/metrics")
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"no {name} in {text[:2000]}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@contextlib.asynccontextmanager
async def ready_forwarder(replicas: Sequence[Replica]) -> AsyncIterator[int]:
    """A TCP forwarder on a free loopback port: each connection goes to the first replica whose
    /readyz answers 200 now (none: closed), as a Service routes to ready endpoints only."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for replica in replicas:
            if await asyncio.to_thread(replica.ready):
                try:
                    up_reader, up_writer = await asyncio.open_connection("127.0.0.1", replica.cds)
                except OSError:
                    continue
                await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
                return
        writer.close()

    server = await asyncio.start_server(forward, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


def test_only_the_leader_serves_the_cds_and_stunnerd_follows_the_next_leader(
    tmp_path: Path, stunnerd: StartStunnerd
) -> None:
    async def main() -> None:
        turn, moved, health = free_port(), free_port(), free_port()
        annotations = {HEALTH_CHECK_PORT: str(health)}
        with FakeApiServer() as fake:
            gateway = k.gateway(k.listener(port=turn), annotations=annotations)
            for obj in (
                k.gateway_class(),
                k.gateway_config(userName=USERNAME, password=PASSWORD),
                k.dataplane(),
                k.static_service(prefixes=("127.0.0.1/32",)),
                gateway,
                k.route(),
            ):
                fake.seed(obj)
            kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
            a = Replica(kubeconfig, "a", tmp_path / "a.log")
            replicas = [a]
            try:
                await wait_for(lambda: asyncio.to_thread(a.ready), timeout=30)
                b = Replica(kubeconfig, "b", tmp_path / "b.log")
                replicas.append(b)
                # b is up, has rendered, and stands by: not ready, and its CDS refuses (before
                # any token check) with when to come back.
                await wait_for(
                    lambda: asyncio.to_thread(
                        lambda: "standing by" in b.get(b.health, "/readyz")[1]
                    ),
                    timeout=30,
                )
                status, body, headers = b.get(b.cds, "/api/v1/configs/stunner/gw")
                assert status == 503 and "leader only" in body, (status, body)
                assert headers.get("Retry-After") == "1"
                token = tmp_path / "token"
                token.write_text(fake.issue_token(k.NS, "gw-stunnerd", (CDS_TOKEN_AUDIENCE,)))
                env = NO_NODE_NAME | {
                    "STUNNER_CDS_TOKEN_FILE": str(token),
                    "STUNNER_ADDR": "127.0.0.1",
                }
                async with ready_forwarder([a, b]) as port:
                    process = stunnerd(
                        *WATCH, "-c", f"127.0.0.1:{port}", "-i", "stunner/gw", env=env
                    )
                    await wait_for(lambda: allocates(turn), timeout=30)
                    # stunnerd's one watch is on the leader; none on the standby.
                    assert a.gauge("stunner_reconciler_cds_clients") == 1
                    assert b.gauge("stunner_reconciler_cds_clients") == 0
                    # The leader dies without releasing the Lease.
                    killed_at = time.monotonic()
                    a.stop(signal.SIGKILL)
                    await wait_for(lambda: asyncio.to_thread(b.ready), timeout=30)
                    took = time.monotonic() - killed_at
                    assert took <= TAKEOVER + 1.0, took  # + the readiness poll's own second
                    # A change made now reaches stunnerd through the new leader.
                    k.edit_gateway(
                        fake, lambda g: g["spec"]["listeners"][0].update({"port": moved})
                    )
                    await wait_for(lambda: allocates(moved), timeout=30)
                    assert b.gauge("stunner_reconciler_cds_clients") == 1
                    assert process.running()
                    log = await asyncio.to_thread(process.stop, at_once=True)
                    assert "connected to CDS server" in log
            finally:
                for replica in replicas:
                    replica.stop()

    asyncio.run(main())
