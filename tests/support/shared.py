"""What the tests read of the specification and the Gateway API, from the repository itself: the
Gateway API CRDs the chart ships (charts/stunner/gateway-api) and the spec's documents kept as
test data (tests/data/spec). The steering repository's shared/ folder, where one is beside the
repository, is only compared with those copies (tests/support/test_shared_copies.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
GATEWAY_API = "gateway-api-v1.6.1"
CHART_GATEWAY_API = ROOT / "charts" / "stunner" / "gateway-api"
SPEC = ROOT / "tests" / "data" / "spec"


def shared(name: str) -> Path | None:
    """``shared/<name>`` in the nearest folder above the repository that has it, else None."""
    for parent in ROOT.parents:
        candidate = parent / "shared" / name
        if candidate.exists():
            return candidate
    return None


def gateway_api_crds(channel: str = "standard") -> list[Path]:
    """The Gateway API v1.6.1 CRD files of a channel, as the chart ships them; the experimental
    channel's UDPRoute replaces the standard one (it also serves v1alpha2)."""
    base = CHART_GATEWAY_API
    files = {p.name: p for p in sorted((base / "standard").glob("*.yaml"))}
    if channel == "experimental":
        files.update({p.name: p for p in sorted((base / "experimental").glob("*.yaml"))})
    return sorted(files.values())


def crd_versions(paths: list[Path]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(a CRD's spec, one entry of its spec.versions) of every CRD in the files."""
    for path in paths:
        for crd in yaml.safe_load_all(path.read_text()):
            if crd:
                for version in crd["spec"]["versions"]:
                    yield crd["spec"], version


def crd_served_versions(paths: list[Path]) -> set[tuple[str, str, str, str, bool, bool]]:
    """(group, version, plural, kind, namespaced, status subresource) of every served version."""
    return {
        (
            spec["group"],
            version["name"],
            spec["names"]["plural"],
            spec["names"]["kind"],
            spec["scope"] == "Namespaced",
            "status" in (version.get("subresources") or {}),
        )
        for spec, version in crd_versions(paths)
        if version.get("served")
    }


def crd_schemas(paths: list[Path]) -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the openAPIV3Schema of that version of the kind."""
    return {
        (f"{spec['group']}/{version['name']}", spec["names"]["kind"]): version["schema"][
            "openAPIV3Schema"
        ]
        for spec, version in crd_versions(paths)
    }
