"""The webhook as an operator runs it, and clients that misbehave: shared by the serving tests
and ``bench/webhook_hostile_bench.py``.

- :func:`make_certs`: a CA and a serving certificate for 127.0.0.1, made here;
  :func:`tls_secret`: a kubernetes.io/tls Secret with an RSA-2048 key, for a TURN-TLS listener.
- :class:`Webhook`: ``gunicorn -c webhook/gunicorn.conf.py 'webhook:create_app()'`` over TLS on
  an ephemeral loopback port, KUBECONFIG pointing at a fake API server; its log is kept.
- :class:`Hostile`: idle connections (connect, send nothing) and trickling ones (a TLS
  ClientHello, HTTP header lines after a finished handshake, or a request body after its head,
  one byte at a time), kept open until the server closes them.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support.objects import secret
from tests.support.pki import Authority, key_pem, self_signed
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def make_certs(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a serving certificate for 127.0.0.1/localhost; returns (ca, cert, key)."""
    ca = Authority.new("test webhook CA")
    cert, key = ca.issue("stunner-webhook", server=True)
    paths = directory / "ca.crt", directory / "tls.crt", directory / "tls.key"
    for path, pem in zip(paths, (ca.pem, cert, key), strict=True):
        path.write_bytes(pem)
    return paths


def tls_secret(name: str, namespace: str) -> dict[str, Any]:
    """A kubernetes.io/tls Secret with a self-signed RSA-2048 certificate (cert-manager's
    default key) for a TURN-TLS listener."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = {"tls.crt": self_signed(key), "tls.key": key_pem(key)}
    return secret(name, "kubernetes.io/tls", namespace, **pem)


class Webhook:
    """gunicorn serving the webhook over TLS; ``start()`` returns once /healthz answers."""

    def __init__(
        self,
        directory: Path,
        kubeconfig: Path,
        env: dict[str, str] | None = None,
        args: Sequence[str] = (),
        workers: int = 2,
    ) -> None:
        self.directory = directory
        self.ca, self.cert, self.key = make_certs(directory)
        self.port = free_port()
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "STUNNER_WEBHOOK_BIND": f"127.0.0.1:{self.port}",
            "STUNNER_WEBHOOK_CERTFILE": str(self.cert),
            "STUNNER_WEBHOOK_KEYFILE": str(self.key),
            "STUNNER_WEBHOOK_WORKERS": str(workers),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            **(env or {}),
        }
        self.env.pop("KUBERNETES_SERVICE_HOST", None)
        self.args = list(args)
        self.log_path = directory / "gunicorn.log"
        self.context = ssl.create_default_context(cafile=str(self.ca))
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        conf = str(ROOT / "webhook" / "gunicorn.conf.py")
        return [sys.executable, "-m", "gunicorn", "-c", conf, *self.args, "webhook:create_app()"]

    def spawn(self) -> subprocess.Popen[bytes]:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command(), cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        return self.proc

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def start(self, within: float = 20) -> Webhook:
        proc = self.spawn()
        deadline = time.monotonic() + within
        while True:
            assert proc.poll() is None, self.log()
            try:
                if self.request("GET", "/healthz", timeout=1)[0] == 200:
                    return self
            except (OSError, http.client.HTTPException):
                pass
            assert time.monotonic() < deadline, self.log()
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Webhook:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def connection(self, timeout: float = 10) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            "127.0.0.1", self.port, context=self.context, timeout=timeout
        )

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 10,
    ) -> tuple[int, Any]:
        """One request on a new connection: (status, parsed JSON body or the raw text)."""
        conn = self.connection(timeout)
        try:
            default = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, body=body, headers={**default, **(headers or {})})
            resp = conn.getresponse()
            data = resp.read()
            try:
                return resp.status, json.loads(data)
            except ValueError:
                return resp.status, data.decode(errors="replace")
        finally:
            conn.close()

    def review(self, path: str, body: dict[str, Any], timeout: float = 10) -> dict[str, Any]:
        status, out = self.request("POST", path, json.dumps(body).encode(), timeout=timeout)
        assert status == 200, out
        assert out["response"]["uid"] == body["request"]["uid"]
        response: dict[str, Any] = out["response"]
        return response


def client_hello(server_name: str = "localhost") -> bytes:
    """The bytes of a real TLS ClientHello (what a trickling client sends a byte at a time)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    context = ssl.create_default_context()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


