"""`stunnerd [flags] [turn-URI]`: the command line of Go stunnerd, where it applies.

Here are the flags, the config source they name, and the Stunner (and UDP worker pool) they
build; serving it (the config watch, signals, drain) is stunnerd.process.serving's."""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.metadata
import logging
import os
import sys
from collections.abc import Callable, Sequence

from stunner_api.dataplane import ConfigError, StunnerConfig, redacted, zero_config
from stunner_api.turn_uri import config_from_uri
from stunner_api.vocabulary import FORCE_READY_ENV

from ..surface import logs
from ..surface.admin import parse_address
from ..surface.runtime import event_loop_factory
from ..transport import native
from ..turn.auth import NonceManager
from ..turn.ledger import LocalQuota
from ..turn.limits import Limits
from .daemon import Stunner
from .relay_discovery import relay_discovery_from_env
from .serving import serve
from .sources import DEFAULT_CDS_ADDRESS, CdsSource, ConfigSource, SourceError, source_for
from .worker_pool import WorkerPool, udp_process_count, usable_cpus

log = logging.getLogger("stunner.stunnerd")


def _address(text: str) -> str:
    try:
        if text:
            parse_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stunnerd",
        description="STUNner dataplane: a TURN server for Kubernetes media ingress.",
        epilog="Example: stunnerd turn://user:pass@127.0.0.1:3478?transport=udp",
    )
    parser.add_argument("--version", action="version", version=f"stunnerd {_version()}")
    parser.add_argument(
        "uri",
        nargs="?",
        metavar="turn-URI",
        help="build a default config from turn://user:pass@addr:port?transport=udp",
    )
    parser.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help="watch the config origin and reconcile every change (start empty)",
    )
    parser.add_argument(
        "-i",
        "--id",
        metavar="NAMESPACE/NAME",
        help="the config to ask the CDS for (default STUNNER_NAMESPACE/STUNNER_NAME)",
    )
    parser.add_argument(
        "-c",
        "--config",
        metavar="ORIGIN",
        default=os.environ.get("STUNNER_CONFIG_ORIGIN"),
        help="config origin: a file path, file://PATH, or the config discovery service "
        f"(http://HOST:PORT, HOST:PORT; default {DEFAULT_CDS_ADDRESS}); env STUNNER_CONFIG_ORIGIN",
    )
    parser.add_argument(
        "-l",
        "--log",
        metavar="SPEC",
        help="log levels, e.g. all:INFO,turn:DEBUG (overrides admin.loglevel)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="same as -l all:DEBUG")
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    parser.add_argument(
        "-d",
        "--dry-run",
        action="store_true",
        help="validate the config, print it (secrets redacted) and exit",
    )
    parser.add_argument(
        "-u",
        "--udp-thread-num",
        type=_non_negative,
        default=None,
        metavar="N",
        help="processes serving each UDP listener, one SO_REUSEPORT socket each (default: one "
        "per usable CPU, on both relay paths; 0 or 1: this process alone; "
        "capped at the usable CPUs)",
    )
    parser.add_argument(
        "--force-ready-status",
        action="store_true",
        default=os.environ.get(FORCE_READY_ENV, "").strip().lower() in ("1", "true", "yes"),
        help="keep /ready at 200 while draining after SIGTERM (what a pod needs for its UDP "
        f"calls to go on draining: README, Rollouts); env {FORCE_READY_ENV}=true",
    )
    parser.add_argument(
        "--grace-period",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="after SIGTERM, exit when the last allocation is gone or after this long "
        "(default 3600, the operator's terminationGracePeriodSeconds)",
    )
    for kind, what in (("health", "health-check"), ("metrics", "metrics")):
        parser.add_argument(
            f"--{kind}-address",
            type=_address,
            default="",
            metavar="HOST:PORT",
            help=f"serve the {what} endpoint here instead of at the address in the config "
            "(which still says whether it is on, and the path); for several stunnerds on one "
            "host",
        )
    limits = parser.add_argument_group(
        "abuse limits", "bounds Go STUNner's config has no key for; each flag's env is shown"
    )
    for name, (metavar, text) in LIMIT_FLAGS.items():
        default = getattr(Limits, name)
        env = limit_env(name)
        limits.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=_non_negative_number(type(default)),
            default=os.environ.get(env, default),
            metavar=metavar,
            help=f"{text} (default {default}; env {env})",
        )
    return parser


