"""Every process the chart runs starts from the image's own dependency set (issue 19).

The venvs are the Dockerfile's (conftest.py builds them with its RUN lines); the commands,
arguments, environment and probes are read from `helm template` of the chart and from the
Deployment the reconciler renders, as the kubelet would run them. Only what a pod's network
gives differs: loopback addresses and free ports instead of a pod IP and fixed ports, the fake
API server's kubeconfig instead of the in-cluster one, and a status patch giving the Gateway's
Service its LoadBalancer address. The image once shipped with gunicorn's gevent worker missing
`packaging` (only pytest brought it to the test venvs) and with its C extension check shadowed by
the source tree: both are caught here.
"""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.charts.conftest import NAMESPACE, helm_binary, of_kind, render
from tests.charts.test_helm_test import GATEWAY, cluster_objects
from tests.image.conftest import ROOT, ImageVenvs
from tests.support import ports
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Authority

POD_IP = "127.0.0.1"
NODE_NAME = "node-1"
# The dataplane image adds its venv to the base image: no more than this (issue 19).
DATAPLANE_VENV_LIMIT = 60 * 1024 * 1024
CONTROL_PLANE_ONLY = (
    "flask",
    "gunicorn",
    "gevent",
    "kubernetes",
    "jsonpatch",
    "aioice",
    "asyncio_dgram",
)


