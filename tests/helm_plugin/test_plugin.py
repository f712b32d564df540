"""`helm stunner ...` with real helm 3 and helm 4: the plugin installed with `helm plugin install
./helm-plugin`, reaching the real CDS server (reconciler/cds/server.py) through the fake API
server's service proxy, and the offline render/check over manifest files."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from reconciler.cds.server import cds_app
from reconciler.cds.store import ConfigStore
from stunner_api.dataplane import validate_config
from stunner_cli import offline
from tests.charts.conftest import HELMS, ROOT, helm_binary
from tests.support.background import Background
from tests.support.fakeapi import FakeApiServer
from tests.support.objects import cds_service

NAMESPACE = "stunner-system"
PASSWORD = "pass-1"
SHARED_SECRET = "my-shared-secret"


def rendered_configs() -> dict[str, Any]:
    """The configs render makes of the bundled local example, one made ephemeral."""
    configs = dict(offline.plan(offline.load(ROOT / "examples" / "local")).configs)
    (local,) = configs.values()
    data = local.to_dict()
    data["admin"]["name"] = "media/ephemeral-gateway"
    data["auth"] = {
        "type": "ephemeral",
        "realm": "stunner.l7mp.io",
        "credentials": {"secret": SHARED_SECRET},
    }
    for listener in data["listeners"]:
        listener["name"] = listener["name"].replace(
            "stunner/local-gateway", "media/ephemeral-gateway"
        )
        listener["public_address"] = "192.0.2.10"
    configs["media/ephemeral-gateway"] = validate_config(data)
    return configs


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The real CDS server with rendered configs, a stunnerd-like /status, the fake API server
    proxying to both, and a kubeconfig for it."""
    background = Background()
    store = ConfigStore()
    store.publish(rendered_configs())
    cds = background.serve(cds_app(store))

    async def status(request: web.Request) -> web.Response:
        return web.json_response(
            {"admin": {"name": "stunner/local-gateway"}, "allocationCount": 3, "status": "READY"}
        )

    pod_app = web.Application()
    pod_app.router.add_get("/status", status)
    pod = background.serve(pod_app)
    with FakeApiServer() as api:
        api.seed(cds_service(NAMESPACE))
        api.proxy(NAMESPACE, "services", "stunner-config-discovery", 13478, cds)
        api.seed(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "local-gateway-abc",
                    "namespace": "stunner",
                    "labels": {
                        "app": "stunner",
                        "stunner.l7mp.io/related-gateway-name": "local-gateway",
                    },
                },
            }
        )
        api.proxy("stunner", "pods", "local-gateway-abc", 8086, pod)
        for located in offline.load(ROOT / "examples" / "local"):  # what the CDS serves, live
            api.seed(located.obj)
        kubeconfig = api.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config")
        yield {"kubeconfig": str(kubeconfig), "store": store, "background": background}
    background.close()


