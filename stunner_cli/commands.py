"""Each `stunner` subcommand's run, from its parsed arguments to an exit code: the cluster
commands (config, status, ice, diff, and explain against the running config), the offline
render and check, selftest and the auth server. `explain` is in stunner_cli.explain, what they
print in stunner_cli.output."""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from stunner_api.cds import listener_parts
from stunner_api.dataplane import ListenerConfig
from stunner_api.ice import IceError, IceQuery, ice_config, unaddressed
from stunner_api.vocabulary import DEFAULT_DATAPLANE
from stunner_cli.explain import _explain_target, show_explanation
from stunner_cli.output import FAILED, OK, _err, _out, show_config, show_rendered, status_line


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
