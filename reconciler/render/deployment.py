"""The Deployment (or DaemonSet) of a Gateway (ANCHORS §2.4, managed mode): stunnerd, from its
Dataplane.

The Dataplane's `dataplaneResource` picks the stunnerd workload: a Deployment (the default) or
a DaemonSet, one stunnerd per node, with the same pod template and no replica count. With
`hostNetwork` the pods use the node's network (and `ClusterFirstWithHostNet`, so the CDS
Service's cluster DNS name still resolves).

Named after the Gateway, in its namespace and owned by it (when its uid is known: objects read
from files have none), with the metadata helpers the Service uses (manifests.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stunner_api.annotations import (
    DISABLE_MANAGED_DATAPLANE_ROW,
    RELAY_ADDRESS_DISCOVERY_ROW,
    RELAY_STUN_SERVER_ROW,
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
    DEFAULT_TERMINATION_GRACE_PERIOD,
    FORCE_READY_ENV,
    HOST_NETWORK_DNS_POLICY,
    METRICS_PORT,
    OWNED_BY_LABEL,
    OWNED_BY_VALUE,
    RELATED_GATEWAY_NAME,
    RELATED_GATEWAY_NAMESPACE,
    RELAY_STUN_SERVER_ENV,
)

from ..store import Object, meta, name_of, namespace_of
from .context import Context, GatewayPlan, Staged, id_of
from .inputs import (
    annotation,
    copy_json,
    dataplane_account,
    gateway_metadata,
    owned_map,
    related_labels,
    stunnerd_ports,
    view,
)
from .plan import DEFAULT_STUNNERD_IMAGE, RenderSettings

CONTAINER_NAME = "stunner-daemon"
DEFAULT_COMMAND = ("stunnerd",)
DEFAULT_ARGS = ("-w", "--udp-thread-num=16")
DEFAULT_PULL_POLICY = "Always"
DEFAULT_RESOURCES = {"limits": {"memory": "20M"}, "requests": {"cpu": "250m"}}


# Go's probes are both every 15 s. The kubelet probes readiness first as the container starts,
# before stunnerd has its config, and then only a period later: a pod took 18 s from scheduled
# to Ready on a real node (issue 19). Readiness is asked every second, so a pod is Ready within a
# second of having its config, and unready after 10 s without an answer; liveness stays Go's.
LIVENESS_PROBE_TIMING = {"periodSeconds": 15, "failureThreshold": 3}
READINESS_PROBE_TIMING = {"periodSeconds": 1, "failureThreshold": 10}


def _probe(path: str, timing: Mapping[str, int], port: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port, "scheme": "HTTP"},
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


def workload_kind(dataplane: Object) -> str:
    """The kind of a Dataplane's stunnerd workload: its `dataplaneResource` (Deployment or
    DaemonSet; the rule table refuses anything else, which counts as the default here)."""
    kind = view(dataplane.get("spec")).get("dataplaneResource")
    return "DaemonSet" if kind == "DaemonSet" else DEFAULT_DATAPLANE_RESOURCE


def uses_host_network(dataplane: Object | None) -> bool:
    """Whether a Dataplane's pods run in their node's network namespace."""
    return view(view(dataplane).get("spec")).get("hostNetwork") is True


# The kernel offload (issue 30, admin.offload_engine) needs CAP_BPF and CAP_NET_ADMIN in
# stunnerd's effective set, and nothing more. Kubernetes gives a container's added capabilities to
# a process that runs as root only (it sets no ambient capabilities for another user), so with
# the offload on the container runs as uid 0 with every other capability dropped, without
# privilege escalation and not privileged. What the Dataplane's own security contexts set stays:
# a user or runAsNonRoot of its own (pod or container) keeps stunnerd's user, and stunnerd then
# says which capability it lacks, rather than a pod the kubelet refuses to start.
OFFLOAD_CAPABILITIES = ("BPF", "NET_ADMIN")


def offload_on(dataplane: Object) -> bool:
    engine = view(dataplane.get("spec")).get("offloadEngine")
    return isinstance(engine, str) and engine.lower() not in ("", "none")


def offload_security_context(
    given: Mapping[str, Any], pod: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """`given` (a containerSecurityContext) with what the offload needs, and only that; `pod`:
    the pod's securityContext."""
    context = owned_map(given)
    capabilities = owned_map(context.get("capabilities"))
    added = [c for c in capabilities.get("add") or [] if isinstance(c, str)]
    capabilities["add"] = added + [c for c in OFFLOAD_CAPABILITIES if c not in added]
    capabilities.setdefault("drop", ["ALL"])
    context["capabilities"] = capabilities
    context.setdefault("allowPrivilegeEscalation", False)
    context.setdefault("privileged", False)
    user_keys = ("runAsUser", "runAsNonRoot")
    if not any(key in scope for scope in (context, view(pod)) for key in user_keys):
        context["runAsUser"], context["runAsNonRoot"] = 0, False
    return context


