"""The pure half of bench/machine_bench.py: /proc/stat deltas, a run's figures, medians, the
tables and the issue's targets. No I/O here (tests/bench/ checks it without timing anything).

A run is a dict with what the generator printed (sent, echoed, received, seconds, rtt_p50_ms,
rtt_p99_ms, cpus, stat_before, stat_after) and what the bench read around it (server_cpu_s, and for
an offload row bpf_run_ns / bpf_run_cnt: the kernel's run-time statistics of the program).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

# /proc/stat's "cpu" line: user nice system idle iowait irq softirq steal guest guest_nice. Its
# busy fields are sampled at each timer tick (this kernel has no IRQ_TIME or VIRT_CPU
# accounting): work that wakes and sleeps between two ticks, as a 50-pps voice load does, is
# charged to no one. Its idle and iowait are clock-based on a NO_HZ kernel (the kernel times each
# idle period from its entry to its exit, interrupts excluded). So busy time here is the window's
# wall time on every CPU minus idle and iowait.
IDLE_FIELDS = (3, 4)
DIRECT = "direct"
ANCHOR = "coturn"
LOSS_MARGIN_PP = 0.5
SHARE_TARGET = 5.0  # the relay's share, offload on: >= 5x cheaper than coturn's
MACHINE_TARGET = 2.0  # the whole machine, generator included: >= 2x


def idle_ticks(line: str) -> int:
    """Idle + iowait ticks of all CPUs from /proc/stat's first line ("cpu  ...")."""
    fields = line.split()
    if not fields or fields[0] != "cpu":
        raise ValueError(f"not /proc/stat's all-CPU line: {line!r}")
    values = [int(v) for v in fields[1:9]]
    return sum(values[i] for i in IDLE_FIELDS)


def busy_seconds(
    before: str, after: str, clk_tck: int, seconds: float, cpus: int
) -> tuple[float, float]:
    """(busy, total) CPU-seconds of all CPUs over a window of `seconds` between two /proc/stat
    lines: total is the wall time on every CPU, busy what of it was not idle."""
    total = seconds * cpus
    idle = (idle_ticks(after) - idle_ticks(before)) / clk_tck
    return min(total, max(0.0, total - idle)), total


def figures(run: dict[str, Any], direct: dict[str, Any] | None, clk_tck: int) -> dict[str, Any]:
    """One run's figures; `direct` is the run with no relay in the same repeat (its busy time,
    per second of window, is the generator's and the peer's: subtracted for the relay's share).
    Every echoed round trip is two relayed packets (client -> peer, peer -> client)."""
    busy, total = busy_seconds(
        run["stat_before"], run["stat_after"], clk_tck, run["seconds"], run["cpus"]
    )
    relayed = 2 * run["received"]
    seconds = run["seconds"]
    out: dict[str, Any] = {
        "sent_per_s": run["sent"] / seconds if seconds > 0 else 0.0,
        "relayed_per_s": relayed / seconds if seconds > 0 else 0.0,
        "loss_pct": 100.0 * (run["sent"] - run["received"]) / run["sent"] if run["sent"] else 0.0,
        "rtt_p50_ms": run["rtt_p50_ms"],
        "rtt_p99_ms": run["rtt_p99_ms"],
        "machine_busy_pct": 100.0 * busy / total if total > 0 else 0.0,
        "machine_us_per_pkt": 1e6 * busy / relayed if relayed else None,
        "pkt_per_machine_cpu_s": relayed / busy if busy > 0 else None,
        "server_cpu_s": run.get("server_cpu_s"),
        "pkt_per_server_cpu_s": None,
        "share_us_per_pkt": None,
        "pkt_per_share_cpu_s": None,
        "bpf_ns_per_run": None,
        "bpf_ns_per_pkt": None,
    }
    server_cpu = run.get("server_cpu_s")
    if server_cpu:
        out["pkt_per_server_cpu_s"] = relayed / server_cpu
    if direct is not None and relayed and run is not direct:
        direct_busy, _ = busy_seconds(
            direct["stat_before"], direct["stat_after"], clk_tck, direct["seconds"], direct["cpus"]
        )
        share = busy - direct_busy * seconds / direct["seconds"]
        out["share_us_per_pkt"] = 1e6 * share / relayed
        out["pkt_per_share_cpu_s"] = relayed / share if share > 0 else None
    if run.get("bpf_run_cnt"):
        out["bpf_ns_per_run"] = run["bpf_run_ns"] / run["bpf_run_cnt"]
        out["bpf_ns_per_pkt"] = run["bpf_run_ns"] / relayed if relayed else None
    return out


