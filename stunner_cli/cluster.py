"""The cluster side of `helm stunner`: everything goes through the Kubernetes API server (the
service proxy to the CDS, the pod proxy to stunnerd's /status), never to a pod IP.

The CDS serves configs only to ServiceAccount tokens of its audience (reconciler.cds_access).
The API server's service proxy strips `Authorization` (kubernetes/kubernetes#38775), so the CLI
mints a short-lived token (TokenRequest, `READER_TOKEN_SECONDS`) for the chart's reader account
(`READER_ACCOUNT` in the CDS's namespace) and sends it as `X-Stunner-Authorization`: whoever RBAC
lets `create serviceaccounts/token` on that account reads the configs through the CLI, nobody
else. The token is never printed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import kubernetes.client
import kubernetes.config

from stunner_api.cds import CONFIGS_PATH, DEFAULT_PORT, NAMESPACE_PATH, config_path
from stunner_api.dataplane import StunnerConfig, validate_config
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

CDS_LABEL = f"{CDS_SERVICE_LABEL}=true"
READER_ACCOUNT = "stunner-config-reader"  # the chart's cdsAuth.readerServiceAccount
READER_TOKEN_SECONDS = 600  # the shortest a TokenRequest may ask for
TIMEOUT = 10.0


class ClusterError(Exception):
    """The cluster, the CDS or a pod could not be reached; the message says what to do."""


@dataclass(frozen=True)
class Target:
    """Where to look: the namespace STUNner runs in, and an optional Gateway `ns/name`."""

    namespace: str
    gateway_namespace: str = ""
    gateway: str = ""


def connect(kubeconfig: str | None, context: str | None) -> kubernetes.client.ApiClient:
    try:
        client: kubernetes.client.ApiClient = kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context
        )
        return client
    except Exception as e:  # ConfigException, OSError, YAML errors
        raise ClusterError(
            f"no usable Kubernetes configuration ({e}); pass --kubeconfig or set KUBECONFIG"
        ) from None


def reader_token(client: kubernetes.client.ApiClient, namespace: str) -> str | None:
    """A fresh token of the CDS's audience for the reader account in `namespace`; None when the
    account does not exist (a release whose CDS asks for none)."""
    core = kubernetes.client.CoreV1Api(client)
    request = kubernetes.client.AuthenticationV1TokenRequest(
        spec=kubernetes.client.V1TokenRequestSpec(
            audiences=[CDS_TOKEN_AUDIENCE], expiration_seconds=READER_TOKEN_SECONDS
        )
    )
    try:
        answer = core.create_namespaced_service_account_token(
            READER_ACCOUNT, namespace, request, _request_timeout=TIMEOUT
        )
    except kubernetes.client.exceptions.ApiException as e:
        if e.status == 404:
            return None
        if e.status == 403:
            raise ClusterError(
                f"reading configs needs a token of ServiceAccount {namespace}/{READER_ACCOUNT} "
                "and RBAC refuses you `create serviceaccounts/token` on it: ask for it, or read "
                "a Gateway's config as its dataplane does"
            ) from None
        raise ClusterError(
            f"minting a token for {namespace}/{READER_ACCOUNT}: HTTP {e.status} {e.reason}"
        ) from None
    except Exception as e:
        raise ClusterError(f"cannot reach the Kubernetes API: {e}") from None
    token = answer.status.token if answer.status is not None else None
    return str(token) if token else None


def _proxy_get(call: Any, what: str, *args: Any, headers: dict[str, str] | None = None) -> Any:
    try:
        response = call(*args, _preload_content=False, _request_timeout=TIMEOUT, _headers=headers)
        return json.loads(response.data)
    except kubernetes.client.exceptions.ApiException as e:
        raise ClusterError(f"{what}: HTTP {e.status} {e.reason}: {_message(e.body)}") from None
    except (OSError, ValueError) as e:
        raise ClusterError(f"{what}: {e}") from None
    except Exception as e:  # urllib3's MaxRetryError and friends
        raise ClusterError(f"{what}: cannot reach the Kubernetes API: {e}") from None


def _message(body: Any) -> str:
    try:
        return str(json.loads(body).get("message", body))
    except (TypeError, ValueError, AttributeError):
        return str(body or "")


def cds_namespace(client: kubernetes.client.ApiClient, namespace: str) -> str:
    """Where the CDS Service runs: `namespace` if it is there, else the one namespace that has
    one (found by its label); `namespace` when Services cannot be listed cluster-wide."""
    core = kubernetes.client.CoreV1Api(client)
    try:
        found = core.list_service_for_all_namespaces(
            label_selector=CDS_LABEL, _request_timeout=TIMEOUT
        )
    except kubernetes.client.exceptions.ApiException as e:
        if e.status == 403:
            return namespace
        raise ClusterError(f"listing Services: HTTP {e.status} {e.reason}") from None
    except Exception as e:
        raise ClusterError(f"cannot reach the Kubernetes API: {e}") from None
    items: list[Any] = found.items
    namespaces = sorted({str(item.metadata.namespace) for item in items})
    if namespace in namespaces or len(namespaces) > 1:
        return namespace
    if not namespaces:
        raise ClusterError(
            f"no config discovery service (a Service labelled {CDS_LABEL}) in the cluster: "
            f"install STUNner with helm install stunner charts/stunner -n {SYSTEM_NAMESPACE}"
        )
    return namespaces[0]


def cds_configs(client: kubernetes.client.ApiClient, target: Target) -> list[StunnerConfig]:
    """The running dataplane configs, from the CDS Service through the API server's proxy."""
    namespace = cds_namespace(client, target.namespace)
    if target.gateway:
        path = config_path(target.gateway_namespace, target.gateway)
    elif target.gateway_namespace:
        path = NAMESPACE_PATH.format(namespace=target.gateway_namespace)
    else:
        path = CONFIGS_PATH
    core = kubernetes.client.CoreV1Api(client)
    token = reader_token(client, namespace)
    headers = {CDS_AUTH_HEADERS[1]: f"Bearer {token}"} if token else None
    body = _proxy_get(
        core.connect_get_namespaced_service_proxy_with_path,
        f"the config discovery service {namespace}/{CDS_SERVICE_NAME}",
        f"{CDS_SERVICE_NAME}:{DEFAULT_PORT}",
        namespace,
        path.lstrip("/"),
        headers=headers,
    )
    items = body.get("items", []) if "items" in body else [body]
    return [validate_config(item) for item in items if isinstance(item, dict)]


