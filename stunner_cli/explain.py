"""`stunner explain NS/GW PEER[:PORT] [-f DIR|FILE]`: why a peer is admitted or refused, per
listener (stunner_api.peer_admission), from the running config (the cluster commands fetch it)
or offline from manifests or a dataplane config file. Exit 0 if some listener admits the peer,
1 if every one refuses it."""

from __future__ import annotations

import argparse
from pathlib import Path

from stunner_api.dataplane import StunnerConfig
from stunner_cli.output import FAILED, OK, USAGE, err, out


def show_explanation(config: StunnerConfig, peer_ip: str, peer_port: int | None) -> int:
    """Print, per listener, what admits the peer or what refuses it; OK if some listener
    admits it, FAILED if every one refuses it."""
    from stunner_api.peer_admission import explain_config

    peer = peer_ip if peer_port is None else f"{peer_ip}:{peer_port}"
    if ":" in peer_ip and peer_port is not None:
        peer = f"[{peer_ip}]:{peer_port}"
    what = "any port" if peer_port is None else "this port"
    out(f"Gateway {config.admin.name}, peer {peer} ({what}):")
    verdicts = explain_config(config, peer_ip, peer_port)
    for name, verdict in verdicts:
        if verdict.admitted:
            out(f"  {name}: admitted via route {verdict.cluster}: {verdict.reason}")
        else:
            out(f"  {name}: refused ({verdict.code}): {verdict.reason}")
            if verdict.allow:
                out(f"    would be allowed by: {verdict.allow}")
    if not verdicts:
        out("  no listeners: nothing admits any peer")
    return OK if any(v.admitted for _, v in verdicts) else FAILED


def explain_target(args: argparse.Namespace) -> tuple[str, str, str, int | None] | None:
    """(namespace, gateway, peer ip, peer port) of `explain`, or None (said on stderr)."""
    from stunner_api.peer_admission import parse_peer

    if args.gateway is None or not args.gateway[1]:
        err("explain: want NAMESPACE/GATEWAY PEER[:PORT]")
        return None
    try:
        ip, port = parse_peer(args.peer)
    except ValueError as e:
        err(f"explain: {e}")
        return None
    return args.gateway[0], args.gateway[1], ip, port


def run_explain_offline(args: argparse.Namespace) -> int:
    from reconciler.files import ManifestError, documents, read_text
    from stunner_api.dataplane import ConfigError
    from stunner_api.dataplane_load import load_config
    from stunner_cli import offline

    target = explain_target(args)
    if target is None:
        return USAGE
    namespace, gateway, ip, port = target
    path: Path = args.filename
    config: StunnerConfig | None = None
    if path.is_file():
        try:  # read and parsed within the bounds of `check -f` and `render -f`
            text = read_text(path)
            found = [data for _, data in documents(path, text)]
        except ManifestError as e:
            err(str(e))
            return FAILED
        if len(found) == 1 and isinstance(found[0], dict) and "kind" not in found[0]:
            try:  # a dataplane config, as stunnerd reads it
                config = load_config(text, env={})
            except ConfigError as e:
                err(f"{path}: {e}")
                return FAILED
    if config is None:
        try:
            objects = offline.load(path, skipped=err)
        except ManifestError as e:
            err(str(e))
            return FAILED
        plan = offline.plan(objects)
        config = plan.configs.get(f"{namespace}/{gateway}")
        if config is None:
            err(
                f"no Gateway {namespace}/{gateway} rendered from {path} "
                f"(rendered: {', '.join(sorted(plan.configs)) or 'none'})"
            )
            return FAILED
    elif config.admin.name and config.admin.name != f"{namespace}/{gateway}":
        err(f"{path} is the config of {config.admin.name}, not {namespace}/{gateway}")
        return FAILED
    return show_explanation(config, ip, port)
