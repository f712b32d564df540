"""The Go v2.0.2 render fixes (issue 31), beyond the dual-stack golden case
(tests/data/render/dual-stack): without endpoint discovery an ExternalName backend is not
rendered as a STRICT_DNS name either (its cluster DNS name resolves to whatever host it aliases,
outside the policy), and an ExternalName Service is never the Gateway's Service."""

from __future__ import annotations

from reconciler.render import RenderSettings, render
from reconciler.store import Snapshot
from tests.reconciler.test_render_golden import NOW, load_case


def test_an_external_name_backend_is_no_strict_dns_name() -> None:
    objects = load_case("dual-stack")
    plan = render(Snapshot.from_objects(objects), RenderSettings(endpoint_discovery=False), NOW)
    [cluster] = plan.configs["stunner/dual-gateway"].clusters
    assert cluster.type == "STRICT_DNS"
    assert cluster.endpoints == ["media-server-pool.stunner.svc.cluster.local"]


def test_every_address_family_of_a_backend_and_of_the_load_balancer() -> None:
    objects = load_case("dual-stack")
    plan = render(Snapshot.from_objects(objects), RenderSettings(), NOW)
    config = plan.configs["stunner/dual-gateway"]
    assert set(config.clusters[0].endpoints) == {
        "10.96.0.50",
        "fd00:10:96::50",
        "10.244.0.51",
        "fd00:10:244::51",
    }
    assert config.admin.relay_address_family == "DualStack"
    [status] = [s for s in plan.statuses if s.name == "dual-gateway" and s.kind == "Gateway"]
    assert [a["value"] for a in status.status["addresses"]] == ["198.51.100.40", "2001:db8::40"]


def test_an_external_name_service_is_never_the_gateways() -> None:
    objects = [
        o
        for o in load_case("dual-stack")
        if not (o["kind"] == "Service" and o["metadata"]["name"] == "dual-gateway")
    ]
    plan = render(Snapshot.from_objects(objects), RenderSettings(), NOW)
    assert plan.configs["stunner/dual-gateway"].listeners[0].public_address == ""
    assert not any("dual-gateway-alias" in str(f) for f in plan.findings), plan.findings
