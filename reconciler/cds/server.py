"""The config discovery service (CDS) server: the HTTP and WebSocket side of the store of
rendered configs (`ConfigStore`, reconciler.cds.store: the configs by id, their watchers, the
Nodes' public addresses).

`cds_app(store)` serves what stunnerd's CDS client speaks (`stunner_api.cds`, ANCHORS §1.12):
GET `/api/v1/configs[/{namespace}[/{name}]]`, and the same with `?watch=true` over WebSocket
(text frames, one full config each: the current ones on connect, then every change). An unknown
id is a 404 `{code, message}` (a watch on it is accepted and waits: stunnerd may start before
its Gateway renders). The server pings every watcher and drops one that does not answer. A
watcher sends its keepalive and nothing else, or, on a watch of one config, usage reports of
cluster-wide user quotas (reconciler.cds.usage: a Gateway's own pod, on a config with a quota,
is then sent the other reporting pods' counts; a report of anyone else counts nothing and is not
parsed; a watcher that never reports gets configs only). One past WATCH_BUDGET frames is closed
with 1008, as is a frame that is not a valid report and a watch whose token is revoked (one whose
token expires with 1000: reconciler.cds.access, `LAPSED_KEY`); an unmasked frame with 1002
(stunner_http.websocket). Per-watcher log lines come at a bounded rate (LOG_PERIOD).

Relay address discovery (Go's node patcher): a request's `node` parameter names the requesting
stunnerd's Node; every listener `address` that is the node placeholder is replaced, in what
that request or watcher gets, with the Node's public address (`set_nodes`: ExternalIP, else
ExternalDNS resolved here, else the Node's relay-address annotation), else with `$STUNNER_ADDR`
(the pod's own address: stunnerd expands it, and the Gateway's status says which Nodes have no
public address). A request without `node` gets the placeholder, as from Go's. A watcher is sent
its config again when its Node's address changes. GET NODES_PATH lists the Nodes' public
addresses and, per Gateway with a stunnerd on every node, those of the Nodes it runs on (the
auth service's per-node ICE URIs: `node_local`, set from render's plan).

In leader-only mode (reconciler.cluster) a replica that does not lead answers every request 503
with `Retry-After` (`standby_refusal`), before any token check.

`serve` runs an app with the connection discipline of every server of ours
(stunner_http.server): a request deadline, caps on connections in total and per source IP
(CDS_LIMITS, the auth service's AUTH_LIMITS in reconciler.auth, an admin endpoint's otherwise),
accept errors logged at a bounded rate. With access control (`access`), a connection whose
request passed it (a valid token) is proven and never evicted; the CDS, when full, evicts the
oldest unproven connection for a new one rather than refusing it (issue 28 #5), and a request
refused as unauthenticated (401) has its connection closed after the answer: connections without
a valid token cannot shut out the ones with one.

Every watcher has its own bounded queue: at most one pending config per id, a newer one replacing
an older one that was not sent yet (latest config wins). Publishing never waits for a watcher; a
watcher that cannot take a frame within `write_timeout` seconds (not reading, or gone) is dropped,
and the others are not held up.

Secrets are in the configs the CDS serves and nowhere else: logs name ids, never content. The
auth service's endpoints over the same store are reconciler.auth's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus

from aiohttp import WSCloseCode, WSMessage, WSMsgType, web
from aiohttp.typedefs import Middleware

from stunner_api.cds import (
    CONFIG_PATH,
    CONFIGS_PATH,
    LIST_VERSION,
    MAX_USAGE_BYTES,
    NAMESPACE_PATH,
    NODE_PARAM,
    NODES_PATH,
    PING_PERIOD,
    POD_ADDRESS,
    USAGE_REPORT_KEY,
    WATCH_PARAM,
    WRITE_TIMEOUT,
    UsageError,
    encode_usage,
    has_node_placeholder,
    parse_usage,
)
from stunner_api.sessions import (
    ALLOCATION_PARAM,
    DISCONNECT_PATH,
    HELLO,
    MAX_SELECTORS,
    MAX_SESSIONS_BYTES,
    REPORT_KEY,
    SESSIONS_PATH,
    USER_PARAM,
    SessionsError,
    end_frame,
    frame_key,
    parse_report,
    request_frame,
)
from stunner_http.server import (
    LIMITS_KEY,
    NAME_KEY,
    RateLimitedLog,
    Served,
    ServerLimits,
    prove,
)
from stunner_http.server import serve as serve_http
from stunner_http.websocket import FrameBudget, WebSocketGuard

from .access import ACCOUNT_KEY, ALLOWED_KEY, LAPSED_KEY, READER_KEY, REPORTER_KEY, Lapsed
from .sessions import ASKS_PER_SECOND
from .store import ConfigStore, Selector, Watcher
from .usage import LOG_PERIOD

log = logging.getLogger("stunner.cds-server")

# One frame is one config (a few kB; TLS certificates make it larger): wait for the socket to
# drain once this much is buffered, so a watcher that does not read blocks only its own sender.
WRITER_LIMIT = 64 * 1024
# A watch client sends its keepalive (a pong per ping of ours and a ping of its own, each every
# PING_PERIOD: 0.4 frames a second) and, with a user quota, usage reports (at most one every
# REPORT_INTERVAL, 0.2 s: 5 a second). Allowed: 16 at once, then 8 a second (or 4 per heartbeat
# where it is shorter); a ping or report flood runs at thousands a second.
WATCH_BUDGET = FrameBudget(burst=16, rate=8.0)
MAX_CLIENT_MESSAGE = 4096  # a close frame's reason is at most 123 bytes
# A usage report (stunner_api.cds) is at most MAX_USAGE_BYTES; a larger frame is closed (1009).
# A pod's sessions report (stunner_api.sessions) is at most MAX_SESSIONS_BYTES.
MAX_WATCH_MESSAGE = max(MAX_USAGE_BYTES, MAX_SESSIONS_BYTES) + 1024
NO_USAGE = encode_usage(USAGE_REPORT_KEY, {})[0]  # an empty report
# Connections per server (stunner_http.server): every stunnerd replica holds one CDS watch
# (1,000 Gateways with a few replicas each fit); per source IP as stunnerd's TCP listeners (a node
# with a hundred host-network stunnerd pods fits; so do the CLI's reads through the API server's
# service proxy, which all come from its address). The listen queue holds what a connect flood
# sends during one turn of the event loop (red team finding B: at 128 it overflowed and honest
# SYNs were dropped); the kernel caps it at net.core.somaxconn (4096 since Linux 5.4).
CDS_BACKLOG = 4096
CDS_LIMITS = ServerLimits(max_connections=8192, connections_per_source=256, backlog=CDS_BACKLOG)


STORE_KEY = web.AppKey("store", ConfigStore)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_error(status: HTTPStatus, message: str) -> web.Response:
    return web.json_response({"code": int(status), "message": message}, status=status)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own errors (no such path, wrong method) as `{code, message}` too."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return json_error(HTTPStatus(exc.status), f"{exc.reason}: {request.method} {request.path}")


@web.middleware
async def unauthenticated_closed(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outside access control: a connection refused as unauthenticated is not kept alive."""
    response = await handler(request)
    if response.status == HTTPStatus.UNAUTHORIZED and isinstance(response, web.Response):
        response.force_close()
    return response