@pytest.fixture(params=sorted(HELMS), scope="module")
def helm_env(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """helm N with the plugin installed from ./helm-plugin into a fresh HELM home."""
    helm = helm_binary(str(request.param))
    home = tmp_path_factory.mktemp(str(request.param))
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(home),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
        "HELM_PLUGINS": str(home / "data" / "plugins"),  # where helm 4 installs as well
        "HELM_BIN_UNDER_TEST": str(helm),
    }
    done = subprocess.run(
        [str(helm), "plugin", "install", str(ROOT / "helm-plugin")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return env


def helm_stunner(
    env: dict[str, str], *args: str, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [env["HELM_BIN_UNDER_TEST"], "stunner", *args],
        env={**env, **(extra or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_config_summary_hides_credentials(
    helm_env: dict[str, str], cluster: dict[str, str]
) -> None:
    done = helm_stunner(helm_env, "config", "--kubeconfig", cluster["kubeconfig"], "-n", NAMESPACE)
    assert done.returncode == 0, done.stderr
    assert "Gateway: stunner/local-gateway" in done.stdout
    assert "Protocol: TURN-UDP" in done.stdout and "Protocol: TURN-TCP" in done.stdout
    assert "Routes: [stunner/echo-route]" in done.stdout
    assert PASSWORD not in done.stdout and SHARED_SECRET not in done.stdout
    shown = helm_stunner(
        helm_env,
        "config",
        "stunner/local-gateway",
        "-o",
        "json",
        "--show-secrets",
        "--kubeconfig",
        cluster["kubeconfig"],
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["auth"]["credentials"]["password"] == PASSWORD


def test_config_yaml_and_namespace_from_helm(
    helm_env: dict[str, str], cluster: dict[str, str]
) -> None:
    done = helm_stunner(
        helm_env,
        "config",
        "media",
        "-o",
        "yaml",
        extra={"KUBECONFIG": cluster["kubeconfig"], "HELM_NAMESPACE": NAMESPACE},
    )
    assert done.returncode == 0, done.stderr
    (config,) = list(yaml.safe_load_all(done.stdout))
    assert config["admin"]["name"] == "media/ephemeral-gateway"
    assert SHARED_SECRET not in done.stdout
    # helm passes its own namespace (default): the CDS is found by its label all the same
    found = helm_stunner(
        helm_env, "config", extra={"KUBECONFIG": cluster["kubeconfig"], "HELM_NAMESPACE": "default"}
    )
    assert found.returncode == 0 and "Gateway: media/ephemeral-gateway" in found.stdout


def test_no_stunner_installed_is_a_clear_error(helm_env: dict[str, str], tmp_path: Path) -> None:
    with FakeApiServer() as empty:
        kubeconfig = str(empty.write_kubeconfig(tmp_path / "config"))
        done = helm_stunner(helm_env, "ice", "--kubeconfig", kubeconfig)
    assert done.returncode == 1
    assert "no config discovery service" in done.stderr and "helm install" in done.stderr


def test_ice_mints_ephemeral_credentials(helm_env: dict[str, str], cluster: dict[str, str]) -> None:
    done = helm_stunner(
        helm_env,
        "ice",
        "media/ephemeral-gateway",
        "--ttl",
        "600",
        "--username",
        "alice",
        "--kubeconfig",
        cluster["kubeconfig"],
        "-n",
        NAMESPACE,
    )
    assert done.returncode == 0, done.stderr
    (server,) = json.loads(done.stdout)["iceServers"]
    expiry, _, user = server["username"].partition(":")
    assert user == "alice" and 590 <= int(expiry) - time.time() <= 610
    mac = hmac.new(SHARED_SECRET.encode(), server["username"].encode(), hashlib.sha1).digest()
    assert server["credential"] == base64.b64encode(mac).decode()
    assert server["urls"] == [
        "turn:192.0.2.10:3478?transport=udp",
        "turn:192.0.2.10:3478?transport=tcp",
    ]

    # stunner/local-gateway has no public address: the cluster has no Service for it yet.
    pending = helm_stunner(
        helm_env,
        "ice",
        "stunner/local-gateway",
        "--kubeconfig",
        cluster["kubeconfig"],
        "-n",
        NAMESPACE,
    )
    assert pending.returncode == 1 and pending.stdout == "", pending.stdout
    assert (
        "stunner/local-gateway: listener udp-listener has no public address: "
        "no Service exposes it yet"
    ) in pending.stderr


def test_status_one_line_per_pod(helm_env: dict[str, str], cluster: dict[str, str]) -> None:
    done = helm_stunner(helm_env, "status", "--kubeconfig", cluster["kubeconfig"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "stunner/local-gateway-abc: stunner/local-gateway: allocs:3/status=READY listeners: []"
    ]


def test_check_reports_file_line_and_field(helm_env: dict[str, str], tmp_path: Path) -> None:
    clean = helm_stunner(helm_env, "check", "-f", str(ROOT / "examples" / "cluster"))
    assert clean.returncode == 0 and clean.stdout == "", clean.stderr
    bad = tmp_path / "bad.yaml"
    text = (ROOT / "examples" / "cluster" / "stunner.yaml").read_text()
    bad.write_text(
        text.replace(
            "port: 3478\n      protocol: TURN-TCP", "port: 70000\n      protocol: TURN-TCP"
        )
    )
    done = helm_stunner(helm_env, "check", "-f", str(bad))
    assert done.returncode == 1
    line = next(n for n, t in enumerate(bad.read_text().splitlines(), 1) if "70000" in t)
    assert f"{bad}:{line}: spec.listeners[1].port: Error:" in done.stdout
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: Gateway\nmetadata: {name: x\n")
    done = helm_stunner(helm_env, "check", "-f", str(broken))
    assert done.returncode == 1 and f"{broken}:" in done.stderr


def test_render_prints_the_reconcilers_configs(helm_env: dict[str, str]) -> None:
    local = str(ROOT / "examples" / "local")
    done = helm_stunner(helm_env, "render", "-f", local, "--configs-only", "-o", "json")
    assert done.returncode == 0, done.stderr
    config = json.loads(done.stdout)
    assert config["admin"]["name"] == "stunner/local-gateway"
    assert config["auth"]["credentials"]["password"] != PASSWORD  # hidden
    # By default the Service and Deployment the reconciler would write come with the config.
    done = helm_stunner(helm_env, "render", "-f", local, "-o", "json")
    assert done.returncode == 0, done.stderr
    kinds = [doc.get("kind") for doc in json.loads(done.stdout)]
    assert "Service" in kinds and "Deployment" in kinds


def test_usage_errors_exit_2_and_every_command_has_help(helm_env: dict[str, str]) -> None:
    assert helm_stunner(helm_env, "config", "a/b/c").returncode == 2
    assert helm_stunner(helm_env, "frobnicate").returncode == 2
    for command in ("config", "status", "ice", "render", "check", "diff", "explain"):
        done = helm_stunner(helm_env, command, "--help")
        assert done.returncode == 0 and f"stunner {command}" in done.stdout


def test_missing_distribution_says_how_to_install(helm_env: dict[str, str]) -> None:
    done = helm_stunner(helm_env, "config", extra={"PATH": "/usr/bin:/bin"})
    assert done.returncode != 0
    assert "not installed" in done.stderr and "pip install" in done.stderr


def test_no_cluster_is_a_clear_error(helm_env: dict[str, str], tmp_path: Path) -> None:
    done = helm_stunner(helm_env, "config", "--kubeconfig", str(tmp_path / "absent"))
    assert done.returncode == 1
    assert "no usable Kubernetes configuration" in done.stderr
    assert "Traceback" not in done.stderr


def edited_example(tmp_path: Path, name: str, old: str, new: str) -> Path:
    """A copy of examples/local with one file edited."""
    target = tmp_path / "manifests"
    target.mkdir(parents=True)
    for path in (ROOT / "examples" / "local").glob("*.yaml"):
        text = path.read_text()
        (target / path.name).write_text(text.replace(old, new) if path.name == name else text)
    assert (target / name).read_text() != (ROOT / "examples" / "local" / name).read_text()
    return target


def test_diff_says_in_place_or_restarted_and_what_a_restart_drops(
    helm_env: dict[str, str], cluster: dict[str, str], tmp_path: Path
) -> None:
    kube = ["--kubeconfig", cluster["kubeconfig"], "-n", NAMESPACE]
    same = helm_stunner(helm_env, "diff", "-f", str(ROOT / "examples" / "local"), *kube)
    assert same.returncode == 0, same.stderr
    assert "stunner/local-gateway: unchanged" in same.stdout.splitlines()
    assert "media/ephemeral-gateway: deleted (its stunnerd pods drain)" in same.stdout

    port = "port: 3478\n      protocol: TURN-UDP"
    moved = edited_example(tmp_path / "a", "gateway.yaml", port, port.replace("3478", "3479"))
    done = helm_stunner(helm_env, "diff", "-f", str(moved), "stunner/local-gateway", *kube)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "stunner/local-gateway:",
        "  stunner/local-gateway/tcp-listener: unchanged",
        "  stunner/local-gateway/udp-listener: restarted",
        "  cost: 1 listener(s) restarted or removed; up to 3 live allocations dropped on 1 "
        "stunnerd pod(s) (/status counts allocations per pod, not per listener)",
    ]

    peer = edited_example(tmp_path / "b", "echo.yaml", "127.0.0.1/32", "127.0.0.2/32")
    done = helm_stunner(helm_env, "diff", "-f", str(peer), "stunner", *kube)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "stunner/local-gateway:",
        "  stunner/local-gateway/tcp-listener: reconciled in place",
        "  stunner/local-gateway/udp-listener: reconciled in place",
    ]


def test_config_watch_prints_each_change(helm_env: dict[str, str], cluster: dict[str, Any]) -> None:
    store, background = cluster["store"], cluster["background"]
    original = store.configs["stunner/local-gateway"]
    with subprocess.Popen(
        [helm_env["HELM_BIN_UNDER_TEST"], "stunner", "config", "stunner/local-gateway", "-w"]
        + ["--kubeconfig", cluster["kubeconfig"], "-n", NAMESPACE],
        env=helm_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as watch:
        try:
            _watch_sees_a_change(watch, store, background, original)
        finally:
            watch.terminate()
            watch.wait(10)
            background.loop.call_soon_threadsafe(store.set, "stunner/local-gateway", original)


def _watch_sees_a_change(
    watch: subprocess.Popen[str], store: ConfigStore, background: Background, original: Any
) -> None:
    assert watch.stdout is not None
    first = [watch.stdout.readline() for _ in range(2)]
    assert first[0].startswith("Gateway: stunner/local-gateway")
    data = original.to_dict()
    data["admin"]["loglevel"] = "all:DEBUG"
    changed = validate_config(data)
    background.loop.call_soon_threadsafe(store.set, "stunner/local-gateway", changed)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = watch.stdout.readline()
        if line.startswith("Gateway: stunner/local-gateway"):
            assert '"all:DEBUG"' in line
            break
    else:
        raise AssertionError("no update printed")


def test_kube_context_chooses_the_cluster(
    helm_env: dict[str, str], cluster: dict[str, str], tmp_path: Path
) -> None:
    """A kubeconfig with two contexts, the current one a cluster without STUNner: helm's
    --kube-context (before or after the plugin's name) and HELM_KUBECONTEXT reach the other."""
    with FakeApiServer() as empty:
        other = json.loads(empty.write_kubeconfig(tmp_path / "empty").read_text())
        ours = json.loads(Path(cluster["kubeconfig"]).read_text())
        merged: dict[str, Any] = {"apiVersion": "v1", "kind": "Config"}
        for key, renamed in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            merged[key] = []
            for name, config in (("no-stunner", other), ("with-stunner", ours)):
                (entry,) = config[key]
                entry = {**entry, "name": name}
                if key == "contexts":
                    entry[renamed] = {**entry[renamed], "cluster": name, "user": name}
                merged[key].append(entry)
        merged["current-context"] = "no-stunner"
        kubeconfig = tmp_path / "two-contexts"
        kubeconfig.write_text(json.dumps(merged))
        env = {**helm_env, "KUBECONFIG": str(kubeconfig), "HELM_NAMESPACE": NAMESPACE}
        helm = env["HELM_BIN_UNDER_TEST"]

        def run(*args: str, extra: dict[str, str] | None = None) -> str:
            done = subprocess.run(
                [helm, *args],
                env={**env, **(extra or {})},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            return f"{done.returncode}\n{done.stdout}{done.stderr}"

        current = run("stunner", "config")
        assert current.startswith("1\n") and "no config discovery service" in current
        for args, extra in (
            (("--kube-context", "with-stunner", "stunner", "config"), None),
            (("stunner", "config", "--kube-context", "with-stunner"), None),
            (("stunner", "config"), {"HELM_KUBECONTEXT": "with-stunner"}),
        ):
            out = run(*args, extra=extra)
            assert out.startswith("0\n") and "Gateway: stunner/local-gateway" in out, (args, out)
        wrong = run("stunner", "config", "--kube-context", "nowhere")
        assert wrong.startswith("1\n") and "nowhere" in wrong and "Traceback" not in wrong


def plugin_home(tmp_path: Path, helm: Path, path: str) -> dict[str, str]:
    home = tmp_path / "home"
    return {
        "PATH": path,
        "HOME": str(home),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
        "HELM_PLUGINS": str(home / "data" / "plugins"),
        "HELM_BIN_UNDER_TEST": str(helm),
    }


def install_plugin(env: dict[str, str], source: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [env["HELM_BIN_UNDER_TEST"], "plugin", "install", str(source)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("helm_name", sorted(HELMS))
def test_plugin_install_uses_a_stunner_command_on_path(helm_name: str, tmp_path: Path) -> None:
    env = plugin_home(tmp_path, helm_binary(helm_name), f"{Path(sys.executable).parent}:/usr/bin")
    done = install_plugin(env, ROOT / "helm-plugin")
    assert done.returncode == 0, done.stderr
    assert f"helm stunner: runs {Path(sys.executable).parent}/stunner" in done.stdout


@pytest.mark.parametrize("helm_name", sorted(HELMS))
def test_plugin_install_installs_the_cli_into_its_own_venv(helm_name: str, tmp_path: Path) -> None:
    """A fresh clone, no `stunner` on PATH: the install hook makes helm-plugin/venv and runs pip
    on the clone. Offline here, pip cannot fetch the build backend: the hook says so and how to
    retry, and the plugin says how to install. Once the venv holds the command (as pip puts it
    there, and as a manual run with PyPI does), the plugin runs it with nothing on PATH."""
    clone = tmp_path / "clone"
    shutil.copytree(
        ROOT / "helm-plugin", clone / "helm-plugin", ignore=shutil.ignore_patterns("venv")
    )
    shutil.copy(ROOT / "pyproject.toml", clone)
    env = plugin_home(tmp_path, helm_binary(helm_name), "/usr/bin:/bin")
    env["PIP_NO_INDEX"] = "1"  # no network in tests
    done = install_plugin(env, clone / "helm-plugin")
    assert done.returncode == 1
    assert f"installing the stunner command from {clone}" in done.stdout
    assert "could not install the stunner command" in done.stderr
    assert f"pip install '{clone}[cli]'" in done.stderr
    assert (clone / "helm-plugin" / "venv" / "bin" / "pip").exists()  # the venv was made
    missing = helm_stunner(env, "render", "-f", str(ROOT / "examples" / "local"))
    assert missing.returncode == 1 and "pip install" in missing.stderr
    # what a successful pip run leaves: the command in the plugin's venv
    (clone / "helm-plugin" / "venv" / "bin" / "stunner").symlink_to(
        Path(sys.executable).parent / "stunner"
    )
    local = str(ROOT / "examples" / "local")
    done = helm_stunner(env, "render", "-f", local, "--configs-only", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["admin"]["name"] == "stunner/local-gateway"
