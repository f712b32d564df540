"""`helm stunner diff`'s proposal: the objects of the files, placed as the API server would place
them. We test: an object written without a namespace gets "default" exactly when its kind is
namespaced in the kinds table (stunner_api.vocabulary.KINDS), for every kind render reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.render import RenderSettings
from stunner_api.vocabulary import RENDERED_KINDS, KindInfo
from stunner_cli.diff import proposed
from stunner_cli.offline import Located


@pytest.mark.parametrize("kind", RENDERED_KINDS, ids=lambda k: k.kind)
def test_a_file_object_without_a_namespace_is_placed_by_the_kinds_table(kind: KindInfo) -> None:
    obj = {"apiVersion": kind.api_versions[0], "kind": kind.kind, "metadata": {"name": "x"}}
    proposed([], [Located(Path("f.yaml"), 1, "", obj)], RenderSettings())
    assert obj["metadata"].get("namespace") == ("default" if kind.namespaced else None)
