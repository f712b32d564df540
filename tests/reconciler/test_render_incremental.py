"""The incremental render (`reconciler.render.core.Renderer`) makes the plan a render of the
whole snapshot makes, after any sequence of edits.

Differential: over the render cases (tests/data/render/, each alone and all of them in one
world), a seeded random sequence of edits (an object deleted, put back, copied unchanged, a leaf
of it changed or swapped with the same leaf of another object, the plan's status written back
as the reconciler's own write would be), and after each edit the incremental render and a
fresh full render are compared: configs, manifests, statuses and findings, in order.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from reconciler.apply import status_writes
from reconciler.render import Plan, RenderSettings, render
from reconciler.render.core import Renderer
from reconciler.store import Snapshot
from tests.reconciler.test_render_golden import CASES, load_case

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
EDITS = 60
SETTINGS = RenderSettings()

Obj = dict[str, Any]
Path = tuple[Any, ...]


def document(plan: Plan) -> dict[str, Any]:
    return {
        "configs": {k: v.to_dict() for k, v in plan.configs.items()},
        "config order": list(plan.configs),
        "deployments": list(plan.deployments.items()),
        "services": list(plan.services.items()),
        "statuses": [asdict(s) for s in plan.statuses],
        "findings": [str(f) for f in plan.findings],
    }


def leaves(value: Any, path: Path = ()) -> Iterator[Path]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaves(item, (*path, index))
    else:
        yield path


def get_at(value: Any, path: Path) -> Any:
    for step in path:
        value = value[step]
    return value


def set_at(value: Any, path: Path, new: Any) -> None:
    for step in path[:-1]:
        value = value[step]
    value[path[-1]] = new


def changed(leaf: Any, rng: random.Random) -> Any:
    if isinstance(leaf, bool):
        return not leaf
    if isinstance(leaf, int):
        return leaf + rng.choice((1, -1, 1000))
    if isinstance(leaf, str):
        return rng.choice((leaf + "x", leaf.upper(), ""))
    return rng.choice(("x", 1, None))


class World:
    """The objects, edited at random; each edit replaces an object's dict, as the cache does."""

    def __init__(self, objects: list[Obj], rng: random.Random) -> None:
        self.objects = {self.key(o): o for o in objects}
        self.deleted: list[Obj] = []
        self.rng = rng
        self.least = len(objects) // 2  # deletions stop here (restores go on)

    @staticmethod
    def key(obj: Obj) -> tuple[str, str, str, str]:
        meta = obj.get("metadata") or {}
        return (
            str(obj.get("apiVersion")),
            str(obj.get("kind")),
            str(meta.get("namespace") or ""),
            str(meta.get("name") or ""),
        )

    def edit(self, plan: Plan) -> str:
        rng = self.rng
        key = rng.choice(sorted(self.objects))
        obj = self.objects[key]
        what = rng.choice(("delete", "restore", "copy", "leaf", "leaf", "swap", "swap", "status"))
        if what == "delete" and len(self.objects) > self.least:
            del self.objects[key]
            self.deleted.append(obj)
            return f"deleted {key}"
        if what == "restore" and self.deleted:
            back = self.deleted.pop(rng.randrange(len(self.deleted)))
            self.objects[self.key(back)] = back
            return f"restored {self.key(back)}"
        new = copy.deepcopy(obj)
        if what == "status":
            kind = str(obj.get("kind"))
            namespace = "" if kind == "GatewayClass" else key[2] or "default"
            status = plan.status_of(kind, namespace, key[3])
            if status is None:
                return "nothing"
            new["status"] = copy.deepcopy(dict(status))
            new.setdefault("metadata", {})["resourceVersion"] = str(rng.randrange(10**6))
        elif what in ("leaf", "swap"):
            paths = [p for p in leaves(new) if p[:2] != ("metadata", "name") and p]
            if not paths:
                return "nothing"
            path = rng.choice(paths)
            if what == "swap":  # the same leaf of another object of the kind: a real value
                others = [
                    o
                    for k, o in self.objects.items()
                    if k[:2] == key[:2] and k != key and path in set(leaves(o))
                ]
                if not others:
                    return "nothing"
                set_at(new, path, copy.deepcopy(get_at(rng.choice(others), path)))
            else:
                set_at(new, path, changed(get_at(new, path), rng))
        self.objects[key] = new
        return f"{what} {key}"


def renders_alike(objects: list[Obj], seed: int) -> tuple[int, int]:
    """Random edits; after each the incremental and the full render agree. Returns the parts
    rendered again and kept over the sequence."""
    rng = random.Random(seed)
    world = World(objects, rng)
    renderer = Renderer(SETTINGS)
    rendered = kept = 0
    plan = render(Snapshot.from_objects(list(world.objects.values())), SETTINGS, NOW)
    for step in range(EDITS):
        snapshot = Snapshot.from_objects(list(world.objects.values()))
        full = render(snapshot, SETTINGS, NOW)
        incremental = renderer.render(snapshot, NOW)
        assert document(incremental) == document(full), f"seed {seed}, step {step}"
        rendered, kept = rendered + renderer.rendered_parts, kept + renderer.kept_parts
        plan = full
        world.edit(plan)
    return rendered, kept


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", range(3))
def test_incremental_render_equals_full_render_after_random_edits(case: str, seed: int) -> None:
    renders_alike(load_case(case), seed)


