"""`stunner-reconciler`: Gateways rendered to dataplane configs and served to stunnerd.

    stunner-reconciler --manifests DIR [--start-dataplanes]

Local mode reads the resources from the YAML files in DIR (and watches them), renders them,
serves the configs on the config discovery service (CDS) and the TURN credentials on the auth
service, and with `--start-dataplanes` runs one stunnerd per Gateway on this machine, pointed at
its config on the CDS. Cluster mode (from the Kubernetes API) is not here yet.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from stunner_api.cds import DEFAULT_PORT as DEFAULT_CDS_PORT

from .files import ManifestError
from .local import DEFAULT_AUTH_PORT, LocalSettings, run_local
from .loop import THROTTLE

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
    parser.add_argument("--cds-port", type=int, default=DEFAULT_CDS_PORT, help="CDS port (13478)")
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
    return parser


async def serve_local(settings: LocalSettings) -> None:
    """Run local mode until SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with run_local(settings) as local:
        log.info(
            "local mode: manifests in %s, CDS on %s, auth service on %s",
            settings.manifests,
            local.cds_address,
            local.auth_address,
        )
        await stop.wait()
        log.info("stopping")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    if args.manifests is None:
        print(
            "stunner-reconciler: cluster mode (watching the Kubernetes API) is not supported yet; "
            "run local mode with --manifests DIR",
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
        asyncio.run(serve_local(settings))
    except (ManifestError, OSError) as exc:
        print(f"stunner-reconciler: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
