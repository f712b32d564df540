"""The README's cluster quick start: every command from a fresh clone to an echo through the
relay (the image built and loaded, the plugin with its CLI, `helm test`), at most four of them
from `helm install` to a printed ICE config, each naming what exists, and what they apply renders
to a Gateway `ice` can answer for."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from stunner_api.ice import IceQuery, ice_config
from stunner_cli import offline
from tests.charts.conftest import CHART, NAMESPACE, ROOT, chart_api, of_kind

README = (ROOT / "README.md").read_text()


def quick_start() -> list[str]:
    section = README.split("## On a cluster", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_every_command_from_a_fresh_clone_to_an_echo_is_listed(
    default_manifests: list[dict[str, Any]],
) -> None:
    commands = quick_start()
    words = [c.split() for c in commands]
    (dataplane,) = of_kind(default_manifests, "Dataplane")
    dataplane_image = dataplane["spec"]["image"]  # what the chart's stunnerd pods run
    (reconciler,) = [d for d in of_kind(default_manifests, "Deployment") if "reconciler" in str(d)]
    image = reconciler["spec"]["template"]["spec"]["containers"][0]["image"]
    # the images: built, then handed to the cluster (no published image to pull)
    assert words[0] == ["docker", "build", "-t", image, "."]
    assert words[1] == ["docker", "build", "--target", "dataplane", "-t", dataplane_image, "."]
    assert words[2] == ["kind", "load", "docker-image", image, dataplane_image]
    install = next(i for i, c in enumerate(commands) if c.startswith("helm install "))
    ice = next(i for i, c in enumerate(commands) if c.startswith("helm stunner ice "))
    assert ice - install + 1 <= 4  # from helm install to the ICE servers
    assert commands[install].startswith("helm install stunner charts/stunner")
    assert "helm plugin install ./helm-plugin" in commands[install:ice]
    assert not any("pip install" in c for c in commands)  # the plugin's install hook does it
    # the last proves a relay: `helm test` of the release installed above, which echoes
    # through the Gateway `ice` was asked about
    release = words[install][2], words[install][words[install].index("-n") + 1]
    assert words[-1] == ["helm", "test", release[0], "-n", release[1]]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert words[ice][-1] in values["test"]["gateways"]
    assert len(commands) == 8
    for command in commands:
        for word in command.split():
            if word.startswith(("charts/", "examples/", "./")):
                assert (ROOT / word).exists(), f"{command}: {word} does not exist"


def test_the_applied_example_renders_a_gateway_ice_answers_for(
    default_manifests: list[dict[str, Any]],
) -> None:
    (apply,) = [c for c in quick_start() if c.startswith("kubectl apply -f")]
    objects = offline.load(ROOT / apply.split()[-1])
    assert offline.check(objects) == []
    (dataplane,) = of_kind(default_manifests, "Dataplane")  # what the chart installed
    chart = offline.Located(ROOT / "charts", 1, "", dataplane)
    plan = offline.plan([*objects, chart])
    (ice,) = [c for c in quick_start() if c.startswith("helm stunner ice ")]
    gateway = ice.split()[-1]
    assert gateway in plan.configs
    namespace, name = gateway.split("/")
    answer = ice_config(plan.configs, IceQuery(namespace=namespace, gateway=name), int(time.time()))
    (server,) = answer["iceServers"]
    assert len(server["urls"]) == 2  # the UDP and the TCP listener


def test_notes_give_the_next_three_commands(helm: Path, tmp_path: Path) -> None:
    with chart_api() as api:  # helm 3 asks a cluster for its version even on a dry run
        done = subprocess.run(
            [str(helm), "install", "stunner", str(CHART), "--dry-run=client", "-n", NAMESPACE]
            + ["--disable-openapi-validation"],
            capture_output=True,
            text=True,
            timeout=60,
            env={
                "KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig")),
                "PATH": "/usr/bin:/bin",
                "HOME": str(tmp_path),
            },
            check=False,
        )
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    steps = re.findall(r"^  (\d)\. .*\n\s+(\S.*)$", notes, re.M)
    assert [n for n, _ in steps] == ["1", "2", "3"]
    commands = [command for _, command in steps]
    assert commands[0] == "kubectl apply -f examples/cluster/"
    assert (ROOT / "examples" / "cluster").is_dir()
    from stunner_cli.parser import build_parser

    for command in commands[1:]:
        assert command.startswith("helm stunner ")
        args = build_parser().parse_args(command.split()[2:])
        assert args.namespace == NAMESPACE
