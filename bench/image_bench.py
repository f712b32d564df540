"""The images' sizes and stunnerd's start time from them (issue 19).

    .venv/bin/python bench/image_bench.py                  # the venvs the Dockerfile builds
    .venv/bin/python bench/image_bench.py --builder podman --build-arg=--runtime=runc \\
        --build-arg=--network=host                         # and the images themselves

The venvs are built by the Dockerfile's own RUN lines (tests/image/conftest.py, as CI builds
them); with `--builder`, both targets are built and their sizes read next to the base image's
(the anchor: what an image adds over `python:3.11-slim-bookworm`). Start time: stunnerd from
each venv, from exec to its `/ready` answering 200, with its config from a file and from a
config discovery server (`-w`, the chart's way; the server is the reconciler's own CDS app),
median and max of `--repeat` runs; `python -c pass` from the same venv is the floor. A pod's
time to Ready adds the kubelet's: the container start and the readiness probe period (render
asks every second; Go every 15 s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reconciler.cds.server import cds_app  # noqa: E402
from reconciler.cds.store import ConfigStore  # noqa: E402
from stunner_api.dataplane import validate_config  # noqa: E402
from tests.image.conftest import IMAGE_PREFIX, Stage, run_stage, stages  # noqa: E402
from tests.support.background import Background  # noqa: E402
from tests.support.ports import free_port  # noqa: E402

GATEWAY = "bench/gateway"
BASE = "python:3.11-slim-bookworm"


def mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def du(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def build_venvs(into: Path) -> dict[str, Path]:
    all_stages = stages()
    build = all_stages["build"]
    wheels = into / "wheels"
    wheels.mkdir()
    runs = tuple(r for r in build.runs if "pip wheel" in r)
    run_stage(
        Stage("build", build.base, "/src", runs, ()), {"/wheels": str(wheels), "/src": str(ROOT)}
    )
    copies = {dest: str(ROOT / src) for src, dest in build.copies if dest.endswith(".py")}
    venvs = {}
    for image in ("controlplane", "dataplane"):
        venv = into / image
        run_stage(
            all_stages[f"venv-{image}"], {IMAGE_PREFIX: str(venv), "/wheels": str(wheels)} | copies
        )
        venvs[image] = venv
    return venvs


def config(health_port: int) -> dict[str, object]:
    return {
        "version": "v1",
        "admin": {
            "name": GATEWAY,
            "loglevel": "all:WARN",
            "healthcheck_endpoint": f"http://127.0.0.1:{health_port}",
        },
        "auth": {"type": "static", "realm": "bench",
                 "credentials": {"username": "u", "password": "p"}},
        "listeners": [{"name": "udp", "protocol": "TURN-UDP", "address": "127.0.0.1",
                       "port": free_port(), "routes": []}],
        "clusters": [],
    }  # fmt: skip


def time_to_ready(argv: list[str], health_port: int, timeout: float = 30.0) -> float:
    url = f"http://127.0.0.1:{health_port}/ready"
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.monotonic() - started < timeout:
            try:
                with urllib.request.urlopen(url, timeout=0.5) as response:
                    if response.status == 200:
                        return time.monotonic() - started
            except OSError:
                pass
            if proc.poll() is not None:
                raise SystemExit(f"{argv[0]} exited {proc.returncode} before it was ready")
            time.sleep(0.005)
        raise SystemExit(f"{argv[0]} not ready within {timeout} s")
    finally:
        proc.terminate()
        proc.wait(10)


def floor(venv: Path, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        started = time.monotonic()
        subprocess.run([str(venv / "bin" / "python"), "-c", "pass"], cwd="/", check=True)
        out.append(time.monotonic() - started)
    return out


def start_times(venvs: dict[str, Path], repeat: int, workdir: Path) -> list[str]:
    rows = ["| venv | how | median s | max s |", "|---|---|---:|---:|"]
    background = Background()
    store = ConfigStore()
    try:
        for image, venv in venvs.items():
            base = floor(venv, repeat)
            rows.append(f"| {image} | `python -c pass` (floor) | "
                        f"{statistics.median(base):.3f} | {max(base):.3f} |")  # fmt: skip
            stunnerd = str(venv / "bin" / "stunnerd")
            for how in ("config file", "CDS watch (-w)"):
                times = []
                for _ in range(repeat):
                    port = free_port()
                    if how == "config file":
                        path = workdir / f"{image}-{port}.json"
                        path.write_text(json.dumps(config(port)))
                        argv = [stunnerd, "-c", str(path)]
                    else:
                        store.set(GATEWAY, validate_config(config(port)))
                        host, cds_port = background.serve(cds_app(store))
                        argv = [stunnerd, "-w", "-c", f"http://{host}:{cds_port}", "-i", GATEWAY]
                    times.append(time_to_ready(argv, port))
                rows.append(f"| {image} | stunnerd, {how} | {statistics.median(times):.3f} | "
                            f"{max(times):.3f} |")  # fmt: skip
    finally:
        background.close()
    return rows


def image_sizes(builder: str, build_args: list[str], tag: str) -> list[str]:
    def size(image: str) -> int:
        done = subprocess.run(
            [builder, "image", "inspect", "--format", "{{.Size}}", image],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return int(done.stdout.strip())

    images = {"controlplane": f"localhost/stunner:{tag}", "dataplane": f"localhost/stunnerd:{tag}"}
    for target, image in images.items():
        sys.stderr.write(f"building {image} ...\n")
        subprocess.run(
            [builder, "build", *build_args, "--target", target, "-t", image, str(ROOT)],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    base = size(BASE)
    rows = [
        "| image | MiB | over the base MiB |",
        "|---|---:|---:|",
        f"| {BASE} (anchor) | {mib(base)} | 0 |",
    ]
    for image in images.values():
        rows.append(f"| {image} | {mib(size(image))} | {mib(size(image) - base)} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builder", help="docker or podman: build both images and size them")
    parser.add_argument("--build-arg", action="append", default=[], help="extra build flag")
    parser.add_argument("--tag", default="0.1.0")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sys.stderr.write(f"load average: {os.getloadavg()[0]:.2f}\n")
    out = ["| venv | MiB |", "|---|---:|"]
    with tempfile.TemporaryDirectory(prefix="image-bench-") as tmp:
        venvs = build_venvs(Path(tmp))
        out += [f"| {image} | {mib(du(venv))} |" for image, venv in venvs.items()]
        out += ["", *start_times(venvs, args.repeat, Path(tmp))]
    if args.builder:
        out += ["", *image_sizes(args.builder, args.build_arg, args.tag)]
    sys.stdout.write("\n".join(out) + "\n")
    sys.stderr.write(f"load average after: {os.getloadavg()[0]:.2f}\n")


if __name__ == "__main__":
    main()
