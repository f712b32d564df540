"""The Kubernetes side of the webhook: a :class:`stunner_api.rules.Lookup` over the official
``kubernetes`` client, bound to the user of each AdmissionReview (:meth:`KubeLookup.for_user`),
so that a Secret in another namespace is read only when a ReferenceGrant permits the reference
or that user may read it (a SubjectAccessReview): the webhook never reads with its own rights
for a user who has none.

The client configuration is found the usual way, on first use: in-cluster (the service account),
else ``KUBECONFIG`` / ``~/.kube/config``; tests pass an explicit ``ApiClient`` instead. Reads use
a short timeout and no retries, so that an unreachable API server turns into a prompt
:class:`LookupFailed` well within the kube-apiserver's webhook timeout (10 s by default).

:func:`discover_cluster_networks` reads the pod and service CIDRs the API offers, once at start.
"""

from __future__ import annotations

import ipaddress
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kubernetes.client
import kubernetes.config

from stunner_api.rules import LookupFailed
from stunner_api.vocabulary import (
    DATAPLANE,
    GATEWAY,
    GATEWAY_CLASS,
    GATEWAY_CONFIG,
    NODE,
    REFERENCE_GRANT,
    SECRET,
    SERVICE_CIDR,
    KindInfo,
)

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


class _Connection:
    """The ApiClient, made on first use and shared by every per-user view."""

    def __init__(self, api_client: kubernetes.client.ApiClient | None, timeout: float) -> None:
        self.api_client = api_client
        self.timeout = timeout
        self.lock = threading.Lock()

    def client(self, what: str) -> kubernetes.client.ApiClient:
        with self.lock:
            if self.api_client is None:
                try:
                    self.api_client = load_api_client()
                except Exception as e:  # ConfigException, OSError, YAML errors
                    raise LookupFailed(
                        f"cannot read {what} from the Kubernetes API: "
                        f"no usable client configuration: {e}"
                    ) from e
            return self.api_client


