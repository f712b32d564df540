"""stunnerd's readiness while it drains, as a real process over real sockets (issue 32).

A rollout of a Gateway's Deployment lost 68 % of its calls' packets on a real cluster: the old
stunnerd went unready on SIGTERM, the EndpointSlice marked its endpoint `serving: false`, and
kube-proxy then flushes the UDP conntrack entries that point at an endpoint no longer serving,
so the next packet of every UDP call on the old pod went to the new pod, which holds none of
their allocations. A terminating pod already leaves new connections by Kubernetes' own rule (its
endpoint is `ready: false`), so the pods the reconciler renders stay ready while they drain:
STUNNER_FORCE_READY_STATUS=true, the environment's way of saying Go's --force-ready-status.

Without it stunnerd keeps Go's behaviour (503 while draining). Either way a draining stunnerd
keeps its allocations (a Refresh succeeds), refuses new ones (508) and says TERMINATING in
/status.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from stunner_api.stun import Class, Message
from tests.support.turnclient import RawClient, binding_answered, error_code, free_port

from .conftest import StartStunnerd


def _get(port: int, path: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _until(what: str, check: Callable[[], bool], within: float = 10) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {within:.0f} s"
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("env", "ready_while_draining"),
    [
        ({"STUNNER_FORCE_READY_STATUS": "true"}, 200),
        ({}, 503),
        ({"STUNNER_FORCE_READY_STATUS": "false"}, 503),
    ],
    ids=["env-true", "go-default", "env-false"],
)
def test_a_draining_stunnerd_is_ready_as_its_environment_says(
    stunnerd: StartStunnerd, env: dict[str, str], ready_while_draining: int
) -> None:
    port, health = free_port(), free_port()
    process = stunnerd(
        "-u", "1", "--health-address", f"127.0.0.1:{health}",
        f"turn://user:pass@127.0.0.1:{port}?transport=udp",
        env=env,
    )  # fmt: skip
    assert binding_answered(port)
    _until("/ready 200 once serving", lambda: _get(health, "/ready")[0] == 200)

    async def drain() -> tuple[int, Message, Message, Message]:
        client = await RawClient.connect(("127.0.0.1", port), username="user", password="pass")
        try:
            assert (await client.allocate()).message_class == Class.SUCCESS
            process.send(signal.SIGTERM)
            await asyncio.to_thread(
                _until,
                "/status TERMINATING",
                lambda: _get(health, "/status")[1].get("status") == "TERMINATING",
            )
            ready = await asyncio.to_thread(_get, health, "/ready")
            refreshed = await client.refresh(600)
            other = await RawClient.connect(("127.0.0.1", port), username="user", password="pass")
            try:
                refused = await other.allocate()
            finally:
                other.close()
            gone = await client.refresh(0)  # the last allocation: stunnerd exits
            return ready[0], refreshed, refused, gone
        finally:
            client.close()

    ready, refreshed, refused, gone = asyncio.run(drain())
    assert ready == ready_while_draining
    assert refreshed.message_class == Class.SUCCESS, error_code(refreshed)  # still served
    assert error_code(refused) == 508  # no new allocation while draining
    assert gone.message_class == Class.SUCCESS
    assert process.wait(timeout=10) == 0
    assert "SIGTERM: draining 1 allocation(s)" in process.stderr
