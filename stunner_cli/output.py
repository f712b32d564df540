"""What `stunner` says: the exit codes, the stdout/stderr writers, and the presentation of
dataplane configs (`config`, `render`) and of stunnerd's /status (`status`)."""

from __future__ import annotations

import ipaddress
import json
import sys
from typing import TYPE_CHECKING, Any

import yaml

from stunner_api.dataplane import StunnerConfig, redacted, uri_host_port

if TYPE_CHECKING:
    from reconciler.render import Plan

OK, FAILED, USAGE = 0, 1, 2


def out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def err(text: str) -> None:
    sys.stderr.write(f"stunner: {text}\n")


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
        public = uri_host_port(listener.public_address or "-", listener.public_port or "-")
        lines += [
            f"Listener: {listener.name}",
            f"  Protocol: {listener.protocol}",
            f"  Relay address: {uri_host_port(listener.address, listener.port)}",
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
    """Each Gateway's dataplane config, Service, ServiceAccount and Deployment, Gateway by
    Gateway."""
    documents: list[tuple[str, Any]] = []
    for gw_id in sorted({*plan.configs, *plan.services, *plan.deployments}):
        if gw_id in plan.configs:
            config = plan.configs[gw_id]
            shown = config if show_secrets else redacted(config)
            account = plan.dataplane_accounts.get(gw_id, "")
            title = f"dataplane config of {gw_id} (served over CDS to ServiceAccount {account})"
            documents.append((title, shown.to_dict()))
        # plan.deployments: a Deployment or a DaemonSet
        for manifests in (plan.services, plan.service_accounts, plan.deployments):
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
    return uri_host_port(str(address), listener.get("public_port") or listener.get("port", "-"))


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


def _count(session: dict[str, Any], packets: str, octets: str) -> str:
    """`packets/bytes` of one direction, `-` where the relay path does not count them."""
    if session.get(packets) is None:
        return "-"
    return f"{session[packets]}/{session[octets]}"


def _rate(bits_per_second: int | None) -> str:
    """An allocation's cap each way as a person reads it (`64kbps`, `2.5Mbps`), `-`: none."""
    if not bits_per_second:
        return "-"
    for unit, size in (("Gbps", 1e9), ("Mbps", 1e6), ("kbps", 1e3)):
        if bits_per_second >= size:
            return f"{bits_per_second / size:.4g}{unit}"
    return f"{bits_per_second}bps"


def show_sessions(answers: list[dict[str, Any]], output: str, user: str | None) -> str:
    """`stunner sessions`: every allocation of the Gateways' pods (only `user`'s, if given),
    a table or JSON; a note for each pod that did not answer. Never a password: the pods
    report user ids only."""
    for answer in answers:
        sessions = answer.get("sessions") or []
        answer["sessions"] = [s for s in sessions if user is None or s.get("user") == user]
    if output == "json":
        return json.dumps(answers, indent=2)
    header: tuple[str, ...] = (
        "GATEWAY",
        "POD",
        "LISTENER",
        "TRANSPORT",
        "CLIENT",
        "USER",
        "RELAY",
        "PEERS",
    )
    header += ("CHANNELS", "AGE", "LEFT", "RX PKTS/BYTES", "TX PKTS/BYTES", "CAP", "ID")
    rows: list[tuple[str, ...]] = [header]
    notes = []
    for answer in answers:
        gateway = str(answer.get("gateway", ""))
        for s in answer["sessions"]:
            rows.append(
                (
                    gateway,
                    str(s["pod"]),
                    str(s["listener"]).rpartition("/")[2],
                    str(s["transport"]),
                    str(s["client"]),
                    str(s["user"]),
                    str(s["relay"]),
                    ",".join(s["peers"]) or "-",
                    ",".join(f"{n}>{p}" for n, p in s["channels"].items()) or "-",
                    f"{s['age']:.0f}s",
                    f"{s['lifetime']:.0f}s",
                    _count(s, "rxPackets", "rxBytes"),
                    _count(s, "txPackets", "txBytes"),
                    _rate(s.get("bandwidthLimit")),
                    str(s["id"]),
                )
            )
        for pod in answer.get("silent") or []:
            notes.append(f"{gateway}: pod {pod} did not answer in time")
        if answer.get("omitted"):
            notes.append(f"{gateway}: {answer['omitted']} allocation(s) left out (report size)")
    if len(rows) == 1:
        return "\n".join(["no allocations", *notes])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    return "\n".join(lines + notes)


def show_ended(answer: dict[str, Any]) -> str:
    """`stunner disconnect`: what ended, one line each."""
    lines = [
        f"ended {s['id']} on {s['pod']}: user {s['user']}, client {s['client']}, "
        f"{s['transport']} {str(s['listener']).rpartition('/')[2]}"
        for s in answer.get("sessions") or []
    ]
    lines.append(f"{len(lines)} allocation(s) ended on {len(answer.get('pods') or [])} pod(s)")
    lines += [f"pod {pod} did not answer in time" for pod in answer.get("silent") or []]
    return "\n".join(lines)