def _container_ports(dataplane: Object, metrics: int | None) -> list[dict[str, Any]]:
    """The container's declared ports: `metrics-port` (what the chart's PodMonitor scrapes),
    always, as Go, at 8080 unless the Gateway's metrics-port annotation moves it. A host-network
    pod declares it only when the metrics endpoint is on: the API server turns every port of such
    a pod into a hostPort, and the scheduler keeps two pods with the same hostPort off one node,
    so a port stunnerd does not bind would keep a second host-network Gateway off the node."""
    if metrics is None and uses_host_network(dataplane):
        return []
    port = METRICS_PORT if metrics is None else metrics
    return [{"name": "metrics-port", "containerPort": port, "protocol": "TCP"}]


def deployment(
    gateway: Object, dataplane: Object, settings: RenderSettings, stun_server: str = ""
) -> dict[str, Any]:
    """The stunnerd workload of a Gateway, from its Dataplane template: a Deployment, or a
    DaemonSet when the Dataplane asks for one (`workload_kind`). The probes ask stunnerd's
    health check where the config puts it (`stunnerd_ports`). `stun_server`: the STUN server
    its pods ask for their public address where their Node has none (relay address discovery),
    in RELAY_STUN_SERVER_ENV."""
    spec = view(dataplane.get("spec"))
    ports = stunnerd_ports(gateway, dataplane)
    gw_labels = {k: str(v) for k, v in view(meta(gateway).get("labels")).items()}
    labels = {k: v for k, v in gw_labels.items() if k not in settings.label_filter}
    labels |= {OWNED_BY_LABEL: OWNED_BY_VALUE} | related_labels(gateway)
    annotations = {k: text_of(v) for k, v in view(meta(gateway).get("annotations")).items()}
    annotations[RELATED_GATEWAY_NAME] = id_of(gateway)
    pod_labels = {k: str(v) for k, v in view(spec.get("labels")).items()}
    pod_labels |= {APP_LABEL: APP_VALUE} | related_labels(gateway)
    pod_annotations = {k: str(v) for k, v in view(spec.get("annotations")).items()}
    pod_annotations[RELATED_GATEWAY_NAME] = id_of(gateway)
    own_env = {e.get("name") for e in spec.get("env") or [] if isinstance(e, Mapping)}
    env: list[dict[str, Any]] = [
        {"name": "STUNNER_ADDR", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "STUNNER_NAME", "value": name_of(gateway)},
        {"name": "STUNNER_NAMESPACE", "value": namespace_of(gateway)},
        {"name": "STUNNER_NODENAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "STUNNER_CONFIG_ORIGIN", "value": settings.config_discovery_url},
        {"name": CDS_TOKEN_FILE_ENV, "value": CDS_TOKEN_FILE},
        # ready while draining, so its UDP calls stay on it (FORCE_READY_ENV), unless the
        # Dataplane's env says otherwise
        *([] if FORCE_READY_ENV in own_env else [{"name": FORCE_READY_ENV, "value": "true"}]),
        *([{"name": RELAY_STUN_SERVER_ENV, "value": stun_server}] if stun_server else []),
        *[owned_map(e) for e in spec.get("env") or [] if isinstance(e, Mapping)],
    ]
    declared = _container_ports(dataplane, ports.metrics)
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.get("image") or DEFAULT_STUNNERD_IMAGE,
        "imagePullPolicy": spec.get("imagePullPolicy") or DEFAULT_PULL_POLICY,
        "command": list(spec.get("command") or DEFAULT_COMMAND),
        "args": list(spec.get("args") or DEFAULT_ARGS),
        "env": env,
        **({"ports": declared} if declared else {}),
        "resources": owned_map(spec.get("resources")) or owned_map(DEFAULT_RESOURCES),
        "volumeMounts": [{"name": CDS_TOKEN_VOLUME, "mountPath": CDS_TOKEN_DIR, "readOnly": True}],
    }
    if spec.get("envFrom"):  # Go declares it and drops it; we pass it on
        container["envFrom"] = [owned_map(e) for e in spec["envFrom"] if isinstance(e, Mapping)]
    if ports.health is not None:
        container["livenessProbe"] = _probe("/live", LIVENESS_PROBE_TIMING, ports.health)
        container["readinessProbe"] = _probe("/ready", READINESS_PROBE_TIMING, ports.health)
    if spec.get("containerSecurityContext"):
        container["securityContext"] = owned_map(spec["containerSecurityContext"])
    if offload_on(dataplane):
        container["securityContext"] = offload_security_context(
            container.get("securityContext", {}), view(spec.get("securityContext"))
        )
    grace = spec.get("terminationGracePeriodSeconds")
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "terminationGracePeriodSeconds": grace
        if isinstance(grace, int)
        else DEFAULT_TERMINATION_GRACE_PERIOD,
        "hostNetwork": uses_host_network(dataplane),
        "volumes": [copy_json(CDS_TOKEN_SOURCE)],
        # The Gateway's own account (account.py): the one the CDS serves its config to.
        "serviceAccountName": dataplane_account(gateway, dataplane),
        # stunnerd never calls the API server: only the CDS token above is mounted.
        "automountServiceAccountToken": False,
    }
    if pod_spec["hostNetwork"]:
        pod_spec["dnsPolicy"] = HOST_NETWORK_DNS_POLICY
    for key in ("affinity", "securityContext"):
        if spec.get(key):
            pod_spec[key] = owned_map(spec[key])
    for key in ("tolerations", "topologySpreadConstraints", "imagePullSecrets"):
        if spec.get(key):
            pod_spec[key] = [owned_map(item) for item in spec[key] if isinstance(item, Mapping)]
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
        "metadata": gateway_metadata(gateway, labels, annotations),
        "spec": deployment_spec,
    }


def deployment_of(ctx: Context, plan: GatewayPlan) -> Staged[dict[str, Any] | None]:
    """The stage: the Deployment (or DaemonSet) of a Gateway whose config rendered, None when
    its annotations (or its GatewayConfig's load-balancer annotations) disable the managed
    dataplane."""
    assert plan.context.gateway_config is not None and plan.context.dataplane is not None
    limits = Limits(ctx.rule_settings.node_port_range)
    unmanaged = annotation(
        DISABLE_MANAGED_DATAPLANE_ROW, plan.gateway, plan.context.gateway_config, limits
    )
    stun = _stun_server(plan.gateway, plan.context.gateway_config, limits)
    manifest = (
        None if unmanaged else deployment(plan.gateway, plan.context.dataplane, ctx.settings, stun)
    )
    return Staged(manifest)


def _stun_server(gateway: Object, gateway_config: Object, limits: Limits) -> str:
    """The STUN server a Gateway's pods ask for their public address: with relay address
    discovery only."""
    if not annotation(RELAY_ADDRESS_DISCOVERY_ROW, gateway, gateway_config, limits):
        return ""
    return annotation(RELAY_STUN_SERVER_ROW, gateway, gateway_config, limits)
