"""The bundled example both demos run (`examples/local/`): copied into a directory of the demo's,
with its listeners and its route's port moved where the demo needs them."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .local import LocalSettings

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "local"
GATEWAY_ID = "stunner/local-gateway"
EXAMPLE_PORT = 3478
EXAMPLE_ECHO_PORT = 9001


def prepare(manifests: Path, port: int, echo_port: int) -> Path:
    """Copy the example into `manifests`, with the listeners on `port` and the route to the echo
    peer's port; the UDPRoute file's path."""
    for source in sorted(EXAMPLE.glob("*.yaml")):
        text = source.read_text()
        text = text.replace(f"port: {EXAMPLE_PORT}", f"port: {port}")
        text = text.replace(f"port: {EXAMPLE_ECHO_PORT}", f"port: {echo_port}")
        (manifests / source.name).write_text(text)
    return manifests / "udproute.yaml"


def local_settings(manifests: Path, address: str, verbose: bool) -> LocalSettings:
    """Local mode as both demos run it: the manifests rendered, the CDS and the auth service on
    free ports of `address`, a stunnerd started there for each Gateway (its log shown when
    verbose)."""
    return LocalSettings(
        manifests=manifests,
        host=address,
        cds_port=0,
        auth_port=0,
        start_dataplanes=True,
        dataplane_address=address,
        dataplane_output=None if verbose else subprocess.DEVNULL,
    )
