"""The repository's copies of the steering folder's data (the spec's documents in tests/data/spec,
the Gateway API CRDs in the chart) are the steering folder's own, where one is beside the
repository; a clone standing alone skips this, and only this, in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.shared import CHART_GATEWAY_API, GATEWAY_API, SPEC, shared

COPIES = (("spec", SPEC), (GATEWAY_API, CHART_GATEWAY_API))


def files(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.suffix in (".md", ".yaml") and p.name != "README.md"
    }


@pytest.mark.parametrize(("name", "copy"), COPIES, ids=[name for name, _ in COPIES])
def test_the_copy_is_the_steering_folders_own(name: str, copy: Path) -> None:
    original = shared(name)
    if original is None:
        pytest.skip(f"no shared/{name} beside the repository to compare the copy with")
    assert files(copy) == files(original)
    assert files(copy), copy
