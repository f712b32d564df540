"""`stunner-demo --browser`: a real browser (headless Chromium, Debian's) makes a relay-only WebRTC
call through the local pipeline to the aiortc echo media server, with a fake camera's video and a
data channel, and media goes both ways through stunnerd.

The media server's ICE gathers on this machine's own IPv4 addresses (aioice leaves 127.0.0.1
out): the kernel delivers traffic to them locally, nothing leaves the machine. Without Chromium
(a developer's machine; CI installs it in .ci/run) the call is skipped in one line.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import aiohttp
import pytest

from reconciler.browser_demo import any_port, find_browser, media_prefixes, page_app, serving
from reconciler.demo_example import EXAMPLE, EXAMPLE_ECHO_PORT, prepare
from stunner_client.media_echo import MediaEcho, media_addresses
from tests.support.ports import free_port

HOST = "127.0.0.1"


def outcome_of(stdout: str) -> dict[str, Any]:
    """The page's outcome, as the demo prints it (indented JSON before the result line)."""
    start = stdout.index("\n{\n") + 1
    end = stdout.index("\n}\n", start) + 2
    parsed: dict[str, Any] = json.loads(stdout[start:end])
    return parsed


@pytest.mark.skipif(find_browser() is None, reason="no Chromium on this machine (CI installs it)")
@pytest.mark.skipif(not media_addresses(), reason="no IPv4 address but 127.0.0.1 for ICE")
def test_a_browser_calls_the_echo_media_server_relay_only_through_stunnerd() -> None:
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "reconciler.demo", "--browser", "--headless", "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.rstrip().endswith("result: OK")
    outcome = outcome_of(result.stdout)
    pair = outcome["pair"]
    # the browser's side of the pair is a relay candidate of our stunnerd; the far side is the
    # media server's host candidate on an address the route admits
    assert pair["localType"] == "relay" and pair["local"].startswith(f"relay {HOST}:")
    assert pair["remote"].split()[1].rsplit(":", 1)[0] in media_addresses()
    assert outcome["messagesEchoed"] == 20
    assert outcome["framesDecoded"] >= 30  # the echo's video, decoded in the browser
    assert outcome["bytesSent"] > 0 and outcome["bytesReceived"] > 0
    assert "stunnerd (pid " in result.stdout and f"serving TURN on {HOST}:{port}" in result.stdout


def test_the_route_admits_the_media_servers_addresses_on_any_port(tmp_path: Any) -> None:
    route = prepare(tmp_path, 3478, EXAMPLE_ECHO_PORT)
    opened = any_port(route.read_text(), EXAMPLE_ECHO_PORT)
    assert "port:" not in opened.split("backendRefs:")[1]
    assert "name: echo" in opened
    service = media_prefixes((tmp_path / "echo.yaml").read_text(), ["10.0.0.5", "192.0.2.7"])
    assert service.endswith("  prefixes:\n    - 10.0.0.5/32\n    - 192.0.2.7/32\n")
    assert "127.0.0.1/32" not in service
    assert (EXAMPLE / "echo.yaml").read_text().count("127.0.0.1/32") == 1  # the example stays


def test_the_media_servers_addresses_leave_out_only_what_its_ice_leaves_out() -> None:
    addresses = media_addresses()
    assert HOST not in addresses
    assert all(":" not in address for address in addresses)  # IPv4: the relay's family


async def post(url: str, body: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=body) as response:
            return response.status, await response.json()


def test_an_offer_that_is_not_one_is_refused_naming_what_is_wrong() -> None:
    async def scenario() -> list[tuple[int, Any]]:
        outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        media = MediaEcho()
        async with serving(page_app(media, "http://127.0.0.1:9", outcome), HOST) as url:
            answers = [
                await post(f"{url}offer", ["not", "an", "object"]),
                await post(f"{url}offer", {"sdp": "hello", "type": "offer"}),
                await post(f"{url}offer", {"sdp": "v=0\r\n", "type": "answer"}),
            ]
            answers.append(await post(f"{url}result", {"ok": True}))
        assert outcome.result() == {"ok": True}
        assert media.calls == 0  # nothing was answered, nothing left running
        await media.aclose()
        return answers

    answers = asyncio.run(scenario())
    assert [status for status, _ in answers] == [400, 400, 400, 200]
    assert "not a JSON object" in answers[0][1]["error"]
    assert answers[1][1]["error"].startswith("sdp:")
    assert answers[2][1]["error"].startswith("type:")
