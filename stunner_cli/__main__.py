"""`stunner` (and `helm stunner`): STUNner's command line for cluster operators.

    stunner config [NS/GW] [-o summary|json|yaml] [--show-secrets] [-w]
    stunner status [NS/GW]
    stunner ice [NS/GW] [--ttl S] [--username U]
    stunner render -f DIR|FILE
    stunner check -f DIR|FILE
    stunner diff -f DIR|FILE [NS/GW]
    stunner explain NS/GW PEER[:PORT] [-f DIR|FILE]   (why a peer is admitted or refused)
    stunner selftest --cds-url URL [--peer|--echo IP:PORT] [--gateway NS/GW]  (`helm test`)
    stunner auth-server --cds-url URL [--port 8088]     (the chart's auth/ICE service)

Exit codes: 0 done, 1 the cluster or the input has a problem (said on stderr), 2 bad usage;
`explain`: 0 some listener admits the peer, 1 every listener refuses it.
Run as a helm plugin it honours HELM_NAMESPACE, HELM_KUBECONTEXT and --kubeconfig.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from stunner_api.cds import listener_parts
from stunner_api.dataplane import ListenerConfig, StunnerConfig, redacted
from stunner_api.ice import (
    DEFAULT_TTL,
    IceError,
    IceQuery,
    ice_config,
    parse_ttl,
    unaddressed,
)
from stunner_api.vocabulary import DEFAULT_DATAPLANE, SYSTEM_NAMESPACE

if TYPE_CHECKING:
    from reconciler.render import Plan

OK, FAILED, USAGE = 0, 1, 2


def _ttl(text: str) -> int:
    """--ttl as the auth service takes `ttl` (stunner_api.ice.parse_ttl)."""
    try:
        return parse_ttl(text)
    except IceError as e:
        raise argparse.ArgumentTypeError(e.message) from None


def _out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def _err(text: str) -> None:
    sys.stderr.write(f"stunner: {text}\n")


def _gateway(value: str) -> tuple[str, str]:
    namespace, sep, name = value.partition("/")
    if not namespace or (sep and not name) or "/" in name:
        raise argparse.ArgumentTypeError(f"{value!r}: want NAMESPACE or NAMESPACE/GATEWAY")
    return namespace, name


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stunner", description="Drive STUNner: running configs, status, ICE, offline checks."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def cluster(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
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

    config = cluster("config", "the running dataplane configs, from the config discovery service")
    config.add_argument("-o", "--output", choices=("summary", "json", "yaml"), default="summary")
    config.add_argument("--show-secrets", action="store_true", help="print credentials in clear")
    config.add_argument("-w", "--watch", action="store_true", help="print each change as it comes")
    config.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
    cluster("status", "each stunnerd pod's /status, one line per pod")
    ice = cluster("ice", "the ICE servers a browser passes to RTCPeerConnection")
    ice.add_argument(
        "--ttl",
        type=_ttl,
        default=DEFAULT_TTL,
        help="ephemeral credentials' lifetime in seconds (1 to 604800, a week)",
    )
    ice.add_argument("--username", default="", help="the user id in ephemeral credentials")
    for name, help in (
        (
            "render",
            "offline: what the reconciler would produce of manifests: each Gateway's dataplane "
            "config, Service and Deployment (the chart's default Dataplane unless the files "
            "hold a Dataplane named default)",
        ),
        ("check", "offline: every finding of the admission rules, with file, line and field"),
    ):
        p = sub.add_parser(name, help=help, description=help)
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
        "what applying manifests would change in the running dataplanes: each listener "
        "reconciled in place or restarted, and the live allocations a restart drops",
    )
    diff.add_argument("-f", "--filename", required=True, type=Path, metavar="DIR|FILE")
    selftest = sub.add_parser(
        "selftest", help="allocate through every Gateway over UDP and TCP (helm test)"
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
        "--timeout", type=float, default=10.0, help="seconds for the Gateways and routes to be up"
    )
    auth = sub.add_parser(
        "auth-server", help="serve GET / and GET /ice (TURN credentials) over the CDS's configs"
    )
    auth.add_argument("--cds-url", required=True, help="the config discovery service URL")
    auth.add_argument("--address", default="0.0.0.0", help="listen address")
    auth.add_argument("--port", type=int, default=8088, help="listen port (8088)")
    auth.add_argument(
        "--public-address", default="", help="the address in the URIs (STUNNER_PUBLIC_ADDR)"
    )
    auth.add_argument("-l", "--log", default="INFO", help="log level")
    return parser


# --- presentation ------------------------------------------------------------------------------


def summary(config: StunnerConfig) -> str:
    auth = config.auth
    creds = auth.credentials
    if auth.type == "ephemeral":
        shown = f"shared-secret: {creds.get('secret', '')}"
    else:
        shown = f"username/password: {creds.get('username', '')}/{creds.get('password', '')}"
    lines = [
        f"Gateway: {config.admin.name} (loglevel: {json.dumps(config.admin.loglevel)})",
        f"Authentication type: {auth.type}, {shown}",
    ]
    clusters = {c.name: c for c in config.clusters}
    for listener in config.listeners:
        endpoints = [e for r in listener.routes if r in clusters for e in clusters[r].endpoints]
        public = f"{listener.public_address or '-'}:{listener.public_port or '-'}"
        lines += [
            f"Listener: {listener.name}",
            f"  Protocol: {listener.protocol}",
            f"  Relay address: {listener.address}:{listener.port}",
            f"  Public address: {public}",
            f"  Routes: [{', '.join(listener.routes)}]",
            f"  Endpoints: [{', '.join(endpoints)}]",
        ]
    return "\n".join(lines)


def show_config(configs: list[StunnerConfig], output: str, show_secrets: bool) -> str:
    shown = configs if show_secrets else [redacted(c) for c in configs]
    if output == "summary":
        return "\n".join(summary(c) for c in shown) or "no dataplane configs"
    dicts = [c.to_dict() for c in shown]
    if output == "json":
        return json.dumps(dicts if len(dicts) != 1 else dicts[0], indent=2)
    return yaml.safe_dump_all(dicts, sort_keys=False)


def show_rendered(plan: Plan, output: str, show_secrets: bool) -> str:
    """Each Gateway's dataplane config, Service and Deployment, Gateway by Gateway."""
    documents: list[tuple[str, Any]] = []
    for gw_id in sorted({*plan.configs, *plan.services, *plan.deployments}):
        if gw_id in plan.configs:
            config = plan.configs[gw_id]
            shown = config if show_secrets else redacted(config)
            documents.append((f"dataplane config of {gw_id} (served over CDS)", shown.to_dict()))
        for manifests in (plan.services, plan.deployments):  # a Deployment or a DaemonSet
            if gw_id in manifests:
                documents.append((f"{manifests[gw_id]['kind']} of {gw_id}", manifests[gw_id]))
    if not documents:
        return "no Gateway rendered"
    if output == "json":
        return json.dumps([document for _, document in documents], indent=2)
    return "---\n".join(
        f"# {title}\n" + yaml.safe_dump(document, sort_keys=False) for title, document in documents
    )


