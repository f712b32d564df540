"""The reconciler's door to the API server, and its ONLY importer of `kubernetes`: the client
configured the usual way (`load_client`), JSON requests over its transport (`Api`), the REST
path of a row of the vocabulary's kinds table (`resource_path`), and an API error in one line
(`describe`).

Every create, update and patch names the reconciler as the field manager. The informers
(`.informer`), the writer (`.writer`) and the Lease elector (`.lease`) talk through `Api`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import kubernetes.client
import kubernetes.config
import kubernetes.watch

from stunner_api.vocabulary import EVENT, WRITTEN_KINDS, KindInfo, api_version, group_of, version_of

from ..apply import Verb, Write
from ..store import Watched

# The client's untyped parts, typed as Any once here.
_config: Any = kubernetes.config
ApiException: Any = kubernetes.client.exceptions.ApiException
Watch: Any = kubernetes.watch.Watch

REQUEST_TIMEOUT = 30.0  # seconds for a single non-watch request
# Every create, update and patch names us, so managedFields credit the reconciler (not the
# client's user agent) with the fields it set, and others' fields stay theirs.
FIELD_MANAGER = "stunner-reconciler"
FIELD_MANAGED_METHODS = frozenset({"POST", "PUT", "PATCH"})

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"  # the CDS's token checks
WRITTEN: Mapping[tuple[str, str], KindInfo] = {(k.group, k.kind): k for k in WRITTEN_KINDS}


def resource_path(info: KindInfo, version: str, namespace: str = "", name: str = "") -> str:
    """The REST path of a kind's collection (or of one object, given its name)."""
    base = f"/apis/{info.group}/{version}" if info.group else f"/api/{version}"
    if info.namespaced and namespace:
        base += f"/namespaces/{namespace}"
    base += f"/{info.plural}"
    return f"{base}/{name}" if name else base


# --- the client ---------------------------------------------------------------------------------


class ConfigUnavailable(Exception):
    """No way to reach an API server is configured."""


def load_client(kubeconfig: str | None = None) -> kubernetes.client.ApiClient:
    """An ApiClient configured the usual way: `kubeconfig` if given, else in-cluster, else
    KUBECONFIG or ~/.kube/config. ConfigUnavailable if none works."""
    configuration = kubernetes.client.Configuration()
    try:
        if kubeconfig:
            _config.load_kube_config(kubeconfig, client_configuration=configuration)
        else:
            try:
                _config.load_incluster_config(client_configuration=configuration)
            except _config.ConfigException:
                _config.load_kube_config(client_configuration=configuration)
    except (_config.ConfigException, OSError) as exc:
        raise ConfigUnavailable(
            f"no Kubernetes API configured (in-cluster, KUBECONFIG or ~/.kube/config): {exc}"
        ) from exc
    # One connection per watched kind, plus the writes and the Lease.
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, 32)
    return kubernetes.client.ApiClient(configuration)


