"""`stunner-demo --browser`: a browser's relay-only WebRTC call through the local pipeline.

The same pipeline as the demo (the bundled example rendered by local mode, served on the config
discovery service, a stunnerd watching it, the auth service), with a WebRTC echo media server
(stunner_client.media_echo) in place of the UDP echo peer, and a page (examples/browser/) that
calls it with a camera stream and a data channel, allowing relay candidates only. The route
admits the media server's addresses (this machine's IPv4 addresses but 127.0.0.1, where its ICE
gathers) on any port: its ICE ports are ephemeral.

`--browser` serves the page until interrupted; with `--headless` it runs Chromium (headless,
a fake camera) on the page itself, prints the call's outcome and exits 0 when media and data
went both ways through the relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, web

from stunner_client.media_echo import MediaEcho, media_addresses, offer_of
from stunner_client.probes import wait_until_serving

from .demo_example import EXAMPLE_ECHO_PORT, GATEWAY_ID, local_settings, prepare
from .local import run_local

PAGE = Path(__file__).resolve().parent.parent / "examples" / "browser" / "index.html"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CALL_TIMEOUT = 60.0  # seconds the headless call may take, its browser's start included
ICE_QUERY = urllib.parse.urlencode(
    {"service": "turn", "namespace": "stunner", "iceTransportPolicy": "relay"}
)


def media_prefixes(static_service_text: str, addresses: list[str]) -> str:
    """The example's StaticService naming the media server's addresses (/32 each) instead of the
    UDP echo peer's 127.0.0.1."""
    head, sep, _ = static_service_text.partition("  prefixes:\n")
    assert sep, "the example's StaticService has no prefixes"
    return head + sep + "".join(f"    - {address}/32\n" for address in addresses)


def any_port(route_text: str, echo_port: int) -> str:
    """The example's UDPRoute admitting its StaticService on every port (not only the UDP echo
    peer's): a WebRTC media server's ICE ports are ephemeral."""
    line = f"          port: {echo_port}\n"
    assert line in route_text, "the example's UDPRoute names no port"
    return route_text.replace(line, "")


def find_browser() -> str | None:
    """Chromium (or Chrome): $STUNNER_CHROMIUM, else the first of BROWSERS on PATH."""
    named = os.environ.get("STUNNER_CHROMIUM")
    if named:
        return shutil.which(named) or (named if os.access(named, os.X_OK) else None)
    return next((found for name in BROWSERS if (found := shutil.which(name))), None)


def headless_argv(browser: str, url: str, profile: Path) -> list[str]:
    """Chromium without a display: a fake camera, no permission prompt, a fresh profile."""
    argv = [
        browser,
        "--headless=new",
        "--use-fake-device-for-media-stream",
        "--use-fake-ui-for-media-stream",
        "--autoplay-policy=no-user-gesture-required",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-gpu",
        "--disable-extensions",
        "--enable-logging=stderr",
        f"--user-data-dir={profile}",
    ]
    if os.geteuid() == 0:
        argv.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox
    return [*argv, url]


def page_app(media: MediaEcho, auth_address: str, outcome: asyncio.Future[Any]) -> web.Application:
    """The page, /ice (the auth service's answer, same origin), /offer (the media server) and
    /result (where the page reports its outcome)."""

    async def page(_: web.Request) -> web.FileResponse:
        return web.FileResponse(PAGE)

    async def ice(_: web.Request) -> web.Response:
        async with ClientSession() as session:
            async with session.get(f"{auth_address}/ice?{ICE_QUERY}") as answer:
                return web.json_response(await answer.json(), status=answer.status)

    async def offer(request: web.Request) -> web.Response:
        try:
            sdp, kind = offer_of(await request.json())
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(await media.answer(sdp, kind))

    async def result(request: web.Request) -> web.Response:
        body = await request.json()
        if not outcome.done():
            outcome.set_result(body)
        return web.json_response({"received": True})

    app = web.Application(client_max_size=256 * 1024)
    app.router.add_get("/", page)
    app.router.add_get("/ice", ice)
    app.router.add_post("/offer", offer)
    app.router.add_post("/result", result)
    return app


