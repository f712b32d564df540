"""The chart's observability objects against what really runs: the PodMonitor finds a metrics
endpoint on every stunnerd pod of the default Dataplane, each alert and dashboard panel reads
metrics a running stunnerd and a running reconciler expose (scraped here, not listed), and the
allocation alert compares against the cap stunnerd is started with."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stunner_api.vocabulary import CDS_TOKEN_AUDIENCE
from stunner_cli import offline
from stunnerd.process.cli import build_parser as stunnerd_parser
from stunnerd.process.cli import limits_from
from tests.charts.conftest import CHART, NAMESPACE, ROOT, chart_api, of_kind, refused, render
from tests.support.ports import free_port

MONITORED = ("observability.podMonitor=true", "observability.serviceMonitor=true")
RULES = (*MONITORED, "observability.prometheusRule=true")
# Series Prometheus makes itself for every target, not the target's.
PROMETHEUS_OWN = {"up"}
PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not functions,
    keywords, label names (matchers, grouping lists) or range durations."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = re.findall(r"(?<![\w.])([a-zA-Z_:][\w:]*)\b(?!\s*\()", expr)
    return {n for n in names if n not in PROMQL_WORDS}


def alerts(manifests: list[dict[str, Any]]) -> dict[str, str]:
    (rule,) = of_kind(manifests, "PrometheusRule")
    return {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}


def dashboard_exprs(manifests: list[dict[str, Any]]) -> list[str]:
    (dashboard,) = [c for c in of_kind(manifests, "ConfigMap") if "dashboard" in str(c)]
    panels = json.loads(dashboard["data"]["stunner.json"])["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def exposed(text: str) -> set[str]:
    """Every series name an exposition can carry, families without samples included."""
    names = set()
    for family in text_string_to_metric_families(text):
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_sum", "_count"),
            "summary": ("", "_sum", "_count"),
        }.get(family.type, ("",))
        names |= {family.name + s for s in suffixes} | {s.name for s in family.samples}
    return names


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return str(answer.read().decode())


def until(check: Any, what: str, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
            if value:
                return value
        except OSError:
            pass
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def gauge(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not exposed")


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A cluster-mode reconciler (against the fake API server) and a stunnerd serving a config
    with listeners and its metrics endpoint: each one's /metrics URL, and the CDS's."""
    tmp = tmp_path_factory.mktemp("observability")
    metrics, udp, tcp = free_port(), free_port(), free_port()
    config = {
        "version": "v1",
        "admin": {
            "name": "t/gw",
            "healthcheck_endpoint": "",
            "metrics_endpoint": f"http://127.0.0.1:{metrics}/metrics",
            "user_quota": 5,  # stunner_user_quota_shared is exposed with a quota
        },
        "auth": {"type": "static", "credentials": {"username": "u", "password": "p"}},
        "listeners": [
            {"name": "t/gw/udp", "protocol": "TURN-UDP", "address": "127.0.0.1", "port": udp},
            {"name": "t/gw/tcp", "protocol": "TURN-TCP", "address": "127.0.0.1", "port": tcp},
        ],
        "clusters": [{"name": "t/echo", "endpoints": ["127.0.0.1/32"]}],
    }
    (tmp / "stunnerd.json").write_text(json.dumps(config))
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "stunnerd", "-u", "1", "-c", str(tmp / "stunnerd.json")],
            stderr=subprocess.DEVNULL,
        )
    ]
    cds, health, reconciler_metrics = free_port(), free_port(), free_port()
    with chart_api() as api:
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "reconciler"]
                + ["--kubeconfig", str(api.write_kubeconfig(tmp / "kubeconfig"))]
                + ["--leader-elect", "--leader-election-namespace", NAMESPACE]
                + ["--config-discovery-address", f"127.0.0.1:{cds}"]
                + ["--health-probe-bind-address", f"127.0.0.1:{health}"]
                + ["--metrics-bind-address", f"127.0.0.1:{reconciler_metrics}"],
                stderr=subprocess.DEVNULL,
            )
        )
        # What the kubelet writes for t/gw's stunnerd pod: the CDS requires its token.
        token = tmp / "token"
        token.write_text(api.issue_token("t", "gw-stunnerd", (CDS_TOKEN_AUDIENCE,)))
        try:
            yield {
                "stunnerd": f"http://127.0.0.1:{metrics}/metrics",
                "reconciler": f"http://127.0.0.1:{reconciler_metrics}/metrics",
                "cds": f"http://127.0.0.1:{cds}",
                "token": str(token),
            }
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def test_the_pod_monitor_turns_the_default_dataplanes_metrics_on(helm: Path) -> None:
    for sets, wanted in (
        ((), False),
        (("observability.podMonitor=true",), True),
        (("dataplane.spec.enableMetricsEndpoint=true",), True),
    ):
        (dataplane,) = of_kind(render(helm, *sets), "Dataplane")
        assert dataplane["spec"]["enableMetricsEndpoint"] is wanted, sets
    # the config the reconciler renders with that Dataplane names the endpoint stunnerd opens
    (dataplane,) = of_kind(render(helm, "observability.podMonitor=true"), "Dataplane")
    objects = offline.load(ROOT / "examples" / "cluster")
    plan = offline.plan([*objects, offline.Located(CHART, 1, "", dataplane)])
    (config,) = plan.configs.values()
    assert config.admin.metrics_endpoint == "http://:8080/metrics"
    (monitor,) = of_kind(render(helm, "observability.podMonitor=true"), "PodMonitor")
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics-port"]


