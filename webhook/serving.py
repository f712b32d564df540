"""The gunicorn worker class of the webhook: gevent, with deadlines on what a client sends.

``worker_class = "webhook.serving.DeadlineWorker"`` (set in ``webhook/gunicorn.conf.py``).

Why gevent: a sync worker (or a gthread pool thread) does the TLS handshake and reads the request
head itself, so a handful of connections that send nothing, or trickle bytes, hold every worker
and no AdmissionReview is answered. gunicorn's gevent worker gives each connection a greenlet
from a pool of ``worker_connections`` (1000 by default), independent of the number of workers;
an idle connection costs a few KiB, not a worker. What gevent alone does not bound is how long a
connection may hold its greenlet, so this worker adds three deadlines:

- the TLS handshake must finish within ``keepalive`` seconds of the accept;
- the head of every request (request line and headers) must arrive within ``keepalive`` seconds
  (gunicorn's async workers already put ``timeout_ctx`` around each header read);
- a request (body read and answer) must be done within ``timeout`` seconds, or its connection is
  closed: the kube-apiserver has given up by then anyway (its webhook timeout is at most 30 s).

A client that breaks one is disconnected, so a pool slot is held for seconds at most.

The kubernetes client used inside a request works unchanged: the worker monkey-patches the
standard library (sockets, ssl, threading) before the application is loaded, so the client's
HTTPS calls to the API server yield to other connections instead of blocking the worker. Nothing
imported by ``webhook/gunicorn.conf.py`` or this module may import ``kubernetes`` or ``urllib3``
in the gunicorn master (they would bind the unpatched ``ssl`` classes).
"""

from __future__ import annotations

import ssl
from functools import partial
from typing import Any

import gevent
from gevent.server import StreamServer
from gunicorn.workers.ggevent import GeventWorker

__all__ = ["DeadlineWorker"]

# The handshake deadline when keepalive is 0 (gunicorn then reads request heads without one).
HANDSHAKE_SECONDS = 5.0


class _DeadlineServer(StreamServer):  # type: ignore[misc]  # gevent is not annotated
    """A StreamServer that bounds the TLS handshake and hands the connection to the worker."""

    def __init__(
        self,
        listener: Any,
        *,
        worker: DeadlineWorker,
        spawn: Any,
        application: Any = None,  # the keywords gunicorn passes to its server_class
        log: Any = None,
        handler_class: Any = None,
        environ: Any = None,
        **ssl_args: Any,
    ) -> None:
        super().__init__(listener, spawn=spawn, **ssl_args)
        self._worker = worker
        self._listener = listener
        if worker.cfg.workers > 1:
            self.max_accept = 1  # as gunicorn does: spread connections over the workers

    def wrap_socket_and_handle(self, client_socket: Any, address: Any) -> Any:
        ssl_socket = self.wrap_socket(client_socket, do_handshake_on_connect=False, **self.ssl_args)
        try:
            try:
                with gevent.Timeout(self._worker.cfg.keepalive or HANDSHAKE_SECONDS):
                    ssl_socket.do_handshake()
            except (gevent.Timeout, OSError, ssl.SSLError) as e:
                self._worker.log.debug("TLS handshake from %s failed: %s", address, e)
                return None
            return self.handle(ssl_socket, address)
        finally:
            ssl_socket.close()

    def handle(self, client: Any, address: Any) -> None:
        self._worker.handle(self._listener, client, address)


class DeadlineWorker(GeventWorker):  # type: ignore[misc]  # gunicorn is not annotated
    """gunicorn's gevent worker with a handshake deadline and a per-request deadline."""

    def init_process(self) -> None:
        # GeventWorker.run() builds one server_class(listener, spawn=pool, ...) per listener.
        self.server_class = partial(_DeadlineServer, worker=self)
        if not self.cfg.keepalive:
            self.log.warning("keepalive is 0: request heads are read without a deadline")
        super().init_process()

    def timeout_ctx(self) -> Any:
        """Around each read of a request head: disconnect after ``keepalive`` seconds."""
        return gevent.Timeout(self.cfg.keepalive, False)

    def handle_request(self, listener_name: Any, req: Any, sock: Any, addr: Any) -> Any:
        """Serve one request; close the connection if it is not done in ``timeout`` seconds."""
        timeout = gevent.Timeout(self.cfg.timeout or None)  # timeout 0: no deadline
        timeout.start()
        try:
            return super().handle_request(listener_name, req, sock, addr)
        except gevent.Timeout as e:
            if e is not timeout:
                raise
            self.log.warning("request from %s not done within %ss: closed", addr, self.cfg.timeout)
            raise StopIteration from None  # AsyncWorker.handle: close the connection
        finally:
            timeout.close()
