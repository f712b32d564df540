"""gunicorn settings for the STUNner admission webhook.

Run: ``gunicorn -c webhook/gunicorn.conf.py 'webhook:create_app()'``

Environment:

- ``STUNNER_WEBHOOK_BIND``: listen address (default ``0.0.0.0:9443``).
- ``STUNNER_WEBHOOK_CERTFILE`` / ``STUNNER_WEBHOOK_KEYFILE``: the serving certificate and key
  (default ``/etc/webhook/certs/tls.crt`` and ``tls.key``, a mounted ``kubernetes.io/tls``
  Secret).
- ``STUNNER_WEBHOOK_WORKERS``: worker processes (default 2).
"""

import os

bind = os.environ.get("STUNNER_WEBHOOK_BIND", "0.0.0.0:9443")
certfile = os.environ.get("STUNNER_WEBHOOK_CERTFILE", "/etc/webhook/certs/tls.crt")
keyfile = os.environ.get("STUNNER_WEBHOOK_KEYFILE", "/etc/webhook/certs/tls.key")
workers = int(os.environ.get("STUNNER_WEBHOOK_WORKERS", "2"))
worker_class = "sync"
# The kube-apiserver gives up on a webhook after 10 s (the default timeoutSeconds); a worker
# stuck longer than this is restarted. Lookups themselves time out after 2 s.
timeout = 15
graceful_timeout = 5
keepalive = 5
accesslog = "-"
errorlog = "-"
loglevel = os.environ.get("STUNNER_WEBHOOK_LOG_LEVEL", "info")