def test_a_pod_monitor_with_metrics_turned_off_is_refused(helm: Path) -> None:
    error = refused(
        helm, "observability.podMonitor=true", "dataplane.spec.enableMetricsEndpoint=false"
    )
    assert "dataplane.spec.enableMetricsEndpoint=false" in error
    assert "every pod would be reported down" in error


def test_alerts_are_rendered_only_for_what_is_scraped(helm: Path) -> None:
    dataplane_only = alerts(render(helm, "observability.podMonitor=true", RULES[-1]))
    reconciler_only = alerts(render(helm, "observability.serviceMonitor=true", RULES[-1]))
    assert dataplane_only and reconciler_only
    assert all("stunner_reconciler" not in expr for expr in dataplane_only.values())
    assert all(
        "up{" not in expr and "stunner_reconciler" in expr for expr in reconciler_only.values()
    )
    assert "needs observability.podMonitor" in refused(helm, RULES[-1])


def test_every_alert_and_panel_reads_metrics_that_are_exposed(
    helm: Path, running: dict[str, str]
) -> None:
    manifests = render(helm, *RULES, "observability.grafanaDashboard=true")
    names = PROMETHEUS_OWN.copy()
    for url in (running["stunnerd"], running["reconciler"]):
        names |= exposed(until(lambda url=url: scrape(url), url))
    assert "stunner_allocations_active" in names and "stunner_reconciler_leader" in names
    panels = {f"panel {i}": expr for i, expr in enumerate(dashboard_exprs(manifests))}
    exprs = {**alerts(manifests), **panels}
    assert len(exprs) > 10
    for where, expr in exprs.items():
        read = metric_names(expr)
        assert read, f"{where}: {expr} reads no metric"
        assert read <= names, f"{where}: {expr} reads {sorted(read - names)}, which nothing exposes"
    (monitor,) = of_kind(manifests, "PodMonitor")
    job = f"{NAMESPACE}/{monitor['metadata']['name']}"  # the Prometheus Operator's job label
    for name, expr in alerts(manifests).items():
        if "up{" in expr:
            assert f'up{{job="{job}"}}' in expr, name


def test_the_config_alert_counts_one_cds_watch_per_stunnerd(
    helm: Path, running: dict[str, str], tmp_path: Path
) -> None:
    """StunnerDataplaneNotWatchingConfig compares answering stunnerd pods with the CDS's open
    watches: a stunnerd following its config (-w) is exactly one watch, and none once gone."""
    expr = alerts(render(helm, *RULES))["StunnerDataplaneNotWatchingConfig"]
    assert "stunner_reconciler_cds_clients" in metric_names(expr)
    clients = running["reconciler"]
    until(lambda: gauge(scrape(clients), "stunner_reconciler_cds_clients") == 0, "no watch")
    stunnerd = subprocess.Popen(
        [sys.executable, "-m", "stunnerd", "-w", "-u", "1", "-c", running["cds"], "-i", "t/gw"],
        stderr=subprocess.DEVNULL,
        env=os.environ | {"STUNNER_CDS_TOKEN_FILE": running["token"]},
    )
    try:
        until(lambda: gauge(scrape(clients), "stunner_reconciler_cds_clients") == 1, "a watch")
    finally:
        stunnerd.terminate()
        stunnerd.wait(10)
    until(lambda: gauge(scrape(clients), "stunner_reconciler_cds_clients") == 0, "watch gone")


def test_the_allocation_alert_compares_against_the_cap_stunnerd_runs_with(helm: Path) -> None:
    manifests = render(helm, *RULES, "dataplane.maxAllocations=1234")
    (dataplane,) = of_kind(manifests, "Dataplane")
    env = {e["name"]: e["value"] for e in dataplane["spec"]["env"]}
    monkeypatch = pytest.MonkeyPatch()
    with monkeypatch.context() as patched:
        for key, value in env.items():
            patched.setenv(key, value)
        args = stunnerd_parser().parse_args(dataplane["spec"]["args"])  # stunnerd's own flags
    assert limits_from(args).max_allocations == 1234
    expr = alerts(manifests)["StunnerAllocationsNearCap"]
    assert expr.endswith("> 0.8 * 1234")
    for bad in ("dataplane.spec.args={-w,--max-allocations=9}", "dataplane.spec.env[0].name="
                "STUNNER_MAX_ALLOCATIONS,dataplane.spec.env[0].value=9"):  # fmt: skip
        assert "set dataplane.maxAllocations" in refused(helm, bad)
