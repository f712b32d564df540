"""Cluster-mode reconciler figures (issues 12 and 20), against the fake API server with 1,000
Gateways:

0. the first pass: from the reconciler's start until every Gateway has its Deployment, its
   Service, its ServiceAccount and its status, and every UDPRoute its status, written (target:
   60 s at 1,000 Gateways); meanwhile `/healthz` is probed every second with a 1 s timeout
   (the kubelet's default), and its latency (p50/p99/max) and failures are reported (target:
   every probe answered, within 100 ms).
1. edit -> watcher: a backend edit (the StaticService of one Gateway's UDPRoute) made in the
   API server reaches a stunnerd-style CDS watcher of that Gateway: watch event -> render of
   the parts of the snapshot that changed -> publish -> WebSocket. Target: p99 <= 1 s. Edits
   are spaced wider than the render throttle window (250 ms), as a person editing would.
2. writes per render when nothing changed: every edit above changes a config and nothing in the
   cluster, and idle renders (an unused Dataplane touched) change nothing at all: the API writes
   counted on the fake divided by the renders the reconciler reports. Target: 0.
3. the reconciler's RSS (VmRSS and VmHWM of its process) with 1,000 Gateways cached.

The reconciler runs as its own process (`python -m reconciler --kubeconfig ...`, cluster mode);
the fake API server runs in this one, with the garbage collector off once it is seeded: its
collections (up to a second with 1,000 Gateways and the watch history) are no pause of the
reconciler's and delayed the edits' watch events.

    .venv/bin/python bench/reconciler_bench.py [--gateways 1000] [--edits 100]
        [--first-pass-limit 300]

Check the load average before you trust a run: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cds_bench import percentiles, say  # noqa: E402  (bench/ is on the path: run as a script)

from stunner_api.vocabulary import CDS_TOKEN_AUDIENCE  # noqa: E402
from tests.reconciler import clusterkit as k  # noqa: E402
from tests.support.fakeapi import FakeApiServer  # noqa: E402
from tests.support.ports import free_port  # noqa: E402

NS = k.NS
TARGET = 1.0


def seed(fake: FakeApiServer, gateways: int) -> None:
    """The GatewayClass, its GatewayConfig, the default and an unused Dataplane, and per Gateway
    one UDP listener routed to its own StaticService (the cluster-mode tests' builders)."""
    unused = k.dataplane()
    unused["metadata"]["name"] = "unused"
    for obj in (k.gateway_class(), k.gateway_config(), k.dataplane(), unused):
        fake.seed(obj)
    for i in range(gateways):
        fake.seed(k.gateway(name=f"gw-{i}"))
        fake.seed(static_service(i, 0))
        peer = {"group": "stunner.l7mp.io", "kind": "StaticService", "name": f"peer-{i}"}
        fake.seed(k.route(peer, name=f"route-{i}", parents=(f"gw-{i}",)))


def static_service(i: int, edit: int) -> dict[str, Any]:
    return k.static_service(f"peer-{i}", (f"10.{edit // 256 % 256}.{edit % 256}.1/32",))


def edit_static_service(fake: FakeApiServer, i: int, edit: int) -> str:
    obj = fake.get_object("stunner.l7mp.io/v1", "StaticService", NS, f"peer-{i}")
    assert obj is not None
    prefix = static_service(i, edit)["spec"]["prefixes"][0]
    obj["spec"]["prefixes"] = [prefix]
    fake.replace(fake.resource_type("stunner.l7mp.io/v1", "StaticService"), NS, f"peer-{i}", obj)
    return str(prefix)


def touch_unused_dataplane(fake: FakeApiServer, n: int) -> None:
    obj = fake.get_object("stunner.l7mp.io/v1", "Dataplane", "", "unused")
    assert obj is not None
    obj["spec"]["replicas"] = 1 + n % 3
    fake.replace(fake.resource_type("stunner.l7mp.io/v1", "Dataplane"), "", "unused", obj)


def metric(address: str, name: str) -> float:
    with urllib.request.urlopen(address + "/metrics", timeout=30) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    found = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.M))
    return f"VmRSS {int(found['VmRSS']) / 1024:.0f} MiB, VmHWM {int(found['VmHWM']) / 1024:.0f} MiB"


CREATED = re.compile(
    r"^/apis?/(?:[^/]+/)?[^/]+/namespaces/[^/]+/(deployments|services|serviceaccounts)$"
)
STATUS = re.compile(r"^/apis/[^/]+/[^/]+/namespaces/[^/]+/(gateways|udproutes)/([^/]+)/status$")