@pytest.mark.parametrize("seed", range(4))
def test_incremental_render_equals_full_render_in_a_world_of_every_case(seed: int) -> None:
    rendered, kept = renders_alike(every_case(), 100 + seed)
    assert kept > rendered  # most parts were kept: the test compared the incremental path


def test_an_unchanged_snapshot_renders_nothing_again() -> None:
    objects = [obj for case in CASES[:1] for obj in load_case(case)]
    renderer = Renderer(SETTINGS)
    first = renderer.render(Snapshot.from_objects(objects), NOW)
    assert renderer.rendered_parts > 0 and renderer.kept_parts == 0
    again = renderer.render(Snapshot.from_objects([copy.deepcopy(o) for o in objects]), NOW)
    assert renderer.rendered_parts == 0 and renderer.kept_parts > 0
    assert document(again) == document(first)


def every_case(last: str = "") -> list[Obj]:
    """The objects of every case in one world (an object of a later case replaces one of the
    same name; `last` is loaded last)."""
    objects: dict[tuple[str, ...], Obj] = {}
    for case in sorted(CASES, key=lambda case: case == last):
        for obj in load_case(case):
            objects[World.key(obj)] = obj
    return list(objects.values())


def test_an_edit_renders_only_the_parts_it_touches() -> None:
    """In the world of every case: an edit of one route's StaticService renders the part of
    that route and its Gateway again, and keeps every other part."""
    objects = every_case(last="staticservice")
    renderer = Renderer(SETTINGS)
    renderer.render(Snapshot.from_objects(objects), NOW)
    total = renderer.rendered_parts
    assert total > 3
    static = next(o for o in objects if o.get("kind") == "StaticService")
    edited = copy.deepcopy(static)
    edited["spec"]["prefixes"] = ["10.99.0.0/16"]
    objects = [edited if o is static else o for o in objects]
    plan = renderer.render(Snapshot.from_objects(objects), NOW)
    assert renderer.rendered_parts == 1 and renderer.kept_parts == total - 1
    assert document(plan) == document(render(Snapshot.from_objects(objects), SETTINGS, NOW))
    assert any("10.99.0.0/16" in str(c.to_dict()) for c in plan.configs.values())


def test_the_echo_of_the_planned_status_renders_nothing_again() -> None:
    """Every Gateway and route given the status the plan wants (as the reconciler's own status
    writes come back): nothing renders again, and the plan is the full render's."""
    objects = every_case()
    renderer = Renderer(SETTINGS)
    plan = renderer.render(Snapshot.from_objects(objects), NOW)
    planned = {(s.api_version, s.kind, s.namespace, s.name): s.status for s in plan.statuses}
    echoed = []
    for obj in objects:
        api_version, kind, namespace, name = World.key(obj)
        status = planned.get((api_version, kind, namespace or "default", name))
        if status is not None and kind != "GatewayClass":
            obj = copy.deepcopy(obj) | {"status": copy.deepcopy(dict(status))}
        echoed.append(obj)
    again = renderer.render(Snapshot.from_objects(echoed), NOW)
    assert renderer.rendered_parts == 0 and renderer.kept_parts > 3
    assert document(again) == document(render(Snapshot.from_objects(echoed), SETTINGS, NOW))


def test_the_echo_of_an_earlier_renders_status_renders_nothing_again() -> None:
    """A render that ran while the status writes of the render before it were on their way
    (cluster mode renders in a thread, beside the writes) plans the same conditions stamped
    with its own, later time. The echo of the earlier write then differs from what the part
    planned in the transition times only: apply keeps the stored ones and writes nothing for
    it, and the part renders nothing again either."""
    objects = every_case()
    earlier = render(Snapshot.from_objects(objects), SETTINGS, NOW)  # its statuses written
    renderer = Renderer(SETTINGS)
    later = NOW + timedelta(seconds=2)
    renderer.render(Snapshot.from_objects(objects), later)  # before the echo: no status yet
    planned = {(s.api_version, s.kind, s.namespace, s.name): s.status for s in earlier.statuses}
    echoed = []
    for obj in objects:
        status = planned.get(_status_key(obj))
        if status is not None and obj.get("kind") != "GatewayClass":
            obj = copy.deepcopy(obj) | {"status": copy.deepcopy(dict(status))}
        echoed.append(obj)
    snapshot = Snapshot.from_objects(echoed)
    again = renderer.render(snapshot, later + timedelta(seconds=2))
    assert renderer.rendered_parts == 0 and renderer.kept_parts > 3
    stored = {_status_key(o): o for o in echoed}

    def current(api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        return stored.get((api_version, kind, namespace, name))

    ours = [s for s in again.statuses if s.kind != "GatewayClass"]  # not echoed here
    assert len(ours) > 3 and status_writes(ours, current) == []


def _status_key(obj: Obj) -> tuple[str, str, str, str]:
    """(apiVersion, kind, namespace, name) as a StatusUpdate names the object."""
    api_version, kind, namespace, name = World.key(obj)
    return api_version, kind, namespace or "default", name
