"""Layer 5 of ../shared/TESTING.md: the README's quick start on a real, disposable cluster.

Opt-in: with ``STUNNER_TEST_CLUSTER`` naming the kubeconfig of a disposable cluster (kind,
minikube, or a single node you made), the quick start runs there for real, once per helm major;
without it every test here is skipped, reported in one summary line. tests/cluster/README.md
lists the variables (how an image reaches the nodes, the image builder, the address a
LoadBalancer Service gets when the cluster has no LoadBalancer controller).

The tests of a module run in their order, on one release per helm major (``release``): each
test is a phase of the quick start or a property a user relies on, and its duration is printed
in the run's summary, beside what the phases measured (``MEASURED``).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
CLUSTER_VARIABLE = "STUNNER_TEST_CLUSTER"
NO_CLUSTER = f"{CLUSTER_VARIABLE} unset: no disposable cluster (tests/cluster/README.md)"

# What a phase measured, printed in the run's summary (and kept for tests/cluster/README.md).
MEASURED: dict[str, str] = {}
PHASES: list[tuple[str, str, float]] = []


@dataclass(frozen=True)
class Settings:
    """The run's configuration, from the environment (tests/cluster/README.md)."""

    kubeconfig: Path
    image_load: str  # a command with {image} (once per image) or {images} (all at once)
    builder: list[str]  # the image builder and extra arguments of its `build`
    lb_address: str  # given to LoadBalancer Services by a status patch; empty: wait for one
    kubectl: str
    helms: tuple[str, ...]

    @classmethod
    def from_environment(cls) -> Settings:
        env = os.environ
        helms = tuple(env.get("STUNNER_TEST_HELM", "helm3,helm4").replace(" ", "").split(","))
        return cls(
            kubeconfig=Path(env[CLUSTER_VARIABLE]),
            image_load=env.get("STUNNER_TEST_IMAGE_LOAD", "kind load docker-image {images}"),
            builder=[env.get("STUNNER_TEST_BUILDER", "docker")]
            + shlex.split(env.get("STUNNER_TEST_BUILD_ARGS", "")),
            lb_address=env.get("STUNNER_TEST_LB_ADDRESS", ""),
            kubectl=env.get("STUNNER_TEST_KUBECTL", "kubectl"),
            helms=tuple(h for h in helms if h),
        )


@dataclass
class Kube:
    """kubectl against the disposable cluster."""

    settings: Settings
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.env = {**os.environ, "KUBECONFIG": str(self.settings.kubeconfig)}

    def run(
        self, *args: str, stdin: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.settings.kubectl, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            check=False,
            cwd=ROOT,
        )

    def ok(self, *args: str, stdin: str | None = None, timeout: float = 120) -> str:
        done = self.run(*args, stdin=stdin, timeout=timeout)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}{done.stdout}"
        return done.stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.ok("get", *args, "-o", "json"))

    def apply(self, *objects: dict[str, Any]) -> str:
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
        return self.ok("apply", "-f", "-", stdin=body)


def wait_for(what: str, check: Any, within: float, every: float = 0.5) -> Any:
    """`check()` until it returns something true (returned) or `within` seconds pass (fail)."""
    deadline = time.monotonic() + within
    last: Any = None
    while True:
        try:
            last = check()
        except (AssertionError, subprocess.SubprocessError, KeyError, IndexError) as e:
            last = e
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {within:.0f} s (last: {last!r})")
        time.sleep(every)


def pytest_report_header(config: pytest.Config) -> list[str]:
    kubeconfig = os.environ.get(CLUSTER_VARIABLE)
    if not kubeconfig:
        return []
    settings = Settings.from_environment()
    version = Kube(settings).run("version", "-o", "json")
    server = "?"
    if version.returncode == 0:
        server = json.loads(version.stdout).get("serverVersion", {}).get("gitVersion", "?")
    return [
        f"cluster {kubeconfig}: server {server}",
        f"cluster builder {' '.join(settings.builder)}; load {settings.image_load!r}; "
        f"LB address {settings.lb_address or '(the LB controller)'}; helm {settings.helms}",
    ]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Without a cluster, every skip of this layer is reported at one place: one summary line.
    With one, each phase's outcome and duration is kept for the summary."""
    report = yield
    if report.skipped and isinstance(report.longrepr, tuple) and NO_CLUSTER in report.longrepr[2]:
        report.longrepr = (__file__, None, report.longrepr[2])
    elif report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        PHASES.append((item.name, report.outcome, report.duration))
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not PHASES:
        return
    write = terminalreporter.write_line
    terminalreporter.section("cluster phases")
    for name, outcome, duration in PHASES:
        write(f"{outcome:7} {duration:7.1f} s  {name}")
    for key, value in MEASURED.items():
        write(f"measured: {key}: {value}")


@pytest.fixture(scope="session")
def settings() -> Settings:
    if not os.environ.get(CLUSTER_VARIABLE):
        pytest.skip(NO_CLUSTER)
    return Settings.from_environment()


@pytest.fixture(scope="session")
def kube(settings: Settings) -> Kube:
    kube = Kube(settings)
    nodes = kube.get("nodes")["items"]
    assert nodes, "the cluster has no node"
    return kube


@pytest.fixture(scope="session")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("helm-home")