@contextlib.asynccontextmanager
async def serving(app: web.Application, host: str) -> AsyncIterator[str]:
    """The app on (host, a free port) until the block ends; its URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    try:
        yield f"http://{host}:{runner.addresses[0][1]}/"
    finally:
        await runner.cleanup()


async def headless_call(browser: str, url: str, outcome: asyncio.Future[Any], verbose: bool) -> Any:
    """Run the page in headless Chromium (its log on stderr when verbose: the page's console
    lines are its CONSOLE lines); the outcome it reported, or why there is none."""
    profile = Path(tempfile.mkdtemp(prefix="stunner-browser-"))
    process = await asyncio.create_subprocess_exec(
        *headless_argv(browser, url, profile),
        stdout=subprocess.DEVNULL,
        stderr=None if verbose else subprocess.DEVNULL,
    )
    try:
        return await asyncio.wait_for(asyncio.shield(outcome), CALL_TIMEOUT)
    except TimeoutError:
        return {"ok": False, "error": f"the page reported nothing within {CALL_TIMEOUT:g} s"}
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), 5)
        if process.returncode is None:
            process.kill()
            await process.wait()
        shutil.rmtree(profile, ignore_errors=True)


def describe(result: Any) -> str:
    """The page's outcome in a few lines."""
    if not isinstance(result, dict):
        return f"the page reported {result!r}"
    if result.get("error"):
        return f"the call failed: {result['error']}"
    pair = result.get("pair") or {}
    return "\n".join(
        [
            f"candidate pair: {pair.get('local')} -> {pair.get('remote')} "
            f"(RTT {pair.get('rttMs')} ms)",
            f"data channel: {result.get('messagesEchoed')} messages echoed, median round trip "
            f"{result.get('channelRttMsMedian', 0):.1f} ms",
            f"video: {result.get('framesDecoded')} frames decoded from the echo, "
            f"{result.get('bytesSent')} bytes sent, {result.get('bytesReceived')} received",
        ]
    )


async def run_browser(
    address: str, port: int, manifests: Path, headless: bool, verbose: bool
) -> int:
    """Local mode on the example (prepared by the demo into `manifests`) with the route opened
    to every port of the media server's address; the page served, and called by headless
    Chromium or a person."""
    browser = find_browser() if headless else None
    if headless and browser is None:
        print(f"no Chromium found (tried $STUNNER_CHROMIUM, {', '.join(BROWSERS)})")
        return 1
    addresses = media_addresses()
    if not addresses:
        print("this machine has no IPv4 address but 127.0.0.1 for the media server's ICE")
        return 1
    route_file = prepare(manifests, port, EXAMPLE_ECHO_PORT)
    route_file.write_text(any_port(route_file.read_text(), EXAMPLE_ECHO_PORT))
    service_file = manifests / "echo.yaml"
    service_file.write_text(media_prefixes(service_file.read_text(), addresses))
    media = MediaEcho()
    settings = local_settings(manifests, address, verbose)
    outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    try:
        async with run_local(settings) as local:
            await local.rendered(1)
            stunnerd = await local.dataplane(GATEWAY_ID)
            await wait_until_serving(address, port, stunnerd)
            app = page_app(media, local.auth_address, outcome)
            async with serving(app, address) as url:
                print(f"stunnerd (pid {stunnerd.pid}) serving TURN on {address}:{port}")
                print(f"the call's page: {url} (relay candidates only)")
                print(f"the echo media server's addresses: {', '.join(addresses)} (the route")
                print("admits them on any port)")
                if browser is None:
                    print("open it in a browser; Ctrl-C to stop")
                    result = await outcome
                    print(describe(result))
                    await asyncio.Event().wait()
                    return 0
                print(f"calling from headless {Path(browser).name} with a fake camera ...")
                result = await headless_call(browser, url, outcome, verbose)
                print(describe(result))
                print(json.dumps(result, indent=2))
                ok = isinstance(result, dict) and result.get("ok") is True
                print("\nresult:", "OK" if ok else "FAILED")
                return 0 if ok else 1
    finally:
        await media.aclose()