def du(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def until(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def container_of(manifests: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (obj,) = [m for m in of_kind(manifests, kind) if m["metadata"]["name"] == name]
    spec = obj["spec"].get("template", {}).get("spec") or obj["spec"]
    (container,) = spec["containers"]
    return dict(container)


def environment(container: dict[str, Any], venv_bin: Path, **more: str) -> dict[str, str]:
    """The container's env as the kubelet resolves it (downward API: pod IP, node name, the
    pod's namespace and name), with the image's PATH."""
    fields = {
        "status.podIP": POD_IP,
        "spec.nodeName": NODE_NAME,
        "metadata.namespace": NAMESPACE,
        "metadata.name": "pod-0",
    }
    env = {"PATH": f"{venv_bin}:/usr/bin:/bin", "PYTHONUNBUFFERED": "1"}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env | more


def projected_tokens(
    fake: FakeApiServer, pod: dict[str, Any], namespace: str, env: dict[str, str], tmp: Path
) -> dict[str, str]:
    """What the kubelet does for the pod's projected serviceAccountToken volumes: a token of the
    pod's ServiceAccount for each one's audience, in a file; the env's paths under the volumes'
    mount points moved to those files."""
    account = pod.get("serviceAccountName") or "default"
    (container,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
    moved = dict(env)
    for volume in pod.get("volumes", []):
        for source in volume.get("projected", {}).get("sources", []):
            token = source.get("serviceAccountToken")
            if token is None or volume["name"] not in mounts:
                continue
            path = tmp / f"{namespace}-{account}-{volume['name']}" / token["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(fake.issue_token(namespace, account, (token["audience"],)))
            mounted = f"{mounts[volume['name']]}/{token['path']}"
            moved = {k: str(path) if v == mounted else v for k, v in moved.items()}
    return moved


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """The kubelet's $(VAR) expansion of command and args."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in args]


def in_venv(command: list[str], venv: Path) -> list[str]:
    """The image's command from its venv (/opt/stunner mapped to where the test built it)."""
    first = command[0] if "/" in command[0] else str(venv / "bin" / command[0])
    return [first] + [a.replace("/opt/stunner", str(venv)) for a in command[1:]]


def http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return bool(response.status == 200)
    except OSError:
        return False


class Processes:
    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(argv, env=env, cwd="/", stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((name, proc))
        return proc

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def alive(self, name: str) -> bool:
        (proc,) = [p for n, p in self.procs if n == name]
        assert proc.poll() is None, f"{name} exited {proc.returncode}:\n{self.log(name)}"
        return True

    def close(self) -> None:
        for _, proc in reversed(self.procs):
            proc.terminate()
        for _, proc in reversed(self.procs):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    yield procs
    procs.close()


@pytest.fixture(scope="module")
def chart() -> list[dict[str, Any]]:
    return render(helm_binary("helm4"), f"test.echoPort={ports.free_port()}")


def test_the_build_checks_pass_from_slash_and_cover_every_command(image_venvs: ImageVenvs) -> None:
    controlplane = image_venvs.checks["venv-controlplane"]
    for command in ("stunnerd", "stunner-reconciler", "stunner"):
        assert f"check: {command} -> " in controlplane
    assert "check: gunicorn worker_class webhook.serving.DeadlineWorker" in controlplane
    assert "check: stunnerd._relay" in controlplane
    assert "check: stunnerd/offload/relay.bpf.o" in controlplane
    dataplane = image_venvs.checks["venv-dataplane"]
    assert re.findall(r"check: (\S+) -> ", dataplane) == ["stunnerd"]
    assert "check: stunnerd._relay" in dataplane
    assert "check: stunnerd/offload/relay.bpf.o" in dataplane


def image_check(image_venvs: ImageVenvs, image: str, pythonpath: Path) -> str:
    """Run the Dockerfile's check in a venv with `pythonpath` first on sys.path; return what it
    said on failure (it must fail)."""
    done = subprocess.run(
        [image_venvs.bin(image, "python"), str(ROOT / "hack" / "image_venv.py"), "check"],
        env={"PYTHONPATH": str(pythonpath)},
        cwd="/",
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0, done.stdout
    return done.stderr


def test_the_check_fails_when_a_module_gunicorn_loads_late_is_missing(
    image_venvs: ImageVenvs, tmp_path: Path
) -> None:
    """The fault the image shipped with: gunicorn's gevent worker imports `packaging` only when
    gunicorn starts it. Hidden here (a package that fails to import shadows it), the check the
    Dockerfile runs must fail and say so."""
    (tmp_path / "packaging").mkdir()
    (tmp_path / "packaging" / "__init__.py").write_text("raise ModuleNotFoundError('packaging')\n")
    assert "packaging" in image_check(image_venvs, "controlplane", tmp_path)


def test_the_check_fails_when_the_source_tree_shadows_the_venv(image_venvs: ImageVenvs) -> None:
    """The other fault: a check run in the build's WORKDIR imported the source folder."""
    assert "not from the venv" in image_check(image_venvs, "dataplane", ROOT)


def test_the_dataplane_venv_carries_stunnerd_alone(image_venvs: ImageVenvs) -> None:
    venv = image_venvs.dataplane
    python = image_venvs.bin("dataplane", "python")
    probe = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    done = subprocess.run(
        [python, "-c", probe, *CONTROL_PLANE_ONLY, "reconciler", "webhook", "stunner_cli", "pip"],
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "[]"
    ours = {p.name for p in (venv / "bin").iterdir()} & {
        "stunnerd",
        "stunner",
        "stunner-reconciler",
        "stunner-demo",
        "stunnerd-demo",
        "gunicorn",
    }
    assert ours == {"stunnerd"}
    assert du(venv) <= DATAPLANE_VENV_LIMIT, f"{du(venv) / 2**20:.1f} MiB"


def test_the_webhook_starts_as_the_chart_runs_it(
    image_venvs: ImageVenvs, chart: list[dict[str, Any]], processes: Processes, tmp_path: Path
) -> None:
    container = container_of(chart, "Deployment", "stunner-webhook")
    authority = Authority.new("webhook-ca")
    cert, key = authority.issue("stunner-webhook", server=True)
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    port = ports.free_port()
    env = environment(container, image_venvs.controlplane / "bin")
    assert env["STUNNER_WEBHOOK_BIND"].endswith(":9443")
    env |= {
        "STUNNER_WEBHOOK_BIND": f"127.0.0.1:{port}",
        "STUNNER_WEBHOOK_CERTFILE": str(tmp_path / "tls.crt"),
        "STUNNER_WEBHOOK_KEYFILE": str(tmp_path / "tls.key"),
    }
    argv = in_venv(container["command"] + container.get("args", []), image_venvs.controlplane)
    conf = Path(argv[1].removeprefix("--config="))
    assert conf.is_file(), f"the chart's gunicorn config {argv[1]} is not in the image's venv"
    processes.start("webhook", argv, env)
    context = ssl.create_default_context(cadata=authority.pem.decode())
    probe = container["readinessProbe"]["httpGet"]
    assert probe["scheme"] == "HTTPS"
    url = f"https://127.0.0.1:{port}{probe['path']}"
    until(lambda: processes.alive("webhook") and http_ok(url, context), "the webhook's /readyz")
    # A worker, not only the master, answered: the gevent worker class loaded.
    assert "Booting worker" in processes.log("webhook")
    assert "Error" not in processes.log("webhook")


def free_ports_in(args: list[str], names: tuple[str, ...]) -> tuple[list[str], dict[str, int]]:
    """`--NAME=:PORT` arguments moved to 127.0.0.1 and a free port."""
    out, chosen = [], {}
    for arg in args:
        flag, _, value = arg.partition("=")
        if flag.lstrip("-") in names and value.startswith(":"):
            chosen[flag.lstrip("-")] = ports.free_port()
            arg = f"{flag}=127.0.0.1:{chosen[flag.lstrip('-')]}"
        out.append(arg)
    return out, chosen


def seed_cluster(fake: FakeApiServer, chart: list[dict[str, Any]], turn_port: int) -> None:
    """The quick start's example with the chart's Dataplane and test hooks, as the API server
    stores them; the Gateway's listeners on a free port (what its pod would bind)."""
    (pod,) = [h for h in of_kind(chart, "Pod")]
    echo = next(a for a in pod["spec"]["containers"][0]["args"] if a.startswith("--echo="))
    echo_port = int(echo.rsplit(":", 1)[1])
    for located in cluster_objects(chart, echo_port):
        obj = json.loads(json.dumps(located.obj))
        if obj["kind"] == "Gateway":
            for listener in obj["spec"]["listeners"]:
                listener["port"] = turn_port
        fake.seed(obj)


def test_the_control_plane_and_the_dataplane_run_from_their_images(
    image_venvs: ImageVenvs, chart: list[dict[str, Any]], processes: Processes, tmp_path: Path
) -> None:
    """The reconciler, stunnerd (from the dataplane venv, as the reconciler's Deployment runs
    it), the auth service and `helm test`'s selftest, each with the chart's arguments."""
    turn_port = ports.free_port()
    with ExitStack() as stack:
        fake = stack.enter_context(FakeApiServer())
        seed_cluster(fake, chart, turn_port)
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")

        # The reconciler.
        reconciler = container_of(chart, "Deployment", "stunner-reconciler")
        args, chosen = free_ports_in(
            reconciler["args"],
            ("config-discovery-address", "health-probe-bind-address", "metrics-bind-address"),
        )
        cds = f"http://127.0.0.1:{chosen['config-discovery-address']}"
        env = environment(reconciler, image_venvs.controlplane / "bin", KUBECONFIG=str(kubeconfig))
        processes.start(
            "reconciler", in_venv(reconciler["command"] + args, image_venvs.controlplane), env
        )
        health = reconciler["readinessProbe"]["httpGet"]["path"]
        ready = f"http://127.0.0.1:{chosen['health-probe-bind-address']}{health}"
        until(lambda: processes.alive("reconciler") and http_ok(ready), "the reconciler ready")
        namespace, name = GATEWAY.split("/")
        deployment = until(
            lambda: fake.get_object("apps/v1", "Deployment", namespace, name),
            "the Gateway's Deployment",
        )

        # What a LoadBalancer controller would do: the Service gets its address.
        service = until(lambda: fake.get_object("v1", "Service", namespace, name), "its Service")
        service["status"] = {"loadBalancer": {"ingress": [{"ip": POD_IP}]}}
        fake.replace(fake.resource_type("v1", "Service"), namespace, name, service, "status")

        # stunnerd, from the dataplane venv, as the rendered Deployment runs it.
        (stunnerd,) = deployment["spec"]["template"]["spec"]["containers"]
        env = environment(stunnerd, image_venvs.dataplane / "bin")
        env = projected_tokens(
            fake, deployment["spec"]["template"]["spec"], namespace, env, tmp_path
        )
        assert env["STUNNER_CONFIG_ORIGIN"].endswith(":13478")
        env["STUNNER_CONFIG_ORIGIN"] = cds
        argv = in_venv(expand(stunnerd["command"] + stunnerd["args"], env), image_venvs.dataplane)
        processes.start("stunnerd", argv, env)
        probe = stunnerd["readinessProbe"]["httpGet"]
        stunnerd_ready = f"http://127.0.0.1:{probe['port']}{probe['path']}"
        until(lambda: processes.alive("stunnerd") and http_ok(stunnerd_ready), "stunnerd ready")

        # The auth service: the ICE servers name the Service's address.
        auth = container_of(chart, "Deployment", "stunner-auth")
        auth_port = ports.free_port()
        args = [
            f"--cds-url={cds}"
            if a.startswith("--cds-url=")
            else (f"--port={auth_port}" if a.startswith("--port=") else a)
            for a in auth["args"]
        ]
        env = environment(auth, image_venvs.controlplane / "bin")
        auth_pod = [
            d for d in of_kind(chart, "Deployment") if d["metadata"]["name"] == "stunner-auth"
        ][0]["spec"]["template"]["spec"]
        env = projected_tokens(fake, auth_pod, NAMESPACE, env, tmp_path)
        processes.start("auth", in_venv(auth["command"] + args, image_venvs.controlplane), env)
        ice_url = f"http://127.0.0.1:{auth_port}/ice?service=turn"

        def ice() -> dict[str, Any] | None:
            processes.alive("auth")
            try:
                with urllib.request.urlopen(ice_url, timeout=2) as response:
                    body: dict[str, Any] = json.load(response)
            except OSError:
                return None
            uris = [u for server in body.get("iceServers", []) for u in server.get("urls", [])]
            return body if f"turn:{POD_IP}:{turn_port}?transport=udp" in uris else None

        until(ice, "the auth service's ICE servers")

        # `helm test`: the test pod's command, as the kubelet expands it.
        (pod,) = of_kind(chart, "Pod")
        (test,) = pod["spec"]["containers"]
        env = environment(test, image_venvs.controlplane / "bin")
        env = projected_tokens(fake, pod["spec"], NAMESPACE, env, tmp_path)
        args = [f"--cds-url={cds}" if a.startswith("--cds-url=") else a for a in test["args"]]
        argv = in_venv(expand(test["command"] + args, env), image_venvs.controlplane)
        done = subprocess.run(argv, env=env, cwd="/", capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr + processes.log("stunnerd")
        lines = done.stdout.splitlines()
        assert len(lines) == 2 and all("echoed 5/5" in line for line in lines), lines
        for name in ("reconciler", "stunnerd", "auth"):
            processes.alive(name)
            assert "Traceback" not in processes.log(name), processes.log(name)
