"""A real Kubernetes control plane for tests: etcd and kube-apiserver on 127.0.0.1, started from
the binaries in ``$KUBEBUILDER_ASSETS`` (controller-runtime's envtest convention).

Everything is made here, in a temporary directory: a CA for clients and one for serving, the
API server's serving certificate, a service-account signing key, and a client certificate per
user (``admin`` is in ``system:masters``). Authorization is RBAC, so ``kubectl --as`` and
SubjectAccessReviews are answered by the real authorizer. Ports are ephemeral (a free one is
picked, and the start is retried if another process took it meanwhile).

There is no kubelet, scheduler or controller-manager (unless ``kube-controller-manager`` is in
the assets and asked for): pods never run; namespaces, RBAC, CRDs and admission do.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support.pki import Authority, key_pem
from tests.support.ports import free_port

ASSETS_VARIABLE = "KUBEBUILDER_ASSETS"
NO_ASSETS = f"{ASSETS_VARIABLE} unset: no real control plane (tests/envtest/README.md)"
CHANNEL_VARIABLE = "ENVTEST_GATEWAY_API_CHANNEL"  # standard (the default) or experimental
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
ADMIN_GROUPS = ("system:masters",)
# The serving certificate's names: loopback, and the kubernetes Service in-cluster clients use.
API_SERVER_NAMES = ("localhost", "kubernetes.default.svc", "127.0.0.1", "10.0.0.1")


def binary_versions(assets: Path) -> dict[str, str]:
    """The first line of `--version` of each binary in the assets folder."""
    out = {}
    for name in ("kube-apiserver", "etcd", "kube-controller-manager"):
        path = assets / name
        if not path.exists():
            continue
        try:
            text = subprocess.run(
                [str(path), "--version"], capture_output=True, text=True, timeout=20
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            text = f"? ({e})"
        out[name] = text.splitlines()[0] if text else "?"
    return out


class StartFailed(RuntimeError):
    """A binary exited or did not become ready; the message carries the end of its log."""


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Process:
    """One binary of the control plane, its output in a log file."""

    def __init__(self, name: str, argv: Sequence[str], log: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise StartFailed(f"{self.name} exited ({code}):\n{_tail(self.log)}")

    def stop(self, within: float = 15) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(within)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_until(what: str, ready: Any, processes: Sequence[Process], within: float) -> None:
    """Poll ready() until true; StartFailed when a process exits or the time is up."""
    deadline = time.monotonic() + within
    last: object = None
    while True:
        for process in processes:
            process.check_alive()
        try:
            if ready():
                return
        except (OSError, ValueError, urllib.error.URLError) as e:
            last = e
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name}:\n{_tail(p.log)}" for p in processes)
            raise StartFailed(f"{what} not ready within {within:.0f} s ({last}):\n{logs}")
        time.sleep(0.2)


class ControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager) from an assets directory."""

    def __init__(self, assets: Path, directory: Path, controller_manager: bool = False) -> None:
        self.assets = assets
        self.directory = directory
        self.want_controller_manager = controller_manager
        self.client_ca = Authority.new("envtest client CA")
        self.serving_ca = Authority.new("envtest serving CA")
        self.processes: list[Process] = []
        self.port = 0
        self.admin_kubeconfig = directory / "admin.kubeconfig"
        self.controller_manager_error = ""  # why the optional kube-controller-manager is not up

    # --- binaries --------------------------------------------------------------------------

    def binary(self, name: str) -> Path:
        path = self.assets / name
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise StartFailed(f"{path} is missing or not executable (see tests/envtest/README.md)")
        return path

    # --- start and stop --------------------------------------------------------------------

    def _write(self, name: str, data: bytes) -> Path:
        path = self.directory / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    def start(self, within: float = 120) -> ControlPlane:
        for attempt in range(3):  # a port picked free may be taken before the binary binds it
            try:
                self._start_etcd(within)
                self._start_apiserver(within)
                break
            except StartFailed:
                self.stop()
                if attempt == 2:
                    raise
        self.admin_kubeconfig = self.kubeconfig("admin", ADMIN_GROUPS)
        if self.want_controller_manager and (self.assets / "kube-controller-manager").exists():
            try:
                self._start_controller_manager()
            except StartFailed as e:  # optional: the tests that need it say so
                self.controller_manager_error = str(e)
                self.processes = [p for p in self.processes if p.name != "kube-controller-manager"]
        return self

    def _start_etcd(self, within: float) -> None:
        client, peer = free_port(), free_port()
        data = self.directory / f"etcd-{client}"
        self.etcd_url = f"http://127.0.0.1:{client}"
        etcd = Process(
            "etcd",
            [
                str(self.binary("etcd")),
                "--name=envtest",
                f"--data-dir={data}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=envtest=http://127.0.0.1:{peer}",
                "--logger=zap",
                "--log-level=warn",
            ],
            self.directory / "etcd.log",
        )
        etcd.start()
        self.processes.append(etcd)

        def healthy() -> bool:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as resp:
                return bool(json.loads(resp.read()).get("health") == "true")

        wait_until("etcd", healthy, [etcd], within)

    def _start_apiserver(self, within: float) -> None:
        self.port = free_port()
        serving_cert, serving_key = self.serving_ca.issue(
            "kube-apiserver", server=True, names=API_SERVER_NAMES
        )
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        files = {
            "client-ca.crt": self.client_ca.pem,
            "serving-ca.crt": self.serving_ca.pem,
            "apiserver.crt": serving_cert,
            "apiserver.key": serving_key,
            "sa.key": key_pem(sa_key),
        }
        paths = {name: self._write(name, data) for name, data in files.items()}
        apiserver = Process(
            "kube-apiserver",
            [
                str(self.binary("kube-apiserver")),
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--cert-dir={self.directory}",
                f"--tls-cert-file={paths['apiserver.crt']}",
                f"--tls-private-key-file={paths['apiserver.key']}",
                f"--client-ca-file={paths['client-ca.crt']}",
                "--authorization-mode=RBAC",
                f"--service-account-issuer=https://127.0.0.1:{self.port}",
                f"--service-account-key-file={paths['sa.key']}",
                f"--service-account-signing-key-file={paths['sa.key']}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                # No controller creates the default ServiceAccount of a namespace here.
                "--disable-admission-plugins=ServiceAccount",
                "--allow-privileged=true",
                # A webhook or APIService behind a Service is called at an endpoint (a pod),
                # never at the ClusterIP: with no kubelet there is none, and the call fails at
                # once instead of leaving loopback for an address of the service network.
                "--enable-aggregator-routing=true",
            ],
            self.directory / "kube-apiserver.log",
        )
        apiserver.start()
        self.processes.append(apiserver)
        context = self.ssl_context("admin", ADMIN_GROUPS)

        def ready() -> bool:
            url = f"{self.url}/readyz"
            try:
                with urllib.request.urlopen(url, timeout=3, context=context) as resp:
                    return bool(resp.status == 200)
            except urllib.error.HTTPError as e:  # 500 while starting: close its socket
                e.close()
                return False

        wait_until("kube-apiserver", ready, self.processes, within)

    def _start_controller_manager(self) -> None:
        # Its own user, in system:masters: a test cluster need not mirror kubeadm's RBAC split.
        kubeconfig = self.kubeconfig("system:kube-controller-manager", ADMIN_GROUPS)
        manager = Process(
            "kube-controller-manager",
            [
                str(self.binary("kube-controller-manager")),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--leader-elect=false",
                f"--service-account-private-key-file={self.directory / 'sa.key'}",
            ],
            self.directory / "kube-controller-manager.log",
        )
        manager.start()
        self.processes.append(manager)
        time.sleep(1)
        manager.check_alive()

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- clients ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _credentials(self, user: str, groups: Iterable[str]) -> tuple[Path, Path]:
        safe = user.replace(":", "_").replace("/", "_")
        cert, key = self.client_ca.issue(user, groups)
        return self._write(f"user-{safe}.crt", cert), self._write(f"user-{safe}.key", key)

    def ssl_context(self, user: str, groups: Iterable[str]) -> ssl.SSLContext:
        cert, key = self._credentials(user, groups)
        context = ssl.create_default_context(cadata=self.serving_ca.pem.decode())
        context.load_cert_chain(str(cert), str(key))
        return context

    def kubeconfig(self, user: str, groups: Iterable[str], namespace: str = "default") -> Path:
        """A kubeconfig authenticating as `user` (groups: the certificate's O entries)."""
        cert, key = self._credentials(user, groups)
        credentials = {
            "client-certificate-data": base64.b64encode(cert.read_bytes()).decode(),
            "client-key-data": base64.b64encode(key.read_bytes()).decode(),
        }
        safe = user.replace(":", "_").replace("/", "_")
        return self._kubeconfig(f"{safe}.kubeconfig", user, credentials, namespace)

    def token_kubeconfig(self, name: str, token: str) -> Path:
        """A kubeconfig authenticating with a bearer token (a ServiceAccount's, say)."""
        return self._kubeconfig(f"token-{name}.kubeconfig", name, {"token": token}, "default")

    def _kubeconfig(
        self, filename: str, user: str, credentials: dict[str, str], namespace: str
    ) -> Path:
        ca = base64.b64encode(self.serving_ca.pem).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "envtest",
                    "cluster": {"server": self.url, "certificate-authority-data": ca},
                }
            ],
            "users": [{"name": user, "user": credentials}],
            "contexts": [
                {
                    "name": "envtest",
                    "context": {"cluster": "envtest", "user": user, "namespace": namespace},
                }
            ],
            "current-context": "envtest",
        }
        return self._write(filename, yaml.safe_dump(config).encode())

    def kubectl(
        self,
        *args: str,
        stdin: str | None = None,
        kubeconfig: Path | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl (from PATH) against this control plane, as admin by default."""
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            raise StartFailed("kubectl is not on PATH")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig or self.admin_kubeconfig)}
        return subprocess.run(
            [kubectl, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )

    def install_crds(self, files: Iterable[Path], within: float = 60) -> None:
        """Apply CRD files and wait until every CRD is Established."""
        for path in files:
            # Server-side: Gateway API's CRDs are too large for client-side apply's annotation.
            result = self.kubectl("apply", "--server-side", "-f", str(path))
            assert result.returncode == 0, f"{path}: {result.stderr}"
        result = self.kubectl(
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            f"--timeout={within:.0f}s",
            timeout=within + 30,
        )
        assert result.returncode == 0, result.stderr

    def apply(self, *docs: dict[str, Any], args: Sequence[str] = ()) -> None:
        """kubectl apply as admin; AssertionError with kubectl's output when it fails."""
        result = self.kubectl("apply", *args, "-f", "-", stdin=yaml.safe_dump_all(docs))
        assert result.returncode == 0, result.stderr + result.stdout
