# STUNner's two images, from one build of the project's wheel:
#
#   docker build -t localhost/stunner:0.1.0 .                      # the control plane (default)
#   docker build --target dataplane -t localhost/stunnerd:0.1.0 .  # the dataplane: stunnerd
#
# The control-plane image carries the reconciler (stunner-reconciler), the admission webhook
# (gunicorn 'webhook:create_app()'), the operator CLI and auth service (stunner) and stunnerd; the
# dataplane image carries stunnerd and what it imports, nothing else (no Flask, gunicorn, gevent
# or Kubernetes client), as Go STUNner ships stunnerd apart from its operator. charts/stunner runs
# both. The builder compiles the native pieces (our C relay extension, the kernel offload program
# with clang's BPF target, and the wheels that need building); the runtime images get only a
# virtualenv at /opt/stunner, with no compiler, no pip, stripped shared objects, and run as an
# unprivileged user on a read-only root file system.
#
# Every build stage ends with `hack/image_venv.py check`, run from / so that nothing but the venv
# can be imported: each command the image has must load, with gunicorn's worker class and the C
# relay extension. tests/image/test_image_deps.py builds the same venvs with the same script and
# starts every process the chart runs from them.

ARG PYTHON=python:3.11-slim-bookworm

FROM ${PYTHON} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libssl-dev binutils clang \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# setup.py* : the C extension's build (when present); one COPY so that a glob matching nothing
# is not an error.
COPY pyproject.toml README.md setup.py* ./
COPY stunner_api/ stunner_api/
COPY stunner_http/ stunner_http/
COPY stunner_client/ stunner_client/
COPY stunnerd/ stunnerd/
COPY reconciler/ reconciler/
COPY webhook/ webhook/
COPY stunner_cli/ stunner_cli/
COPY hack/image_venv.py /usr/local/lib/image_venv.py
# The project's wheel, with the C relay extension compiled in; both images install it.
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && rm -rf build

# A runtime virtualenv: the wheel with the given extras, then no pip or setuptools, stripped
# shared objects, bytecode compiled once here (the root file system is read-only at run time).
FROM build AS venv-controlplane
WORKDIR /
RUN python -m venv /opt/stunner \
    && /opt/stunner/bin/pip install --no-cache-dir --no-compile \
        "$(ls /wheels/stunner-*.whl)[reconciler,webhook,cli]" \
    && /opt/stunner/bin/python -m pip uninstall --yes --quiet pip setuptools \
    && find /opt/stunner -name '*.so' -exec strip --strip-unneeded {} + \
    && /opt/stunner/bin/python -m compileall -q /opt/stunner/lib \
    && /opt/stunner/bin/python /usr/local/lib/image_venv.py check --native

FROM build AS venv-dataplane
WORKDIR /
RUN python -m venv /opt/stunner \
    && /opt/stunner/bin/pip install --no-cache-dir --no-compile "$(ls /wheels/stunner-*.whl)" \
    && /opt/stunner/bin/python -m pip uninstall --yes --quiet pip setuptools \
    && /opt/stunner/bin/python /usr/local/lib/image_venv.py prune-dataplane \
    && find /opt/stunner -name '*.so' -exec strip --strip-unneeded {} + \
    && /opt/stunner/bin/python -m compileall -q /opt/stunner/lib \
    && /opt/stunner/bin/python /usr/local/lib/image_venv.py check --native

FROM ${PYTHON} AS runtime
ENV PATH=/opt/stunner/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A numeric user, so that Kubernetes' runAsNonRoot can check it without /etc/passwd.
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT []

# The dataplane: TURN (3478 UDP/TCP), stunnerd's health check (8086) and metrics (8080).
FROM runtime AS dataplane
COPY --from=venv-dataplane /opt/stunner /opt/stunner
EXPOSE 3478/udp 3478/tcp 8086 8080
CMD ["stunnerd", "--help"]

# The control plane (the default target): the CDS (13478), the auth service (8088), the
# webhook (9443), the reconciler's health (8081) and metrics (8080), and stunnerd's ports.
FROM runtime AS controlplane
COPY --from=venv-controlplane /opt/stunner /opt/stunner
EXPOSE 3478/udp 3478/tcp 8086 8080 8081 13478 8088 9443
CMD ["stunnerd", "--help"]
