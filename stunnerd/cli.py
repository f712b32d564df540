"""`stunnerd [flags] [turn-URI]`: the command line of Go stunnerd, where it applies."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from stunner_api.dataplane import ConfigError, StunnerConfig, config_from_uri, load_config, redacted

from . import logs
from .daemon import ApplyError, Stunner

log = logging.getLogger("stunner.stunnerd")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stunnerd",
        description="STUNner dataplane: a TURN server for Kubernetes media ingress.",
        epilog="Example: stunnerd turn://user:pass@127.0.0.1:3478?transport=udp",
    )
    parser.add_argument(
        "uri",
        nargs="?",
        metavar="turn-URI",
        help="build a default config from turn://user:pass@addr:port?transport=udp",
    )
    parser.add_argument(
        "-c",
        "--config",
        metavar="ORIGIN",
        default=os.environ.get("STUNNER_CONFIG_ORIGIN"),
        help="config file path or file:// URI (env STUNNER_CONFIG_ORIGIN)",
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
        type=int,
        default=0,
        metavar="N",
        help="UDP read loops per listener (accepted; one loop is used for now)",
    )
    parser.add_argument(
        "--force-ready-status",
        action="store_true",
        help="keep /ready at 200 while draining after SIGTERM",
    )
    parser.add_argument(
        "--grace-period",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="after SIGTERM, exit when the last allocation is gone or after this long "
        "(default 3600, the operator's terminationGracePeriodSeconds)",
    )
    return parser


def resolve_config(args: argparse.Namespace) -> StunnerConfig:
    """The startup config from the URI shorthand or the config origin; ConfigError if none."""
    if args.uri:
        return config_from_uri(args.uri)
    origin: str | None = args.config
    if not origin:
        raise ConfigError("no config: give -c FILE or a turn:// URI")
    if origin.startswith(("http://", "https://", "ws://", "wss://")) or origin == "k8s":
        raise ConfigError(
            f"config origin {origin!r}: the config discovery service is not "
            "supported yet; give a file path"
        )
    path = Path(origin.removeprefix("file://"))
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    return load_config(text)


DRAIN_POLL_INTERVAL = 1.0


async def serve(stunner: Stunner, config: StunnerConfig, grace_period: float = 3600.0) -> int:
    """Serve until SIGTERM/SIGINT, then drain: not ready, keep serving, exit when the last
    allocation is gone or the grace period ends. A second signal exits at once."""
    signals = asyncio.Queue[int]()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    try:
        await stunner.apply(config)
    except ApplyError as exc:
        log.error("could not apply configuration: %s", exc)
        await stunner.close()
        return 1
    log.info("stunnerd running with %d listener(s)", len(stunner.listeners))
    received = await signals.get()
    stunner.terminating = True
    log.info(
        "%s: draining %d allocation(s), at most %gs",
        signal.Signals(received).name,
        stunner.allocation_count,
        grace_period,
    )
    deadline = loop.time() + grace_period
    while stunner.allocation_count > 0 and loop.time() < deadline:
        try:
            received = await asyncio.wait_for(signals.get(), DRAIN_POLL_INTERVAL)
        except TimeoutError:
            continue
        log.info("%s again: exiting now", signal.Signals(received).name)
        break
    log.info("shutting down (%d active allocations)", stunner.allocation_count)
    await stunner.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    override = "all:DEBUG" if args.verbose else args.log
    try:
        logs.setup(override or logs.DEFAULT_LEVEL_SPEC, args.log_format)
    except ValueError as exc:
        print(f"stunnerd: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    try:
        config = resolve_config(args)
    except ConfigError as exc:
        log.error("invalid configuration: %s", exc)
        return 1
    if args.dry_run:
        print(redacted(config).to_json())  # noqa: T201
        return 0
    stunner = Stunner(log_override=override, force_ready=args.force_ready_status)
    return asyncio.run(serve(stunner, config, args.grace_period))


if __name__ == "__main__":
    sys.exit(main())
