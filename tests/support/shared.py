"""The steering repository's shared/ folder (specs, Gateway API CRDs): beside the repository in
CI, above the worktree on a developer's machine."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
GATEWAY_API = "gateway-api-v1.6.1"


def shared(name: str) -> Path | None:
    """``shared/<name>`` in the nearest folder above the repository that has it, else None."""
    for parent in ROOT.parents:
        candidate = parent / "shared" / name
        if candidate.exists():
            return candidate
    return None


def gateway_api_crds(channel: str = "standard") -> list[Path]:
    """The Gateway API v1.6.1 CRD files of a channel ([] when shared/ is not there); the
    experimental channel's UDPRoute replaces the standard one (it also serves v1alpha2)."""
    base = shared(GATEWAY_API)
    if base is None:
        return []
    files = {p.name: p for p in sorted((base / "standard").glob("*.yaml"))}
    if channel == "experimental":
        files.update({p.name: p for p in sorted((base / "experimental").glob("*.yaml"))})
    return sorted(files.values())


def crd_served_versions(paths: list[Path]) -> set[tuple[str, str, str, str, bool, bool]]:
    """(group, version, plural, kind, namespaced, status subresource) of every served version."""
    out = set()
    for path in paths:
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd:
                continue
            spec = crd["spec"]
            for version in spec["versions"]:
                if version.get("served"):
                    out.add(
                        (
                            spec["group"],
                            version["name"],
                            spec["names"]["plural"],
                            spec["names"]["kind"],
                            spec["scope"] == "Namespaced",
                            "status" in (version.get("subresources") or {}),
                        )
                    )
    return out
