"""`helm stunner check` over the 11 seed examples (tests/data/resources): wall time per run,
end to end (helm starting the plugin, Python starting, loading, judging), budget 2 s.

    bash hack/helm.sh && .venv/bin/python bench/check_bench.py [--runs 10] [--helm 3|4]

The plugin is installed into a temporary helm home; the `stunner` command is this virtualenv's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEEDS = ROOT / "tests" / "data" / "resources"
BUDGET = 2.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--helm", choices=("3", "4"), default="4")
    args = parser.parse_args()
    helm = ROOT / ".tools" / f"helm{args.helm}" / "helm"
    if not helm.is_file():
        sys.stderr.write(f"{helm} is missing: run bash hack/helm.sh\n")
        return 1
    with tempfile.TemporaryDirectory() as home:
        env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            "HELM_CONFIG_HOME": f"{home}/config",
            "HELM_CACHE_HOME": f"{home}/cache",
            "HELM_DATA_HOME": f"{home}/data",
            "HELM_PLUGINS": f"{home}/data/plugins",
        }
        subprocess.run(
            [str(helm), "plugin", "install", str(ROOT / "helm-plugin")],
            env=env,
            check=True,
            capture_output=True,
        )
        command = [str(helm), "stunner", "check", "-f", str(SEEDS)]
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            times.append(time.perf_counter() - start)
            if done.returncode not in (0, 1):
                sys.stderr.write(done.stderr)
                return 1
    files = len(list(SEEDS.glob("*.yaml")))
    median, worst = statistics.median(times), max(times)
    sys.stdout.write(
        f"helm {args.helm} stunner check -f {SEEDS.relative_to(ROOT)} ({files} files), "
        f"{args.runs} runs: median {median:.2f} s, max {worst:.2f} s, budget {BUDGET:.1f} s "
        f"(median/budget {median / BUDGET:.2f}); load average {os.getloadavg()[0]:.2f}\n"
    )
    return 0 if worst <= BUDGET else 1


if __name__ == "__main__":
    sys.exit(main())
