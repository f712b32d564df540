"""The Deployment (or DaemonSet) and the Service of a Gateway (ANCHORS §2.4, managed mode).

The Dataplane's `dataplaneResource` picks the stunnerd workload: a Deployment (the default) or
a DaemonSet, one stunnerd per node, with the same pod template and no replica count. With
`hostNetwork` the pods use the node's network (and `ClusterFirstWithHostNet`, so the CDS
Service's cluster DNS name still resolves).

Both are named after the Gateway, live in its namespace and are owned by it (when its uid is
known: objects read from files have none). The Service rendered here is the operator's intent;
keeping the fields others set on the live Service (nodePorts, loadBalancerClass, user labels) is
the applier's job.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from stunner_api.annotations import (
    DISABLE_HEALTH_CHECK_EXPOSE_ROW,
    DISABLE_SESSION_AFFINITY_ROW,
    EXTERNAL_TRAFFIC_POLICY_ROW,
    MIXED_PROTOCOL_LB_ROW,
    NODEPORT_ROW,
    RELAY_ADDRESS_DISCOVERY_ROW,
    SERVICE_TYPE_ROW,
    TARGETPORT_ROW,
    Annotation,
    Limits,
    text_of,
)
from stunner_api.vocabulary import (
    APP_LABEL,
    APP_VALUE,
    CDS_TOKEN_AUDIENCE,
    CDS_TOKEN_DIR,
    CDS_TOKEN_EXPIRATION,
    CDS_TOKEN_FILE,
    CDS_TOKEN_FILE_ENV,
    CDS_TOKEN_PATH,
    CDS_TOKEN_VOLUME,
    DEFAULT_DATAPLANE_RESOURCE,
    DEFAULT_SERVICE_ACCOUNT,
    DEFAULT_TERMINATION_GRACE_PERIOD,
    GATEWAY,
    HOST_NETWORK_DNS_POLICY,
    METRICS_PORT,
    NODE_ADDRESS_PLACEHOLDER,
    OWNED_BY_LABEL,
    OWNED_BY_VALUE,
    RELATED_GATEWAY_NAME,
    RELATED_GATEWAY_NAMESPACE,
    STATUS_PORT,
)

from ..store import Object, meta, name_of, namespace_of
from .config import STUNNER_ADDR
from .plan import DEFAULT_STUNNERD_IMAGE, RenderSettings

CONTAINER_NAME = "stunner-daemon"
DEFAULT_COMMAND = ("stunnerd",)
DEFAULT_ARGS = ("-w", "--udp-thread-num=16")
DEFAULT_PULL_POLICY = "Always"
DEFAULT_RESOURCES = {"limits": {"memory": "20M"}, "requests": {"cpu": "250m"}}
HEALTH_CHECK_PORT_NAME = "gateway-health-check"
HEALTH_PORT_ANNOTATION = re.compile(r"^service\.beta\.kubernetes\.io/.*health.*port$")
HEALTH_PROTOCOL_ANNOTATION = re.compile(r"^service\.beta\.kubernetes\.io/.*health.*protocol$")


T = TypeVar("T")

_SCALARS = (str, int, float, bool, type(None))


def _copy(value: Any) -> Any:
    """A deep copy of a JSON value: its dicts and lists are rebuilt and its scalars shared, much
    faster than copy.deepcopy; anything else (not from JSON or YAML) goes to copy.deepcopy."""
    if type(value) is dict:
        return {k: _copy(v) for k, v in value.items()}
    if type(value) is list:
        return [_copy(v) for v in value]
    if isinstance(value, _SCALARS):
        return value
    return copy.deepcopy(value)


def _map(value: Any) -> dict[str, Any]:
    """A deep copy of a mapping taken from an input object (a manifest never shares state with
    the snapshot), {} for anything else."""
    return {k: _copy(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


_EMPTY: Mapping[str, Any] = {}


def _view(value: Any) -> Mapping[str, Any]:
    """A mapping taken from an input object, only to be read (no copy), {} for anything else.
    What goes into a manifest from it is copied there (`_map`) or is a scalar."""
    return value if isinstance(value, Mapping) else _EMPTY


def annotation(row: Annotation[T], gateway: Object, gateway_config: Object, limits: Limits) -> T:
    """A STUNner annotation's value for a Gateway, read by its row of the annotation table from
    the Gateway and its GatewayConfig's loadBalancerServiceAnnotations."""
    return row.value(
        _view(meta(gateway).get("annotations")),
        _view(_view(gateway_config.get("spec")).get("loadBalancerServiceAnnotations")),
        limits,
    )


