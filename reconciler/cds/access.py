"""Who may read which config from the CDS (issue 20 #5): bearer tokens checked with TokenReview.

In cluster mode (`--cds-auth=required`) every CDS request carries a ServiceAccount token of the
CDS's audience (`CDS_TOKEN_AUDIENCE`) in `Authorization: Bearer …` or, through the API server's
service proxy, which strips Authorization, in `X-Stunner-Authorization: Bearer …`. The token is
verified with a TokenReview asking for that audience only (`TokenVerifier`), so a token minted
for the API server is refused here and ours is refused by the API server.

A caller `system:serviceaccount:NS:SA` may read config `NS/GW` iff SA is the ServiceAccount the
Gateway's dataplane runs as (`account_of`: the one rendered for the Gateway, `GW-stunnerd`,
unless its Dataplane names one; issue 28 #3), or is one of the readers (`--cds-readers NS/SA,…`:
the auth service, the CLI's reader account) who may read every config. The decision is taken
again for every config sent, so a watcher never receives a config its account stops (or has not
yet started) being allowed to read. The lists (`/api/v1/configs`, `/api/v1/configs/NS`) hold
only what the caller may read.

A projected (bound) token names its pod: the TokenReview answers its name and uid in
`status.user.extra` (reconciler.cds.quota.PodClaim), kept as the account's `pod`. Usage
reports of cluster-wide user quotas count only from a pod of the Gateway (reconciler.cds.store):
the middleware leaves the pod a caller may report as under REPORTER_KEY, None for a reader (who
never reports) or a token bound to no pod.

Answers: no or unverifiable token 401 (with `WWW-Authenticate: Bearer`); a config the caller may
not read 403 (decided from the id and the caller alone, whether the config exists or not); the
TokenReview failing (API server away, RBAC missing) 503. Each refusal is counted
(`stunner_reconciler_cds_refusals_total{reason}`) and logged at most once per `LOG_PERIOD`
seconds per reason, with the count of the ones not logged; a token is never logged.

Verifying costs the API server a TokenReview, so a token that is not a JWT claiming our audience
(unexpired) is refused without one, and answers are cached by the token's SHA-256: an
authenticated one until min(the token's `exp`, `MAX_TTL` seconds), a refused one for
`NEGATIVE_TTL` seconds, an API failure not at all. Concurrent requests with the same token share
one review, at most `CONCURRENCY` reviews run at once (a flood of made-up tokens cannot swamp
the API server), the cache holds at most `MAX_ENTRIES` tokens, and every review runs in a thread.

A token stops reading within `MAX_TTL` seconds of the API server refusing it (issue 28 #8: its
pod or ServiceAccount deleted, or expired), and so does a watch: the watch handler awaits
`LAPSED_KEY`'s callable, which asks again each time the token's cached answer runs out
(`until_lapsed`) and returns once the token no longer authenticates; the watch is then closed
and counted: `revoked` with 1008 (policy violation, the reason in the close frame), `expired`
with 1000 (the routine end of a projected token, which the kubelet has rotated by then:
stunnerd reconnects at once with the new one). That is one TokenReview
per `MAX_TTL` per watching token, however many requests show it. While the API server cannot
answer, a watch is kept and asked about again `MAX_TTL` later (new requests get 503).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from http import HTTPStatus
from typing import Any

from aiohttp import WSCloseCode, web
from prometheus_client import CollectorRegistry, Counter

from stunner_api.cds import InvalidId, config_id, split_id
from stunner_api.vocabulary import CDS_AUTH_HEADERS, CDS_SERVICE_NAME, CDS_TOKEN_AUDIENCE
from stunner_http.server import RateLimitedLog

from .quota import PodClaim

log = logging.getLogger("stunner.cds-server")

# Seconds an authenticated answer is trusted: a revoked token reads no more, and its watch is
# closed, within this long after the API server refuses it (which itself trusts a token it
# authenticated for as long: kube-apiserver's --token-auth cache, TokenSuccessCacheTTL 10 s).
MAX_TTL = 10.0
NEGATIVE_TTL = 10.0  # seconds a refused token stays refused without asking again
MAX_ENTRIES = 10_000
CONCURRENCY = 4
LOG_PERIOD = 10.0
MAX_TOKEN = 16 * 1024  # bytes; a longer "token" is refused unasked
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
Allowed = Callable[[str], bool]
# The request key under which the middleware leaves the caller's "may read this id" predicate.
ALLOWED_KEY: web.RequestKey[Allowed] = web.RequestKey("stunner.cds.allowed")
# An awaitable that returns only once the caller's token no longer authenticates: the close code
# and reason for its watch.
Lapsed = Callable[[], Awaitable[tuple[int, str]]]
# The request key under which the middleware leaves it, for a watch to close on.
LAPSED_KEY: web.RequestKey[Lapsed] = web.RequestKey("stunner.cds.lapsed")
Review = Callable[[str], Mapping[str, Any]]  # blocking: a token -> its TokenReview status


class AuthMode(StrEnum):
    REQUIRED = "required"
    OFF = "off"


class Lapse(StrEnum):
    """Why a token that authenticated no longer does."""

    REVOKED = "revoked"  # the API server refuses it: its pod or ServiceAccount is gone
    EXPIRED = "expired"  # past its `exp`


class ReviewUnavailable(Exception):
    """The TokenReview could not be asked (the message says why; it never holds the token)."""


@dataclass(frozen=True)
class Account:
    """A ServiceAccount: `namespace/name`; `pod`: the pod its token is bound to (not part of
    the account's identity: compared and hashed without it)."""

    namespace: str
    name: str
    pod: PodClaim | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def of_user(cls, username: str) -> Account | None:
        """The account of a `system:serviceaccount:NS:SA` user name, else None."""
        if not username.startswith(SERVICE_ACCOUNT_PREFIX):
            return None
        namespace, sep, name = username.removeprefix(SERVICE_ACCOUNT_PREFIX).partition(":")
        return cls(namespace, name) if sep and namespace and name and ":" not in name else None


# The request key under which the middleware leaves the pod the caller may report usage as (the
# pod its token is bound to), None when it may not (a reader, a token bound to no pod).
REPORTER_KEY: web.RequestKey[PodClaim | None] = web.RequestKey("stunner.cds.reporter")
# The caller's account (`namespace/name`), and whether it is one of the readers: only they may
# list and end sessions (reconciler.cds.sessions), and the CDS logs who ended what.
ACCOUNT_KEY: web.RequestKey[str] = web.RequestKey("stunner.cds.account")
READER_KEY: web.RequestKey[bool] = web.RequestKey("stunner.cds.reader")


def parse_readers(text: str) -> frozenset[Account]:
    """`--cds-readers`: `NS/SA` items, comma separated; ValueError naming a bad one."""
    readers = set()
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            readers.add(Account(*split_id(item)))
        except InvalidId:
            raise ValueError(f"not a ServiceAccount <namespace>/<name>: {item!r}") from None
    return frozenset(readers)


def token_claims(token: str) -> dict[str, Any] | None:
    """The claims of a JWT, read and NOT verified (only the TokenReview says whether they are
    true); None when the token is not JWT-shaped."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        return None
    return payload if isinstance(payload, dict) else None


def token_expiry(token: str) -> float | None:
    """The `exp` claim of a JWT (unverified: only to bound how long a verified token's answer is
    cached), None when it has none."""
    exp = (token_claims(token) or {}).get("exp")
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


def could_be_ours(token: str, audience: str, now: float) -> bool:
    """Whether a token is worth a TokenReview: a JWT that claims our audience and has not
    expired. Anything else (garbage, a token for the API server) is refused unasked; a forged
    JWT that claims all this still costs one review (at most CONCURRENCY at once)."""
    claims = token_claims(token)
    if claims is None:
        return False
    aud = claims.get("aud")
    audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    exp = claims.get("exp")
    expired = isinstance(exp, int | float) and not isinstance(exp, bool) and exp <= now
    return audience in audiences and not expired


class TokenVerifier:
    """Tokens to accounts through TokenReview, cached (see the module's docstring)."""

    def __init__(
        self,
        review: Review,
        *,
        audience: str = CDS_TOKEN_AUDIENCE,
        max_ttl: float = MAX_TTL,
        negative_ttl: float = NEGATIVE_TTL,
        max_entries: int = MAX_ENTRIES,
        concurrency: int = CONCURRENCY,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,  # on `clock`
    ) -> None:
        self.review = review
        self.audience = audience
        self.max_ttl = max_ttl
        self.negative_ttl = negative_ttl
        self.max_entries = max_entries
        self.clock = clock
        self.wall_clock = wall_clock
        self.sleep = sleep
        self.reviews = 0  # TokenReviews asked
        self._cache: OrderedDict[bytes, tuple[float, Account | None]] = OrderedDict()
        self._pending: dict[bytes, asyncio.Future[Account | None]] = {}
        self._slots = asyncio.Semaphore(concurrency)

    async def account(self, token: str) -> Account | None:
        """The ServiceAccount `token` authenticates for our audience, None if it does not;
        ReviewUnavailable if the API server cannot tell now."""
        if len(token) > MAX_TOKEN:
            return None
        key = _key(token)
        cached = self._cache.get(key)
        if cached is not None and cached[0] > self.clock():
            self._cache.move_to_end(key)
            return cached[1]
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        if not could_be_ours(token, self.audience, self.wall_clock()):
            self._remember(key, None, self.negative_ttl)
            return None
        future: asyncio.Future[Account | None] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            async with self._slots:
                self.reviews += 1
                status = await asyncio.to_thread(self.review, token)
            account = self._judge(status)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: nobody else may be waiting
            raise
        finally:
            del self._pending[key]
        ttl = self.negative_ttl
        if account is not None:
            expiry = token_expiry(token)
            left = self.max_ttl if expiry is None else expiry - self.wall_clock()
            ttl = max(0.0, min(self.max_ttl, left))
        self._remember(key, account, ttl)
        future.set_result(account)
        return account

    def cached_for(self, token: str) -> float:
        """Seconds the cached answer about `token` is still trusted (0: none is)."""
        cached = self._cache.get(_key(token))
        return max(0.0, cached[0] - self.clock()) if cached is not None else 0.0

    async def until_lapsed(self, token: str, account: Account) -> Lapse:
        """Returns only once `token`, which authenticated as `account`, no longer does (see the
        module's docstring): asked again whenever its cached answer runs out, so at most
        `max_ttl` seconds after the API server refuses it."""
        while True:
            await self.sleep(self.cached_for(token) or self.max_ttl)
            try:
                now = await self.account(token)
            except ReviewUnavailable:
                continue  # the API server cannot tell now: keep it, ask again later
            if now != account:
                expiry = token_expiry(token)
                expired = expiry is not None and expiry <= self.wall_clock()
                return Lapse.EXPIRED if expired else Lapse.REVOKED

    def _remember(self, key: bytes, account: Account | None, ttl: float) -> None:
        self._cache[key] = (self.clock() + ttl, account)
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)

    def _judge(self, status: Mapping[str, Any]) -> Account | None:
        if status.get("authenticated") is not True:
            return None
        # An authenticator that ignores audiences answers none: then the token is not ours.
        if self.audience not in (status.get("audiences") or ()):
            return None
        user = status.get("user")
        username = user.get("username") if isinstance(user, Mapping) else None
        account = Account.of_user(username) if isinstance(username, str) else None
        if account is None or not isinstance(user, Mapping):
            return None
        return replace(account, pod=PodClaim.of_user(user))


def _key(token: str) -> bytes:
    """A token's key in the cache (the token itself is not kept there)."""
    return hashlib.sha256(token.encode()).digest()


class RefusalLog:
    """Refusals counted, and logged at most once per `period` seconds per reason (the shared
    stunner_http.server.RateLimitedLog, one per reason)."""

    def __init__(
        self,
        registry: CollectorRegistry | None,
        period: float = LOG_PERIOD,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.counter = Counter(
            "stunner_reconciler_cds_refusals",
            "CDS requests refused, by reason (unauthenticated, forbidden, unavailable; watches "
            "closed: revoked, expired)",
            ("reason",),
            registry=registry,
        )
        self.period = period
        self.clock = clock
        self._logs: dict[str, RateLimitedLog] = {}

    def refused(self, reason: str, message: str, level: int = logging.WARNING) -> None:
        self.counter.labels(reason).inc()
        if level < logging.WARNING:  # routine: every time, where asked for
            log.log(level, "CDS request refused (%s): %s", reason, message)
            return
        if reason not in self._logs:
            self._logs[reason] = RateLimitedLog(log, self.period, self.clock)
        self._logs[reason].event(logging.WARNING, "CDS request refused (%s): %s", reason, message)


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The bearer token of the first CDS auth header present, else None."""
    for header in CDS_AUTH_HEADERS:
        value = headers.get(header)
        if value is None:
            continue
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return None


class Access:
    """The CDS's access policy: a verifier, the readers, and each config's account."""

    def __init__(
        self,
        verifier: TokenVerifier,
        *,
        readers: Iterable[Account] = (),
        account_of: Callable[[str], str | None],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.verifier = verifier
        self.readers = frozenset(readers)
        self.account_of = account_of
        self.refusals = RefusalLog(registry)

    def may_read(self, account: Account, id: str) -> bool:
        if account in self.readers:
            return True
        namespace, _, _ = id.partition("/")
        return account.namespace == namespace and account.name == self.account_of(id)

    def _refuse(
        self, request: web.Request, status: HTTPStatus, reason: str, message: str
    ) -> web.Response:
        self.refusals.refused(reason, f"{request.remote or '?'} {request.path}: {message}")
        response = web.json_response({"code": int(status), "message": message}, status=status)
        if status == HTTPStatus.UNAUTHORIZED:
            response.headers["WWW-Authenticate"] = f'Bearer realm="{CDS_SERVICE_NAME}"'
        return response

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        token = bearer_token(request.headers)
        if token is None:
            return self._refuse(
                request,
                HTTPStatus.UNAUTHORIZED,
                "unauthenticated",
                "a ServiceAccount token of audience "
                f"{self.verifier.audience} is needed (Authorization: Bearer)",
            )
        try:
            account = await self.verifier.account(token)
        except ReviewUnavailable as exc:
            return self._refuse(
                request,
                HTTPStatus.SERVICE_UNAVAILABLE,
                "unavailable",
                f"cannot verify the token now: {exc}",
            )
        if account is None:
            return self._refuse(
                request,
                HTTPStatus.UNAUTHORIZED,
                "unauthenticated",
                "the token is not a valid ServiceAccount token of audience "
                f"{self.verifier.audience}",
            )
        namespace = request.match_info.get("namespace", "")
        name = request.match_info.get("name", "")
        if name and not self.may_read(account, config_id(namespace, name)):
            return self._refuse(
                request,
                HTTPStatus.FORBIDDEN,
                "forbidden",
                f"ServiceAccount {account} may not read config {config_id(namespace, name)}",
            )
        request[ALLOWED_KEY] = lambda id: self.may_read(account, id)
        request[LAPSED_KEY] = lambda: self._lapsed(request, token, account)
        request[REPORTER_KEY] = None if account in self.readers else account.pod
        request[ACCOUNT_KEY] = str(account)
        request[READER_KEY] = account in self.readers
        return await handler(request)

    async def _lapsed(self, request: web.Request, token: str, account: Account) -> tuple[int, str]:
        """The watch's `LAPSED_KEY`: returns once its token no longer authenticates (counted,
        and logged: at DEBUG when it merely expired), with the close code and reason."""
        lapse = await self.verifier.until_lapsed(token, account)
        expired = lapse == Lapse.EXPIRED
        message = f"the token of ServiceAccount {account} " + (
            "expired" if expired else "no longer authenticates"
        )
        where = f"{request.remote or '?'} {request.path}: watch closed: {message}"
        self.refusals.refused(lapse, where, logging.DEBUG if expired else logging.WARNING)
        return (WSCloseCode.OK if expired else WSCloseCode.POLICY_VIOLATION), message