LIMIT_FLAGS: dict[str, tuple[str, str]] = {
    "stream_deadline": ("SECONDS", "TCP/TLS: time for the first message, and for each frame"),
    "idle_timeout": ("SECONDS", "TCP/TLS: close a connection without allocation this idle"),
    "connections_per_source": ("N", "TCP/TLS connections per client IP"),
    "connections": ("N", "TCP/TLS connections per process (also capped by --fd-reserve)"),
    "fd_reserve": ("N", "file descriptors kept for relay sockets, never used by TCP/TLS"),
    "dtls_pending_per_source": ("N", "DTLS handshakes in progress per client IP"),
    "dtls_pending": ("N", "DTLS handshakes in progress per listener"),
    "stream_high_water": ("BYTES", "output queued per TCP/TLS client before drops"),
    "stream_latency_bound": (
        "SECONDS",
        "TCP/TLS: relayed packets older than this are dropped, never queued; 0: no bound",
    ),
    "max_udp_message": ("BYTES", "STUN messages over UDP above this are dropped unparsed"),
    "max_attributes": ("N", "STUN attributes per message"),
    "max_peers_per_request": ("N", "XOR-PEER-ADDRESS per CreatePermission (508 past it)"),
    "max_permissions": ("N", "permissions per allocation (508 past it)"),
    "max_channels": ("N", "channel bindings per allocation (508 past it)"),
    "max_peer_connections": ("N", "RFC 6062: TCP peer connections per TCP allocation (508)"),
    "peer_connection_timeout": (
        "SECONDS",
        "RFC 6062: a Connect's time (447 past it), and a peer connection's wait for its "
        "ConnectionBind",
    ),
    "max_allocations": ("N", "allocations in the whole stunnerd; 0: no cap (508 past it)"),
    "allocation_rate": ("PER_S", "new allocations per second per client IP and process"),
    "error_rate": ("PER_S", "error answers per second per client address; more are dropped"),
    "error_rate_total": ("PER_S", "error answers per second per process; 0: no cap"),
    "unauthenticated_rate": (
        "PER_S",
        "UDP: STUN without MESSAGE-INTEGRITY per second per client IP with no allocation; "
        "more are dropped unparsed; 0: no limit",
    ),
    "unauthenticated_rate_total": (
        "PER_S",
        "UDP: the same from all client IPs together, in the whole stunnerd (each of the -u "
        "processes keeps an even share); within it an unsigned Allocate gets a stateless 401, "
        "past it they are dropped unparsed; 0: no limit",
    ),
}


def limit_env(name: str) -> str:
    return "STUNNER_" + name.upper()


def limits_from(args: argparse.Namespace) -> Limits:
    return Limits(**{name: getattr(args, name) for name in LIMIT_FLAGS})


def _non_negative_number(kind: type) -> Callable[[str], float | int]:
    """An argparse type: a non-negative int or float."""
    what = "an integer" if kind is int else "a number"

    def parse(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"must not be negative: {value}")
        return value  # type: ignore[no-any-return]

    return parse


def _version() -> str:
    try:
        return importlib.metadata.version("stunner")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def _non_negative(text: str) -> int:
    return int(_non_negative_number(int)(text))


def config_source(args: argparse.Namespace) -> ConfigSource | StunnerConfig:
    """The URI shorthand's config, or the source named by -c (default: the CDS on :13478)."""
    if args.uri:
        return config_from_uri(args.uri, certificate=_self_signed_certificate)
    return source_for(args.config or DEFAULT_CDS_ADDRESS, args.id)


def _self_signed_certificate(hostname: str) -> tuple[str, str]:
    """For a turns:// or turn+dtls URI only: cryptography is not loaded for a plain one."""
    from ..transport.certificates import self_signed_certificate

    return self_signed_certificate(hostname)


HOW_TO_CONFIGURE = (
    "give a config with -c FILE (YAML or JSON), a turn:// URI "
    "(e.g. stunnerd turn://user:pass@127.0.0.1:3478), or the config discovery service with "
    "-c HOST:PORT; see stunnerd --help"
)


