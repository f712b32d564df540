"""Local mode: the reconciler on one machine, from YAML files instead of an API server.

    files (ManifestDir) -> Reconciler (Snapshot -> render) -> ConfigStore -> CDS + auth servers
                                                                  |
                                          (optional) one stunnerd per Gateway, watching its id

`run_local(settings)` is an async context manager that brings all of it up and yields a
`LocalMode` with the bound addresses; it stops everything it started on exit (the stunnerds get
SIGTERM, then a second one, then SIGKILL, so none outlives the reconciler). The watcher, the
render loop and the dataplanes' keeper are core tasks of a `Supervisor`: one that ends sets
`LocalMode.supervisor.failed`, and the command exits non-zero (`reconciler.supervise`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from stunner_api.cds import DEFAULT_PORT as DEFAULT_CDS_PORT

from .auth import auth_app
from .cds.server import cds_app, serve
from .cds.store import ConfigStore
from .files import ManifestDir
from .loop import THROTTLE, Reconciler, Rendered
from .render import RenderSettings, render
from .store import Snapshot
from .supervise import Supervisor, what_failed

log = logging.getLogger("stunner.local")

DEFAULT_AUTH_PORT = 8088  # the auth service's port (Go's authd -p)
STOP_TIMEOUT = 3.0  # seconds a stunnerd gets after each signal at shutdown
SUPERVISE_PERIOD = 1.0  # seconds between checks for a stunnerd that exited


@dataclass(frozen=True)
class LocalSettings:
    manifests: Path
    host: str = "127.0.0.1"
    cds_port: int = DEFAULT_CDS_PORT
    auth_port: int = DEFAULT_AUTH_PORT
    # The address in the URIs the auth service hands out (Go's STUNNER_PUBLIC_ADDR); default:
    # `dataplane_address` when the stunnerds run here.
    public_address: str = ""
    throttle: float = THROTTLE
    poll_interval: float = 0.1
    # Start one stunnerd per Gateway, watching the CDS; STUNNER_ADDR is `dataplane_address`.
    start_dataplanes: bool = False
    dataplane_address: str = "127.0.0.1"
    dataplane_args: tuple[str, ...] = ()
    # Where the stunnerds' output goes: None inherits the reconciler's stdout and stderr.
    dataplane_output: int | IO[bytes] | None = None
    render_settings: RenderSettings = field(default_factory=RenderSettings)


def renderer(
    settings: RenderSettings, clock: Callable[[], datetime] = lambda: datetime.now(UTC)
) -> Callable[[Sequence[Mapping[str, Any]]], Rendered]:
    """The loop's render step: raw objects -> Snapshot -> Plan."""

    def render_objects(objects: Sequence[Mapping[str, Any]]) -> Rendered:
        return render(Snapshot.from_objects(objects), settings, clock())

    return render_objects


def _free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Dataplanes:
    """One `stunnerd -w -c <CDS> -i <id>` process per config id.

    They share this host, so the health-check and metrics endpoints their configs ask for
    (`http://:8086` for every Gateway by default) cannot all be had: each stunnerd gets its own
    loopback ports instead (`--health-address`, `--metrics-address`; `admin_ports`), kept
    across its restarts. Its config still says whether each endpoint is on.
    """

    def __init__(
        self,
        cds_address: str,
        address: str,
        args: Sequence[str] = (),
        output: int | IO[bytes] | None = None,
    ) -> None:
        self.cds_address = cds_address
        self.address = address
        self.args = tuple(args)
        self.output = output
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.draining: list[subprocess.Popen[bytes]] = []
        self.admin_ports: dict[str, tuple[int, int]] = {}  # id -> (health, metrics)

    def command(self, id: str) -> list[str]:
        if id not in self.admin_ports:
            self.admin_ports[id] = (_free_loopback_port(), _free_loopback_port())
        health, metrics = self.admin_ports[id]
        return [
            sys.executable,
            "-m",
            "stunnerd",
            "-w",
            "-c",
            self.cds_address,
            "-i",
            id,
            "--health-address",
            f"127.0.0.1:{health}",
            "--metrics-address",
            f"127.0.0.1:{metrics}",
            *self.args,
        ]

    def reconcile(self, ids: Sequence[str]) -> None:
        """Run a stunnerd for exactly `ids`: start the new ones, drain the ones gone (SIGTERM:
        it serves its calls to their end, as a deleted Gateway's pods do), restart a crashed one."""
        self.draining = [proc for proc in self.draining if proc.poll() is None]
        for id in sorted(self.processes.keys() - set(ids)):
            proc = self.processes.pop(id)
            self.admin_ports.pop(id, None)
            log.info("Gateway %s is gone: draining its stunnerd (pid %d)", id, proc.pid)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            self.draining.append(proc)
        for id in sorted(ids):
            running = self.processes.get(id)
            if running is not None and running.poll() is None:
                continue
            if running is not None:
                log.warning(
                    "stunnerd for %s exited with code %s; restarting", id, running.returncode
                )
            env = {**os.environ, "STUNNER_ADDR": self.address}
            env.pop("STUNNER_CONFIG_ORIGIN", None)
            self.processes[id] = subprocess.Popen(
                self.command(id), env=env, stdout=self.output, stderr=self.output
            )
            log.info(
                "started stunnerd for %s (pid %d; health check, when on, at http://127.0.0.1:%d)",
                id,
                self.processes[id].pid,
                self.admin_ports[id][0],
            )

    async def stop(self) -> None:
        """Stop every stunnerd: SIGTERM, then a second signal (exit now), then SIGKILL."""
        procs = [*self.processes.values(), *self.draining]
        self.processes.clear()
        self.draining.clear()
        for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL):
            alive = [proc for proc in procs if proc.poll() is None]
            if not alive:
                break
            for proc in alive:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)
            await asyncio.to_thread(_wait_all, alive, STOP_TIMEOUT)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=STOP_TIMEOUT)


