"""Go STUNner operator's flags and env that mean the same here (ANCHORS §2.1): parsed into the
settings, and what each one does against the fake API server."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from reconciler.__main__ import build_parser, cluster_settings, main
from reconciler.cluster import ClusterSettings
from reconciler.render import RenderSettings, render
from reconciler.render.finalize import SHUTDOWN_ERROR
from reconciler.render.plan import DEFAULT_LABEL_FILTER
from reconciler.store import Snapshot
from tests.reconciler import clusterkit as k
from tests.support.fakeapi import FakeApiServer

GW = k.GW
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def settings(*argv: str) -> ClusterSettings:
    return cluster_settings(build_parser().parse_args(list(argv)))


def test_defaults_are_gos() -> None:
    got = settings()
    assert got.render_settings.endpoint_discovery is True
    assert got.watch_endpoint_slices is True
    assert got.enable_finalizer is False
    assert got.render_settings.label_filter == DEFAULT_LABEL_FILTER


@pytest.mark.parametrize(
    "argv",
    [
        ["--disable-endpointslice-controller"],
        ["--disable-endpontslice-controller"],  # Go's spelling
        ["--disable-endpontslice-controller=true"],
    ],
)
def test_disabling_the_endpointslice_controller_turns_endpoint_discovery_off(
    argv: list[str],
) -> None:
    got = settings(*argv)
    assert got.watch_endpoint_slices is False
    assert got.render_settings.endpoint_discovery is False


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--endpoint-discovery=false"], False),
        (["--endpoint-discovery", "f"], False),
        (["--endpoint-discovery"], True),
        (["--disable-endpointslice-controller=false"], True),
    ],
)
def test_go_bool_flags(argv: list[str], expected: bool) -> None:
    assert settings(*argv).render_settings.endpoint_discovery is expected


def test_enable_finalizer_flag() -> None:
    assert settings("--enable-finalizer").enable_finalizer is True
    assert settings("--enable-finalizer=false").enable_finalizer is False


def test_a_bool_flag_that_is_no_bool_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        settings("--enable-finalizer=maybe")
    assert exited.value.code == 2
    assert "not a boolean: 'maybe'" in capsys.readouterr().err


def test_legacy_dataplane_mode_is_refused_with_the_reason(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["--dataplane-mode=legacy"]) == 2
    err = capsys.readouterr().err
    assert "--dataplane-mode=legacy is not supported" in err and "config discovery" in err
    monkeypatch.setenv("STUNNER_GATEWAY_OPERATOR_DATAPLANE_MODE", "managed-ish")
    assert main([]) == 2
    assert "unknown dataplane mode 'managed-ish'" in capsys.readouterr().err
    assert build_parser().parse_args(["--dataplane-mode=managed"]).dataplane_mode == "managed"


def test_the_node_port_range_flag_admits_a_nodeport_annotation_within_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A cluster whose kube-apiserver has another --service-node-port-range: the chart passes
    webhook.nodePortRange to the webhook and to the reconciler alike. Without the flag render
    ignored (as refused) a nodeport annotation the webhook had admitted, and the Service got a
    random NodePort."""
    annotations = {
        "stunner.l7mp.io/service-type": "NodePort",
        "stunner.l7mp.io/nodeport": '{"udp":20001}',
    }
    objects = [
        k.gateway_class(),
        k.gateway_config(),
        k.dataplane(),
        k.gateway(annotations=annotations),
    ]

    def node_ports(render_settings: RenderSettings) -> list[int | None]:
        plan = render(Snapshot.from_objects(objects), render_settings, NOW)
        return [p.get("nodePort") for p in plan.services["stunner/gw"]["spec"]["ports"]]

    custom = settings("--node-port-range=20000-22767").render_settings
    assert custom.rules.node_port_range == (20000, 22767)
    assert node_ports(custom) == [20001]
    assert settings().render_settings.rules.node_port_range == (30000, 32767)
    assert node_ports(settings().render_settings) == [None]  # outside the default range
    with pytest.raises(SystemExit):
        settings("--node-port-range=32767-30000")
    assert "expected low-high within 1-65535, got '32767-30000'" in capsys.readouterr().err


