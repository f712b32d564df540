"""bench/machine_figures.py, the pure half of bench/machine_bench.py: /proc/stat deltas, a
run's figures against the direct run, the targets and the tables. Nothing here is timed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import machine_figures as mf  # noqa: E402  (bench/ is not a package)

CLK = 100


def stat(user: int, system: int, idle: int, iowait: int = 0, softirq: int = 0) -> str:
    # user nice system idle iowait irq softirq steal guest guest_nice
    return f"cpu  {user} 0 {system} {idle} {iowait} 0 {softirq} 0 7 0"


def run(busy_ticks: int, received: int, sent: int | None = None, **more: Any) -> dict[str, Any]:
    """A 10-s window on 2 CPUs (2,000 ticks) of which busy_ticks were not idle. The tick-sampled
    busy fields say nothing here (0 of them moved): only idle counts."""
    return {
        "sent": sent if sent is not None else received,
        "echoed": received,
        "received": received,
        "seconds": 10.0,
        "rtt_p50_ms": 0.2,
        "rtt_p99_ms": 1.0,
        "cpus": 2,
        "stat_before": stat(1000, 500, 9000, softirq=10),
        "stat_after": stat(1000, 500, 9000 + 2000 - busy_ticks, softirq=10),
        **more,
    }


def test_busy_is_the_windows_wall_time_less_idle_and_iowait() -> None:
    assert mf.idle_ticks("cpu  1 2 3 400 500 6 7 8 9 10") == 900
    # 10 s on 2 CPUs; idle 8 s, iowait 1 s: 11 s busy, whatever the tick-sampled fields say
    busy, total = mf.busy_seconds(stat(0, 0, 0), stat(1, 0, 800, iowait=100), CLK, 10.0, 2)
    assert (busy, total) == (11.0, 20.0)


def test_timer_driven_work_between_ticks_still_counts_as_busy() -> None:
    """A 50-pps load's work falls between ticks: the busy fields stay still while idle grows by
    less than the window. Tick-based accounting called such a window 0 % busy."""
    before, after = stat(500, 500, 1000), stat(500, 500, 1000 + 1500)
    busy, total = mf.busy_seconds(before, after, CLK, 10.0, 2)
    assert busy == pytest.approx(5.0) and total == 20.0


def test_an_idle_count_past_the_window_is_not_negative_busy() -> None:
    assert mf.busy_seconds(stat(0, 0, 0), stat(0, 0, 2100), CLK, 10.0, 2) == (0.0, 20.0)


def test_the_real_proc_stat_line_parses() -> None:
    assert mf.idle_ticks(Path("/proc/stat").read_text().splitlines()[0]) > 0


def test_a_line_that_is_not_the_all_cpu_line_is_refused() -> None:
    with pytest.raises(ValueError, match="all-CPU"):
        mf.idle_ticks("cpu0 1 2 3 4 5 6 7 8")


def test_the_relays_share_is_the_figure_minus_the_direct_run() -> None:
    direct = run(busy_ticks=200, received=100_000)  # 2 CPU-s for the generator and peer
    relayed = run(busy_ticks=600, received=100_000, server_cpu_s=1.0)
    fig = mf.figures(relayed, direct, CLK)
    assert fig["machine_us_per_pkt"] == pytest.approx(6e6 / 200_000)
    assert fig["share_us_per_pkt"] == pytest.approx(4e6 / 200_000)  # 6 - 2 CPU-s
    assert fig["pkt_per_server_cpu_s"] == pytest.approx(200_000)
    assert fig["loss_pct"] == 0.0
    assert mf.figures(direct, direct, CLK)["share_us_per_pkt"] is None


def test_bpf_statistics_give_ns_per_run_and_per_relayed_packet() -> None:
    fig = mf.figures(run(200, 1000, bpf_run_ns=1_200_000, bpf_run_cnt=2400), None, CLK)
    assert (fig["bpf_ns_per_run"], fig["bpf_ns_per_pkt"]) == (500, 600)


def medians_of(busy: int, received: int, sent: int, p99: float = 1.0) -> dict[str, Any]:
    direct = run(busy_ticks=200, received=100_000)
    one = mf.figures(run(busy, received, sent, rtt_p99_ms=p99), direct, CLK)
    return mf.medians([one, one])


def test_the_table_gives_ratios_against_coturn_and_the_targets() -> None:
    direct = mf.medians([mf.figures(run(200, 100_000), None, CLK)])
    rows = {
        ("c", "direct"): direct,
        ("c", "coturn"): medians_of(busy=1400, received=100_000, sent=100_000),  # share 12 CPU-s
        ("c", "stunnerd-TC"): medians_of(busy=400, received=100_000, sent=100_100),  # share 2
        ("c", "stunnerd-XDP"): medians_of(busy=800, received=100_000, sent=101_000, p99=2.0),
    }
    text = mf.table(rows, ["stunnerd-TC", "stunnerd-XDP"])
    tc, xdp = (line for line in text.splitlines() if "stunnerd-" in line)
    assert "| 6.00x | 3.50x |" in tc and tc.endswith("| met |")
    assert "MISSED: share<5x, machine<2x, loss, p99" in xdp  # 2x, 1.75x, +0.99 pp, 2 > 1 ms
    off = mf.table(rows, ["stunnerd-TC", "stunnerd-XDP"], {"stunnerd-XDP": "not built"})
    assert "offload off: not built" in off


def test_the_maximum_rate_is_the_last_step_within_the_loss_limit() -> None:
    def step(loss: float, sent: float) -> dict[str, Any]:
        return {"loss_pct": loss, "sent_per_s": sent}

    steps = [(1000.0, step(0.0, 1000)), (2000.0, step(0.5, 2000)), (4000.0, step(3.0, 4000))]
    best = mf.max_rate(steps, 1.0)
    assert best["offered"] == 2000.0 and best["stopped_by"].startswith("loss 3.0 %")
    short = mf.max_rate([(1000.0, step(0.0, 1000)), (2000.0, step(0.0, 1500))], 1.0)
    assert short["offered"] == 2000.0 and "sent 1,500 of 2,000" in short["stopped_by"]
    assert mf.max_rate(steps[:1], 1.0)["stopped_by"] == mf.LAST_STEP
