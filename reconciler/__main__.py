"""`stunner-reconciler`: Gateways rendered to dataplane configs and served to stunnerd.

    stunner-reconciler --manifests DIR [--start-dataplanes]

Local mode reads the resources from the YAML files in DIR (and watches them), renders them,
serves the configs on the config discovery service (CDS) and the TURN credentials on the auth
service, and with `--start-dataplanes` runs one stunnerd per Gateway on this machine, pointed at
its config on the CDS.

    stunner-reconciler [--kubeconfig FILE] [--leader-elect] ...

Cluster mode (no --manifests) watches the Kubernetes API (in-cluster, KUBECONFIG or
~/.kube/config), renders, serves CDS on every replica and, as the leader, writes the Deployments,
Services and status (`reconciler.cluster`). Its flags and env are Go STUNner's operator's where
they mean the same (ANCHORS §2.1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import signal
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stunner_api.annotations import parse_port_range
from stunner_api.cds import DEFAULT_PORT as DEFAULT_CDS_PORT
from stunner_api.vocabulary import (
    DEFAULT_CONTROLLER_NAME,
    DEFAULT_NODE_PORT_RANGE,
    SYSTEM_NAMESPACE,
)

from .cds.access import Account, AuthMode, parse_readers
from .files import ManifestError
from .local import DEFAULT_AUTH_PORT, LocalSettings, run_local
from .loop import THROTTLE
from .render import RenderSettings
from .render.plan import DEFAULT_CONFIG_DISCOVERY_URL

if TYPE_CHECKING:  # cluster mode needs the `reconciler` extra; local mode does not
    from .cluster import ClusterSettings

log = logging.getLogger("stunner.reconciler")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stunner-reconciler",
        description="Render STUNner Gateways to dataplane configs and serve them to stunnerd.",
        epilog="Example: stunner-reconciler --manifests examples/local --start-dataplanes",
    )
    parser.add_argument(
        "--manifests",
        metavar="DIR",
        type=Path,
        help="local mode: read the resources from the YAML files in DIR and watch them",
    )
    parser.add_argument(
        "--address", default="127.0.0.1", help="address to serve the CDS and auth service on"
    )
    parser.add_argument(
        "--cds-port", type=int, default=DEFAULT_CDS_PORT, help=f"CDS port ({DEFAULT_CDS_PORT})"
    )
    parser.add_argument(
        "--auth-port", type=int, default=DEFAULT_AUTH_PORT, help="auth service port (8088)"
    )
    parser.add_argument(
        "--public-address",
        default="",
        help="the address in the TURN URIs the auth service hands out (STUNNER_PUBLIC_ADDR)",
    )
    parser.add_argument(
        "--start-dataplanes",
        action="store_true",
        help="run one stunnerd per Gateway on this machine, watching its config on the CDS",
    )
    parser.add_argument(
        "--dataplane-address",
        default="127.0.0.1",
        help="STUNNER_ADDR of the local stunnerds (their relay address)",
    )
    parser.add_argument(
        "--udp-thread-num",
        type=int,
        default=None,
        metavar="N",
        help="passed to each local stunnerd (-u)",
    )
    parser.add_argument(
        "--throttle",
        type=float,
        default=THROTTLE,
        metavar="SECONDS",
        help=f"minimum time between two renders (default {THROTTLE})",
    )
    parser.add_argument(
        "-l",
        "--log",
        default="INFO",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="log level (default INFO)",
    )
    add_cluster_arguments(parser)
    return parser


def _go_duration(text: str) -> float:
    """Seconds of a Go duration ("250ms", "15s", "1m30s") or of a plain number."""
    try:
        return float(text)
    except ValueError:
        pass
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 250ms, 15s)")
    return sum(float(n) * units[u] for n, u in parts)


def _bind_address(text: str) -> tuple[str, int] | None:
    """Go's bind address ("0" off, ":8080", "127.0.0.1:8080")."""
    if text in ("0", ""):
        return None
    host, _, port = text.rpartition(":")
    try:
        return (host.strip("[]") or "0.0.0.0", int(port))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a bind address: {text!r}") from None