def public(listener: dict[str, Any]) -> str:
    """A listener's public address in stunnerd's /status: ADDRESS:PORT, or "pending" until the
    reconciler finds one (see `ice`, which says what is missing)."""
    address = listener.get("public_address")
    if not address:
        return "pending"
    return f"{address}:{listener.get('public_port') or listener.get('port', '-')}"


def status_line(entry: dict[str, Any]) -> str:
    status = entry["status"]
    if "error" in status:
        return f"{entry['pod']}: unreachable: {status['error']}"
    listeners = ", ".join(
        f"{listener.get('name')}={listener.get('protocol')} public={public(listener)}"
        for listener in status.get("listeners", [])
    )
    relays = ", ".join(
        f"{listener.get('name')}={relay(listener)}"
        for listener in status.get("listeners", [])
        if listener.get("address")
    )
    return (
        f"{entry['pod']}: {status.get('admin', {}).get('name', '-')}: "
        f"allocs:{status.get('allocationCount', 0)}/status={status.get('status', '?')} "
        f"listeners: [{listeners}]" + (f" relay: [{relays}]" if relays else "")
    )


def relay(listener: dict[str, Any]) -> str:
    """The relay address a pod hands clients (XOR-RELAYED-ADDRESS), marked when it is private:
    a pod address relay address discovery fell back to (no public address for its Node), or a
    pod's own address, which only clients that reach the pod network can use."""
    address = str(listener.get("address"))
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    private = ip.is_private and not (ip.is_loopback or ip.is_unspecified)
    return f"{address} (private)" if private else address


# --- commands ----------------------------------------------------------------------------------