@web.middleware
async def proven(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Inside access control, so reached only with a valid token: the connection is proven
    (stunner_http.server.prove), never evicted to make room."""
    prove(request)
    return await handler(request)


def _selector(request: web.Request) -> Selector:
    return Selector(
        request.match_info.get("namespace", ""),
        request.match_info.get("name", ""),
        request.get(ALLOWED_KEY),
    )


class CdsHandlers:
    """The CDS endpoints over one `ConfigStore`."""

    def __init__(
        self, store: ConfigStore, *, write_timeout: float, heartbeat: float | None
    ) -> None:
        self.store = store
        self.write_timeout = write_timeout
        self.heartbeat = heartbeat
        self.sockets: set[web.WebSocketResponse] = set()
        rate = max(WATCH_BUDGET.rate, 4 / heartbeat) if heartbeat else WATCH_BUDGET.rate
        self.guard = WebSocketGuard(dataclasses.replace(WATCH_BUDGET, rate=rate))
        # Lines about one watcher (anyone may make many): each kind at most once per LOG_PERIOD.
        self.bad_report_log = RateLimitedLog(log, LOG_PERIOD)
        self.dropped_log = RateLimitedLog(log, LOG_PERIOD)
        self.no_public_address_log = RateLimitedLog(log, LOG_PERIOD)

    async def get(self, request: web.Request) -> web.StreamResponse:
        selector = _selector(request)
        if request.query.get(WATCH_PARAM) == "true":
            if request.headers.get("Upgrade", "").lower() != "websocket":
                return json_error(HTTPStatus.BAD_REQUEST, "watch=true needs a WebSocket upgrade")
            return await self.watch(request, selector)
        node = request.query.get(NODE_PARAM, "")
        if selector.name:
            text = self.store.text(str(selector))
            if text is None:
                return json_error(HTTPStatus.NOT_FOUND, f"config {selector} not found")
            text = self.store.patched(text, node)
            return web.Response(text=text, content_type="application/json")
        items = ",".join(self.store.select(selector, node).values())
        body = f'{{"version":"{LIST_VERSION}","items":[{items}]}}'
        return web.Response(text=body, content_type="application/json")

    async def nodes(self, request: web.Request) -> web.StreamResponse:
        """GET NODES_PATH: the Nodes' public addresses, and per config the Nodes' a Gateway with
        a stunnerd on every node runs on (no secret: Node and Gateway statuses have them); the
        configs the caller may read only."""
        selector = _selector(request)
        gateways = {
            id: list(found)
            for id, found in sorted(self.store.node_local.items())
            if selector.matches(id)
        }
        body = {"version": LIST_VERSION, "nodes": self.store.node_names, "gateways": gateways}
        return web.json_response(body)

    async def watch(self, request: web.Request, selector: Selector) -> web.WebSocketResponse:
        ws = self.guard.response(
            heartbeat=self.heartbeat,
            writer_limit=WRITER_LIMIT,
            compress=False,
            max_msg_size=MAX_WATCH_MESSAGE,
        )
        await ws.prepare(request)
        watcher = Watcher(
            selector,
            peer=request.remote or "?",
            node=request.query.get(NODE_PARAM, ""),
            authenticated=REPORTER_KEY in request,  # cds.access checked its token
            pod=request.get(REPORTER_KEY),
        )
        # No await from here to the registration: no change can slip in between.
        for id, text in self.store.select(selector, watcher.node).items():
            watcher.offer(id, text)
        self.store.watchers.add(watcher)
        self.sockets.add(ws)
        # Anyone may connect: one DEBUG line each (issue 20); `store.watchers` counts them.
        log.debug("watcher %s connected for %s", watcher.peer, selector)
        if watcher.node and self.store.node_address(watcher.node) == POD_ADDRESS:
            discovering = [
                id
                for id in self.store.select(selector)
                if has_node_placeholder(self.store.text(id) or "")
            ]
            if discovering:
                self.no_public_address_log.event(
                    logging.INFO,
                    "watcher %s on Node %s: the Node has no public address (ExternalIP or "
                    "ExternalDNS), so %s hand clients the pod's own address",
                    watcher.peer,
                    watcher.node,
                    ", ".join(discovering),
                )
        sender = asyncio.create_task(self._send(ws, watcher, request))
        lapsed = request.get(LAPSED_KEY)
        guard = asyncio.create_task(self._close_when(ws, lapsed)) if lapsed else None
        try:
            # Control frames are handled inside; a client sending more (the guard's budget) or
            # an unmasked frame is closed there. A text frame is a usage report.
            async for message in ws:
                if message.type == WSMsgType.ERROR:
                    break
                problem = self._on_frame(watcher, message)
                if problem is not None:
                    self.bad_report_log.event(
                        logging.WARNING, "watcher %s closed: %s", watcher.peer, problem
                    )
                    await ws.close(
                        code=WSCloseCode.POLICY_VIOLATION, message=problem.encode()[:120]
                    )
                    break
        except ConnectionError:
            pass  # the client went away: not an error
        finally:
            self.store.forget(watcher)
            self.sockets.discard(ws)
            for task in (sender, guard):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            log.debug("watcher %s for %s disconnected", watcher.peer, selector)
        return ws

    @staticmethod
    async def _close_when(ws: web.WebSocketResponse, lapsed: Lapsed) -> None:
        """Close the watch (with the code and reason given) once its token no longer
        authenticates."""
        code, reason = await lapsed()
        await ws.close(code=code, message=reason.encode()[:120])

    def _on_frame(self, watcher: Watcher, message: WSMessage) -> str | None:
        """A client frame: a usage report is recorded, a sessions report taken; anything else
        is a problem (returned)."""
        if message.type != WSMsgType.TEXT:
            return f"unexpected {message.type.name} frame"
        if not watcher.selector.name:
            return "a usage report needs a watch of one config"
        if frame_key(message.data) == REPORT_KEY:
            return self._on_sessions(watcher, message.data)
        if len(message.data) > MAX_USAGE_BYTES + 1024:
            return f"a frame of {len(message.data)} bytes is no usage report"
        refusal = self.store.usage.refusal(watcher)
        if refusal is not None:  # counts nothing: not worth a parse
            if message.data == NO_USAGE:  # nothing to count (stunnerd's last, quota gone)
                self.store.usage.forget(watcher)
            else:
                self.store.usage.refuse(watcher, refusal)
            return None
        try:
            counts = parse_usage(message.data, USAGE_REPORT_KEY)
        except UsageError as exc:
            return str(exc)
        self.store.usage.report(watcher, counts)
        return None

    def _on_sessions(self, watcher: Watcher, text: str) -> str | None:
        """A sessions report: the hello that makes `watcher` one that is asked, or an answer."""
        if not watcher.may_report:  # a token bound to no pod: it answers for no pod
            return None
        try:
            request, pod, sessions, omitted = parse_report(text)
        except SessionsError as exc:
            return str(exc)
        if request == HELLO:
            watcher.sessions_pod = watcher.pod.name if watcher.pod is not None else pod
            watcher.sessions_pod = watcher.sessions_pod or watcher.peer
            return None
        if watcher.sessions_pod:
            self.store.sessions.answered(watcher, request, sessions, omitted)
        return None

    async def sessions(self, request: web.Request) -> web.StreamResponse:
        """GET SESSIONS_PATH: every live allocation of the Gateway's pods (readers only)."""
        id, refusal = self._sessions_caller(request)
        if refusal is not None:
            return refusal
        gathered = await self.store.sessions.ask(self.store.answering(id), request_frame)
        return web.json_response(gathered.as_json(id))

    async def disconnect(self, request: web.Request) -> web.StreamResponse:
        """POST DISCONNECT_PATH?user=U&allocation=ID (each repeatable): end those allocations
        on every pod of the Gateway; answers what ended, and logs who asked."""
        id, refusal = self._sessions_caller(request)
        if refusal is not None:
            return refusal
        users = frozenset(v for v in request.query.getall(USER_PARAM, []) if v)
        ids = frozenset(v for v in request.query.getall(ALLOCATION_PARAM, []) if v)
        if not users and not ids:
            return json_error(
                HTTPStatus.BAD_REQUEST, f"name a {USER_PARAM} or an {ALLOCATION_PARAM} to end"
            )
        if len(users) + len(ids) > MAX_SELECTORS:
            return json_error(HTTPStatus.BAD_REQUEST, f"at most {MAX_SELECTORS} names at once")
        gathered = await self.store.sessions.ask(
            self.store.answering(id), lambda r: end_frame(r, users, ids)
        )
        log.warning(
            "disconnect asked by %s for %s (users %s, allocations %s): ended %d allocation(s)%s%s",
            request.get(ACCOUNT_KEY, "an unauthenticated caller (no --cds-auth)"),
            id,
            sorted(users) or "-",
            sorted(ids) or "-",
            len(gathered.sessions),
            "".join(f" {s['id']}@{s['pod']}" for s in gathered.sessions[:20]),
            f"; pods that did not answer: {', '.join(gathered.silent)}" if gathered.silent else "",
        )
        return web.json_response(gathered.as_json(id))

    def _sessions_caller(self, request: web.Request) -> tuple[str, web.Response | None]:
        """The config id of a sessions request, and a refusal unless the caller may ask: with
        access control, only the readers (the CLI's account)."""
        selector = _selector(request)
        id = str(selector)
        if READER_KEY in request and not request[READER_KEY]:
            return id, json_error(
                HTTPStatus.FORBIDDEN,
                f"ServiceAccount {request[ACCOUNT_KEY]} may not list or end sessions (readers "
                "only: --cds-readers)",
            )
        if self.store.text(id) is None:
            return id, json_error(HTTPStatus.NOT_FOUND, f"config {id} not found")
        if not self.store.sessions.admit(id):
            return id, json_error(
                HTTPStatus.TOO_MANY_REQUESTS,
                f"at most {ASKS_PER_SECOND} sessions requests a second per Gateway: ask again",
            )
        return id, None

    async def _send(
        self, ws: web.WebSocketResponse, watcher: Watcher, request: web.Request
    ) -> None:
        while True:
            for text in await watcher.take():
                try:
                    await asyncio.wait_for(ws.send_str(text), self.write_timeout)
                except (TimeoutError, ConnectionError, RuntimeError) as exc:
                    # RuntimeError: aiohttp's "cannot write to closing transport"
                    self.store.forget(watcher)
                    self.store.dropped_watchers += 1
                    self.dropped_log.event(
                        logging.WARNING,
                        "dropping watcher %s for %s: %s",
                        watcher.peer,
                        watcher.selector,
                        "not reading" if isinstance(exc, TimeoutError) else "connection lost",
                    )
                    if request.transport is not None:
                        request.transport.abort()  # ends the reader loop in watch()
                    return

    async def close_all(self) -> None:
        """Close every watcher's WebSocket (clients reconnect)."""

        async def close(ws: web.WebSocketResponse) -> None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(code=1001, message=b"going away"), 0.5)

        await asyncio.gather(*(close(ws) for ws in list(self.sockets)))