REQUEST_HEAD = (
    b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 2\r\nX-Padding: " + b"x" * 200 + b"\r\n\r\n{}"
)
SLOW_BODY_HEAD = (
    b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100000\r\n\r\n"
)

# What a hostile connection does: (TLS handshake first?, bytes sent at once, bytes trickled).
KINDS: dict[str, tuple[bool, bytes, bytes]] = {
    "idle": (False, b"", b""),
    "hello": (False, b"", b""),  # the ClientHello, filled in by Hostile
    "head": (True, b"", REQUEST_HEAD),
    "body": (True, SLOW_BODY_HEAD, b" " * 100000),
}


class Hostile:
    """Connections that hold what they can: ``idle`` ones send nothing, trickling ones send a
    byte every ``interval`` seconds, of a TLS ClientHello (``hello``), of an HTTP request head
    after the handshake (``head``), or of a request body after its head (``body``). A thread
    keeps them going until :meth:`close`; :attr:`closed` records, per connection, its kind and
    how long after opening the server closed it; with ``reopen`` each closed one is replaced, so
    that the server always faces the same number."""

    def __init__(
        self, port: int, context: ssl.SSLContext, interval: float = 0.2, reopen: bool = False
    ) -> None:
        self.port = port
        self.context = context
        self.interval = interval
        self.reopen = reopen
        self.closed: list[tuple[str, float]] = []  # (kind, seconds after opening)
        self.opened = 0
        self._hello = client_hello()
        self._conns: dict[socket.socket, tuple[float, str, int]] = {}  # sock: (t0, kind, sent)
        self._reopen: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def open(self, idle: int = 0, hello: int = 0, head: int = 0, body: int = 0) -> Hostile:
        for kind, count in (("idle", idle), ("hello", hello), ("head", head), ("body", body)):
            for _ in range(count):
                self._open(kind)
        if not self._thread.is_alive():
            self._thread.start()
        return self

    def _trickled(self, kind: str) -> bytes:
        return self._hello if kind == "hello" else KINDS[kind][2]

    def _open(self, kind: str) -> None:
        started = time.monotonic()
        tls, at_once, _ = KINDS[kind]
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        if tls:
            sock = self.context.wrap_socket(sock, server_hostname="127.0.0.1")
        sock.sendall(at_once)
        sock.setblocking(False)
        with self._lock:
            self._conns[sock] = (started, kind, 0)
            self.opened += 1

    def closed_after(self, *kinds: str) -> list[float]:
        """Seconds from open to close of the closed connections of ``kinds`` (all), sorted."""
        return sorted(t for kind, t in self.closed if not kinds or kind in kinds)

    @property
    def open_count(self) -> int:
        with self._lock:
            return len(self._conns)

    def _closed(self, sock: socket.socket) -> None:
        started, kind, _ = self._conns.pop(sock)
        self.closed.append((kind, time.monotonic() - started))
        sock.close()
        if self.reopen:
            self._reopen.append(kind)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                for sock in list(self._conns):
                    self._tick(sock)
                again, self._reopen = self._reopen, []
            for kind in again:
                try:
                    self._open(kind)
                except OSError:
                    self._reopen.append(kind)  # next round
            self._stop.wait(self.interval)

    def _tick(self, sock: socket.socket) -> None:
        started, kind, sent = self._conns[sock]
        try:
            # A server that closed us: EOF (or an alert, then EOF) on read, or a reset.
            chunk = sock.recv(4096)
            if not chunk or not isinstance(sock, ssl.SSLSocket):
                self._closed(sock)
                return
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass
        except OSError:
            self._closed(sock)
            return
        data = self._trickled(kind)
        if sent < len(data):
            try:
                sock.send(data[sent : sent + 1])
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except OSError:
                self._closed(sock)
                return
            self._conns[sock] = (started, kind, sent + 1)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        with self._lock:
            for sock in self._conns:
                sock.close()
            self._conns.clear()