def _flag(value: str) -> bool:
    """A Go bool flag's value (strconv.ParseBool's spellings)."""
    if value in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if value in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {value!r} (true or false)")


def _label_filter(text: str) -> tuple[str, ...]:
    """STUNNER_GATEWAY_OPERATOR_LABEL_FILTER: label keys, comma separated."""
    return tuple(key.strip() for key in text.split(",") if key.strip())


def _readers(text: str) -> frozenset[Account]:
    try:
        return parse_readers(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


DATAPLANE_MODES = ("managed", "legacy")
LEGACY_REFUSED = (
    "--dataplane-mode=legacy is not supported: in legacy mode Go STUNner writes each Gateway's "
    "config to a ConfigMap that stunnerd reads from a file; here every dataplane is managed and "
    "gets its config from the config discovery service. Use --dataplane-mode=managed (the "
    "default) and, for dataplanes you run yourself, the disable-managed-dataplane annotation."
)


def _port_range(text: str) -> tuple[int, int]:
    try:
        return parse_port_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """Cluster mode's flags, named and defaulted as Go STUNner's operator's (ANCHORS §2.1)."""
    group = parser.add_argument_group("cluster mode (without --manifests)")
    env = os.environ.get
    group.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, KUBECONFIG)")
    group.add_argument(
        "--controller-name",
        default=env("STUNNER_GATEWAY_OPERATOR_CONTROLLER_NAME", DEFAULT_CONTROLLER_NAME),
        help="the GatewayClass controllerName served (env STUNNER_GATEWAY_OPERATOR_"
        "CONTROLLER_NAME)",
    )
    group.add_argument(
        "--config-discovery-address",
        default=f":{DEFAULT_CDS_PORT}",
        help=f"CDS bind address (:{DEFAULT_CDS_PORT}); env STUNNER_GATEWAY_OPERATOR_ADDRESS "
        "replaces the host",
    )
    group.add_argument(
        "--config-discovery-url",
        default=env("STUNNER_CONFIG_DISCOVERY_URL", DEFAULT_CONFIG_DISCOVERY_URL),
        help="STUNNER_CONFIG_ORIGIN of the dataplanes: a stable Service address, never a pod IP "
        f"(default {DEFAULT_CONFIG_DISCOVERY_URL})",
    )
    group.add_argument(
        "--throttle-timeout",
        type=_go_duration,
        default=None,
        help="minimum interval between two renders (Go duration; default 250ms)",
    )
    group.add_argument(
        "--dataplane-mode",
        default=env("STUNNER_GATEWAY_OPERATOR_DATAPLANE_MODE", "managed"),
        choices=DATAPLANE_MODES,
        help="managed (the only mode here; legacy is refused); env STUNNER_GATEWAY_OPERATOR_"
        "DATAPLANE_MODE",
    )
    group.add_argument(
        "--node-port-range",
        type=_port_range,
        default=DEFAULT_NODE_PORT_RANGE,
        metavar="LOW-HIGH",
        help="the cluster's NodePort range (kube-apiserver's --service-node-port-range; default "
        f"{DEFAULT_NODE_PORT_RANGE[0]}-{DEFAULT_NODE_PORT_RANGE[1]}): a nodeport annotation "
        "outside it is ignored, as the webhook refuses it (ours; the chart passes "
        "webhook.nodePortRange)",
    )
    group.add_argument(
        "--endpoint-discovery",
        type=_flag,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="render backend endpoints from EndpointSlices; false: STRICT_DNS clusters of the "
        "Services' DNS names (default true)",
    )
    group.add_argument(
        "--disable-endpointslice-controller",
        "--disable-endpontslice-controller",  # Go's spelling
        dest="disable_endpointslice_controller",
        type=_flag,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="watch no EndpointSlices: endpoint discovery off, STRICT_DNS clusters (Go falls "
        "back to the Endpoints API, which is not read here)",
    )
    group.add_argument(
        "--enable-finalizer",
        type=_flag,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="on shutdown, the leader invalidates the statuses of our GatewayClasses and "
        "Gateways and deletes their Deployments and Services (at most 2 s; default false)",
    )
    group.add_argument(
        "--cds-auth",
        choices=[str(m) for m in AuthMode],
        default=None,
        help="required (the default in cluster mode): a CDS client shows a ServiceAccount token "
        "and reads only its Gateway's config; off: anyone who reaches the CDS reads every "
        "config (local mode: always off)",
    )
    group.add_argument(
        "--cds-readers",
        type=_readers,
        default=frozenset(),
        metavar="NS/SA,...",
        help="ServiceAccounts that may read every config from the CDS (the auth service's)",
    )
    group.add_argument("--leader-elect", action="store_true", help="run leader election")
    for flag, default, what in (
        ("lease-duration", "15s", "how long a Lease not renewed stays its holder's"),
        ("renew-deadline", "10s", "how long the leader tries to renew before it stops leading"),
        ("retry-period", "2s", "between two rounds of acquiring or renewing"),
    ):
        group.add_argument(
            f"--leader-election-{flag}",
            type=_go_duration,
            default=None,
            help=f"{what} (Go duration; default {default}, client-go's)",
        )
    group.add_argument(
        "--cds-leader-only",
        action="store_true",
        help="only the leader serves the CDS and answers /readyz; a standby answers 503 with "
        "Retry-After (the chart's with more than one replica: cluster-wide user quotas are then "
        "counted by one replica)",
    )
    group.add_argument(
        "--leader-election-namespace",
        default=env("POD_NAMESPACE", SYSTEM_NAMESPACE),
        help=f"namespace of the Lease (env POD_NAMESPACE; default {SYSTEM_NAMESPACE})",
    )
    group.add_argument(
        "--leader-election-id", default=None, help="name of the Lease (92062b70.l7mp.io)"
    )
    group.add_argument(
        "--leader-election-owner",
        default="",
        metavar="DEPLOYMENT",
        help="the Deployment, in the Lease's namespace, that owns the Lease: deleting it "
        "deletes the Lease (the chart names the reconciler's own; default: none)",
    )
    group.add_argument(
        "--metrics-bind-address",
        type=_bind_address,
        default=":8080",
        help="Prometheus metrics (/metrics) bind address, 0 to disable (:8080)",
    )
    group.add_argument(
        "--health-probe-bind-address",
        type=_bind_address,
        default=":8081",
        help="/healthz and /readyz bind address, 0 to disable (:8081)",
    )
    group.add_argument(
        "--zap-log-level",
        default=None,
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="log level (Go's flag name; same as --log)",
    )


