"""The CLI's one command table: every subcommand names its runner in the parser, the helm
plugin's description lists exactly the operator's subcommands, and an unknown one is refused."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from stunner_cli.__main__ import main
from stunner_cli.parser import CHART_COMMANDS, build_parser

PLUGIN = Path(__file__).resolve().parents[2] / "helm-plugin" / "plugin.yaml"


def subcommands() -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1
    return dict(actions[0].choices)


def test_every_subcommand_names_its_own_runner() -> None:
    runners = {name: p.get_default("run") for name, p in subcommands().items()}
    assert all(callable(run) for run in runners.values()), runners
    assert len(set(runners.values())) == len(runners), "two subcommands share a runner"


def test_the_plugin_lists_the_operator_subcommands_and_only_those() -> None:
    listed = set(re.findall(r"^\s*helm stunner ([a-z-]+)", PLUGIN.read_text(), re.M))
    assert listed == set(subcommands()) - set(CHART_COMMANDS)
    assert set(CHART_COMMANDS) <= set(subcommands())


def test_an_unknown_subcommand_is_refused_and_prints_no_config(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["sessionz"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "invalid choice: 'sessionz'" in captured.err
