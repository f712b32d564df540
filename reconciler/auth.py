"""The auth service (ANCHORS §5, Go's `authd`): TURN credentials and ICE-server JSON over the
configs the CDS serves, beside the CDS server (reconciler.cds.server).

`auth_app(store)` serves its TURN REST endpoints: `GET /` (credentials) and `GET /ice`
(ICE-server JSON), computed by `stunner_api.ice` over a `ConfigStore`. Like Go's, it is
unauthenticated: serve it where only the application server reaches it. Secrets are in these
answers and nowhere else: logs name ids, never content. Local mode serves it over the store it
renders into; `stunner auth-server` (the chart's auth Deployment) runs `run`, which fills a
store of its own by following every config on the CDS (`follow`, through the one CDS client,
stunner_client.cds, which stunnerd's config source shares), and the Nodes' public addresses
of the Gateways with a stunnerd on every node (NODES_PATH, asked every NODES_PERIOD seconds).

To the CDS the follower shows the projected ServiceAccount token in STUNNER_CDS_TOKEN_FILE (the
chart mounts one of the CDS's audience and lists its account in the reconciler's
`--cds-readers`), read again at every (re)connect as the kubelet rotates it; never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from stunner_api.cds import CONFIGS_PATH, NODES_PATH, RETRY_PERIOD
from stunner_api.dataplane import ConfigError, StunnerConfig, validate_config, zero_config
from stunner_api.ice import IceError, IceQuery, ice_config, turn_auth
from stunner_api.vocabulary import CDS_TOKEN_FILE_ENV
from stunner_client.cds import CdsClient, CdsError
from stunner_http.server import LIMITS_KEY, NAME_KEY, RateLimitedLog, ServerLimits

from .cds.server import MAX_CLIENT_MESSAGE, STORE_KEY, Handler, json_error, json_errors, serve
from .cds.store import ConfigStore

auth_log = logging.getLogger("stunner.auth-service")
log = logging.getLogger("stunner.auth")

# Connections (stunner_http.server): the auth service answers an application server's short
# requests; one source IP (an application server's pool of keep-alive connections) holds at most
# a quarter of them, so one client cannot shut the others out.
AUTH_LIMITS = ServerLimits(max_connections=1024, connections_per_source=256)

Builder = Callable[
    [Mapping[str, StunnerConfig], IceQuery, int, str, Mapping[str, Sequence[str]]],
    dict[str, Any],
]
# How often the auth service asks the CDS for the Nodes' public addresses (a Gateway with relay
# address discovery has a URI per node; Nodes change rarely, and no config change says so).
NODES_PERIOD = 10.0


def auth_app(
    store: ConfigStore,
    *,
    public_address: str = "",
    clock: Callable[[], float] = time.time,
) -> web.Application:
    """The auth service's `GET /` and `GET /ice` as an aiohttp application over `store`.
    `public_address`: the address put in the URIs unless the request names one (Go's
    STUNNER_PUBLIC_ADDR)."""

    # Anyone may send a bad query: a WARNING line per 10 s at most, with a count.
    bad_queries = RateLimitedLog(auth_log, AUTH_LIMITS.log_period)

    def answer(build: Builder) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            try:
                query = IceQuery.from_params(request.query)
                nodes = store.node_local
                body = build(store.configs, query, int(clock()), public_address, nodes)
            except IceError as exc:
                bad_queries.event(
                    logging.WARNING,
                    "%s %s: %d %s",
                    request.method,
                    request.path[:64],
                    int(exc.status),
                    exc.message,
                )
                return json_error(exc.status, exc.message)
            auth_log.debug("%s %s: answered", request.method, request.path)
            return web.Response(text=json.dumps(body), content_type="application/json")

        return handler

    app = web.Application(middlewares=[json_errors], client_max_size=MAX_CLIENT_MESSAGE)
    app[STORE_KEY] = store
    app[LIMITS_KEY] = AUTH_LIMITS
    app[NAME_KEY] = "auth service"
    app.router.add_get("/", answer(turn_auth), allow_head=False)
    app.router.add_get("/ice", answer(ice_config), allow_head=False)
    return app


def apply_frame(store: ConfigStore, text: str | bytes) -> None:
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
    env = {CDS_TOKEN_FILE_ENV: str(token_file)} if token_file is not None else None
    cds = CdsClient(cds_url, env=env, retry_period=retry, logger=log)
    nodes = asyncio.create_task(follow_nodes(store, cds))
    try:
        async for frame in cds.watch(CONFIGS_PATH, what="every config"):
            apply_frame(store, frame)
    finally:
        nodes.cancel()


async def follow_nodes(store: ConfigStore, cds: CdsClient, period: float = NODES_PERIOD) -> None:
    """Keep the store's per-Gateway node addresses (`node_local`) those the CDS serves
    (NODES_PATH), asked every `period` seconds; an unanswered ask keeps the last ones (logged
    once until answered)."""
    failing = False
    while True:
        try:
            body = await asyncio.to_thread(cds.get, NODES_PATH, None, what="Node addresses")
            gateways = json.loads(body).get("gateways")
            if not isinstance(gateways, dict):
                raise ValueError("no gateways map in the answer")
            store.node_local = {
                str(id): tuple(str(a) for a in found)
                for id, found in gateways.items()
                if isinstance(found, list)
            }
            failing = False
        except (CdsError, ValueError) as exc:
            if not failing:
                log.warning("cannot read the Nodes' public addresses from the CDS: %s", exc)
            failing = True
        await asyncio.sleep(period)


async def run(cds_url: str, host: str, port: int, public_address: str) -> None:
    """`stunner auth-server`: serve `auth_app` on host:port over the configs followed from the
    CDS at `cds_url`, until SIGINT or SIGTERM."""
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
