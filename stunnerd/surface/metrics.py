"""Prometheus metrics of stunnerd: Go STUNner's names and labels (ANCHORS §1.6), plus the
`process_*` and `python_*` families a Python exporter is expected to have.

The families come from prometheus_client's metric types and collectors; the exposition is ours
because it must be exact: prometheus_client writes every value as a float in Go's `%g` style
(a byte counter of 2,011,376 becomes `2.011376e+06`, and a counter past 2**53 loses digits).
Here integers are written as integers and floats with full precision (`repr`), which
prometheus_client's own text parser reads back unchanged (see the tests).

With UDP worker processes (`-u N`), every stunner_* value and `process_cpu_seconds_total` /
`process_resident_memory_bytes` count the whole stunnerd (the primary plus its workers); the
other process_* and python_* families describe the primary process.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol

from ..turn.counters import ClusterCounters, Counters, ListenerCounters

if TYPE_CHECKING:
    from prometheus_client.core import Metric

# prometheus_client (~2 MiB of RSS) is imported at the first scrape: a stunnerd without a
# metrics endpoint never loads it (bench/rss_bench.py).

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsView(Protocol):
    """What the metrics read of a running stunnerd: counters of every process, added up."""

    @property
    def allocation_count(self) -> int: ...

    def listener_stats(self) -> Mapping[str, ListenerCounters]: ...

    def listener_allocations(self) -> Mapping[str, int]: ...

    def listener_offload(self) -> Mapping[str, Mapping[str, Any]]:
        """Per listener: the kernel offload on, or why not (Listener.offload_state)."""
        ...

    def cluster_counters(self) -> Mapping[str, ClusterCounters]: ...

    def worker_usage(self) -> tuple[float, int]:
        """CPU seconds and resident bytes of the UDP workers (the dead ones' CPU included)."""
        ...

    @property
    def user_quota_shared(self) -> bool | None:
        """With a user quota: whether it is counted across the pods (the CDS connected), else
        None."""
        ...


def stunner_families(view: MetricsView) -> Iterator[Metric]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    stats = sorted(view.listener_stats().items())
    active = view.listener_allocations()
    yield GaugeMetricFamily(
        "stunner_allocations_active", "Number of active allocations.", value=view.allocation_count
    )
    connections = GaugeMetricFamily(
        "stunner_listener_connections",
        "Number of active downstream connections.",
        labels=["name"],
    )
    total = CounterMetricFamily(
        "stunner_listener_connections",
        "Number of downstream connections (allocations) since start.",
        labels=["name"],
    )
    for name, counters in stats:
        connections.add_metric([name], active.get(name, 0))
        total.add_metric([name], counters.allocations_total)
    yield connections
    yield total
    dropped = CounterMetricFamily(
        "stunner_listener_dropped_packets",
        "Number of packets dropped on the listener, by reason.",
        labels=["name", "reason"],
    )
    for name, counters in stats:
        for reason, count in counters.drops().items():
            dropped.add_metric([name, reason], count)
    yield dropped
    refused = CounterMetricFamily(
        "stunner_listener_allocations_refused",
        "Number of Allocate requests refused, by reason: quota (486, admin.user_quota), full "
        "(508, --max-allocations), draining (508, after SIGTERM), rate (508, --allocation-rate), "
        "revoked (403, auth.revoked_users).",
        labels=["name", "reason"],
    )
    for name, counters in stats:
        for reason, count in counters.refusals().items():
            refused.add_metric([name, reason], count)
    yield refused
    yield from _by_direction("listener", "on the listener", stats, ("rx", "tx"))
    offload = GaugeMetricFamily(
        "stunner_listener_offload",
        "1 while the kernel offload relays the listener's TURN-UDP ChannelData, with how: tc, "
        "xdp_driver, xdp_generic, xdp_mixed; else 0 with why: disabled (admin.offload_engine "
        "None), protocol (not TURN-UDP), capability (no CAP_BPF/CAP_NET_ADMIN), kernel (no "
        "tcx: Linux < 6.6), busy (another XDP program on the interface), verifier, not_built, "
        "native (no native engine), engine (unknown), interface, error; the text is in /status.",
        labels=["name", "reason"],
    )
    for name, state in sorted(view.listener_offload().items()):
        offload.add_metric([name, state.get("code", "")], int(bool(state["on"])))
    yield offload
    for unit in ("packets", "bytes"):
        offloaded = CounterMetricFamily(
            f"stunner_listener_offloaded_{unit}",
            f"Number of {unit} on the listener that the kernel offload relayed (of "
            f"stunner_listener_{unit}_total).",
            labels=["direction", "name"],
        )
        for name, counters in stats:
            for direction in ("rx", "tx"):
                value = getattr(counters, f"offloaded_{direction}_{unit}")
                offloaded.add_metric([direction, name], value)
        yield offloaded
    clusters = sorted(view.cluster_counters().items())
    yield from _by_direction("cluster", "to and from the cluster", clusters, ("tx", "rx"))
    shared = view.user_quota_shared
    if shared is not None:
        yield GaugeMetricFamily(
            "stunner_user_quota_shared",
            "1 while admin.user_quota counts every pod's allocations (the CDS connected), 0 "
            "while it counts this pod's only.",
            value=int(shared),
        )


def _by_direction(
    kind: str, where: str, rows: Sequence[tuple[str, Counters]], directions: tuple[str, str]
) -> Iterator[Metric]:
    """stunner_<kind>_packets_total and _bytes_total, labelled by direction and name."""
    from prometheus_client.core import CounterMetricFamily

    for unit in ("packets", "bytes"):
        family = CounterMetricFamily(
            f"stunner_{kind}_{unit}", f"Number of {unit} {where}.", labels=["direction", "name"]
        )
        for name, counters in rows:
            for direction in directions:
                family.add_metric([direction, name], getattr(counters, f"{direction}_{unit}"))
        yield family


class _Runtime:
    """prometheus_client's process, platform and GC collectors, with the workers' CPU and
    memory added to this process's."""

    def __init__(self) -> None:
        from prometheus_client import (
            CollectorRegistry,
            GCCollector,
            PlatformCollector,
            ProcessCollector,
        )

        self.registry = CollectorRegistry(auto_describe=False)
        self.process = ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def families(self, view: MetricsView) -> Iterator[Metric]:
        worker_cpu, worker_rss = view.worker_usage()
        extra = {
            "process_cpu_seconds_total": worker_cpu,
            "process_resident_memory_bytes": worker_rss,
        }
        for family in self.registry.collect():
            family.samples = [
                s._replace(value=s.value + extra[s.name]) if s.name in extra else s
                for s in family.samples
            ]
            yield family


@cache
def _runtime() -> _Runtime:
    return _Runtime()


def render_metrics(view: MetricsView) -> str:
    """The text exposition (format 0.0.4) of every family."""
    return exposition([*stunner_families(view), *_runtime().families(view)])


def exposition(families: Iterable[Metric]) -> str:
    lines: list[str] = []
    for family in families:
        name = family.name + "_total" if family.type == "counter" else family.name
        lines.append(f"# HELP {name} {_help(family.documentation)}")
        lines.append(f"# TYPE {name} {family.type}")
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue  # not part of Go STUNner's (or the 0.0.4 text format's) families
            labels = ",".join(f'{k}="{_label(v)}"' for k, v in sorted(sample.labels.items()))
            lines.append(f"{sample.name}{{{labels}}} " if labels else f"{sample.name} ")
            lines[-1] += format_value(sample.value)
    return "\n".join(lines) + "\n"


def format_value(value: float) -> str:
    """Integers as integers, floats with every digit (shortest round-trip repr)."""
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")