def _target(args: argparse.Namespace) -> Any:
    from stunner_cli.cluster import Target

    ns, name = args.gateway or ("", "")
    return Target(args.namespace, ns, name)


def run_cluster(args: argparse.Namespace) -> int:
    from stunner_cli import cluster
    from stunner_cli.kube import Kube

    client = Kube.connect(args.kubeconfig, args.kube_context)
    try:
        target = _target(args)
        if args.command == "diff":
            from reconciler.files import ManifestError
            from stunner_cli import offline
            from stunner_cli.diff import report

            try:
                objects = offline.load(args.filename, skipped=_err)
            except ManifestError as e:
                raise cluster.ClusterError(str(e)) from None
            _out("\n".join(report(client, target, objects)))
            return OK
        if args.command == "status":
            entries = cluster.dataplane_status(client, target)
            _out("\n".join(status_line(e) for e in entries) or "no stunnerd pods")
            return OK if all("error" not in e["status"] for e in entries) else FAILED
        if args.command == "explain":
            found = _explain_target(args)
            assert found is not None  # checked in main
            configs = cluster.cds_configs(client, target)
            if not configs:
                raise cluster.ClusterError(f"no dataplane config for {found[0]}/{found[1]}")
            return show_explanation(configs[0], found[2], found[3])
        configs = cluster.cds_configs(client, target)
        if args.command == "ice":
            query = IceQuery(
                username=args.username,
                ttl=args.ttl,
                namespace=target.gateway_namespace,
                gateway=target.gateway,
            )
            by_id = {c.admin.name: c for c in configs}
            nodes = cluster.cds_node_local(client, target)
            try:
                answer = ice_config(by_id, query, int(time.time()), "", nodes)
            except IceError as e:
                raise cluster.ClusterError(e.message) from None
            missing = unaddressed(by_id, query, "", nodes)
            if missing:
                return no_public_address(client, missing)
            _out(json.dumps(answer, indent=2))
            return OK
        last = show_config(configs, args.output, args.show_secrets)
        _out(last)
        while args.watch:
            time.sleep(args.interval)
            now = show_config(cluster.cds_configs(client, target), args.output, args.show_secrets)
            if now != last:
                _out(now)
                last = now
        return OK
    finally:
        client.close()


def no_public_address(client: Any, missing: list[tuple[str, ListenerConfig]]) -> int:
    """`ice` with listeners that have no public address: what is missing, per listener, and
    no ICE configuration (its URIs would say 0.0.0.0, which no client can reach)."""
    from stunner_cli.cluster import why_no_address

    by_gateway: dict[str, list[str]] = {}
    for gw_id, listener in missing:
        parts = listener_parts(listener.name)
        by_gateway.setdefault(gw_id, []).append(parts[2] if parts else listener.name)
    for gw_id, names in by_gateway.items():
        why = why_no_address(client, gw_id)
        for name in names:
            reason = why.get(name) or why.get("") or "the Gateway has no such listener any more"
            _err(f"{gw_id}: listener {name} has no public address: {reason}")
    _err(
        "no ICE configuration printed: its TURN URIs would say 0.0.0.0, which no client can "
        "reach (`helm stunner status` shows each listener's public address or pending)"
    )
    return FAILED


def show_explanation(config: StunnerConfig, peer_ip: str, peer_port: int | None) -> int:
    """Print, per listener, what admits the peer or what refuses it; OK if some listener
    admits it, FAILED if every one refuses it."""
    from stunner_api.peer_admission import explain_config

    peer = peer_ip if peer_port is None else f"{peer_ip}:{peer_port}"
    if ":" in peer_ip and peer_port is not None:
        peer = f"[{peer_ip}]:{peer_port}"
    what = "any port" if peer_port is None else "this port"
    _out(f"Gateway {config.admin.name}, peer {peer} ({what}):")
    verdicts = explain_config(config, peer_ip, peer_port)
    for name, verdict in verdicts:
        if verdict.admitted:
            _out(f"  {name}: admitted via route {verdict.cluster}: {verdict.reason}")
        else:
            _out(f"  {name}: refused ({verdict.code}): {verdict.reason}")
            if verdict.allow:
                _out(f"    would be allowed by: {verdict.allow}")
    if not verdicts:
        _out("  no listeners: nothing admits any peer")
    return OK if any(v.admitted for _, v in verdicts) else FAILED