def median(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over a row's repeats."""
    keys = runs[0].keys()
    return {k: median(r[k] for r in runs) for k in keys} | {"repeats": len(runs)}


def ratio(anchor: float | None, value: float | None) -> float | None:
    """How many times cheaper `value` is than `anchor` (both a cost per packet)."""
    if anchor is None or value is None or value <= 0:
        return None
    return anchor / value


def misses(row: dict[str, Any], coturn: dict[str, Any]) -> list[str]:
    """The issue's targets for an offload row against coturn's medians; [] when all are met."""
    missed = []
    share = ratio(coturn["share_us_per_pkt"], row["share_us_per_pkt"])
    if share is None or share < SHARE_TARGET:
        missed.append(f"share<{SHARE_TARGET:g}x")
    machine = ratio(coturn["machine_us_per_pkt"], row["machine_us_per_pkt"])
    if machine is None or machine < MACHINE_TARGET:
        missed.append(f"machine<{MACHINE_TARGET:g}x")
    if row["loss_pct"] > coturn["loss_pct"] + LOSS_MARGIN_PP:
        missed.append("loss")
    if row["rtt_p99_ms"] > coturn["rtt_p99_ms"]:
        missed.append("p99")
    return missed


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def rtt(value: float | None) -> str:
    """Milliseconds; the generator's last bucket holds every round trip of a second or more."""
    if value is None or value < 0:  # no packet came back
        return "-"
    return ">=1000" if value >= 1000 else f"{value:.2f}"


def times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


COLUMNS = (
    "| case | row | relayed pkt/s | loss % | RTT p50 / p99 ms | machine busy % "
    "| machine µs/pkt (pkt/CPU-s) | relay's share µs/pkt (pkt/CPU-s) "
    "| share: x cheaper than coturn "
    "| machine: x cheaper than coturn | server CPU-s (pkt/server CPU-s) "
    "| BPF ns/run (ns/pkt) | targets |"
)


def table(
    rows: dict[tuple[str, str], dict[str, Any]],
    offload_rows: Iterable[str],
    offload_off: dict[str, str] | None = None,
) -> str:
    """One Markdown row per (case, row) of medians, with the ratios against coturn's row of the
    same case and the targets of the offload rows; `offload_off`: row -> why its offload did
    not run (stunnerd's WARNING), said in place of the targets."""
    offload, off = set(offload_rows), offload_off or {}
    lines = [COLUMNS, "|" + "---|" * 13]
    for (case, name), m in rows.items():
        coturn = rows.get((case, ANCHOR))
        share_x = machine_x = None
        target = ""
        if coturn is not None and name not in (DIRECT, ANCHOR):
            share_x = ratio(coturn["share_us_per_pkt"], m["share_us_per_pkt"])
            machine_x = ratio(coturn["machine_us_per_pkt"], m["machine_us_per_pkt"])
            if name in off:
                target = f"offload off: {off[name]}"
            elif name in offload:
                missed = misses(m, coturn)
                target = "met" if not missed else "MISSED: " + ", ".join(missed)
        server = (
            "-"
            if m["server_cpu_s"] is None
            else f"{m['server_cpu_s']:.2f} ({fmt(m['pkt_per_server_cpu_s'], ',.0f')})"
        )
        lines.append(
            f"| {case} | {name} | {fmt(m['relayed_per_s'], ',.0f')} | {fmt(m['loss_pct'], '.2f')}"
            f" | {rtt(m['rtt_p50_ms'])} / {rtt(m['rtt_p99_ms'])}"
            f" | {fmt(m['machine_busy_pct'], '.0f')} | {fmt(m['machine_us_per_pkt'], '.2f')}"
            f" ({fmt(m['pkt_per_machine_cpu_s'], ',.0f')}) | {fmt(m['share_us_per_pkt'], '.2f')}"
            f" ({fmt(m['pkt_per_share_cpu_s'], ',.0f')}) | {times(share_x)} | {times(machine_x)}"
            f" | {server} | {fmt(m['bpf_ns_per_run'], '.0f')} ({fmt(m['bpf_ns_per_pkt'], '.0f')})"
            f" | {target} |"
        )
    return "\n".join(lines) + "\n"


LAST_STEP = "the last step"
SHORT_OF_RATE = 0.95  # the generator sent less than this share of the offered rate


def max_rate(steps: list[tuple[float, dict[str, Any]]], max_loss_pct: float) -> dict[str, Any]:
    """The highest step (offered pps, figures) with loss <= max_loss_pct, and what ended the
    steps: loss above the limit, or the generator short of the offered rate (its core is full:
    that step still counts)."""
    best: dict[str, Any] = {"offered": None, "figures": None, "stopped_by": LAST_STEP}
    for offered, fig in steps:
        if fig["loss_pct"] > max_loss_pct:
            best["stopped_by"] = f"loss {fig['loss_pct']:.1f} % at {offered:,.0f} pps offered"
            break
        best["offered"], best["figures"] = offered, fig
        if fig["sent_per_s"] < SHORT_OF_RATE * offered:
            best["stopped_by"] = (
                f"the generator sent {fig['sent_per_s']:,.0f} of {offered:,.0f} pps"
            )
            break
    return best


def max_table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| row | offered pps (last <= loss limit) | relayed pkt/s | loss % | RTT p50 / p99 ms "
        "| machine busy % | machine µs/pkt | ÷ direct (the kernel's loopback) | stopped by |",
        "|" + "---|" * 9,
    ]
    direct = results.get(DIRECT, {}).get("figures")
    for name, best in results.items():
        f = best["figures"]
        if f is None:
            lines.append(f"| {name} | - | - | - | - | - | - | - | {best['stopped_by']} |")
            continue
        share = (
            f["relayed_per_s"] / direct["relayed_per_s"]
            if direct and direct["relayed_per_s"]
            else None
        )
        lines.append(
            f"| {name} | {best['offered']:,.0f} | {f['relayed_per_s']:,.0f} "
            f"| {f['loss_pct']:.2f} | {rtt(f['rtt_p50_ms'])} / {rtt(f['rtt_p99_ms'])}"
            f" | {f['machine_busy_pct']:.0f} | {fmt(f['machine_us_per_pkt'], '.2f')}"
            f" | {times(share)} | {best['stopped_by']} |"
        )
    return "\n".join(lines) + "\n"
