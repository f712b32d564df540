"""The CLI's one door to the Kubernetes API server: the only module of stunner_cli that imports
`kubernetes` (or reconciler.kube, whose `Api` lists the kinds the reconciler watches). The rest
of the CLI (cluster.py, diff.py) asks a `Kube` and gets plain values or a `ClusterError` whose
message says what to do.

Everything goes through the API server (the service proxy to the CDS, the pod proxy to
stunnerd's /status), never to a pod IP."""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from typing import Any

import kubernetes.client
import kubernetes.config

from reconciler.kube.api import Api, ConfigUnavailable, describe, load_client
from reconciler.store import WATCHED

TIMEOUT = 10.0
IN_CLUSTER = "KUBERNETES_SERVICE_HOST"  # set by the kubelet in every pod


class ClusterError(Exception):
    """The cluster, the CDS or a pod could not be reached; the message says what to do."""


class Kube:
    """One API server connection (a kubeconfig's context)."""

    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        self.client = client
        self.core = kubernetes.client.CoreV1Api(client)

    @classmethod
    def connect(cls, kubeconfig: str | None, context: str | None) -> Kube:
        """The kubeconfig's context; in a pod with neither given nor a kubeconfig at hand, the
        pod's ServiceAccount (the chart's hooks run the CLI so)."""
        try:
            client: kubernetes.client.ApiClient = kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context
            )
        except Exception as e:  # ConfigException, OSError, YAML errors
            if kubeconfig is None and context is None and os.environ.get(IN_CLUSTER):
                try:
                    return cls(load_client())
                except ConfigUnavailable as unavailable:
                    raise ClusterError(str(unavailable)) from None
            raise ClusterError(
                f"no usable Kubernetes configuration ({e}); pass --kubeconfig or set KUBECONFIG"
            ) from None
        return cls(client)

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]

    def service_account_token(
        self, account: str, namespace: str, audience: str, seconds: int
    ) -> str | None:
        """A fresh token of `audience` for ServiceAccount namespace/account (TokenRequest);
        None when the account does not exist."""
        request = kubernetes.client.AuthenticationV1TokenRequest(
            spec=kubernetes.client.V1TokenRequestSpec(
                audiences=[audience], expiration_seconds=seconds
            )
        )
        try:
            answer = self.core.create_namespaced_service_account_token(
                account, namespace, request, _request_timeout=TIMEOUT
            )
        except kubernetes.client.exceptions.ApiException as e:
            if e.status == 404:
                return None
            if e.status == 403:
                raise ClusterError(
                    f"reading configs needs a token of ServiceAccount {namespace}/{account} "
                    "and RBAC refuses you `create serviceaccounts/token` on it: ask for it, or "
                    "read a Gateway's config as its dataplane does"
                ) from None
            raise ClusterError(
                f"minting a token for {namespace}/{account}: HTTP {e.status} {e.reason}"
            ) from None
        except Exception as e:
            raise ClusterError(f"cannot reach the Kubernetes API: {e}") from None
        token = answer.status.token if answer.status is not None else None
        return str(token) if token else None

    def service_namespaces(self, label_selector: str) -> list[str] | None:
        """The namespaces with a Service `label_selector` selects, sorted; None when Services
        cannot be listed cluster-wide (403)."""
        try:
            found = self.core.list_service_for_all_namespaces(
                label_selector=label_selector, _request_timeout=TIMEOUT
            )
        except kubernetes.client.exceptions.ApiException as e:
            if e.status == 403:
                return None
            raise ClusterError(f"listing Services: HTTP {e.status} {e.reason}") from None
        except Exception as e:
            raise ClusterError(f"cannot reach the Kubernetes API: {e}") from None
        items: list[Any] = found.items
        return sorted({str(item.metadata.namespace) for item in items})

    def service_proxy_get(
        self, namespace: str, service_port: str, path: str, what: str, headers: dict[str, str]
    ) -> Any:
        """GET `path` of Service `service_port` (`name:port`) through the API server's proxy,
        as JSON; `what` names it in a `ClusterError`."""
        return _proxy_get(
            self.core.connect_get_namespaced_service_proxy_with_path,
            what,
            service_port,
            namespace,
            path.lstrip("/"),
            _headers=headers or None,
        )

    def service_proxy_post(
        self,
        namespace: str,
        service_port: str,
        path: str,
        query: list[tuple[str, str]],
        what: str,
        headers: dict[str, str],
    ) -> Any:
        """POST to `path?query` of Service `service_port` through the API server's proxy (no
        body), its answer as JSON; `what` names it in a `ClusterError`."""
        serialized = self.client.param_serialize(
            method="POST",
            resource_path="/api/v1/namespaces/{namespace}/services/{name}/proxy/{path}",
            path_params={"namespace": namespace, "name": service_port, "path": path.lstrip("/")},
            query_params=query,
            header_params=dict(headers),
            auth_settings=["BearerToken"],
        )
        try:
            response: Any = self.client.call_api(*serialized, _request_timeout=TIMEOUT)
            response.read()
            body: bytes = response.data or b""
        except Exception as e:  # urllib3's MaxRetryError and friends
            raise ClusterError(f"{what}: cannot reach the Kubernetes API: {e}") from None
        if response.status >= 400:
            raise ClusterError(
                f"{what}: HTTP {response.status} {response.reason}: {_message(body)}"
            )
        try:
            return json.loads(body)
        except ValueError as e:
            raise ClusterError(f"{what}: {e}") from None

    def pod_proxy_get(self, namespace: str, pod_port: str, path: str) -> Any:
        """GET `path` of pod `pod_port` (`name:port`) through the API server's proxy, as JSON."""
        name = pod_port.partition(":")[0]
        return _proxy_get(
            self.core.connect_get_namespaced_pod_proxy_with_path,
            f"pod {namespace}/{name}",
            pod_port,
            namespace,
            path.lstrip("/"),
        )

    def pods(
        self, label_selector: str, namespace: str = ""
    ) -> list[tuple[str, str, dict[str, Any]]]:
        """(namespace, name, spec) of each pod `label_selector` selects, in `namespace` or in
        all; the spec as the API serves it (camelCase keys)."""
        try:
            if namespace:
                pods = self.core.list_namespaced_pod(namespace, label_selector=label_selector)
            else:
                pods = self.core.list_pod_for_all_namespaces(label_selector=label_selector)
        except kubernetes.client.exceptions.ApiException as e:
            raise ClusterError(f"listing stunnerd pods: HTTP {e.status} {e.reason}") from None
        except Exception as e:
            raise ClusterError(
                f"listing stunnerd pods: cannot reach the Kubernetes API: {e}"
            ) from None
        out = []
        for pod in pods.items:
            metadata: Any = pod.metadata
            spec = self.client.sanitize_for_serialization(pod.spec)  # type: ignore[no-untyped-call]
            out.append(
                (
                    str(metadata.namespace),
                    str(metadata.name),
                    spec if isinstance(spec, dict) else {},
                )
            )
        return out

    def rendered_objects(self) -> list[dict[str, Any]]:
        """Every object of the kinds cluster mode watches and renders, as the API serves them
        now (each kind in the first of its versions the API serves)."""
        api = Api(self.client)
        out: list[dict[str, Any]] = []
        for watched in WATCHED:
            if not watched.rendered:
                continue
            for version in watched.versions:
                try:
                    items, _ = api.list(watched, version)
                except kubernetes.client.exceptions.ApiException as e:
                    if e.status == 404:
                        continue  # this version (or the CRD) is not served
                    raise ClusterError(
                        f"listing {watched.name}: HTTP {e.status} {e.reason}"
                    ) from None
                except Exception as e:
                    raise ClusterError(f"cannot reach the Kubernetes API: {e}") from None
                out.extend(items)
                break
        return out

    def objects_of(self, kinds: Collection[str]) -> dict[str, list[dict[str, Any]]]:
        """The live objects of each of `kinds` (Gateway, Service, Node...) that the reconciler
        watches, by kind; a `ClusterError` naming the listing that failed."""
        api = Api(self.client)
        live: dict[str, list[dict[str, Any]]] = {}
        for watched in WATCHED:
            if watched.info.kind in kinds:
                try:
                    live[watched.info.kind], _ = api.list(watched, watched.versions[0])
                except Exception as e:  # ApiException (403 and the like), urllib3 errors
                    raise ClusterError(f"listing {watched.name}: {describe(e)}") from None
        return live

    def dry_run_create(self, namespace: str, obj: dict[str, Any]) -> tuple[int, str]:
        """Ask the API server to create `obj` (a custom resource) in `namespace` as a dry run,
        through admission; (HTTP status, the message of a refusal). Status 0: the API server
        did not answer."""
        group, _, version = str(obj["apiVersion"]).partition("/")
        plural = str(obj["kind"]).lower() + "s"
        api = kubernetes.client.CustomObjectsApi(self.client)
        try:
            api.create_namespaced_custom_object(
                group, version, namespace, plural, obj, dry_run="All", _request_timeout=TIMEOUT
            )
        except kubernetes.client.exceptions.ApiException as e:
            return int(e.status or 0), _message(e.body) or str(e.reason)
        except Exception as e:  # urllib3's MaxRetryError and friends
            return 0, f"cannot reach the Kubernetes API: {e}"
        return 201, ""


def _proxy_get(call: Any, what: str, *args: Any, **kwargs: Any) -> Any:
    try:
        response = call(*args, _preload_content=False, _request_timeout=TIMEOUT, **kwargs)
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
