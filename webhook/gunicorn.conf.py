"""gunicorn settings for the STUNner admission webhook.

Run: ``gunicorn -c webhook/gunicorn.conf.py 'webhook:create_app()'``

Environment:

- ``STUNNER_WEBHOOK_BIND``: listen address (default ``0.0.0.0:9443``).
- ``STUNNER_WEBHOOK_CERTFILE`` / ``STUNNER_WEBHOOK_KEYFILE``: the serving certificate and key
  (default ``/etc/webhook/certs/tls.crt`` and ``tls.key``, a mounted ``kubernetes.io/tls``
  Secret).
- ``STUNNER_WEBHOOK_WORKERS``: worker processes (default 2).
- ``STUNNER_WEBHOOK_LOG_LEVEL``: gunicorn's log level (default ``info``).

Command-line flags override these (``--keep-alive 1`` etc.).

This file must not import ``kubernetes`` or ``urllib3``: it runs in the gunicorn master, before
the gevent workers monkey-patch ``ssl`` (see :mod:`webhook.serving`).
"""

import os
import sys
from typing import Any

bind = os.environ.get("STUNNER_WEBHOOK_BIND", "0.0.0.0:9443")
certfile = os.environ.get("STUNNER_WEBHOOK_CERTFILE", "/etc/webhook/certs/tls.crt")
keyfile = os.environ.get("STUNNER_WEBHOOK_KEYFILE", "/etc/webhook/certs/tls.key")
workers = int(os.environ.get("STUNNER_WEBHOOK_WORKERS", "2"))
# gevent: a connection costs a greenlet from a pool of worker_connections, not a worker, so idle
# or trickling clients cannot starve the kube-apiserver's reviews (webhook/serving.py says more).
worker_class = "webhook.serving.DeadlineWorker"
worker_connections = 1000
# keepalive: a client has this long to finish the TLS handshake and to send each request's head;
# an idle kept-alive connection is closed after it too.
keepalive = 5
# timeout: a request must be read and answered within it, or its connection is closed (the
# kube-apiserver gives up on a webhook after timeoutSeconds, 10 s by default, 30 s at most);
# also the worker heartbeat. Lookups themselves time out after 2 s.
timeout = 15
graceful_timeout = 5
accesslog = "-"
errorlog = "-"
loglevel = os.environ.get("STUNNER_WEBHOOK_LOG_LEVEL", "info")

# A read-only root file system must work:
# - gunicorn >= 25.1 opens a control socket under $XDG_RUNTIME_DIR or $HOME/.gunicorn: off;
control_socket_disable = True
# - the worker heartbeat file goes to a tmpfs where there is one, not to $TMPDIR.
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None


def on_starting(server: Any) -> None:
    """A malformed STUNNER_* setting stops gunicorn before it binds, in one log line (the
    application factory checks again, for other servers)."""
    from webhook import settings_from_env  # flask and our rules only, no kubernetes

    try:
        settings_from_env()
    except ValueError as e:
        server.log.error("cannot start the STUNner admission webhook: %s", e)
        sys.exit(1)