async def run(args: argparse.Namespace, stunner: Stunner) -> int:
    try:
        origin = config_source(args)
        source = None if isinstance(origin, StunnerConfig) else origin
        if isinstance(source, CdsSource):
            # Cluster-wide user quotas (stunnerd.process.usage) and sessions
            # (stunnerd.process.sessions).
            source.reporter = stunner.watch_link
        if args.watch and not args.dry_run and source is not None:
            # Watch mode starts empty (not ready) and takes its config from the source.
            return await serve(stunner, zero_config(), source, args.grace_period, source)
        if source is None or not args.dry_run:
            config = origin if isinstance(origin, StunnerConfig) else await origin.load()
            warnings: list[str] = []
        else:
            config, warnings = await source.load_checked()
    except (ConfigError, SourceError) as exc:
        if not args.uri and not args.config:
            log.error(
                "no configuration given, and the default config discovery service did not "
                "answer (%s): %s",
                exc,
                HOW_TO_CONFIGURE,
            )
        else:
            log.error("invalid configuration: %s", exc)
        return 1
    if args.dry_run:
        print(redacted(config).to_json())  # noqa: T201
        for warning in warnings:  # what would be a warning at start is an error here
            log.error("config: %s", warning)
        return 1 if warnings else 0
    return await serve(stunner, config, None, args.grace_period, source)


def udp_processes(args: argparse.Namespace) -> int:
    """Engines (native path) or processes (Python path) per UDP listener that -u asks for."""
    cpus = usable_cpus()
    processes = udp_process_count(args.udp_thread_num, cpus)
    if args.udp_thread_num is not None and args.udp_thread_num > processes:
        log.info(
            "--udp-thread-num=%d: using %d %s, one per usable CPU",
            args.udp_thread_num,
            processes,
            "engine thread(s)" if native.unavailable_reason() is None else "process(es)",
        )
    return processes


def udp_workers(
    args: argparse.Namespace, override: str | None, processes: int, limits: Limits
) -> WorkerPool | None:
    """The worker pool of the Python relay path (processes beyond this one), or None: on the
    native path this process runs one engine thread per socket itself (issue 30)."""
    if processes <= 1 or args.dry_run or native.unavailable_reason() is None:
        return None
    return WorkerPool(
        processes - 1,
        secret=os.urandom(32),
        users=LocalQuota(limits.max_allocations),
        log_spec=override or logs.DEFAULT_LEVEL_SPEC,
        log_format=args.log_format,
        log_override=override is not None,
        limits=limits,
    )


async def run_with_workers(args: argparse.Namespace, stunner: Stunner) -> int:
    if stunner.workers is None:
        return await run(args, stunner)
    await stunner.workers.start()
    try:
        return await run(args, stunner)
    finally:
        await stunner.workers.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    override = "all:DEBUG" if args.verbose else args.log
    try:
        logs.setup(override or logs.DEFAULT_LEVEL_SPEC, args.log_format)
    except ValueError as exc:
        print(f"stunnerd: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    # What the imports made (~45,000 objects: modules, classes, the codec's tables) lives as
    # long as the process and holds no garbage: kept out of the cyclic collector's scans, whose
    # full collection of them was ~5 % of the CPU of 200 allocations' set-up (issue 30,
    # bench/README.md "WebRTC's voice load"), as the reconciler does for its cache.
    gc.freeze()
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(_main(args, override))


async def _main(args: argparse.Namespace, override: str | None) -> int:
    processes = udp_processes(args)
    # Each process (Python path) or engine thread (native path) reading a UDP listener keeps
    # its share of the whole stunnerd's --unauthenticated-rate-total.
    limits = limits_from(args).shared_by(processes)
    workers = udp_workers(args, override, processes, limits)
    stunner = Stunner(
        nonces=NonceManager(workers.secret) if workers is not None else None,
        # this process is stunnerd's own: admin.loglevel sets its `stunner` loggers, unless -l/-v
        log_levels=logs.LevelControl.PROCESS if override is None else logs.LevelControl.OVERRIDDEN,
        force_ready=args.force_ready_status,
        workers=workers,
        udp_engines=processes if workers is None else 1,
        limits=limits,
        health_address=args.health_address,
        metrics_address=args.metrics_address,
        relay_discovery=relay_discovery_from_env(os.environ),
    )
    return await run_with_workers(args, stunner)


if __name__ == "__main__":
    sys.exit(main())