def relay_address(gateway: Object, gateway_config: Object, limits: Limits) -> str:
    """A rendered listener's `address`: the pod's address, or with relay address discovery the
    node placeholder, which the CDS replaces for each stunnerd with its Node's public address
    (reconciler.cds; the pod sends its node name, STUNNER_NODENAME below)."""
    if annotation(RELAY_ADDRESS_DISCOVERY_ROW, gateway, gateway_config, limits):
        return NODE_ADDRESS_PLACEHOLDER
    return STUNNER_ADDR  # the pod's address, from stunnerd's environment (status.podIP)


def owner_references(gateway: Object) -> list[dict[str, Any]]:
    uid = meta(gateway).get("uid")
    if not uid:
        return []
    return [
        {
            "apiVersion": str(gateway.get("apiVersion") or GATEWAY.api_versions[0]),
            "kind": "Gateway",
            "name": name_of(gateway),
            "uid": str(uid),
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def _metadata(
    gateway: Object, labels: dict[str, str], annotations: dict[str, str]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": name_of(gateway),
        "namespace": namespace_of(gateway),
        "labels": labels,
        "annotations": annotations,
    }
    owners = owner_references(gateway)
    if owners:
        out["ownerReferences"] = owners
    return out


def related_labels(gateway: Object) -> dict[str, str]:
    return {
        RELATED_GATEWAY_NAME: name_of(gateway),
        RELATED_GATEWAY_NAMESPACE: namespace_of(gateway),
    }


def _gateway_id(gateway: Object) -> str:
    return f"{namespace_of(gateway)}/{name_of(gateway)}"


# --- Deployment -------------------------------------------------------------------------------


# Go's probes are both every 15 s. The kubelet probes readiness first as the container starts,
# before stunnerd has its config, and then only a period later: a pod took 18 s from scheduled
# to Ready on a real node (issue 19). Readiness is asked every second, so a pod is Ready within a
# second of having its config, and unready after 10 s without an answer; liveness stays Go's.
LIVENESS_PROBE_TIMING = {"periodSeconds": 15, "failureThreshold": 3}
READINESS_PROBE_TIMING = {"periodSeconds": 1, "failureThreshold": 10}


def _probe(path: str, timing: Mapping[str, int]) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": STATUS_PORT, "scheme": "HTTP"},
        "periodSeconds": timing["periodSeconds"],
        "timeoutSeconds": 1,
        "failureThreshold": timing["failureThreshold"],
        "successThreshold": 1,
    }


# The pod's credential for the CDS (issue 20 #5): a ServiceAccount token bound to the pod and to
# the CDS's audience only, which the kubelet rotates; stunnerd reads it at each (re)connect.
CDS_TOKEN_SOURCE: Mapping[str, Any] = {
    "name": CDS_TOKEN_VOLUME,
    "projected": {
        "sources": [
            {
                "serviceAccountToken": {
                    "audience": CDS_TOKEN_AUDIENCE,
                    "expirationSeconds": CDS_TOKEN_EXPIRATION,
                    "path": CDS_TOKEN_PATH,
                }
            }
        ]
    },
}


def service_account_of(deployment: Mapping[str, Any]) -> str:
    """The ServiceAccount a rendered Deployment's pods run as (the CDS serves the Gateway's
    config to it only)."""
    pod_spec = _view(_view(_view(deployment.get("spec")).get("template")).get("spec"))
    name = pod_spec.get("serviceAccountName")
    return name if isinstance(name, str) and name else DEFAULT_SERVICE_ACCOUNT


def workload_kind(dataplane: Object) -> str:
    """The kind of a Dataplane's stunnerd workload: its `dataplaneResource` (Deployment or
    DaemonSet; the rule table refuses anything else, which counts as the default here)."""
    kind = _view(dataplane.get("spec")).get("dataplaneResource")
    return "DaemonSet" if kind == "DaemonSet" else DEFAULT_DATAPLANE_RESOURCE


def uses_host_network(dataplane: Object | None) -> bool:
    """Whether a Dataplane's pods run in their node's network namespace."""
    return _view((dataplane or _EMPTY).get("spec")).get("hostNetwork") is True


def deployment(gateway: Object, dataplane: Object, settings: RenderSettings) -> dict[str, Any]:
    """The stunnerd workload of a Gateway, from its Dataplane template: a Deployment, or a
    DaemonSet when the Dataplane asks for one (`workload_kind`)."""
    spec = _view(dataplane.get("spec"))
    gw_labels = {k: str(v) for k, v in _view(meta(gateway).get("labels")).items()}
    labels = {k: v for k, v in gw_labels.items() if k not in settings.label_filter}
    labels |= {OWNED_BY_LABEL: OWNED_BY_VALUE} | related_labels(gateway)
    annotations = {k: text_of(v) for k, v in _view(meta(gateway).get("annotations")).items()}
    annotations[RELATED_GATEWAY_NAME] = _gateway_id(gateway)
    pod_labels = {k: str(v) for k, v in _view(spec.get("labels")).items()}
    pod_labels |= {APP_LABEL: APP_VALUE} | related_labels(gateway)
    pod_annotations = {k: str(v) for k, v in _view(spec.get("annotations")).items()}
    pod_annotations[RELATED_GATEWAY_NAME] = _gateway_id(gateway)
    env: list[dict[str, Any]] = [
        {"name": "STUNNER_ADDR", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "STUNNER_NAME", "value": name_of(gateway)},
        {"name": "STUNNER_NAMESPACE", "value": namespace_of(gateway)},
        {"name": "STUNNER_NODENAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "STUNNER_CONFIG_ORIGIN", "value": settings.config_discovery_url},
        {"name": CDS_TOKEN_FILE_ENV, "value": CDS_TOKEN_FILE},
        *[_map(e) for e in spec.get("env") or [] if isinstance(e, Mapping)],
    ]
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.get("image") or DEFAULT_STUNNERD_IMAGE,
        "imagePullPolicy": spec.get("imagePullPolicy") or DEFAULT_PULL_POLICY,
        "command": list(spec.get("command") or DEFAULT_COMMAND),
        "args": list(spec.get("args") or DEFAULT_ARGS),
        "env": env,
        "ports": [{"name": "metrics-port", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "resources": _map(spec.get("resources")) or _map(DEFAULT_RESOURCES),
        "volumeMounts": [{"name": CDS_TOKEN_VOLUME, "mountPath": CDS_TOKEN_DIR, "readOnly": True}],
    }
    if spec.get("envFrom"):  # Go declares it and drops it; we pass it on
        container["envFrom"] = [_map(e) for e in spec["envFrom"] if isinstance(e, Mapping)]
    if not spec.get("disableHealthCheck"):
        container["livenessProbe"] = _probe("/live", LIVENESS_PROBE_TIMING)
        container["readinessProbe"] = _probe("/ready", READINESS_PROBE_TIMING)
    if spec.get("containerSecurityContext"):
        container["securityContext"] = _map(spec["containerSecurityContext"])
    grace = spec.get("terminationGracePeriodSeconds")
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "terminationGracePeriodSeconds": grace
        if isinstance(grace, int)
        else DEFAULT_TERMINATION_GRACE_PERIOD,
        "hostNetwork": uses_host_network(dataplane),
        "volumes": [_copy(CDS_TOKEN_SOURCE)],
        # stunnerd never calls the API server: only the CDS token above is mounted.
        "automountServiceAccountToken": False,
    }
    if pod_spec["hostNetwork"]:
        pod_spec["dnsPolicy"] = HOST_NETWORK_DNS_POLICY
    if isinstance(spec.get("serviceAccountName"), str) and spec["serviceAccountName"]:
        pod_spec["serviceAccountName"] = spec["serviceAccountName"]
    for key in ("affinity", "securityContext"):
        if spec.get(key):
            pod_spec[key] = _map(spec[key])
    for key in ("tolerations", "topologySpreadConstraints", "imagePullSecrets"):
        if spec.get(key):
            pod_spec[key] = [_map(item) for item in spec[key] if isinstance(item, Mapping)]
    selector = {
        "matchExpressions": [
            {"key": APP_LABEL, "operator": "In", "values": [APP_VALUE]},
            {"key": RELATED_GATEWAY_NAME, "operator": "In", "values": [name_of(gateway)]},
            {"key": RELATED_GATEWAY_NAMESPACE, "operator": "In", "values": [namespace_of(gateway)]},
        ]
    }
    deployment_spec: dict[str, Any] = {
        "selector": selector,
        "template": {
            "metadata": {"labels": pod_labels, "annotations": pod_annotations},
            "spec": pod_spec,
        },
    }
    kind = workload_kind(dataplane)
    replicas = spec.get("replicas")
    # 1 is left to an HPA or a kubectl scale; a DaemonSet has one pod per node, no count.
    if kind == "Deployment" and isinstance(replicas, int) and replicas != 1:
        deployment_spec["replicas"] = replicas
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": _metadata(gateway, labels, annotations),
        "spec": deployment_spec,
    }


# --- Service ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServicePort:
    """A rendered listener as the Service exposes it."""

    name: str
    port: int
    transport: str  # "UDP" | "TCP"


def service_annotations(gateway: Object, gateway_config: Object) -> dict[str, str]:
    """GatewayConfig loadBalancerServiceAnnotations, overridden by the Gateway's annotations."""
    merged = {
        k: text_of(v)
        for k, v in _view(
            _view(gateway_config.get("spec")).get("loadBalancerServiceAnnotations")
        ).items()
    }
    merged |= {k: text_of(v) for k, v in _view(meta(gateway).get("annotations")).items()}
    return merged


def service(
    gateway: Object, gateway_config: Object, ports: Sequence[ServicePort], limits: Limits
) -> dict[str, Any] | None:
    """The Service exposing a Gateway's rendered listeners, None when there is none. A refused
    annotation value counts as absent (the rule table's finding says why, once)."""
    if not ports:
        return None
    annotations = service_annotations(gateway, gateway_config)

    def value(row: Annotation[T]) -> T:
        return annotation(row, gateway, gateway_config, limits)

    service_type = value(SERVICE_TYPE_ROW)
    nodeports, targetports = value(NODEPORT_ROW), value(TARGETPORT_ROW)
    mixed = value(MIXED_PROTOCOL_LB_ROW)
    first = ports[0].transport
    service_ports: list[dict[str, Any]] = []
    for p in ports:
        if p.transport != first and not mixed:
            continue
        entry: dict[str, Any] = {"name": p.name, "protocol": p.transport, "port": p.port}
        if p.name in targetports:
            entry["targetPort"] = targetports[p.name]
        if p.name in nodeports and service_type in ("NodePort", "LoadBalancer"):
            entry["nodePort"] = nodeports[p.name]
        service_ports.append(entry)
    if service_type == "LoadBalancer" and not value(DISABLE_HEALTH_CHECK_EXPOSE_ROW):
        health = _health_check_port(annotations)
        if health is not None:
            service_ports.append(
                {"name": HEALTH_CHECK_PORT_NAME, "protocol": "TCP", "port": health}
            )
    spec: dict[str, Any] = {
        "type": service_type,
        "selector": {APP_LABEL: APP_VALUE} | related_labels(gateway),
        "ports": service_ports,
        "sessionAffinity": "None" if value(DISABLE_SESSION_AFFINITY_ROW) else "ClientIP",
    }
    policy = value(EXTERNAL_TRAFFIC_POLICY_ROW)
    if policy == "Local" and service_type in ("NodePort", "LoadBalancer"):
        spec["externalTrafficPolicy"] = "Local"
    addresses = _view(gateway.get("spec")).get("addresses") or []
    if addresses and isinstance(addresses[0], Mapping):
        if addresses[0].get("type", "IPAddress") == "IPAddress" and addresses[0].get("value"):
            spec["loadBalancerIP"] = str(addresses[0]["value"])
    labels = {OWNED_BY_LABEL: OWNED_BY_VALUE} | related_labels(gateway)
    annotations[RELATED_GATEWAY_NAME] = _gateway_id(gateway)
    manifest = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(gateway, labels, annotations),
        "spec": spec,
    }
    return manifest


def _health_check_port(annotations: Mapping[str, str]) -> int | None:
    """The health-check port the load balancer annotations name (port and TCP/HTTP protocol)."""
    port = next((v for k, v in annotations.items() if HEALTH_PORT_ANNOTATION.match(k)), None)
    protocol = next(
        (v for k, v in annotations.items() if HEALTH_PROTOCOL_ANNOTATION.match(k)), None
    )
    if port is None or protocol is None or protocol.upper() not in ("TCP", "HTTP"):
        return None
    try:
        value = int(port)
    except ValueError:
        return None
    return value if 1 <= value <= 65535 else None
