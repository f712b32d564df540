"""The `stunner` command line: its subcommands, their arguments and flags, and each one's runner
(argparse `set_defaults(run=...)`: the one command table; a subcommand without a runner cannot
be parsed). The usage summary and the exit codes are in stunner_cli.__main__'s docstring;
helm-plugin/plugin.yaml lists every subcommand but the chart's own (`CHART_COMMANDS`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from stunner_api.ice import DEFAULT_TTL, IceError, parse_ttl
from stunner_api.vocabulary import SYSTEM_NAMESPACE
from stunner_cli import commands
from stunner_cli.targets import DEFAULT_CLUSTER_DOMAIN, Target, parse_target
from stunner_cli.webhook_ready import run_webhook_ready

# The subcommands the chart runs (helm test, the auth service), not an operator at a prompt.
CHART_COMMANDS = ("selftest", "auth-server", "webhook-ready")


def _ttl(text: str) -> int:
    """--ttl as the auth service takes `ttl` (stunner_api.ice.parse_ttl)."""
    try:
        return parse_ttl(text)
    except IceError as e:
        raise argparse.ArgumentTypeError(e.message) from None


def _gateway(value: str) -> tuple[str, str]:
    namespace, sep, name = value.partition("/")
    if not namespace or (sep and not name) or "/" in name:
        raise argparse.ArgumentTypeError(f"{value!r}: want NAMESPACE or NAMESPACE/GATEWAY")
    return namespace, name


def _target(value: str) -> Target:
    """--target as selftest takes it (stunner_cli.selftest.parse_target)."""
    try:
        return parse_target(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stunner", description="Drive STUNner: running configs, status, ICE, offline checks."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, run: commands.Runner, help: str, description: str | None = None
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=description)
        p.set_defaults(run=run)
        return p

    def cluster(name: str, run: commands.Runner, help: str) -> argparse.ArgumentParser:
        p = command(name, run, help, help)
        p.add_argument("gateway", nargs="?", type=_gateway, metavar="NS[/GW]", help="a Gateway")
        p.add_argument(
            "-n",
            "--namespace",
            default=os.environ.get("HELM_NAMESPACE") or SYSTEM_NAMESPACE,
            help=f"the namespace STUNner is installed in (HELM_NAMESPACE; {SYSTEM_NAMESPACE})",
        )
        p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG") or None)
        p.add_argument(
            "--kube-context", default=os.environ.get("HELM_KUBECONTEXT") or None, metavar="CTX"
        )
        return p

    config = cluster(
        "config",
        commands.run_config,
        "the running dataplane configs, from the config discovery service",
    )
    config.add_argument("-o", "--output", choices=("summary", "json", "yaml"), default="summary")
    config.add_argument("--show-secrets", action="store_true", help="print credentials in clear")
    config.add_argument("-w", "--watch", action="store_true", help="print each change as it comes")
    config.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
    sessions = cluster(
        "sessions",
        commands.run_sessions,
        "every live allocation of the Gateways' stunnerd pods (user ids, never passwords)",
    )
    sessions.add_argument("--user", metavar="U", help="only this user id's allocations")
    sessions.add_argument("-o", "--output", choices=("table", "json"), default="table")
    disconnect = cluster(
        "disconnect",
        commands.run_disconnect,
        "end allocations on every pod of a Gateway (NAMESPACE/GATEWAY), by user id or id",
    )
    which = disconnect.add_mutually_exclusive_group(required=True)
    which.add_argument("--user", metavar="U", action="append", help="end this user id's")
    which.add_argument(
        "--allocation", metavar="ID", action="append", help="end this allocation (sessions' ID)"
    )
    cluster("status", commands.run_status, "each stunnerd pod's /status, one line per pod")
    ice = cluster("ice", commands.run_ice, "the ICE servers a browser passes to RTCPeerConnection")
    ice.add_argument(
        "--ttl",
        type=_ttl,
        default=DEFAULT_TTL,
        help="ephemeral credentials' lifetime in seconds (1 to 604800, a week)",
    )
    ice.add_argument("--username", default="", help="the user id in ephemeral credentials")
    for name, run, help in (
        (
            "render",
            commands.run_render,
            "offline: what the reconciler would produce of manifests: each Gateway's dataplane "
            "config, Service and Deployment (the chart's default Dataplane unless the files "
            "hold a Dataplane named default)",
        ),
        (
            "check",
            commands.run_check,
            "offline: every finding of the admission rules, with file, line and field",
        ),
    ):
        p = command(name, run, help, help)
        p.add_argument("-f", "--filename", required=True, type=Path, metavar="DIR|FILE")
        if name == "render":
            p.add_argument("-o", "--output", choices=("json", "yaml"), default="yaml")
            p.add_argument("--show-secrets", action="store_true")
            p.add_argument(
                "--configs-only",
                action="store_true",
                help="only the dataplane configs, not the Services and Deployments",
            )
    explain = cluster(
        "explain",
        commands.run_explain,
        "why a peer is admitted or refused: per listener, the route and cluster admitting it, "
        "or the rule refusing it and the setting that would allow it",
    )
    explain.add_argument("peer", metavar="PEER[:PORT]", help="IP, IP:PORT or [IPv6]:PORT")
    explain.add_argument(
        "-f",
        "--filename",
        type=Path,
        metavar="DIR|FILE",
        help="offline: from manifests (rendered as `render` does) or a dataplane config file",
    )
    diff = cluster(
        "diff",
        commands.run_diff,
        "what applying manifests would change in the running dataplanes: each listener "
        "reconciled in place or restarted, and the live allocations a restart drops",
    )
    diff.add_argument("-f", "--filename", required=True, type=Path, metavar="DIR|FILE")
    selftest = command(
        "selftest",
        commands.run_selftest,
        help="allocate through every Gateway over UDP and TCP (helm test)",
    )
    selftest.add_argument("--cds-url", required=True, help="the config discovery service URL")
    peer = selftest.add_mutually_exclusive_group()
    peer.add_argument("--peer", default="", metavar="IP:PORT", help="an echo peer to relay to")
    peer.add_argument(
        "--echo",
        default="",
        metavar="IP:PORT",
        help="run an echo peer on PORT, reached at IP (a route must admit it), and relay to it",
    )
    selftest.add_argument(
        "--gateway",
        action="append",
        default=[],
        metavar="NS/GW",
        help="a Gateway that must echo (repeatable; default: every Gateway, given a peer)",
    )
    selftest.add_argument(
        "--target",
        action="append",
        default=[],
        type=_target,
        metavar="k8s://NS/SVC:PORT",
        help="a Service that echoes UDP: packets relayed to it through every listener of the "
        "Gateways (or those --gateway names) must come back (repeatable)",
    )
    selftest.add_argument(
        "--cluster-domain",
        default=DEFAULT_CLUSTER_DOMAIN,
        help="the cluster's DNS domain, for --target (SVC.NS.svc.DOMAIN)",
    )
    selftest.add_argument(
        "--timeout", type=float, default=10.0, help="seconds for the Gateways and routes to be up"
    )
    ready = command(
        "webhook-ready",
        run_webhook_ready,
        help="wait until the admission webhook judges a dry-run create through the API server "
        "(the chart's post-install hook)",
    )
    ready.add_argument(
        "-n",
        "--namespace",
        default=os.environ.get("HELM_NAMESPACE") or SYSTEM_NAMESPACE,
        help="where the probe GatewayConfig is created as a dry run (the release's namespace)",
    )
    ready.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG") or None)
    ready.add_argument("--kube-context", default=None, metavar="CTX")
    ready.add_argument("--timeout", type=float, default=120.0, help="seconds to wait (120)")
    ready.add_argument("--interval", type=float, default=1.0, help="seconds between tries (1)")
    auth = command(
        "auth-server",
        commands.run_auth_server,
        help="serve GET / and GET /ice (TURN credentials) over the CDS's configs",
    )
    auth.add_argument("--cds-url", required=True, help="the config discovery service URL")
    auth.add_argument("--address", default="0.0.0.0", help="listen address")
    auth.add_argument("--port", type=int, default=8088, help="listen port (8088)")
    auth.add_argument(
        "--public-address", default="", help="the address in the URIs (STUNNER_PUBLIC_ADDR)"
    )
    auth.add_argument("-l", "--log", default="INFO", help="log level")
    return parser
