"""The Kubernetes side of the webhook: a :class:`stunner_api.rules.Lookup` over the official
``kubernetes`` client.

The client configuration is found the usual way, on first use: in-cluster (the service account),
else ``KUBECONFIG`` / ``~/.kube/config``; tests pass an explicit ``ApiClient`` instead. Reads use
a short timeout and no retries, so that an unreachable API server turns into a prompt
:class:`LookupFailed` well within the kube-apiserver's webhook timeout (10 s by default).
"""

from __future__ import annotations

import ipaddress
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kubernetes.client
import kubernetes.config

from stunner_api.rules import LookupFailed

GATEWAY_GROUP = "gateway.networking.k8s.io"
GATEWAY_VERSION = "v1"

DEFAULT_TIMEOUT = 2.0

# The client is only partly annotated: go through Any where it is not.
_config: Any = kubernetes.config
_ApiException: Any = kubernetes.client.exceptions.ApiException


def load_api_client() -> kubernetes.client.ApiClient:
    """An ApiClient configured in-cluster, else from KUBECONFIG or ~/.kube/config."""
    configuration = kubernetes.client.Configuration()
    try:
        _config.load_incluster_config(client_configuration=configuration)
    except _config.ConfigException:
        _config.load_kube_config(client_configuration=configuration)
    configuration.retries = False  # fail fast: the caller is waiting on an admission answer
    return kubernetes.client.ApiClient(configuration)


class KubeLookup:
    """Reads Secrets and GatewayClasses; 404 -> None, any other failure -> LookupFailed."""

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self._api_client = api_client
        self._timeout = timeout
        self._lock = threading.Lock()

    def _client(self, what: str) -> kubernetes.client.ApiClient:
        with self._lock:
            if self._api_client is None:
                try:
                    self._api_client = load_api_client()
                except Exception as e:  # ConfigException, OSError, YAML errors
                    raise LookupFailed(
                        f"cannot read {what} from the Kubernetes API: "
                        f"no usable client configuration: {e}"
                    ) from e
            return self._api_client

    def _get(self, what: str, call: Any, *args: str) -> dict[str, Any] | None:
        api_client = self._client(what)
        try:
            response = call(api_client)(
                *args, _request_timeout=self._timeout, _preload_content=False
            )
            try:
                body = json.loads(response.data)
            finally:
                response.release_conn()
        except _ApiException as e:
            if e.status == 404:
                return None
            raise LookupFailed(
                f"cannot read {what} from the Kubernetes API: HTTP {e.status} {e.reason}"
            ) from e
        except Exception as e:  # urllib3 timeouts and connection errors, bad JSON
            raise LookupFailed(f"cannot read {what} from the Kubernetes API: {e}") from e
        if not isinstance(body, dict):
            raise LookupFailed(f"cannot read {what} from the Kubernetes API: not a JSON object")
        return body

    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(
            f"Secret {namespace}/{name}",
            lambda c: kubernetes.client.CoreV1Api(c).read_namespaced_secret,
            name,
            namespace,
        )

    def gateway_class(self, name: str) -> dict[str, Any] | None:
        return self._get(
            f"GatewayClass {name}",
            lambda c: kubernetes.client.CustomObjectsApi(c).get_cluster_custom_object,
            GATEWAY_GROUP,
            GATEWAY_VERSION,
            "gatewayclasses",
            name,
        )

    def close(self) -> None:
        with self._lock:
            if self._api_client is not None:
                api_client: Any = self._api_client
                api_client.close()
                self._api_client = None


# --- the cluster's pod and service networks (read once, at start) -----------------------------


@dataclass(frozen=True)
class ClusterNetworks:
    """What the API offers about the pod and service networks, and why a part is missing."""

    pod_cidrs: tuple[str, ...]
    service_cidrs: tuple[str, ...]
    problems: tuple[str, ...]  # one line per list that could not be read


def _list_items(call: Any, *args: str, timeout: float) -> list[dict[str, Any]]:
    response = call(*args, _request_timeout=timeout, _preload_content=False)
    try:
        body = json.loads(response.data)
    finally:
        response.release_conn()
    items = body.get("items") if isinstance(body, dict) else None
    return [item for item in items or () if isinstance(item, dict)]


def discover_cluster_networks(
    api_client: kubernetes.client.ApiClient | None = None, timeout: float = DEFAULT_TIMEOUT
) -> ClusterNetworks:
    """The service CIDRs (networking.k8s.io/v1 ServiceCIDR ``spec.cidrs``, Kubernetes >= 1.33)
    and the pod CIDRs (every Node's ``spec.podCIDRs``, set where the cluster allocates node
    CIDRs). Never raises: what cannot be read is empty, with the reason in ``problems``."""
    try:
        client: Any = api_client or load_api_client()
    except Exception as e:  # ConfigException, OSError, YAML errors
        reason = f"no usable Kubernetes client configuration: {e}"
        return ClusterNetworks((), (), (f"ServiceCIDRs: {reason}", f"Nodes: {reason}"))
    try:
        problems: list[str] = []
        service = _discover(
            "ServiceCIDRs",
            lambda: _list_items(
                kubernetes.client.CustomObjectsApi(client).list_cluster_custom_object,
                "networking.k8s.io",
                "v1",
                "servicecidrs",
                timeout=timeout,
            ),
            "cidrs",
            problems,
        )
        pod = _discover(
            "Nodes' spec.podCIDRs",
            lambda: _list_items(kubernetes.client.CoreV1Api(client).list_node, timeout=timeout),
            "podCIDRs",
            problems,
        )
        return ClusterNetworks(pod, service, tuple(problems))
    finally:
        if api_client is None:
            client.close()


def _discover(
    what: str, items: Callable[[], list[dict[str, Any]]], key: str, problems: list[str]
) -> tuple[str, ...]:
    """The CIDRs under ``spec.<key>`` of every listed object, each once, in order."""
    try:
        listed = items()
    except Exception as e:  # ApiException (403; 404 before Kubernetes 1.33), timeouts, bad JSON
        why = f"HTTP {e.status} {e.reason}" if isinstance(e, _ApiException) else str(e) or repr(e)
        problems.append(f"{what}: cannot list: {why}")
        return ()
    out: list[str] = []
    for item in listed:
        spec = item.get("spec")
        values = spec.get(key) if isinstance(spec, dict) else None
        for value in values if isinstance(values, list) else ():
            try:
                network = str(ipaddress.ip_network(str(value), strict=False))
            except ValueError:
                problems.append(f"{what}: ignored {value!r}, not a CIDR")
                continue
            if network not in out:
                out.append(network)
    return tuple(out)