class KubeLookup:
    """Reads Secrets, GatewayClasses and ReferenceGrants and asks SubjectAccessReviews;
    404 -> None (or []), any other failure -> LookupFailed. `user` is the userInfo of the
    AdmissionReview the answers are for (None: nobody, who may read no Secret)."""

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        user: Mapping[str, Any] | None = None,
        *,
        connection: _Connection | None = None,
    ) -> None:
        self._connection = connection or _Connection(api_client, timeout)
        self.user = user

    def for_user(self, user: Mapping[str, Any] | None) -> KubeLookup:
        """The same connection, answering for `user` (an AdmissionReview's userInfo)."""
        return KubeLookup(user=user, connection=self._connection)

    def _call(self, what: str, call: Any, *args: Any) -> dict[str, Any] | None:
        """The JSON object a call answers; 404 -> None, other failures -> LookupFailed."""
        api_client = self._connection.client(what)
        try:
            response = call(api_client)(
                *args, _request_timeout=self._connection.timeout, _preload_content=False
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
        return self._call(
            f"Secret {namespace}/{name}",
            lambda c: kubernetes.client.CoreV1Api(c).read_namespaced_secret,
            name,
            namespace,
        )

    def gateway_class(self, name: str) -> dict[str, Any] | None:
        return self._call(
            f"GatewayClass {name}",
            lambda c: kubernetes.client.CustomObjectsApi(c).get_cluster_custom_object,
            GATEWAY_CLASS.group,
            GATEWAY_CLASS.preferred_version,
            GATEWAY_CLASS.plural,
            name,
        )

    def gateway(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call(
            f"Gateway {namespace}/{name}",
            lambda c: kubernetes.client.CustomObjectsApi(c).get_namespaced_custom_object,
            GATEWAY.group,
            GATEWAY.preferred_version,
            namespace,
            GATEWAY.plural,
            name,
        )

    def gateways(self) -> list[dict[str, Any]]:
        """Every Gateway of the cluster; [] when the kind is not installed (404)."""
        body = self._call(
            "the Gateways",
            lambda c: kubernetes.client.CustomObjectsApi(c).list_cluster_custom_object,
            GATEWAY.group,
            GATEWAY.preferred_version,
            GATEWAY.plural,
        )
        items = (body or {}).get("items")
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []

    def gateway_config(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call(
            f"GatewayConfig {namespace}/{name}",
            lambda c: kubernetes.client.CustomObjectsApi(c).get_namespaced_custom_object,
            GATEWAY_CONFIG.group,
            GATEWAY_CONFIG.preferred_version,
            namespace,
            GATEWAY_CONFIG.plural,
            name,
        )

    def dataplane(self, name: str) -> dict[str, Any] | None:
        return self._call(
            f"Dataplane {name}",
            lambda c: kubernetes.client.CustomObjectsApi(c).get_cluster_custom_object,
            DATAPLANE.group,
            DATAPLANE.preferred_version,
            DATAPLANE.plural,
            name,
        )

    def reference_grants(self, namespace: str) -> list[dict[str, Any]]:
        """The ReferenceGrants of a namespace; [] when the kind is not installed (404)."""
        body = self._call(
            f"the ReferenceGrants of namespace {namespace}",
            lambda c: kubernetes.client.CustomObjectsApi(c).list_namespaced_custom_object,
            REFERENCE_GRANT.group,
            REFERENCE_GRANT.preferred_version,
            namespace,
            REFERENCE_GRANT.plural,
        )
        items = (body or {}).get("items")
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []

    def may_read_secret(self, namespace: str, name: str) -> bool:
        """Whether `user` may get the Secret, asked with a SubjectAccessReview."""
        user = self.user or {}
        if not user.get("username") and not user.get("groups"):
            return False
        spec: dict[str, Any] = {
            "resourceAttributes": {
                "namespace": namespace,
                "verb": "get",
                "group": SECRET.group,
                "version": SECRET.preferred_version,
                "resource": SECRET.plural,
                "name": name,
            }
        }
        for ours, theirs in (("user", "username"), ("uid", "uid"), ("groups", "groups")):
            if user.get(theirs):
                spec[ours] = user[theirs]
        if user.get("extra"):
            spec["extra"] = user["extra"]
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview"}
        body = self._call(
            f"a SubjectAccessReview of Secret {namespace}/{name}",
            lambda c: kubernetes.client.AuthorizationV1Api(c).create_subject_access_review,
            {**review, "spec": spec},
        )
        status = (body or {}).get("status")
        return isinstance(status, dict) and status.get("allowed") is True

    def close(self) -> None:
        connection = self._connection
        with connection.lock:
            if connection.api_client is not None:
                api_client: Any = connection.api_client
                api_client.close()
                connection.api_client = None


# --- the cluster's pod and service networks (read once, at start) -----------------------------


@dataclass(frozen=True)
class ClusterNetworks:
    """What the API offers about the pod and service networks, and why a part is missing."""

    pod_cidrs: tuple[str, ...]
    service_cidrs: tuple[str, ...]
    problems: tuple[str, ...]  # one line per list that could not be read
    # Why a list is empty, the missing fact ("" when it is not empty).
    pod_missing: str = ""
    service_missing: str = ""


def discover_cluster_networks(
    api_client: kubernetes.client.ApiClient | None = None, timeout: float = DEFAULT_TIMEOUT
) -> ClusterNetworks:
    """The service CIDRs (every ServiceCIDR's ``spec.cidrs``, networking.k8s.io/v1, served
    since Kubernetes 1.33) and the pod CIDRs (every Node's ``spec.podCIDRs``, set where the
    cluster allocates node CIDRs). Never raises: what cannot be read is left empty, with the
    reason in ``problems``, and why each empty list is empty in ``pod_missing`` and
    ``service_missing``.

    Where Nodes carry no pod CIDR (EKS and AKS CNIs, Calico IPAM, a cluster that allocates none)
    no other API says what the pod network is: the CNI allocates from its own pools (VPC
    subnets, IPPools), the controller manager's ``--cluster-cidr`` is unset then or hidden (managed
    control planes), the ClusterCIDR kind (networking.k8s.io/v1alpha1) was removed in 1.29, and
    running Pods' IPs are points, not the network's extent (guarding them would refuse
    10.244.0.0/16 yet pass 10.244.0.99/32 beside them) and listing Pods reads every pod spec. So
    the webhook does not guess: the missing fact is reported (see webhook.with_cluster_networks)."""
    kube = KubeLookup(api_client, timeout)
    problems: list[str] = []
    failures: list[tuple[str, str]] = []  # (kind, why its list could not be read)
    try:
        service = _cidrs(
            kube,
            SERVICE_CIDR,
            lambda c: kubernetes.client.CustomObjectsApi(c).list_cluster_custom_object,
            (SERVICE_CIDR.group, SERVICE_CIDR.preferred_version, SERVICE_CIDR.plural),
            "cidrs",
            problems,
            failures,
        )
        pod = _cidrs(
            kube,
            NODE,
            lambda c: kubernetes.client.CoreV1Api(c).list_node,
            (),
            "podCIDRs",
            problems,
            failures,
        )
    finally:
        if api_client is None:
            kube.close()
    failed = {kind: problem for kind, problem in failures}
    return ClusterNetworks(
        pod,
        service,
        tuple(problems),
        pod_missing="" if pod else failed.get("Node", "no Node has spec.podCIDRs"),
        service_missing=""
        if service
        else failed.get("ServiceCIDR", "no ServiceCIDR object (served since Kubernetes 1.33)"),
    )


def _cidrs(
    kube: KubeLookup,
    kind: KindInfo,
    call: Any,
    args: tuple[str, ...],
    key: str,
    problems: list[str],
    failures: list[tuple[str, str]],
) -> tuple[str, ...]:
    """The CIDRs under ``spec.<key>`` of every object of ``kind``, each once, in order."""
    what = f"the {kind.kind}s"
    try:
        body = kube._call(what, call, *args)
    except LookupFailed as e:  # 403, timeouts, no client configuration
        problems.append(str(e))
        failures.append((kind.kind, str(e)))
        return ()
    if body is None:
        problems.append(f"{what}: not served by this API server")
        failures.append((kind.kind, f"{what} are not served by this API server"))
        return ()
    out: list[str] = []
    items = body.get("items")
    for item in items if isinstance(items, list) else ():
        spec = item.get("spec") if isinstance(item, dict) else None
        values = spec.get(key) if isinstance(spec, dict) else None
        for value in values if isinstance(values, list) else ():
            try:
                network = str(ipaddress.ip_network(str(value), strict=False))
            except ValueError:
                problems.append(f"{what}: ignored {value!r} in spec.{key}, not a CIDR")
                continue
            if network not in out:
                out.append(network)
    return tuple(out)
