"""`stunner auth-server`: the TURN auth service (ANCHORS §5, Go's `authd`) as its own process.

It watches every config on the CDS (`/api/v1/configs?watch=true`, one WebSocket frame per full
config, the zero config for a deleted Gateway), keeps them in a `ConfigStore`, and serves the
reconciler's own `GET /` and `GET /ice` over it (reconciler.cds.auth_app). The chart runs it in
its own Deployment behind a ClusterIP Service: it is unauthenticated.

To the CDS it shows the projected ServiceAccount token in STUNNER_CDS_TOKEN_FILE (the chart
mounts one of the CDS's audience and lists its account in the reconciler's `--cds-readers`),
read again at every (re)connect as the kubelet rotates it; never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from pathlib import Path

import aiohttp

from reconciler.cds import ConfigStore, auth_app, serve
from stunner_api.cds import (
    CONFIGS_PATH,
    PING_PERIOD,
    RETRY_PERIOD,
    WATCH_PARAM,
    token_headers,
)
from stunner_api.dataplane import ConfigError, validate_config, zero_config
from stunner_api.vocabulary import CDS_TOKEN_FILE_ENV

log = logging.getLogger("stunner.auth")


def apply_frame(store: ConfigStore, text: str) -> None:
    """One CDS frame into the store: a config set, or deleted when it is the zero config."""
    try:
        config = validate_config(json.loads(text))
    except (ValueError, ConfigError) as e:
        log.warning("ignoring a CDS frame that is not a config: %s", e)
        return
    if config == zero_config(config.admin.name):
        store.delete(config.admin.name)
    else:
        store.set(config.admin.name, config)


async def follow(
    store: ConfigStore,
    cds_url: str,
    retry: float = RETRY_PERIOD,
    token_file: Path | None = None,
) -> None:
    """Keep `store` equal to the CDS's configs, reconnecting forever; `token_file`: the CDS
    token (default: STUNNER_CDS_TOKEN_FILE)."""
    url = f"{cds_url.rstrip('/')}{CONFIGS_PATH}?{WATCH_PARAM}=true"
    env = {CDS_TOKEN_FILE_ENV: str(token_file)} if token_file is not None else None
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.ws_connect(
                    url, heartbeat=PING_PERIOD, headers=token_headers(env)
                ) as ws:
                    log.info("watching %s", url)
                    async for message in ws:
                        if message.type == aiohttp.WSMsgType.TEXT:
                            apply_frame(store, message.data)
            except (aiohttp.ClientError, OSError) as e:
                log.warning("CDS %s: %s; retrying in %.0f s", cds_url, e, retry)
            await asyncio.sleep(retry)


async def run(cds_url: str, host: str, port: int, public_address: str) -> None:
    store = ConfigStore()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with serve(auth_app(store, public_address=public_address), host, port) as served:
        log.info("auth service on %s, configs from %s", served.address, cds_url)
        watcher = asyncio.create_task(follow(store, cds_url))
        await stop.wait()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
