"""The kernel offload programs' own cost, TC's and XDP's side by side: nanoseconds per packet
under the kernel's test-run facility (BPF_PROG_TEST_RUN), per direction, family and payload
size, beside the cost of a datagram it leaves alone (the price every other UDP packet on the
interface pays).

    .venv/bin/python bench/offload_bench.py              # 200000 runs per row
    .venv/bin/python bench/offload_bench.py --repeat 1000000 --rounds 5

Needs root (or CAP_BPF + CAP_NET_ADMIN) and the compiled program (pip install). The kernel
runs the program `repeat` times on one packet and reports the mean; but a rewrite changes that
packet, and the second run would see the rewritten one (which it leaves alone), so a relaying
row is `samples` calls of one run each (the kernel's clock read around one run, ~20-40 ns of
it included), and a row of a packet it leaves alone `rounds` calls of `repeat` runs. Each row
gives the median and the 10th-90th percentiles. It measures the program alone: not the stack
around it, not a wakeup. Prints a Markdown table to stdout and the load average it ran under.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stunnerd.offload import bpf, layout, program  # noqa: E402
from tests.support.packets import udp_frame  # noqa: E402

CHANNEL = 0x4001
ADDRESSES = {
    "IPv4": (("192.0.2.10", 40000), ("10.0.0.1", 3478), ("10.0.0.1", 50000), ("10.0.0.7", 9000)),
    "IPv6": (("2001:db8::10", 40000), ("fd00::1", 3478), ("fd00::1", 50000), ("fd00::7", 9000)),
}
LOOPBACK = 1


def channel_data(data: bytes) -> bytes:
    return CHANNEL.to_bytes(2, "big") + len(data).to_bytes(2, "big") + data


VERDICTS = {
    "TC": {0: "TC_ACT_OK", -1: "TCX_NEXT", 7: "REDIRECT"},
    "XDP": {2: "XDP_PASS", 4: "XDP_REDIRECT"},
}


def measure(
    fd: int, frame: bytes, repeat: int, calls: int, xdp: bool
) -> tuple[float, float, float, int]:
    """(median, 10th, 90th percentile) ns per run, and the last run's verdict."""
    runs = [
        bpf.prog_test_run(fd, frame, repeat, ingress_ifindex=LOOPBACK, xdp=xdp)
        for _ in range(calls)
    ]
    ns = sorted(r.duration_ns for r in runs)
    tenth, ninetieth = ns[len(ns) // 10], ns[len(ns) * 9 // 10]
    return statistics.median(ns), tenth, ninetieth, runs[-1].retval


def measure_hook(
    hook: str, samples: int, repeat: int, rounds: int
) -> list[tuple[str, str, int, str, float, float, float, int]]:
    loaded = program.load(hook=hook)
    expires = time.monotonic_ns() + 3600 * 10**9
    rows = []
    try:
        for family, (client, listener, relay, peer) in ADDRESSES.items():
            loaded.maps["from_clients"].update(
                layout.client_key(client, listener, CHANNEL),
                layout.Route(relay, peer, expires, 1).pack(),
            )
            loaded.maps["from_peers"].update(
                layout.peer_key(peer, relay),
                layout.Route(listener, client, expires, 1, channel=CHANNEL).pack(),
            )
            for size in (120, 1000):
                data = bytes(size)
                cases = {
                    "client -> peer (ChannelData in)": udp_frame(
                        client, listener, channel_data(data)
                    ),
                    "peer -> client (ChannelData out)": udp_frame(peer, relay, data),
                    "not ours (passed up untouched)": udp_frame(
                        peer, (relay[0], relay[1] + 1), data
                    ),
                    "not ours, one run per call (the clock's share)": udp_frame(
                        peer, (relay[0], relay[1] + 1), data
                    ),
                }
                for name, frame in cases.items():
                    untouched = name == "not ours (passed up untouched)"
                    times, calls = (repeat, rounds) if untouched else (1, samples)
                    median, low, high, retval = measure(
                        loaded.fd, frame, times, calls, hook == "XDP"
                    )
                    rows.append((hook, family, size, name, median, low, high, retval))
    finally:
        loaded.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--samples", type=int, default=20_000, help="one-run calls per relaying row"
    )
    parser.add_argument("--repeat", type=int, default=200_000, help="runs per call, untouched rows")
    parser.add_argument("--rounds", type=int, default=5, help="calls per untouched row")
    args = parser.parse_args()
    rows = []
    for hook in ("TC", "XDP"):
        rows += measure_hook(hook, args.samples, args.repeat, args.rounds)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        f"BPF_PROG_TEST_RUN: relaying rows {args.samples} one-run calls, untouched rows "
        f"{args.rounds} calls of {args.repeat} runs; load average {load}; {os.cpu_count()} CPUs",
        "",
        "| hook | family | payload B | packet | ns/packet (median) | p10-p90 | verdict |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    for hook, family, size, name, median, low, high, retval in rows:
        verdict = VERDICTS[hook].get(retval, str(retval))
        lines.append(
            f"| {hook} | {family} | {size} | {name} | {median:.0f} | {low}-{high} | {verdict} |"
        )
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
