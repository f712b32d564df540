"""Issue 15 item 13: a broken config never echoes a credential, whatever the error.

A YAML syntax error on the password's line and a type error inside `auth.credentials` (or a
listener's key) are reported with the field and position, at the default log level, in
`--dry-run` and at start, and never with the secret's text.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from .test_cli import run

SECRET = "hunter2-Sup3rSecret"

BROKEN = {
    "yaml-syntax": f'version: v1\nauth:\n  type: static\n  credentials:\n    password: "{SECRET}\n',
    "credential-type": (
        f"version: v1\nauth:\n  type: static\n  credentials:\n    username: u\n"
        f"    password: [{SECRET}]\n"
    ),
    "credentials-type": f"version: v1\nauth:\n  type: static\n  credentials: 'u:{SECRET}'\n",
    "listener-key-type": (
        "version: v1\nauth: {type: static, credentials: {username: u, password: p}}\n"
        f"listeners:\n- name: l\n  protocol: TURN-TLS\n  cert: c\n  key: [{SECRET}]\n"
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "start"])
def test_config_errors_never_echo_a_secret(tmp_path: Path, case: str, dry_run: bool) -> None:
    config = tmp_path / "stunnerd.yaml"
    config.write_text(BROKEN[case])
    result = run("-c", str(config), *(["--dry-run"] if dry_run else []), "-u", "1")
    assert result.returncode == 1
    assert "invalid configuration" in result.stderr
    assert SECRET not in result.stderr + result.stdout


def test_limit_flags_and_env_reach_the_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    from stunnerd.process.cli import build_parser, limits_from
    from stunnerd.turn.limits import Limits

    monkeypatch.setenv("STUNNER_MAX_ALLOCATIONS", "7")
    args = build_parser().parse_args(["--max-permissions", "3", "--idle-timeout", "2.5"])
    limits = limits_from(args)
    assert (limits.max_permissions, limits.idle_timeout, limits.max_allocations) == (3, 2.5, 7)
    assert limits.max_channels == Limits().max_channels
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--max-channels", "-1"])


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_watch_mode_ignores_a_broken_config_without_echoing_a_secret(
    tmp_path: Path, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    from stunnerd.process.sources import FileSource

    config = tmp_path / "stunnerd.yaml"
    config.write_text(BROKEN[case])

    async def main() -> None:
        async def first() -> None:
            async for _ in FileSource(config, poll_interval=0.05).watch():
                pass

        task = asyncio.get_running_loop().create_task(first())
        await asyncio.sleep(0.3)
        task.cancel()

    with caplog.at_level(logging.INFO):
        asyncio.run(main())
    assert "ignoring invalid config" in caplog.text
    assert SECRET not in caplog.text