def cluster_settings(args: argparse.Namespace) -> ClusterSettings:
    from .cluster import ClusterSettings

    cds = _bind_address(args.config_discovery_address) or ("0.0.0.0", DEFAULT_CDS_PORT)
    host = os.environ.get("STUNNER_GATEWAY_OPERATOR_ADDRESS") or cds[0]
    throttle = args.throttle_timeout if args.throttle_timeout is not None else args.throttle
    label_filter = os.environ.get("STUNNER_GATEWAY_OPERATOR_LABEL_FILTER")
    defaults = RenderSettings()
    render_settings = replace(
        defaults,
        rules=replace(defaults.rules, node_port_range=args.node_port_range),
        controller_name=args.controller_name,
        endpoint_discovery=args.endpoint_discovery and not args.disable_endpointslice_controller,
        config_discovery_url=args.config_discovery_url,
    )
    if label_filter is not None:
        render_settings = replace(render_settings, label_filter=_label_filter(label_filter))
    lease: dict[str, Any] = (
        {"lease_name": args.leader_election_id} if args.leader_election_id else {}
    )
    for timing in ("lease_duration", "renew_deadline", "retry_period"):
        if getattr(args, f"leader_election_{timing}") is not None:
            lease[timing] = getattr(args, f"leader_election_{timing}")
    return ClusterSettings(
        **lease,
        kubeconfig=args.kubeconfig,
        host=host,
        cds_port=cds[1],
        metrics_address=args.metrics_bind_address,
        health_address=args.health_probe_bind_address,
        throttle=throttle,
        render_settings=render_settings,
        leader_elect=args.leader_elect,
        lease_namespace=args.leader_election_namespace,
        lease_owner=args.leader_election_owner,
        enable_finalizer=args.enable_finalizer,
        watch_endpoint_slices=not args.disable_endpointslice_controller,
        cds_auth=AuthMode(args.cds_auth or AuthMode.REQUIRED),
        cds_readers=args.cds_readers,
        cds_leader_only=args.cds_leader_only,
    )