class Api:
    """JSON requests over the official client's transport (auth, TLS, proxies as configured)."""

    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        self.client = client

    def close(self) -> None:
        client: Any = self.client
        client.close()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Sequence[tuple[str, Any]] = (),
        content_type: str = "application/json",
        stream: bool = False,
        timeout: float | None = REQUEST_TIMEOUT,
        field_manager: bool = True,
    ) -> Any:
        """The decoded JSON answer, or the raw response when `stream`; ApiException if the
        answer is not 2xx. A create, update or patch carries `fieldManager=FIELD_MANAGER`."""
        if method in FIELD_MANAGED_METHODS and field_manager:
            query = [*query, ("fieldManager", FIELD_MANAGER)]
        headers = {"Accept": "application/json", "Content-Type": content_type}
        serialized = self.client.param_serialize(
            method,
            path,
            query_params=list(query),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response: Any = self.client.call_api(*serialized, _request_timeout=timeout)
        if not 200 <= response.status <= 299:
            response.read()
            self.client.response_deserialize(response, {})  # raises ApiException
        if stream:
            return response.response
        response.read()
        return json.loads(response.data or b"null")

    def list(self, watched: Watched, version: str) -> tuple[list[dict[str, Any]], str]:
        query = [("labelSelector", watched.label_selector)] if watched.label_selector else []
        answer = self.request("GET", resource_path(watched.info, version), query=query)
        items = []
        for item in answer.get("items") or []:
            # List items carry no apiVersion/kind; render needs them.
            item.setdefault("apiVersion", api_version(watched.info.group, version))
            item.setdefault("kind", watched.info.kind)
            items.append(item)
        return items, str((answer.get("metadata") or {}).get("resourceVersion") or "")

    def watch(
        self, watched: Watched, version: str, resource_version: str, timeout: int, watcher: Any
    ) -> Iterator[dict[str, Any]]:
        """The events of one watch request (the client's Watch helper); a 410 Gone raises
        ApiException(status=410)."""

        def open_stream(**kwargs: Any) -> Any:
            query: list[tuple[str, Any]] = [("watch", "true")]
            if kwargs.get("resource_version"):
                query.append(("resourceVersion", kwargs["resource_version"]))
            if kwargs.get("allow_watch_bookmarks"):
                query.append(("allowWatchBookmarks", "true"))
            if kwargs.get("timeout_seconds"):
                query.append(("timeoutSeconds", kwargs["timeout_seconds"]))
            if kwargs.get("label_selector"):
                query.append(("labelSelector", kwargs["label_selector"]))
            return self.request(
                "GET",
                resource_path(watched.info, version),
                query=query,
                stream=True,
                timeout=timeout + 10,
            )

        kwargs: dict[str, Any] = {
            "resource_version": resource_version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": timeout,
        }
        if watched.label_selector:
            kwargs["label_selector"] = watched.label_selector
        yield from watcher.stream(open_stream, **kwargs)

    # --- writes --------------------------------------------------------------------------------

    def write(self, write: Write) -> dict[str, Any] | None:
        """Send one write; the object as the API server stored it (None for a deletion)."""
        info = WRITTEN[group_of(write.api_version), write.kind]
        version = version_of(write.api_version)
        path = resource_path(info, version, write.namespace, write.name)
        if write.verb == Verb.CREATE:
            return dict(
                self.request("POST", resource_path(info, version, write.namespace), body=write.body)
            )
        if write.verb == Verb.UPDATE:
            return dict(self.request("PUT", path, body=write.body))
        if write.verb == Verb.STATUS:
            body = {"status": write.body}
            return dict(
                self.request(
                    "PATCH",
                    path + "/status",
                    body=body,
                    content_type="application/merge-patch+json",
                )
            )
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if write.uid:
            options["preconditions"] = {"uid": write.uid}  # type: ignore[assignment]
        self.request("DELETE", path, body=options)
        return None

    def review_token(self, token: str, audiences: Sequence[str]) -> dict[str, Any]:
        """The status of a TokenReview of `token` for `audiences` (authenticated, user,
        audiences, error). The token is in the request body only, never in an error."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": list(audiences)},
        }
        answer = self.request("POST", TOKEN_REVIEWS, body=body, field_manager=False)
        return dict(answer.get("status") or {})

    def create_event(self, body: Mapping[str, Any]) -> None:
        """Record an events.k8s.io/v1 Event (reconciler.events builds it)."""
        namespace = str(body["metadata"]["namespace"])
        self.request("POST", resource_path(EVENT, "v1", namespace), body=dict(body))

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any]:
        info = WRITTEN[group_of(api_version), kind]
        path = resource_path(info, version_of(api_version), namespace, name)
        return dict(self.request("GET", path))


def describe(exc: BaseException) -> str:
    """An API error in one line: code, reason and the server's message (never a body we sent)."""
    if isinstance(exc, ApiException):
        message = ""
        with contextlib.suppress(ValueError, TypeError):
            message = str(json.loads(exc.body or "{}").get("message") or "")
        return f"{exc.status} {exc.reason}: {message}" if message else f"{exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {exc}"


def refusal(exc: BaseException) -> tuple[int, str]:
    """An exception of a request as (HTTP status, 0 for no answer; `describe`'s line)."""
    code = int(exc.status or 0) if isinstance(exc, ApiException) else 0
    return code, describe(exc)
