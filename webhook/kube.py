"""The Kubernetes side of the webhook: a :class:`stunner_api.rules.Lookup` over the official
``kubernetes`` client.

The client configuration is found the usual way, on first use: in-cluster (the service account),
else ``KUBECONFIG`` / ``~/.kube/config``; tests pass an explicit ``ApiClient`` instead. Reads use
a short timeout and no retries, so that an unreachable API server turns into a prompt
:class:`LookupFailed` well within the kube-apiserver's webhook timeout (10 s by default).
"""

from __future__ import annotations

import json
import threading
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
