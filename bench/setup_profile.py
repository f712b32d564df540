"""Where stunnerd's Python spends the allocations' set-up (issue 30): py-spy on a real stunnerd.

Runs bench/turn_bench.py's 200-client UDP ChannelData case against stunnerd alone and samples
the server's Python with py-spy (`--py-spy PATH`; install it into a scratch venv, not the
project's) from the moment stunnerd starts. The relaying itself runs in the native engine's C
threads, which py-spy does not see, so what it samples is the Python control path: start-up
(imports), then each client's Allocate (401, then authenticated), CreatePermission /
ChannelBind and Refresh. Prints the samples of each phase and the top frames by own time and by
inclusive time, in the request path only (start-up's imports left out).

    .venv/bin/python bench/setup_profile.py --py-spy /path/to/py-spy
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CASE = "udp-chan-120-c200-50pps"


def stunnerd_pid(bench: subprocess.Popen[bytes], timeout: float) -> int:
    """The stunnerd that `bench` starts (its `stunnerd -c` child), polled from /proc."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            if ppid == bench.pid and any(a.endswith(b"stunnerd") for a in argv[:2]):
                return int(entry.name)
        if bench.poll() is not None:
            break
        time.sleep(0.02)
    raise RuntimeError("stunnerd did not start")


def summarize(raw: Path, rate: int, top: int) -> str:
    """The phases' samples and the request path's top frames, from py-spy's raw output."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    startup = handling = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        frames = stack.split(";")
        count = int(count_text)
        if any("importlib" in frame for frame in frames):
            startup += count
            continue
        handling += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    lines = [
        f"samples at {rate} Hz: start-up (imports) {startup} ({startup / rate:.2f} s), "
        f"the rest {handling} ({handling / rate:.2f} s)",
        "own time (samples, frame):",
        *(f"  {n:5d} {frame}" for frame, n in own.most_common(top)),
        "inclusive time (samples, frame):",
        *(f"  {n:5d} {frame}" for frame, n in inclusive.most_common(top * 2)),
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--py-spy", default=shutil.which("py-spy"), help="py-spy's path")
    parser.add_argument("--rate", type=int, default=500, help="samples per second (500)")
    parser.add_argument("--seconds", type=int, default=12, help="how long to sample (12)")
    parser.add_argument("--top", type=int, default=20, help="frames to print (20)")
    args = parser.parse_args()
    if not args.py_spy:
        parser.error("py-spy not found: pip install py-spy into a scratch venv, pass --py-spy")
    argv = [sys.executable, str(REPO / "bench" / "turn_bench.py"), "--servers", "stunnerd",
            "--cases", CASE, "--repeat", "1", "--duration", "2", "--allocations", "0"]  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        raw = Path(scratch) / "raw.txt"
        bench = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            pid = stunnerd_pid(bench, timeout=30.0)
            subprocess.run(
                [
                    args.py_spy,
                    "record",
                    "-p",
                    str(pid),
                    "-r",
                    str(args.rate),
                    "-f",
                    "raw",
                    "-o",
                    str(raw),
                    "-d",
                    str(args.seconds),
                    "--nonblocking",
                ],  # fmt: skip
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        finally:
            bench.wait(timeout=120)
        sys.stdout.write(summarize(raw, args.rate, args.top) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
