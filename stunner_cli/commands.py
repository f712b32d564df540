"""Each `stunner` subcommand's run, from its parsed arguments to an exit code (a `Runner`; the
parser names each subcommand's runner): the cluster commands (config, status, ice, diff, and
explain against the running config), the offline render and check, selftest and the auth
server. What explain says is in stunner_cli.explain, what they all print in stunner_cli.output."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

from stunner_api.cds import listener_parts
from stunner_api.dataplane import ListenerConfig
from stunner_api.ice import IceError, IceQuery, ice_config, unaddressed
from stunner_api.vocabulary import DEFAULT_DATAPLANE
from stunner_cli.explain import explain_target, run_explain_offline, show_explanation
from stunner_cli.output import (
    FAILED,
    OK,
    USAGE,
    err,
    out,
    show_config,
    show_ended,
    show_rendered,
    show_sessions,
    status_line,
)

Runner = Callable[[argparse.Namespace], int]


def _target(args: argparse.Namespace) -> Any:
    from stunner_cli.cluster import Target

    ns, name = args.gateway or ("", "")
    return Target(args.namespace, ns, name)


def on_cluster(run: Callable[[Any, Any, argparse.Namespace], int]) -> Runner:
    """A cluster command: `run(client, target, args)` with a client connected the usual way
    (--kubeconfig, --kube-context) and closed after it."""

    def connected(args: argparse.Namespace) -> int:
        from stunner_cli.kube import Kube

        client = Kube.connect(args.kubeconfig, args.kube_context)
        try:
            return run(client, _target(args), args)
        finally:
            client.close()

    return connected


@on_cluster
def run_config(client: Any, target: Any, args: argparse.Namespace) -> int:
    from stunner_cli import cluster

    last = show_config(cluster.cds_configs(client, target), args.output, args.show_secrets)
    out(last)
    while args.watch:
        time.sleep(args.interval)
        now = show_config(cluster.cds_configs(client, target), args.output, args.show_secrets)
        if now != last:
            out(now)
            last = now
    return OK


@on_cluster
def run_status(client: Any, target: Any, args: argparse.Namespace) -> int:
    from stunner_cli import cluster

    entries = cluster.dataplane_status(client, target)
    out("\n".join(status_line(e) for e in entries) or "no stunnerd pods")
    return OK if all("error" not in e["status"] for e in entries) else FAILED


@on_cluster
def run_sessions(client: Any, target: Any, args: argparse.Namespace) -> int:
    from stunner_cli import cluster

    answers = cluster.cds_sessions(client, target)
    out(show_sessions(answers, args.output, args.user))
    return OK


@on_cluster
def run_disconnect(client: Any, target: Any, args: argparse.Namespace) -> int:
    from stunner_cli import cluster

    if not target.gateway:
        err("disconnect needs a Gateway: NAMESPACE/GATEWAY")
        return USAGE
    answer = cluster.cds_disconnect(client, target, args.user or [], args.allocation or [])
    out(show_ended(answer))
    return OK if not answer.get("silent") else FAILED


@on_cluster
def run_ice(client: Any, target: Any, args: argparse.Namespace) -> int:
    from stunner_cli import cluster

    configs = cluster.cds_configs(client, target)
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
    out(json.dumps(answer, indent=2))
    return OK


@on_cluster
def run_diff(client: Any, target: Any, args: argparse.Namespace) -> int:
    from reconciler.files import ManifestError
    from stunner_cli import cluster, offline
    from stunner_cli.diff import report

    try:
        objects = offline.load(args.filename, skipped=err)
    except ManifestError as e:
        raise cluster.ClusterError(str(e)) from None
    out("\n".join(report(client, target, objects)))
    return OK


@on_cluster
def _explain_running(client: Any, target: Any, args: argparse.Namespace) -> int:
    from stunner_cli import cluster

    found = explain_target(args)
    assert found is not None  # checked by run_explain before connecting
    configs = cluster.cds_configs(client, target)
    if not configs:
        raise cluster.ClusterError(f"no dataplane config for {found[0]}/{found[1]}")
    return show_explanation(configs[0], found[2], found[3])


def run_explain(args: argparse.Namespace) -> int:
    """`explain`: its arguments checked before any connection, then offline (-f) or against
    the running config."""
    if explain_target(args) is None:
        return USAGE
    if args.filename is not None:
        return run_explain_offline(args)
    return _explain_running(args)


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
            err(f"{gw_id}: listener {name} has no public address: {reason}")
    err(
        "no ICE configuration printed: its TURN URIs would say 0.0.0.0, which no client can "
        "reach (`helm stunner status` shows each listener's public address or pending)"
    )
    return FAILED


def _manifests(args: argparse.Namespace) -> list[Any] | None:
    """The objects of -f DIR|FILE, or None (said on stderr)."""
    from reconciler.files import ManifestError
    from stunner_cli import offline

    try:
        return offline.load(args.filename, skipped=err)
    except ManifestError as e:
        err(str(e))
        return None


def run_check(args: argparse.Namespace) -> int:
    from stunner_cli import offline

    objects = _manifests(args)
    if objects is None:
        return FAILED
    findings = offline.check(objects)
    for finding in findings:
        out(str(finding))
    errors = sum(1 for f in findings if f.severity == "Error")
    err(f"{len(objects)} objects, {errors} errors, {len(findings) - errors} warnings")
    return FAILED if errors else OK


def run_render(args: argparse.Namespace) -> int:
    from stunner_cli import offline

    objects = _manifests(args)
    if objects is None:
        return FAILED
    if not offline.has_default_dataplane(objects):
        err(
            f"no Dataplane {DEFAULT_DATAPLANE!r} in {args.filename}: assuming the chart's "
            f"(stunnerd from {offline.chart_image()})"
        )
    plan = offline.plan(objects)
    for skipped in plan.findings:
        err(str(skipped))
    if args.configs_only:
        configs = [plan.configs[k] for k in sorted(plan.configs)]
        out(show_config(configs, args.output, args.show_secrets))
        return OK
    out(show_rendered(plan, args.output, args.show_secrets))
    return OK


def run_selftest(args: argparse.Namespace) -> int:
    from stunner_cli.selftest import selftest

    return selftest(
        args.cds_url,
        args.peer,
        args.timeout,
        args.echo,
        args.gateway,
        args.target,
        args.cluster_domain,
    )


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
        err(str(e))
        return FAILED
    asyncio.run(run(args.cds_url, args.address, args.port, public))
    return OK