def dataplane_status(client: kubernetes.client.ApiClient, target: Target) -> list[dict[str, Any]]:
    """Each stunnerd pod's /status, through the API server's pod proxy."""
    core = kubernetes.client.CoreV1Api(client)
    selector = f"{APP_LABEL}={APP_VALUE}"
    if target.gateway:
        selector += f",stunner.l7mp.io/related-gateway-name={target.gateway}"
    try:
        if target.gateway_namespace:
            pods = core.list_namespaced_pod(target.gateway_namespace, label_selector=selector)
        else:
            pods = core.list_pod_for_all_namespaces(label_selector=selector)
    except kubernetes.client.exceptions.ApiException as e:
        raise ClusterError(f"listing stunnerd pods: HTTP {e.status} {e.reason}") from None
    except Exception as e:
        raise ClusterError(f"listing stunnerd pods: cannot reach the Kubernetes API: {e}") from None
    out = []
    for pod in pods.items:
        metadata: Any = pod.metadata
        name, namespace = metadata.name, metadata.namespace
        try:
            status = _proxy_get(
                core.connect_get_namespaced_pod_proxy_with_path,
                f"pod {namespace}/{name}",
                f"{name}:{STATUS_PORT}",
                namespace,
                "status",
            )
        except ClusterError as e:
            status = {"error": str(e)}
        out.append({"pod": f"{namespace}/{name}", "status": status})
    return out


def why_no_address(client: kubernetes.client.ApiClient, gateway_id: str) -> dict[str, str]:
    """Why a Gateway's listeners have no public address, by listener name: the reconciler's
    own address finding (reconciler.render.addresses) run over the live Gateway, its Services
    and the Nodes. A listener the cluster does give an address is one the reconciler has not
    rendered yet. An empty answer when the Gateway cannot be read; {"": why} when the Services
    or Nodes cannot."""
    from reconciler.kube.api import Api, describe
    from reconciler.render import addresses
    from reconciler.store import WATCHED
    from stunner_api.vocabulary import (
        GATEWAY,
        LISTENER_PROTOCOLS,
        LISTENER_TRANSPORT,
        NODE,
        RELATED_GATEWAY_NAME,
        SERVICE,
    )

    namespace, _, name = gateway_id.partition("/")
    api = Api(client)
    live: dict[str, list[dict[str, Any]]] = {}
    for watched in WATCHED:
        if watched.info in (GATEWAY, SERVICE, NODE):
            try:
                live[watched.info.kind], _ = api.list(watched, watched.versions[0])
            except Exception as e:  # ApiException (403 and the like), urllib3 errors
                return {"": f"cannot tell why: listing {watched.name}: {describe(e)}"}
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
