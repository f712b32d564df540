"""`stunner render -f`: what the reconciler would produce of manifest files, offline: each
Gateway's dataplane config, Service and Deployment; the chart's default Dataplane when the files
hold none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from stunner_cli.__main__ import main
from stunner_cli.offline import chart_image

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_EXAMPLE = ROOT / "examples" / "cluster"


def test_the_cluster_example_renders_with_the_charts_default_dataplane(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["render", "-f", str(CLUSTER_EXAMPLE)]) == 0
    out, err = capsys.readouterr()
    assert "no Dataplane 'default'" in err and chart_image() in err
    documents = list(yaml.safe_load_all(out))
    assert [d.get("kind") for d in documents] == [None, "Service", "ServiceAccount", "Deployment"]
    config, service, account, deployment = documents
    assert config["admin"]["name"] == "stunner/udp-gateway"
    # The account the config is served to, the one the pods run as.
    assert "served over CDS to ServiceAccount udp-gateway-stunnerd" in out
    assert account["metadata"]["name"] == "udp-gateway-stunnerd"
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "udp-gateway-stunnerd"
    assert [p["name"] for p in service["spec"]["ports"]] == ["udp-listener", "tcp-listener"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == chart_image()
    assert container["args"] == ["-w", "--udp-thread-num=16"]
    assert "pass-1" not in out and "pass-1" not in err  # the example's password


def test_a_dataplane_in_the_files_is_the_one_used(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = (CLUSTER_EXAMPLE / "stunner.yaml").read_text()
    mine = {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "Dataplane",
        "metadata": {"name": "default"},
        "spec": {"image": "example.com/stunnerd:1.2", "replicas": 3},
    }
    (tmp_path / "all.yaml").write_text(text + "\n---\n" + yaml.safe_dump(mine))
    assert main(["render", "-f", str(tmp_path), "-o", "json"]) == 0
    out, err = capsys.readouterr()
    assert "no Dataplane" not in err
    config, service, account, deployment = json.loads(out)
    assert service["kind"] == "Service" and deployment["kind"] == "Deployment"
    assert account["kind"] == "ServiceAccount"
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "example.com/stunnerd:1.2"
    )


def test_configs_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "-f", str(CLUSTER_EXAMPLE), "-o", "json", "--configs-only"]) == 0
    config = json.loads(capsys.readouterr().out)
    assert config["admin"]["name"] == "stunner/udp-gateway"


def test_nothing_to_render_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "empty.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n")
    assert main(["render", "-f", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == "no Gateway rendered"