def _wait_all(procs: Sequence[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))


@dataclass
class LocalMode:
    """The running pipeline: what a caller may look at or wait for."""

    store: ConfigStore
    manifests: ManifestDir
    reconciler: Reconciler
    cds_address: str
    auth_address: str
    dataplanes: Dataplanes | None
    supervisor: Supervisor

    async def dataplane(self, id: str, timeout: float = 10.0) -> subprocess.Popen[bytes]:
        """The stunnerd started for config `id`, once it is there."""
        if self.dataplanes is None:
            raise RuntimeError("local mode runs no dataplanes (start_dataplanes is off)")
        async with asyncio.timeout(timeout):
            while id not in self.dataplanes.processes:
                await asyncio.sleep(0.05)
        return self.dataplanes.processes[id]

    async def rendered(self, renders: int) -> None:
        """Wait until the loop has rendered at least `renders` times."""
        async with self.reconciler.rendered:
            await self.reconciler.rendered.wait_for(lambda: self.reconciler.renders >= renders)


@contextlib.asynccontextmanager
async def run_local(settings: LocalSettings) -> AsyncIterator[LocalMode]:
    """Files -> render -> CDS (+ auth) -> optional stunnerds, until the block ends."""
    manifests = ManifestDir(settings.manifests, poll_interval=settings.poll_interval)
    manifests.scan()  # a missing directory fails here, before anything starts
    store = ConfigStore()
    public_address = settings.public_address or (
        settings.dataplane_address if settings.start_dataplanes else ""
    )
    reconciler = Reconciler(renderer(settings.render_settings), store, throttle=settings.throttle)
    async with (
        serve(cds_app(store), settings.host, settings.cds_port) as cds,
        serve(
            auth_app(store, public_address=public_address),
            settings.host,
            settings.auth_port,
        ) as auth,
    ):
        log.info("config discovery service on %s, auth service on %s", cds.address, auth.address)
        dataplanes = (
            Dataplanes(
                cds.address,
                settings.dataplane_address,
                settings.dataplane_args,
                settings.dataplane_output,
            )
            if settings.start_dataplanes
            else None
        )

        async def feed() -> None:
            async for objects in manifests.watch():
                reconciler.update(objects)

        async def keep_dataplanes(dataplanes: Dataplanes) -> None:
            """One stunnerd per published config: started after a render, restarted if it
            exits. A start that fails (no descriptor or process left) is tried again at the
            next render or period."""
            failing: str | None = None
            while True:
                try:
                    dataplanes.reconcile(sorted(store.configs))
                except OSError as exc:
                    if what_failed(exc) != failing:
                        failing = what_failed(exc)
                        log.error("cannot start a stunnerd (%s); trying again", failing)
                else:
                    failing = None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(SUPERVISE_PERIOD), reconciler.rendered:
                        await reconciler.rendered.wait()

        supervisor = Supervisor()
        supervisor.spawn("manifest watcher", feed())
        supervisor.spawn("render loop", reconciler.run())
        if dataplanes is not None:
            supervisor.spawn("dataplane keeper", keep_dataplanes(dataplanes))
        try:
            yield LocalMode(
                store, manifests, reconciler, cds.address, auth.address, dataplanes, supervisor
            )
        finally:
            await supervisor.stop()
            if dataplanes is not None:
                await dataplanes.stop()
