# One image for STUNner: stunnerd, the reconciler (stunner-reconciler), the admission webhook
# (gunicorn 'webhook:create_app()') and the operator CLI (stunner). charts/stunner runs it.
#
#   docker build -t localhost/stunner:0.1.0 .
#   kind load docker-image localhost/stunner:0.1.0     # or: minikube image load ...
#
# Two stages: the builder compiles the native pieces (C extensions: ours and the wheels that
# need building) into a virtualenv at /opt/stunner; the runtime image gets only that virtualenv,
# no compiler, and runs as an unprivileged user on a read-only root file system.

ARG PYTHON=python:3.11-slim-bookworm

FROM ${PYTHON} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/stunner
WORKDIR /src
# setup.py* : the C extension's build (when present); one COPY so that a glob matching nothing
# is not an error.
COPY pyproject.toml README.md setup.py* ./
COPY stunner_api/ stunner_api/
COPY stunnerd/ stunnerd/
COPY reconciler/ reconciler/
COPY webhook/ webhook/
COPY stunner_cli/ stunner_cli/
# Not editable: the packages (and webhook/gunicorn.conf.py, which the chart names by path)
# land in /opt/stunner/lib/python3.11/site-packages.
RUN /opt/stunner/bin/pip install --no-cache-dir --no-compile ".[reconciler,webhook,cli]" \
    && if [ -d stunnerd/relaycore ]; then /opt/stunner/bin/python -c "import stunnerd._relay"; fi \
    && /opt/stunner/bin/python -m compileall -q /opt/stunner/lib

FROM ${PYTHON}
COPY --from=build /opt/stunner /opt/stunner
ENV PATH=/opt/stunner/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A numeric user, so that Kubernetes' runAsNonRoot can check it without /etc/passwd.
USER 10001:10001
WORKDIR /tmp
# TURN (3478 UDP/TCP), stunnerd's health check (8086) and metrics (8080), the CDS (13478), the
# auth service (8088), the webhook (9443).
EXPOSE 3478/udp 3478/tcp 8086 8080 13478 8088 9443
ENTRYPOINT []
CMD ["stunnerd", "--help"]