def _explain_target(args: argparse.Namespace) -> tuple[str, str, str, int | None] | None:
    """(namespace, gateway, peer ip, peer port) of `explain`, or None (said on stderr)."""
    from stunner_api.peer_admission import parse_peer

    if args.gateway is None or not args.gateway[1]:
        _err("explain: want NAMESPACE/GATEWAY PEER[:PORT]")
        return None
    try:
        ip, port = parse_peer(args.peer)
    except ValueError as e:
        _err(f"explain: {e}")
        return None
    return args.gateway[0], args.gateway[1], ip, port


def run_explain_offline(args: argparse.Namespace) -> int:
    from reconciler.files import ManifestError
    from stunner_api.dataplane import ConfigError
    from stunner_api.dataplane_load import load_config
    from stunner_cli import offline

    target = _explain_target(args)
    if target is None:
        return USAGE
    namespace, gateway, ip, port = target
    path: Path = args.filename
    config: StunnerConfig | None = None
    if path.is_file():
        try:
            documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except (yaml.YAMLError, UnicodeDecodeError, OSError):
            documents = []
        if len(documents) == 1 and isinstance(documents[0], dict) and "kind" not in documents[0]:
            try:  # a dataplane config, as stunnerd reads it
                config = load_config(path.read_text(), env={})
            except ConfigError as e:
                _err(f"{path}: {e}")
                return FAILED
    if config is None:
        try:
            objects = offline.load(path, skipped=_err)
        except ManifestError as e:
            _err(str(e))
            return FAILED
        plan = offline.plan(objects)
        config = plan.configs.get(f"{namespace}/{gateway}")
        if config is None:
            _err(
                f"no Gateway {namespace}/{gateway} rendered from {path} "
                f"(rendered: {', '.join(sorted(plan.configs)) or 'none'})"
            )
            return FAILED
    elif config.admin.name and config.admin.name != f"{namespace}/{gateway}":
        _err(f"{path} is the config of {config.admin.name}, not {namespace}/{gateway}")
        return FAILED
    return show_explanation(config, ip, port)


def run_offline(args: argparse.Namespace) -> int:
    from reconciler.files import ManifestError
    from stunner_cli import offline

    try:
        objects = offline.load(args.filename, skipped=_err)
    except ManifestError as e:
        _err(str(e))
        return FAILED
    if args.command == "check":
        findings = offline.check(objects)
        for finding in findings:
            _out(str(finding))
        errors = sum(1 for f in findings if f.severity == "Error")
        _err(f"{len(objects)} objects, {errors} errors, {len(findings) - errors} warnings")
        return FAILED if errors else OK
    if not offline.has_default_dataplane(objects):
        _err(
            f"no Dataplane {DEFAULT_DATAPLANE!r} in {args.filename}: assuming the chart's "
            f"(stunnerd from {offline.chart_image()})"
        )
    plan = offline.plan(objects)
    for skipped in plan.findings:
        _err(str(skipped))
    if args.configs_only:
        configs = [plan.configs[k] for k in sorted(plan.configs)]
        _out(show_config(configs, args.output, args.show_secrets))
        return OK
    _out(show_rendered(plan, args.output, args.show_secrets))
    return OK


def run_selftest(args: argparse.Namespace) -> int:
    from stunner_cli.selftest import selftest

    return selftest(args.cds_url, args.peer, args.timeout, args.echo, args.gateway)


def run_auth_server(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from reconciler.auth import run
    from stunner_client.cds import CdsError, split_address

    logging.basicConfig(
        level=args.log.upper(), format="%(asctime)s %(name)s %(levelname)s: %(message)s"
    )
    public = args.public_address or os.environ.get("STUNNER_PUBLIC_ADDR", "")
    try:
        split_address(args.cds_url)
    except CdsError as e:
        _err(str(e))
        return FAILED
    asyncio.run(run(args.cds_url, args.address, args.port, public))
    return OK


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        if args.command in ("render", "check"):
            return run_offline(args)
        if args.command == "explain" and _explain_target(args) is None:
            return USAGE  # before any connection
        if args.command == "explain" and args.filename is not None:
            return run_explain_offline(args)
        if args.command == "selftest":
            return run_selftest(args)
        if args.command == "auth-server":
            return run_auth_server(args)
        return run_cluster(args)
    except KeyboardInterrupt:
        return OK
    except Exception as e:
        from stunner_cli.kube import ClusterError

        if isinstance(e, ClusterError):
            _err(str(e))
            return FAILED
        raise


if __name__ == "__main__":
    sys.exit(main())
