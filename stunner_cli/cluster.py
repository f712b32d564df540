"""The cluster side of `helm stunner`: everything goes through the Kubernetes API server (the
service proxy to the CDS, the pod proxy to stunnerd's /status), never to a pod IP, by the CLI's
one door to it, stunner_cli.kube.

The CDS serves configs only to ServiceAccount tokens of its audience (reconciler.cds.access).
The API server's service proxy strips `Authorization` (kubernetes/kubernetes#38775), so the CLI
mints a short-lived token (TokenRequest, `READER_TOKEN_SECONDS`) for the chart's reader account
(`READER_ACCOUNT` in the CDS's namespace) and sends it as `X-Stunner-Authorization`: whoever RBAC
lets `create serviceaccounts/token` on that account reads the configs through the CLI, nobody
else. The token is never printed."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stunner_api.cds import (
    CONFIGS_PATH,
    DEFAULT_PORT,
    NAMESPACE_PATH,
    NODES_PATH,
    config_id,
    config_path,
    split_id,
)
from stunner_api.dataplane import StunnerConfig, validate_config
from stunner_api.sessions import ALLOCATION_PARAM, DISCONNECT_PATH, SESSIONS_PATH, USER_PARAM
from stunner_api.vocabulary import (
    APP_LABEL,
    APP_VALUE,
    CDS_AUTH_HEADERS,
    CDS_SERVICE_LABEL,
    CDS_SERVICE_NAME,
    CDS_TOKEN_AUDIENCE,
    STATUS_PORT,
    SYSTEM_NAMESPACE,
)
from stunner_cli.kube import ClusterError, Kube

CDS_LABEL = f"{CDS_SERVICE_LABEL}=true"
READER_ACCOUNT = "stunner-config-reader"  # the chart's cdsAuth.readerServiceAccount
READER_TOKEN_SECONDS = 600  # the shortest a TokenRequest may ask for

__all__ = ["ClusterError", "Target", "cds_configs", "dataplane_status", "why_no_address"]


@dataclass(frozen=True)
class Target:
    """Where to look: the namespace STUNner runs in, and an optional Gateway `ns/name`."""

    namespace: str
    gateway_namespace: str = ""
    gateway: str = ""


def reader_token(kube: Kube, namespace: str) -> str | None:
    """A fresh token of the CDS's audience for the reader account in `namespace`; None when the
    account does not exist (a release whose CDS asks for none)."""
    return kube.service_account_token(
        READER_ACCOUNT, namespace, CDS_TOKEN_AUDIENCE, READER_TOKEN_SECONDS
    )


def cds_namespace(kube: Kube, namespace: str) -> str:
    """Where the CDS Service runs: `namespace` if it is there, else the one namespace that has
    one (found by its label); `namespace` when Services cannot be listed cluster-wide."""
    namespaces = kube.service_namespaces(CDS_LABEL)
    if namespaces is None or namespace in namespaces or len(namespaces) > 1:
        return namespace
    if not namespaces:
        raise ClusterError(
            f"no config discovery service (a Service labelled {CDS_LABEL}) in the cluster: "
            f"install STUNner with helm install stunner charts/stunner -n {SYSTEM_NAMESPACE}"
        )
    return namespaces[0]


def cds_configs(kube: Kube, target: Target) -> list[StunnerConfig]:
    """The running dataplane configs, from the CDS Service through the API server's proxy."""
    namespace = cds_namespace(kube, target.namespace)
    if target.gateway:
        path = config_path(target.gateway_namespace, target.gateway)
    elif target.gateway_namespace:
        path = NAMESPACE_PATH.format(namespace=target.gateway_namespace)
    else:
        path = CONFIGS_PATH
    token = reader_token(kube, namespace)
    headers = {CDS_AUTH_HEADERS[1]: f"Bearer {token}"} if token else {}
    body = kube.service_proxy_get(
        namespace,
        f"{CDS_SERVICE_NAME}:{DEFAULT_PORT}",
        path,
        f"the config discovery service {namespace}/{CDS_SERVICE_NAME}",
        headers,
    )
    items = body.get("items", []) if "items" in body else [body]
    return [validate_config(item) for item in items if isinstance(item, dict)]


BUSY = "HTTP 429"  # the CDS's answer past its sessions requests a second (per Gateway)
BUSY_RETRIES = 5
BUSY_WAIT = 0.6  # seconds: the CDS admits a few requests a second per Gateway


def _retried_when_busy(call: Callable[[], Any]) -> Any:
    """`call()`, asked again a few times while the CDS says it is busy (429)."""
    for _ in range(BUSY_RETRIES):
        try:
            return call()
        except ClusterError as e:
            if BUSY not in str(e):
                raise
            time.sleep(BUSY_WAIT)
    return call()


def _cds_call(kube: Kube, target: Target) -> tuple[str, dict[str, str]]:
    """The CDS's namespace, and the reader's token header."""
    namespace = cds_namespace(kube, target.namespace)
    token = reader_token(kube, namespace)
    return namespace, ({CDS_AUTH_HEADERS[1]: f"Bearer {token}"} if token else {})


def cds_sessions(kube: Kube, target: Target) -> list[dict[str, Any]]:
    """Every live allocation of the Gateway (of every Gateway the target names), from the
    CDS, which asks the pods on their config watches (stunner_api.sessions): one answer per
    Gateway, `{gateway, pods, silent, omitted, sessions}`."""
    ids = (
        [config_id(target.gateway_namespace, target.gateway)]
        if target.gateway
        else [c.admin.name for c in cds_configs(kube, target)]
    )
    namespace, headers = _cds_call(kube, target)
    answers = []
    for id in ids:
        gateway_namespace, name = split_id(id)
        path = SESSIONS_PATH.format(
            namespace=urllib.parse.quote(gateway_namespace, safe=""),
            name=urllib.parse.quote(name, safe=""),
        )
        answers.append(
            _retried_when_busy(
                lambda path=path: kube.service_proxy_get(  # type: ignore[misc]
                    namespace,
                    f"{CDS_SERVICE_NAME}:{DEFAULT_PORT}",
                    path,
                    f"the config discovery service {namespace}/{CDS_SERVICE_NAME}",
                    headers,
                )
            )
        )
    return answers