def _stop_on_signals() -> asyncio.Event:
    """An event SIGINT and SIGTERM set (in the running loop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def serve_cluster(settings: ClusterSettings) -> int:
    """Run cluster mode until SIGINT or SIGTERM, or until a core task ends (exit code 1); then
    release the Lease and stop writing, and keep the CDS serving until the process ends."""
    from .cluster import run_cluster

    stop = _stop_on_signals()
    async with run_cluster(settings) as running:
        log.info(
            "cluster mode: CDS on %s, health on %s, metrics on %s",
            running.cds_address,
            running.health_address,
            running.metrics_address,
        )
        code = await running.mode.supervisor.until(stop)
        log.info("stopping: releasing the Lease, no more writes")
        await running.mode.shutdown()
    return code


async def serve_local(settings: LocalSettings) -> int:
    """Run local mode until SIGINT or SIGTERM (exit code 0), or until a core task ends (1)."""
    stop = _stop_on_signals()
    async with run_local(settings) as local:
        log.info(
            "local mode: manifests in %s, CDS on %s, auth service on %s",
            settings.manifests,
            local.cds_address,
            local.auth_address,
        )
        code = await local.supervisor.until(stop)
        log.info("stopping")
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=(args.zap_log_level or args.log).upper(),
        format="%(asctime)s %(name)s %(levelname)s: %(message)s",
    )
    if args.manifests is None:
        from .cluster import ClusterUnavailable

        if args.dataplane_mode != "managed":
            problem = (
                LEGACY_REFUSED
                if args.dataplane_mode == "legacy"
                else f"unknown dataplane mode {args.dataplane_mode!r} (--dataplane-mode, env "
                "STUNNER_GATEWAY_OPERATOR_DATAPLANE_MODE): managed is the only mode"
            )
            print(f"stunner-reconciler: {problem}", file=sys.stderr)
            return 2
        cluster = cluster_settings(args)
        if not cluster.retry_period < cluster.renew_deadline < cluster.lease_duration:
            print(
                "stunner-reconciler: leader election needs --leader-election-retry-period < "
                "--leader-election-renew-deadline < --leader-election-lease-duration (got "
                f"{cluster.retry_period:g}s, {cluster.renew_deadline:g}s, "
                f"{cluster.lease_duration:g}s)",
                file=sys.stderr,
            )
            return 2
        try:
            return asyncio.run(serve_cluster(cluster))
        except ClusterUnavailable as exc:
            print(
                f"stunner-reconciler: cluster mode: {str(exc).rstrip('.')}; "
                "or run local mode with --manifests DIR",
                file=sys.stderr,
            )
            return 2
        except OSError as exc:
            print(f"stunner-reconciler: {exc}", file=sys.stderr)
            return 1
    if args.cds_auth == AuthMode.REQUIRED:
        print(
            "stunner-reconciler: --cds-auth=required needs cluster mode (the tokens are checked "
            "with the Kubernetes API); local mode serves the CDS on --address (127.0.0.1) only",
            file=sys.stderr,
        )
        return 2
    if not args.manifests.is_dir():
        print(f"stunner-reconciler: --manifests {args.manifests}: not a directory", file=sys.stderr)
        return 2
    dataplane_args: tuple[str, ...] = ()
    if args.udp_thread_num is not None:
        dataplane_args = ("--udp-thread-num", str(args.udp_thread_num))
    settings = LocalSettings(
        manifests=args.manifests,
        host=args.address,
        cds_port=args.cds_port,
        auth_port=args.auth_port,
        public_address=args.public_address,
        throttle=args.throttle,
        start_dataplanes=args.start_dataplanes,
        dataplane_address=args.dataplane_address,
        dataplane_args=dataplane_args,
    )
    try:
        return asyncio.run(serve_local(settings))
    except (ManifestError, OSError) as exc:
        print(f"stunner-reconciler: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