class FirstPass:
    """Follows the fake API server's write log: done when every Gateway has its Deployment,
    Service and ServiceAccount created (the bench seeds none) and its status written, and every
    UDPRoute its status."""

    def __init__(self, fake: FakeApiServer, gateways: int) -> None:
        self.fake, self.gateways = fake, gateways
        self.seen = 0
        self.created = {"deployments": 0, "services": 0, "serviceaccounts": 0}
        self.status: dict[str, set[str]] = {"gateways": set(), "udproutes": set()}

    def done(self) -> bool:
        writes = self.fake.writes()
        for method, path in writes[self.seen :]:
            path = path.split("?")[0]
            created = CREATED.match(path)
            if method == "POST" and created is not None:
                self.created[created.group(1)] += 1
            status = STATUS.match(path)
            if method == "PATCH" and status is not None:
                self.status[status.group(1)].add(status.group(2))
        self.seen = len(writes)
        counts = [*self.created.values(), *(len(names) for names in self.status.values())]
        return all(count >= self.gateways for count in counts)

    def progress(self) -> str:
        counts = {**self.created, **{k: len(v) for k, v in self.status.items()}}
        return ", ".join(f"{plural} {count}" for plural, count in counts.items())


class Prober(threading.Thread):
    """GET /healthz every second with a 1 s timeout, as the kubelet's liveness probe does."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.latencies: list[float] = []
        self.failures = 0
        self.longest_failing = 0  # probes in a row
        self._run_failing = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            started = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=1.0) as response:
                    response.read()
                    ok = response.status == 200
            except OSError:
                ok = False
            took = time.monotonic() - started
            if ok:
                self.latencies.append(took)
                self._run_failing = 0
            else:
                self.failures += 1
                self._run_failing += 1
                self.longest_failing = max(self.longest_failing, self._run_failing)
            self.stopped.wait(max(0.0, 1.0 - took))

    def report(self) -> str:
        probes = len(self.latencies) + self.failures
        answered = percentiles(self.latencies) if self.latencies else "none answered"
        return (
            f"{probes} probes, {self.failures} failed (longest run {self.longest_failing}); "
            f"answered: {answered}"
        )


async def wait_quiet(fake: FakeApiServer, quiet: float = 2.0, limit: float = 600) -> float:
    started = time.monotonic()
    count, since = len(fake.writes()), time.monotonic()
    while time.monotonic() - since < quiet:
        await asyncio.sleep(0.1)
        if len(fake.writes()) != count:
            count, since = len(fake.writes()), time.monotonic()
        if time.monotonic() - started > limit:
            raise RuntimeError("the reconciler never stopped writing")
    return since - started


async def run(args: argparse.Namespace) -> int:
    with FakeApiServer() as fake, tempfile.TemporaryDirectory() as tmp:
        fake.history_limit = 100_000
        say(f"seeding {args.gateways} Gateways (each: 1 listener, 1 UDPRoute, 1 StaticService)")
        seed(fake, args.gateways)
        gc.freeze()  # the fake's objects: its collections are not the reconciler's pauses
        gc.disable()
        kubeconfig = fake.write_kubeconfig(Path(tmp) / "kubeconfig")
        cds_port, metrics_port, health_port = free_port(), free_port(), free_port()
        command = [
            sys.executable,
            "-m",
            "reconciler",
            "--kubeconfig",
            str(kubeconfig),
            "--config-discovery-address",
            f"127.0.0.1:{cds_port}",
            "--metrics-bind-address",
            f"127.0.0.1:{metrics_port}",
            "--health-probe-bind-address",
            f"127.0.0.1:{health_port}",
            "--log",
            "WARNING",
        ]
        own = resource.getrusage(resource.RUSAGE_SELF)
        fake_cpu = own.ru_utime + own.ru_stime
        started = time.monotonic()
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=sys.stderr)
        metrics = f"http://127.0.0.1:{metrics_port}"
        prober = Prober(f"http://127.0.0.1:{health_port}/healthz")
        first_pass = FirstPass(fake, args.gateways)
        try:
            while True:  # the process is up and serving health: probe from now on
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/healthz") as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if proc.poll() is not None:
                    raise RuntimeError(f"reconciler exited with {proc.returncode}")
                await asyncio.sleep(0.05)
            up = time.monotonic() - started
            prober.start()
            finished: float | None = None
            while time.monotonic() - started < args.first_pass_limit:
                if first_pass.done():
                    finished = time.monotonic() - started
                    break
                if proc.poll() is not None:
                    raise RuntimeError(f"reconciler exited with {proc.returncode}")
                await asyncio.sleep(0.25)
            prober.stopped.set()
            prober.join()
            first_writes = len(fake.writes())
            say(f"0. first pass ({args.gateways} Gateways), health serving after {up:.1f} s:")
            if finished is None:
                say(
                    f"   NOT done within {args.first_pass_limit:.0f} s: {first_pass.progress()} "
                    f"({first_writes} writes)"
                )
            else:
                say(
                    f"   done after {finished:.1f} s (target 60 s at 1,000 Gateways): "
                    f"{first_writes} writes ({first_writes / args.gateways:.1f} per Gateway)"
                )
            say(f"   /healthz during it: {prober.report()}")
            own = resource.getrusage(resource.RUSAGE_SELF)
            say(
                f"   CPU meanwhile: reconciler {cpu_seconds(proc.pid):.1f} s, this process (the "
                f"fake API server) {own.ru_utime + own.ru_stime - fake_cpu:.1f} s"
            )
            say(f"   load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            writing = await wait_quiet(fake)
            say(f"   writes quiet {writing:.1f} s later; {len(fake.writes())} writes in all")
            say(f"   reconciler after the first pass: {rss(proc.pid)}")

            renders_before = metric(metrics, "stunner_reconciler_renders_total")
            writes_before = len(fake.writes())
            samples: list[float] = []
            slow: list[str] = []  # edits slower than 0.5 s: when, for the curious
            url = f"ws://127.0.0.1:{cds_port}/api/v1/configs/{NS}/gw-0?watch=true"
            # As gw-0's stunnerd: its pod's projected token (the CDS requires one).
            token = fake.issue_token(NS, "gw-0-stunnerd", (CDS_TOKEN_AUDIENCE,))
            headers = {"Authorization": f"Bearer {token}"}
            async with (
                aiohttp.ClientSession() as session,
                session.ws_connect(url, headers=headers) as ws,
            ):
                await ws.receive(timeout=10)  # the current config
                for edit in range(1, args.edits + 1):
                    prefix = edit_static_service(fake, 0, edit)
                    sent = time.monotonic()
                    while True:
                        message = await ws.receive(timeout=10)
                        if prefix in message.data:
                            break
                    samples.append(time.monotonic() - sent)
                    if samples[-1] > 0.5:
                        slow.append(f"#{edit} at {sent - started:.0f} s: {samples[-1]:.2f} s")
                    await asyncio.sleep(args.spacing)
            for n in range(args.idle_renders):
                touch_unused_dataplane(fake, n)
                await asyncio.sleep(args.spacing)
            await asyncio.sleep(1.0)
            renders = metric(metrics, "stunner_reconciler_renders_total") - renders_before
            writes = len(fake.writes()) - writes_before
            say(f"reconciler after {args.edits} edits: {rss(proc.pid)}")
            say(f"1. UDPRoute backend edit -> CDS watcher ({args.gateways} Gateways):")
            say(f"   {percentiles(samples)}")
            p99 = sorted(samples)[min(len(samples) - 1, int(0.99 * len(samples)))]
            say(f"   target p99 <= {TARGET:.1f} s: {'met' if p99 <= TARGET else 'NOT met'}")
            if slow:
                say(f"   slower than 0.5 s: {'; '.join(slow)}")
            say(
                f"2. writes per render when nothing in the cluster changed: {writes} writes / "
                f"{renders:.0f} renders = {writes / max(renders, 1):.2f} (target 0)"
            )
            say(
                "   render duration (mean): "
                f"{metric(metrics, 'stunner_reconciler_render_duration_seconds_sum') / max(metric(metrics, 'stunner_reconciler_render_duration_seconds_count'), 1) * 1000:.0f} ms"  # noqa: E501
            )
            say(f"3. reconciler RSS: {rss(proc.pid)}")
            say(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            say(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
            healthy = prober.failures == 0 and finished is not None and finished <= 60
            return 0 if p99 <= TARGET and writes == 0 and healthy else 1
        finally:
            gc.enable()
            prober.stopped.set()
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gateways", type=int, default=1000)
    parser.add_argument("--edits", type=int, default=100)
    parser.add_argument("--idle-renders", type=int, default=10)
    parser.add_argument("--spacing", type=float, default=0.4, help="seconds between edits")
    parser.add_argument(
        "--first-pass-limit", type=float, default=300.0, help="seconds to wait for the first pass"
    )
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