def cds_disconnect(
    kube: Kube, target: Target, users: list[str], allocations: list[str]
) -> dict[str, Any]:
    """End the allocations of `users` and `allocations` on every pod of the Gateway; what
    ended, as the CDS answers."""
    namespace, headers = _cds_call(kube, target)
    query = [(USER_PARAM, u) for u in users] + [(ALLOCATION_PARAM, a) for a in allocations]
    path = DISCONNECT_PATH.format(
        namespace=urllib.parse.quote(target.gateway_namespace, safe=""),
        name=urllib.parse.quote(target.gateway, safe=""),
    )
    answer: dict[str, Any] = _retried_when_busy(
        lambda: kube.service_proxy_post(
            namespace,
            f"{CDS_SERVICE_NAME}:{DEFAULT_PORT}",
            path,
            query,
            f"the config discovery service {namespace}/{CDS_SERVICE_NAME}",
            headers,
        )
    )
    return answer


def cds_node_local(kube: Kube, target: Target) -> dict[str, list[str]]:
    """Per config id, where clients reach a Gateway with a stunnerd on every node (relay address
    discovery): the public addresses of the Nodes it runs on, as the CDS serves them; none from
    a CDS that does not (an older reconciler)."""
    namespace = cds_namespace(kube, target.namespace)
    token = reader_token(kube, namespace)
    headers = {CDS_AUTH_HEADERS[1]: f"Bearer {token}"} if token else {}
    try:
        body = kube.service_proxy_get(
            namespace,
            f"{CDS_SERVICE_NAME}:{DEFAULT_PORT}",
            NODES_PATH,
            f"the config discovery service {namespace}/{CDS_SERVICE_NAME}",
            headers,
        )
    except ClusterError:
        return {}
    gateways = body.get("gateways")
    if not isinstance(gateways, dict):
        return {}
    return {
        str(id): [str(a) for a in found]
        for id, found in gateways.items()
        if isinstance(found, list)
    }


def status_port(pod_spec: dict[str, Any]) -> int:
    """The port a stunnerd pod serves /status on: where its readiness probe asks (the Gateway's
    health-check-port annotation moves it), else the default."""
    for container in pod_spec.get("containers") or []:
        probe = (container.get("readinessProbe") or {}).get("httpGet") or {}
        port = probe.get("port")
        if isinstance(port, int) and not isinstance(port, bool):
            return port
    return STATUS_PORT


def dataplane_status(kube: Kube, target: Target) -> list[dict[str, Any]]:
    """Each stunnerd pod's /status, through the API server's pod proxy, at its probes' port."""
    selector = f"{APP_LABEL}={APP_VALUE}"
    if target.gateway:
        selector += f",stunner.l7mp.io/related-gateway-name={target.gateway}"
    out = []
    for namespace, name, spec in kube.pods(selector, target.gateway_namespace):
        try:
            status = kube.pod_proxy_get(namespace, f"{name}:{status_port(spec)}", "status")
        except ClusterError as e:
            status = {"error": str(e)}
        out.append({"pod": f"{namespace}/{name}", "status": status})
    return out


def why_no_address(kube: Kube, gateway_id: str) -> dict[str, str]:
    """Why a Gateway's listeners have no public address, by listener name: the reconciler's
    own address finding (reconciler.render.addresses) run over the live Gateway, its Services
    and the Nodes. A listener the cluster does give an address is one the reconciler has not
    rendered yet. An empty answer when the Gateway cannot be read; {"": why} when the Services
    or Nodes cannot."""
    from reconciler.render import addresses
    from stunner_api.vocabulary import (
        LISTENER_PROTOCOLS,
        LISTENER_TRANSPORT,
        RELATED_GATEWAY_NAME,
    )

    namespace, _, name = gateway_id.partition("/")
    try:
        live = kube.objects_of(("Gateway", "Service", "Node"))
    except ClusterError as e:
        return {"": f"cannot tell why: {e}"}
    gateway = next(
        (
            g
            for g in live.get("Gateway", [])
            if (g.get("metadata") or {}).get("namespace") == namespace
            and (g.get("metadata") or {}).get("name") == name
        ),
        None,
    )
    if gateway is None:
        return {"": "the Gateway is not in the cluster"}
    services = [
        s
        for s in live.get("Service", [])
        if (s.get("metadata") or {}).get("namespace") == namespace
        and ((s.get("metadata") or {}).get("annotations") or {}).get(RELATED_GATEWAY_NAME)
        == gateway_id
    ]
    service = addresses.gateway_service(gateway, services)
    out: dict[str, str] = {}
    for listener in (gateway.get("spec") or {}).get("listeners") or []:
        protocol = LISTENER_PROTOCOLS.get(str(listener.get("protocol", "")).upper())
        port = listener.get("port")
        if protocol is None or not isinstance(port, int):
            continue
        found = addresses.public_address(
            gateway, service, live.get("Node", []), port, LISTENER_TRANSPORT[protocol]
        )
        out[str(listener.get("name"))] = (
            found.missing
            if not found
            else f"the cluster offers {found.address}:{found.port} ({found.source}) but the "
            "running config does not have it yet: is the reconciler running? (its log says)"
        )
    return out