HANDLERS_KEY = web.AppKey("cds", CdsHandlers)


def standby_refusal(standby: Callable[[], str | None], retry_after: float) -> Middleware:
    """A middleware that answers every request 503 with `Retry-After` (whole seconds, at least
    1) and closes the connection while `standby()` gives a reason (a replica that does not lead
    in leader-only mode, reconciler.cluster): nothing is read or counted there, and the client
    retries, through the Service, on the leader."""
    seconds = str(max(1, math.ceil(retry_after)))

    @web.middleware
    async def refuse_on_standby(request: web.Request, handler: Handler) -> web.StreamResponse:
        why = standby()
        if why is None:
            return await handler(request)
        response = json_error(HTTPStatus.SERVICE_UNAVAILABLE, why)
        response.headers["Retry-After"] = seconds
        response.force_close()
        return response

    return refuse_on_standby


def cds_app(
    store: ConfigStore,
    *,
    write_timeout: float = WRITE_TIMEOUT,
    heartbeat: float | None = PING_PERIOD,
    access: Middleware | None = None,
    standby: Callable[[], str | None] | None = None,
    retry_after: float = 1.0,
) -> web.Application:
    """The CDS as an aiohttp application over `store`; `access`: a middleware that decides
    who reads what (`reconciler.cds.access.Access.middleware`), None: everyone reads all;
    `standby`: while it gives a reason, every request is answered 503 (`standby_refusal`),
    before any token is checked."""
    handlers = CdsHandlers(store, write_timeout=write_timeout, heartbeat=heartbeat)
    guarded = [unauthenticated_closed, access, proven] if access else []
    refused = [standby_refusal(standby, retry_after)] if standby else []
    app = web.Application(
        middlewares=[json_errors, *refused, *guarded], client_max_size=MAX_CLIENT_MESSAGE
    )
    app[STORE_KEY] = store
    app[HANDLERS_KEY] = handlers
    app[LIMITS_KEY] = dataclasses.replace(CDS_LIMITS, evict_unproven=access is not None)
    app[NAME_KEY] = "CDS"
    for path in (CONFIGS_PATH, NAMESPACE_PATH, CONFIG_PATH):
        app.router.add_get(path, handlers.get, allow_head=False)
    app.router.add_get(NODES_PATH, handlers.nodes, allow_head=False)
    app.router.add_get(SESSIONS_PATH, handlers.sessions, allow_head=False)
    app.router.add_post(DISCONNECT_PATH, handlers.disconnect)

    async def on_shutdown(app: web.Application) -> None:
        await handlers.close_all()

    app.on_shutdown.append(on_shutdown)
    return app


@contextlib.asynccontextmanager
async def serve(
    app: web.Application, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[Served]:
    """Serve `app` on host:port (0: any free port) until the block ends, with the connection
    discipline of `stunner_http.server` and the app's limits (CDS_LIMITS, reconciler.auth's
    AUTH_LIMITS, else an admin endpoint's); open WebSockets are closed on exit."""
    async with serve_http(app, host, port) as served:
        yield served
