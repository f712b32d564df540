"""What render is given (`RenderSettings`) and what it gives back (`Plan`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stunner_api import rules
from stunner_api.cds import DEFAULT_PORT as CDS_PORT
from stunner_api.dataplane import StunnerConfig
from stunner_api.vocabulary import CDS_SERVICE_NAME, DEFAULT_CONTROLLER_NAME, SYSTEM_NAMESPACE

# The stable address of the config discovery service (a Service name, never a pod IP, so a
# reconciler restart rolls no dataplane: Go STUNner's #163).
DEFAULT_CONFIG_DISCOVERY_URL = f"http://{CDS_SERVICE_NAME}.{SYSTEM_NAMESPACE}.svc:{CDS_PORT}"
DEFAULT_STUNNERD_IMAGE = "l7mp/stunnerd:latest"


# Gateway labels that are not copied to the Deployment: they belong to tools that would then
# think they own it (operator#70). Env STUNNER_GATEWAY_OPERATOR_LABEL_FILTER replaces it.
DEFAULT_LABEL_FILTER = (
    "applyset.kubernetes.io/part-of",
    "applyset.k8s.io/part-of",
    "app.kubernetes.io/managed-by",
    "argocd.argoproj.io/instance",
    "kustomize.toolkit.fluxcd.io/name",
    "kustomize.toolkit.fluxcd.io/namespace",
)


@dataclass(frozen=True)
class RenderSettings:
    controller_name: str = DEFAULT_CONTROLLER_NAME
    # Off: backends are STRICT_DNS clusters of the Services' cluster DNS names.
    endpoint_discovery: bool = True
    # The Service ClusterIP joins the endpoints of a Service backend (Go: EnableRelayToClusterIP).
    relay_to_cluster_ip: bool = True
    # STUNNER_CONFIG_ORIGIN of every managed dataplane.
    config_discovery_url: str = DEFAULT_CONFIG_DISCOVERY_URL
    cluster_domain: str = "cluster.local"
    label_filter: tuple[str, ...] = DEFAULT_LABEL_FILTER
    # What the rule table needs to know of the cluster (pod/service CIDRs, NodePort range).
    rules: rules.Settings = field(default_factory=rules.Settings)


@dataclass(frozen=True)
class StatusUpdate:
    """The status render wants an object to have (the whole `status` value)."""

    api_version: str
    kind: str
    namespace: str  # "" for cluster-scoped objects
    name: str
    generation: int
    status: Mapping[str, Any]


@dataclass(frozen=True)
class Finding:
    """An object (or part of one) skipped or degraded, for the log; status carries it too."""

    kind: str
    namespace: str
    name: str
    path: str
    message: str
    reason: str

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        path = f" {self.path}:" if self.path else ""
        return f"{self.kind} {where}:{path} {self.message} ({self.reason})"


@dataclass(frozen=True)
class Plan:
    """Everything one render decided. Ids are "<gateway namespace>/<gateway name>"."""

    configs: Mapping[str, StunnerConfig]
    deployments: Mapping[str, dict[str, Any]]  # the stunnerd workload: Deployment or DaemonSet
    services: Mapping[str, dict[str, Any]]
    statuses: tuple[StatusUpdate, ...]
    findings: tuple[Finding, ...]
    # The ServiceAccount rendered for a Gateway's dataplane (none where its Dataplane names one).
    service_accounts: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    # Gateway id -> the ServiceAccount (in its namespace) its dataplane runs as: the one the CDS
    # serves its config to (render/account.py), for every Gateway whose config rendered.
    dataplane_accounts: Mapping[str, str] = field(default_factory=dict)
    # Node name -> its public address (ExternalIP, else ExternalDNS), for the CDS to patch into
    # the listeners of Gateways with relay address discovery (NODE_ADDRESS_PLACEHOLDER).
    node_addresses: Mapping[str, str] = field(default_factory=dict)
    # Gateway id -> where clients reach a Gateway with a stunnerd on every node: the public
    # addresses of the Nodes it runs on (its status.addresses), for the auth service's URIs.
    node_local: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def status_of(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The status planned for one object, None if render writes none."""
        for update in self.statuses:
            if (update.kind, update.namespace, update.name) == (kind, namespace, name):
                return update.status
        return None
