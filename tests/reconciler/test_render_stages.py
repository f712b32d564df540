"""The render stages (reconciler/render/context.py), each run alone on real objects: a pure
function of a frozen context and the frozen values of the stages before it, giving back its
value, its findings and its statuses. core.py only runs them; the golden cases
(test_render_golden.py) show that the plan they make together is the one render always made.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reconciler.render import (
    RenderSettings,
    addresses,
    classes,
    config,
    deployment,
    gateways,
    listeners,
    manifests,
    render,
    routes,
)
from reconciler.render.context import Context, Staged
from reconciler.store import Kind, Snapshot
from tests.reconciler.test_render_golden import CASES, NOW, load_case

RENDER = Path(__file__).resolve().parents[2] / "reconciler" / "render"
STAGES = [
    classes.resolve,
    listeners.plan_gateway,
    routes.attach,
    addresses.listener_addresses,
    config.dataplane_config,
    manifests.service_of,
    deployment.deployment_of,
    gateways.gateway_status,
]


def test_no_render_module_is_over_350_lines() -> None:
    sizes = {path.name: len(path.read_text().splitlines()) for path in RENDER.glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 350} == {}


@pytest.mark.parametrize("stage", STAGES, ids=lambda stage: stage.__module__.rsplit(".", 1)[1])
def test_each_stage_returns_once(stage: Callable[..., Staged[Any]]) -> None:
    """A stage is one path through to one result (its helpers decide, it gathers)."""
    tree = ast.parse(inspect.getsource(stage))
    assert sum(isinstance(node, ast.Return) for node in ast.walk(tree)) == 1


def context(objects: list[dict[str, object]]) -> Context:
    return Context.of(Snapshot.from_objects(objects), RenderSettings(), NOW)


def test_the_stages_alone_make_the_config_render_makes() -> None:
    """classes -> listeners -> routes -> addresses -> config, by hand, on the spec's
    udp-gateway: the config render serves, and nothing of the snapshot touched."""
    objects = load_case("udp-gateway")
    before = copy.deepcopy(objects)
    ctx = context(objects)
    [gateway_class] = classes.ours(ctx)
    resolved = classes.resolve(ctx, gateway_class)
    assert resolved.value.error is None and resolved.findings == ()
    gateway = ctx.snapshot.get(Kind.GATEWAY, "stunner", "udp-gateway")
    assert gateway is not None
    planned = listeners.plan_gateway(ctx, gateway, resolved.value)
    plan = planned.value
    [listener] = plan.listeners
    assert listener.rendered and listener.name == "udp-listener"
    route = ctx.snapshot.get(Kind.STUNNER_UDP_ROUTE, "stunner", "media-plane-route")
    assert route is not None
    attached = routes.attach(ctx, route, {plan.key: plan}, masked=False)
    assert attached.value.listeners == ((plan.key, 0),)
    assert attached.value.cluster is not None and attached.value.cluster.problems == []
    [route_status] = attached.statuses
    assert route_status.status["parents"][0]["conditions"][0]["reason"] == "Accepted"
    publics = addresses.listener_addresses(ctx, plan).value
    assert publics == (("203.0.113.10", 3478, ()),)  # (address, port, the other addresses)
    cluster = {"stunner/media-plane-route": attached.value.cluster}
    made = config.dataplane_config(ctx, plan, publics, {(plan.key, 0): tuple(cluster)}, cluster)
    rendered = render(Snapshot.from_objects(load_case("udp-gateway")), RenderSettings(), NOW)
    assert made.value == rendered.configs["stunner/udp-gateway"] and made.findings == ()
    assert objects == before


def test_a_class_without_its_gateway_config_holds_its_gateways_pending() -> None:
    objects = [o for o in load_case("udp-gateway") if o["kind"] != "GatewayConfig"]
    ctx = context(objects)
    [gateway_class] = classes.ours(ctx)
    resolved = classes.resolve(ctx, gateway_class)
    error = "No GatewayConfig found for name: stunner/stunner-gatewayconfig"
    assert resolved.value.error == error
    assert [(f.kind, f.reason) for f in resolved.findings] == [
        ("GatewayClass", "InvalidParameters")
    ]
    [class_status] = resolved.statuses
    assert class_status.status["conditions"][0]["status"] == "False"
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.value.error = None  # type: ignore[misc]
    gateway = ctx.snapshot.get(Kind.GATEWAY, "stunner", "udp-gateway")
    assert gateway is not None
    planned = listeners.plan_gateway(ctx, gateway, resolved.value)
    assert planned.value.error == error and planned.value.listeners == ()
    assert planned.findings == ()  # the class's error is found once, by the status stage
    status = gateways.gateway_status(ctx, planned.value)
    assert [(f.kind, f.message) for f in status.findings] == [("Gateway", error)]
    [update] = status.statuses
    [entry] = update.status["listeners"]
    assert [(c["status"], c["reason"]) for c in entry["conditions"]] == [("Unknown", "Pending")]


@pytest.mark.parametrize("case", CASES)
def test_render_leaves_its_objects_as_they_were(case: str) -> None:
    objects = load_case(case)
    before = copy.deepcopy(objects)
    render(Snapshot.from_objects(objects), RenderSettings(), NOW)
    assert objects == before