def test_the_label_filter_env_replaces_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STUNNER_GATEWAY_OPERATOR_LABEL_FILTER", " team , example.com/owner,")
    filtered = settings().render_settings.label_filter
    assert filtered == ("team", "example.com/owner")
    labels = {"team": "media", "example.com/owner": "ops", "app.kubernetes.io/managed-by": "x"}
    objects = [
        k.gateway_class(),
        k.gateway_config(),
        k.dataplane(),
        k.gateway(labels=labels),
    ]
    plan = render(Snapshot.from_objects(objects), RenderSettings(label_filter=filtered), NOW)
    deployment_labels = plan.deployments["stunner/gw"]["metadata"]["labels"]
    assert "team" not in deployment_labels and "example.com/owner" not in deployment_labels
    assert deployment_labels["app.kubernetes.io/managed-by"] == "x"  # no longer filtered
    default = render(Snapshot.from_objects(objects), RenderSettings(), NOW)
    assert (
        "app.kubernetes.io/managed-by"
        not in default.deployments["stunner/gw"]["metadata"]["labels"]
    )


def test_the_finalizer_invalidates_our_statuses_and_deletes_our_objects(tmp_path: Path) -> None:
    async def main_() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path, enable_finalizer=True) as running:
                await k.settled(running, fake)
                assert k.get(fake, "apps/v1", "Deployment", "gw") is not None
                await running.mode.shutdown()
                assert k.get(fake, "apps/v1", "Deployment", "gw") is None
                assert k.get(fake, "v1", "Service", "gw") is None
                gateway = k.get(fake, GW, "Gateway", "gw")
                klass = fake.get_object(GW, "GatewayClass", "", "stunner")
                assert gateway is not None and klass is not None
                accepted = {c["type"]: c for c in gateway["status"]["conditions"]}
                assert accepted["Accepted"]["status"] == "False"
                assert SHUTDOWN_ERROR in accepted["Accepted"]["message"]
                assert accepted["Programmed"]["reason"] == "Invalid"
                (class_accepted,) = klass["status"]["conditions"]
                assert class_accepted["reason"] == "InvalidParameters"
                assert SHUTDOWN_ERROR in class_accepted["message"]
                # Writing has stopped: nothing comes back.
                running.mode.reconciler.trigger()
                await asyncio.sleep(0.3)
                assert k.get(fake, "apps/v1", "Deployment", "gw") is None

    asyncio.run(main_())


def test_without_the_finalizer_shutdown_leaves_everything(tmp_path: Path) -> None:
    async def main_() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                writes = len(k.object_writes(fake))
                await running.mode.shutdown()
                assert len(k.object_writes(fake)) == writes
                assert k.get(fake, "apps/v1", "Deployment", "gw") is not None

    asyncio.run(main_())


def test_no_endpointslice_is_watched_when_the_controller_is_disabled(tmp_path: Path) -> None:
    async def main_() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            off = settings("--disable-endpointslice-controller")
            async with k.reconciler(
                fake,
                tmp_path,
                watch_endpoint_slices=off.watch_endpoint_slices,
                render_settings=off.render_settings,
            ) as running:
                await k.settled(running, fake)
                assert "stunner/gw" in running.mode.store.configs
        assert not [path for _, path in fake.requests if "endpointslices" in path]
        assert any("udproutes" in path for _, path in fake.requests)

    asyncio.run(main_())


def test_lease_timings_and_leader_only_cds_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """Go durations into the elector's settings (client-go's defaults without them), and
    timings out of order refused with exit 2 and what is needed, before any connection."""
    got = settings()
    assert (got.lease_duration, got.renew_deadline, got.retry_period) == (15.0, 10.0, 2.0)
    assert not got.cds_leader_only
    got = settings(
        "--cds-leader-only",
        "--leader-election-lease-duration=3s",
        "--leader-election-renew-deadline=2s",
        "--leader-election-retry-period=500ms",
    )
    assert got.cds_leader_only
    assert (got.lease_duration, got.renew_deadline, got.retry_period) == (3.0, 2.0, 0.5)
    assert main(["--leader-elect", "--leader-election-retry-period=20s"]) == 2
    err = capsys.readouterr().err
    assert "--leader-election-retry-period < --leader-election-renew-deadline" in err
    assert "(got 20s, 10s, 15s)" in err
