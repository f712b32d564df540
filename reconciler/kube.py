"""The reconciler's Kubernetes side (its ONLY importer of `kubernetes`): list+watch into a cache,
writes, and the leader-election Lease.

Watching (`Informer`, one thread per watched kind, `WATCHED`): list, then watch from the list's
resourceVersion with bookmarks (the official client's `watch.Watch` helper), resuming from the
last resourceVersion seen when a stream ends; a 410 Gone relists; any other failure is retried
with exponential back-off (`BACKOFF_INITIAL` doubling to `BACKOFF_MAX`) and counted as a watch
restart. Every change lands in the `Cache` and is offered to a callback (the cluster mode decides
whether it is worth a render). The cache is *fresh* while every kind has listed once and no kind
has been failing for longer than `stale_after` seconds (`Cache.freshness`).

Writing (`Writer`): the `reconciler.apply.Write`s, one request each; the API server's answer
goes straight into the cache (a second pass before the watch event arrives sees it). A refused
write (422, 403, anything) is logged with the object and retried with back-off by the caller; a
409 re-reads the object into the cache first.

Leader election (`LeaseElector`): a `coordination.k8s.io/v1` Lease with client-go's semantics
(acquire when absent, released or not renewed for `lease_duration` by our clock; renew every
`retry_period`; give up leading when no renewal succeeded for `renew_deadline`; release on
shutdown by clearing the holder). The pinned client's `leaderelection` package has a LeaseLock,
but its `LeaderElection` runs endless loops with no stop and no release-on-cancel, exits the
process on a configuration error and needs retry periods of at least a second: so the loop is
ours, the Lease fields and their meaning are client-go's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kubernetes.client
import kubernetes.config
import kubernetes.watch

from stunner_api.vocabulary import (
    DATAPLANE,
    GATEWAY,
    GATEWAY_API_UDP_ROUTE,
    GATEWAY_CLASS,
    GATEWAY_CONFIG,
    OWNED_BY_LABEL,
    OWNED_BY_VALUE,
    REFERENCE_GRANT,
    SECRET,
    SERVICE,
    STATIC_SERVICE,
    STUNNER_UDP_ROUTE,
    KindInfo,
)

from .apply import Verb, Write
from .store import Object, meta

log = logging.getLogger("stunner.kube")

# The client's untyped parts, typed as Any once here.
_config: Any = kubernetes.config
ApiException: Any = kubernetes.client.exceptions.ApiException
Watch: Any = kubernetes.watch.Watch

BACKOFF_INITIAL = 0.2  # seconds before the first retry of a failed list/watch
BACKOFF_MAX = 30.0
WATCH_TIMEOUT = 300  # seconds a watch request lasts (the client then resumes it)
STALE_AFTER = 60.0  # seconds a kind's watch may be failing before the cache is not fresh
NOT_SERVED_RETRY = 30.0  # seconds between looks for a kind the API server does not serve
REQUEST_TIMEOUT = 30.0  # seconds for a single non-watch request
# Every create, update and patch names us, so managedFields credit the reconciler (not the
# client's user agent) with the fields it set, and others' fields stay theirs.
FIELD_MANAGER = "stunner-reconciler"
FIELD_MANAGED_METHODS = frozenset({"POST", "PUT", "PATCH"})

NAMESPACE = KindInfo("", "Namespace", "namespaces", ("v1",), False)
NODE = KindInfo("", "Node", "nodes", ("v1",), False)
ENDPOINT_SLICE = KindInfo("discovery.k8s.io", "EndpointSlice", "endpointslices", ("v1",))
DEPLOYMENT = KindInfo("apps", "Deployment", "deployments", ("v1",))
LEASE = KindInfo("coordination.k8s.io", "Lease", "leases", ("v1",))
EVENT = KindInfo("events.k8s.io", "Event", "events", ("v1",))
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"  # the CDS's token checks


def _path(info: KindInfo, version: str, namespace: str = "", name: str = "") -> str:
    base = f"/apis/{info.group}/{version}" if info.group else f"/api/{version}"
    if info.namespaced and namespace:
        base += f"/namespaces/{namespace}"
    base += f"/{info.plural}"
    return f"{base}/{name}" if name else base


@dataclass(frozen=True)
class Watched:
    """One kind the reconciler lists and watches; `versions` in order of preference (the first
    the API server serves is watched: an optional CRD version is detected, as Go does)."""

    info: KindInfo
    versions: tuple[str, ...]
    label_selector: str = ""
    rendered: bool = True  # handed to render (Deployments are only compared with the plan)

    @property
    def name(self) -> str:
        return f"{self.info.kind}.{self.info.group}" if self.info.group else self.info.kind


# ANCHORS §2.8's watch list: what render reads, plus the Deployments we own.
WATCHED: tuple[Watched, ...] = (
    Watched(GATEWAY_CLASS, ("v1",)),
    Watched(GATEWAY_CONFIG, ("v1",)),
    Watched(DATAPLANE, ("v1",)),
    Watched(GATEWAY, ("v1",)),
    Watched(STUNNER_UDP_ROUTE, ("v1",)),
    Watched(GATEWAY_API_UDP_ROUTE, ("v1", "v1alpha2")),
    Watched(STATIC_SERVICE, ("v1",)),
    Watched(SERVICE, ("v1",)),
    Watched(ENDPOINT_SLICE, ("v1",)),
    Watched(SECRET, ("v1",)),
    Watched(NAMESPACE, ("v1",)),
    Watched(NODE, ("v1",)),
    Watched(REFERENCE_GRANT, ("v1beta1", "v1")),
    Watched(DEPLOYMENT, ("v1",), f"{OWNED_BY_LABEL}={OWNED_BY_VALUE}", rendered=False),
)

WRITTEN: Mapping[tuple[str, str], KindInfo] = {
    (info.group, info.kind): info
    for info in (
        DEPLOYMENT,
        SERVICE,
        GATEWAY_CLASS,
        GATEWAY,
        STUNNER_UDP_ROUTE,
        GATEWAY_API_UDP_ROUTE,
    )
}


# --- the client ---------------------------------------------------------------------------------


class ConfigUnavailable(Exception):
    """No way to reach an API server is configured."""


def load_client(kubeconfig: str | None = None) -> kubernetes.client.ApiClient:
    """An ApiClient configured the usual way: `kubeconfig` if given, else in-cluster, else
    KUBECONFIG or ~/.kube/config. ConfigUnavailable if none works."""
    configuration = kubernetes.client.Configuration()
    try:
        if kubeconfig:
            _config.load_kube_config(kubeconfig, client_configuration=configuration)
        else:
            try:
                _config.load_incluster_config(client_configuration=configuration)
            except _config.ConfigException:
                _config.load_kube_config(client_configuration=configuration)
    except (_config.ConfigException, OSError) as exc:
        raise ConfigUnavailable(
            f"no Kubernetes API configured (in-cluster, KUBECONFIG or ~/.kube/config): {exc}"
        ) from exc
    # One connection per watched kind, plus the writes and the Lease.
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, 32)
    return kubernetes.client.ApiClient(configuration)


class Api:
    """JSON requests over the official client's transport (auth, TLS, proxies as configured)."""

    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        self.client = client

    def close(self) -> None:
        client: Any = self.client
        client.close()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Sequence[tuple[str, Any]] = (),
        content_type: str = "application/json",
        stream: bool = False,
        timeout: float | None = REQUEST_TIMEOUT,
        field_manager: bool = True,
    ) -> Any:
        """The decoded JSON answer, or the raw response when `stream`; ApiException if the
        answer is not 2xx. A create, update or patch carries `fieldManager=FIELD_MANAGER`."""
        if method in FIELD_MANAGED_METHODS and field_manager:
            query = [*query, ("fieldManager", FIELD_MANAGER)]
        headers = {"Accept": "application/json", "Content-Type": content_type}
        serialized = self.client.param_serialize(
            method,
            path,
            query_params=list(query),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response: Any = self.client.call_api(*serialized, _request_timeout=timeout)
        if not 200 <= response.status <= 299:
            response.read()
            self.client.response_deserialize(response, {})  # raises ApiException
        if stream:
            return response.response
        response.read()
        return json.loads(response.data or b"null")

    def list(self, watched: Watched, version: str) -> tuple[list[dict[str, Any]], str]:
        query = [("labelSelector", watched.label_selector)] if watched.label_selector else []
        answer = self.request("GET", _path(watched.info, version), query=query)
        items = []
        for item in answer.get("items") or []:
            # List items carry no apiVersion/kind; render needs them.
            item.setdefault("apiVersion", _api_version(watched.info, version))
            item.setdefault("kind", watched.info.kind)
            items.append(item)
        return items, str((answer.get("metadata") or {}).get("resourceVersion") or "")

    def watch(
        self, watched: Watched, version: str, resource_version: str, timeout: int, watcher: Any
    ) -> Iterator[dict[str, Any]]:
        """The events of one watch request (the client's Watch helper); a 410 Gone raises
        ApiException(status=410)."""

        def open_stream(**kwargs: Any) -> Any:
            query: list[tuple[str, Any]] = [("watch", "true")]
            if kwargs.get("resource_version"):
                query.append(("resourceVersion", kwargs["resource_version"]))
            if kwargs.get("allow_watch_bookmarks"):
                query.append(("allowWatchBookmarks", "true"))
            if kwargs.get("timeout_seconds"):
                query.append(("timeoutSeconds", kwargs["timeout_seconds"]))
            if kwargs.get("label_selector"):
                query.append(("labelSelector", kwargs["label_selector"]))
            return self.request(
                "GET",
                _path(watched.info, version),
                query=query,
                stream=True,
                timeout=timeout + 10,
            )

        kwargs: dict[str, Any] = {
            "resource_version": resource_version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": timeout,
        }
        if watched.label_selector:
            kwargs["label_selector"] = watched.label_selector
        yield from watcher.stream(open_stream, **kwargs)

    # --- writes --------------------------------------------------------------------------------

    def write(self, write: Write) -> dict[str, Any] | None:
        """Send one write; the object as the API server stored it (None for a deletion)."""
        info = WRITTEN[_group(write.api_version), write.kind]
        version = write.api_version.rpartition("/")[2]
        path = _path(info, version, write.namespace, write.name)
        if write.verb == Verb.CREATE:
            return dict(
                self.request("POST", _path(info, version, write.namespace), body=write.body)
            )
        if write.verb == Verb.UPDATE:
            return dict(self.request("PUT", path, body=write.body))
        if write.verb == Verb.STATUS:
            body = {"status": write.body}
            return dict(
                self.request(
                    "PATCH",
                    path + "/status",
                    body=body,
                    content_type="application/merge-patch+json",
                )
            )
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if write.uid:
            options["preconditions"] = {"uid": write.uid}  # type: ignore[assignment]
        self.request("DELETE", path, body=options)
        return None

    def review_token(self, token: str, audiences: Sequence[str]) -> dict[str, Any]:
        """The status of a TokenReview of `token` for `audiences` (authenticated, user,
        audiences, error). The token is in the request body only, never in an error."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": list(audiences)},
        }
        answer = self.request("POST", TOKEN_REVIEWS, body=body, field_manager=False)
        return dict(answer.get("status") or {})

    def create_event(self, body: Mapping[str, Any]) -> None:
        """Record an events.k8s.io/v1 Event (reconciler.events builds it)."""
        namespace = str(body["metadata"]["namespace"])
        self.request("POST", _path(EVENT, "v1", namespace), body=dict(body))

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any]:
        info = WRITTEN[_group(api_version), kind]
        path = _path(info, api_version.rpartition("/")[2], namespace, name)
        return dict(self.request("GET", path))


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def _api_version(info: KindInfo, version: str) -> str:
    return f"{info.group}/{version}" if info.group else version


def describe(exc: BaseException) -> str:
    """An API error in one line: code, reason and the server's message (never a body we sent)."""
    if isinstance(exc, ApiException):
        message = ""
        with contextlib.suppress(ValueError, TypeError):
            message = str(json.loads(exc.body or "{}").get("message") or "")
        return f"{exc.status} {exc.reason}: {message}" if message else f"{exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {exc}"


def refusal(exc: BaseException) -> tuple[int, str]:
    """An exception of a request as (HTTP status, 0 for no answer; `describe`'s line)."""
    code = int(exc.status or 0) if isinstance(exc, ApiException) else 0
    return code, describe(exc)


# --- the cache ----------------------------------------------------------------------------------

Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped kinds
OnChange = Callable[[Object | None, Object | None], None]  # (new, old), from a watch thread


def _key(obj: Object) -> Key:
    return (str(meta(obj).get("namespace") or ""), str(meta(obj).get("name") or ""))


def _rv(obj: Object | None) -> int:
    try:
        return int(meta(obj or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


@dataclass
class KindState:
    objects: dict[Key, Object] = field(default_factory=dict)
    synced: bool = False
    failing_since: float | None = None
    version: str = ""


class Cache:
    """The objects of every watched kind, shared by the watch threads and the asyncio loop."""

    def __init__(
        self,
        watched: Sequence[Watched] = WATCHED,
        stale_after: float = STALE_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.watched = tuple(watched)
        self.stale_after = stale_after
        self.clock = clock
        self._lock = threading.Lock()
        self._kinds: dict[Watched, KindState] = {w: KindState() for w in self.watched}
        self.on_change: OnChange = lambda new, old: None
        self.changes = 0  # objects put, removed or relisted so far

    def _state(self, api_version: str, kind: str) -> KindState | None:
        for watched, state in self._kinds.items():
            if watched.info.kind == kind and watched.info.group == _group(api_version):
                return state
        return None

    def _state_of(self, watched: Watched | None, obj: Object) -> KindState | None:
        """The state of `watched`, or (None: a write's answer) of the object's own kind."""
        if watched is not None:
            return self._kinds.get(watched)
        return self._state(str(obj.get("apiVersion")), str(obj.get("kind")))

    # --- writes from the watch threads (and from the API server's answers) --------------------

    def replace(self, watched: Watched, items: Sequence[Object], version: str) -> None:
        """A fresh list of one kind: the changes it makes are offered to `on_change`."""
        new = {_key(item): item for item in items}
        with self._lock:
            state = self._kinds[watched]
            old = state.objects
            state.objects, state.synced, state.failing_since = new, True, None
            state.version = version
            self.changes += len(new)
        for key in old.keys() - new.keys():
            self.on_change(None, old[key])
        for key, obj in new.items():
            if _rv(old.get(key)) != _rv(obj):
                self.on_change(obj, old.get(key))

    def put(self, watched: Watched | None, obj: Object) -> None:
        """An object as the API server has it now (older versions than the cached are ignored)."""
        with self._lock:
            state = self._state_of(watched, obj)
            if state is None:
                return
            old = state.objects.get(_key(obj))
            if old is not None and _rv(old) >= _rv(obj):
                return
            state.objects[_key(obj)] = obj
            self.changes += 1
        self.on_change(obj, old)

    def remove(self, watched: Watched | None, obj: Object) -> None:
        with self._lock:
            state = self._state_of(watched, obj)
            if state is None:
                return
            old = state.objects.pop(_key(obj), None)
            self.changes += 1
        if old is not None:
            self.on_change(None, old)

    def healthy(self, watched: Watched) -> None:
        with self._lock:
            self._kinds[watched].failing_since = None

    def failing(self, watched: Watched) -> None:
        with self._lock:
            state = self._kinds[watched]
            if state.failing_since is None:
                state.failing_since = self.clock()

    # --- reads ---------------------------------------------------------------------------------

    def rendered_objects(self) -> list[Object]:
        """Every object render reads (not the Deployments)."""
        with self._lock:
            return [
                obj
                for watched, state in self._kinds.items()
                if watched.rendered
                for obj in state.objects.values()
            ]

    def all_of(self, kind: str) -> list[Object]:
        with self._lock:
            return [
                obj
                for watched, state in self._kinds.items()
                if watched.info.kind == kind
                for obj in state.objects.values()
            ]

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Object | None:
        with self._lock:
            state = self._state(api_version, kind)
            return state.objects.get((namespace, name)) if state is not None else None

    @property
    def synced(self) -> bool:
        with self._lock:
            return all(state.synced for state in self._kinds.values())

    def freshness(self) -> tuple[bool, str]:
        """(fresh, why not): every kind listed once, none failing for more than stale_after."""
        now = self.clock()
        with self._lock:
            unsynced = [w.name for w, s in self._kinds.items() if not s.synced]
            stale = [
                f"{w.name} ({now - s.failing_since:.0f} s)"
                for w, s in self._kinds.items()
                if s.failing_since is not None and now - s.failing_since > self.stale_after
            ]
        if unsynced:
            return False, "not listed yet: " + ", ".join(unsynced)
        if stale:
            return False, "watch failing for longer than the limit: " + ", ".join(stale)
        return True, "cache fresh"


# --- the informer -----------------------------------------------------------------------------


class Informer:
    """List+watch of one kind into the cache, in its own thread, until `stop()`."""

    def __init__(
        self,
        api: Api,
        cache: Cache,
        watched: Watched,
        *,
        watch_timeout: int = WATCH_TIMEOUT,
        backoff_initial: float = BACKOFF_INITIAL,
        backoff_max: float = BACKOFF_MAX,
        on_restart: Callable[[str, str], None] = lambda kind, reason: None,
        not_served_retry: float = NOT_SERVED_RETRY,
        on_exit: Callable[[str, BaseException | None], None] = lambda name, exc: None,
    ) -> None:
        self.not_served_retry = not_served_retry
        self.on_exit = on_exit  # the thread ends other than by stop(): (its name, exception)
        self.api = api
        self.cache = cache
        self.watched = watched
        self.watch_timeout = watch_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.on_restart = on_restart
        self._stop = threading.Event()
        self._watcher: Any = None
        self._thread = threading.Thread(
            target=self._main, name=f"watch-{watched.name}", daemon=True
        )
        self.version = ""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.stop()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _served_version(self) -> str:
        """The first of the kind's versions the API server lists (ApiException otherwise)."""
        error: ApiException | None = None
        for version in self.watched.versions:
            try:
                self._items, self._list_rv = self.api.list(self.watched, version)
                return version
            except ApiException as exc:
                if exc.status != 404:
                    raise
                error = exc
        assert error is not None
        raise error

    def _main(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.on_exit(self._thread.name, exc)
            raise
        if not self._stop.is_set():
            self.on_exit(self._thread.name, None)

    def _run(self) -> None:
        backoff = self.backoff_initial
        while not self._stop.is_set():
            try:
                version = self._served_version()
                if version != self.version:
                    log.info("watching %s %s", self.watched.name, version)
                    self.version = version
                self.cache.replace(self.watched, self._items, self._list_rv)
                backoff = self.backoff_initial
                self._watch(version, self._list_rv)
            except ApiException as exc:
                if exc.status == 410:
                    log.info("watch of %s expired (410 Gone): relisting", self.watched.name)
                    self.on_restart(self.watched.name, "expired")
                    continue
                if exc.status == 404 and not self.version:
                    # Not served (its CRD is not installed): none of them, and look again later.
                    log.info(
                        "%s is not served (versions %s): none cached; looking again in %.0f s",
                        self.watched.name,
                        ", ".join(self.watched.versions),
                        self.not_served_retry,
                    )
                    self.cache.replace(self.watched, [], "")
                    self._stop.wait(self.not_served_retry)
                    continue
                backoff = self._failed(exc, backoff)
            except Exception as exc:  # the connection, a decode error: retried all the same
                if self._stop.is_set():
                    return
                backoff = self._failed(exc, backoff)

    def _failed(self, exc: BaseException, backoff: float) -> float:
        self.cache.failing(self.watched)
        self.on_restart(self.watched.name, "error")
        log.warning(
            "list/watch of %s failed (%s); retrying in %.1f s",
            self.watched.name,
            describe(exc),
            backoff,
        )
        self._stop.wait(backoff * random.uniform(0.8, 1.2))
        return min(backoff * 2, self.backoff_max)

    def _watch(self, version: str, resource_version: str) -> None:
        """Watch from resource_version until stopped; a stream that ends is resumed."""
        while not self._stop.is_set():
            self._watcher = Watch(return_type="object")
            for event in self.api.watch(
                self.watched, version, resource_version, self.watch_timeout, self._watcher
            ):
                kind, obj = event.get("type"), event.get("raw_object")
                if not isinstance(obj, dict):
                    continue
                resource_version = str(meta(obj).get("resourceVersion") or resource_version)
                self.cache.healthy(self.watched)
                if kind == "BOOKMARK":
                    continue
                obj.setdefault("apiVersion", _api_version(self.watched.info, version))
                obj.setdefault("kind", self.watched.info.kind)
                if kind == "DELETED":
                    self.cache.remove(self.watched, obj)
                elif kind in ("ADDED", "MODIFIED"):
                    self.cache.put(self.watched, obj)
            self.cache.healthy(self.watched)


# --- writing ------------------------------------------------------------------------------------


@dataclass
class WriteResult:
    write: Write
    ok: bool
    code: int = 0  # the API server's HTTP status of a refusal (0: no answer)
    error: str = ""
    previous: Object | None = None  # the cached object before the write


class Writer:
    """Sends writes one by one; every answer goes into the cache."""

    def __init__(self, api: Api, cache: Cache) -> None:
        self.api = api
        self.cache = cache

    def send(self, write: Write) -> WriteResult:
        previous = self.cache.get(write.api_version, write.kind, write.namespace, write.name)
        try:
            stored = self.api.write(write)
        except ApiException as exc:
            if exc.status == 409 or (exc.status == 404 and write.verb == Verb.DELETE):
                self._reread(write)
            if exc.status == 404 and write.verb == Verb.DELETE:
                return WriteResult(write, True, previous=previous)
            return WriteResult(write, False, int(exc.status or 0), describe(exc), previous)
        except Exception as exc:  # no answer (connection refused, timeout)
            return WriteResult(write, False, 0, describe(exc), previous)
        if stored is None:
            self.cache.remove(
                None,
                {
                    "apiVersion": write.api_version,
                    "kind": write.kind,
                    "metadata": {"namespace": write.namespace, "name": write.name},
                },
            )
        else:
            self.cache.put(None, stored)
        return WriteResult(write, True, previous=previous)

    def _reread(self, write: Write) -> None:
        """After a conflict: the object as it is now, into the cache (or out of it)."""
        try:
            fresh = self.api.get(write.api_version, write.kind, write.namespace, write.name)
        except ApiException as exc:
            if exc.status == 404:
                self.cache.remove(
                    None,
                    {
                        "apiVersion": write.api_version,
                        "kind": write.kind,
                        "metadata": {"namespace": write.namespace, "name": write.name},
                    },
                )
            return
        except Exception:
            return
        self.cache.put(None, fresh)


# --- leader election ----------------------------------------------------------------------------

LEASE_DURATION = 15.0  # client-go / controller-runtime defaults
RENEW_DEADLINE = 10.0
RETRY_PERIOD = 2.0
LEADER_ELECTION_ID = "92062b70.l7mp.io"  # Go STUNner's lease name


def _micro_time(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    return f"{os.uname().nodename}_{os.getpid()}_{random.getrandbits(32):08x}"


class LeaseElector:
    """Leader election with a coordination.k8s.io/v1 Lease. `leading` says whether this replica
    may write; `changed` is set on every change of it."""

    def __init__(
        self,
        api: Api,
        namespace: str,
        name: str = LEADER_ELECTION_ID,
        identity: str | None = None,
        *,
        lease_duration: float = LEASE_DURATION,
        renew_deadline: float = RENEW_DEADLINE,
        retry_period: float = RETRY_PERIOD,
        owner: str = "",
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("leader election needs retry period < renew deadline < lease duration")
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.leading = False
        self.changed = asyncio.Event()
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._last_renewal = 0.0
        self._stopped = False
        # The Deployment (in the Lease's namespace) the Lease is owned by, so that deleting it
        # (`helm uninstall`) deletes the Lease: the replica cannot release it then, its
        # ServiceAccount being deleted with it, and a Lease left behind would keep the next
        # install's reconciler from leading for a lease duration.
        self.owner = owner
        self._owner_reference: dict[str, Any] | None = None
        self._owner_warned = False

    @property
    def path(self) -> str:
        return _path(LEASE, "v1", self.namespace, self.name)

    def _set_leading(self, leading: bool) -> None:
        if leading != self.leading:
            self.leading = leading
            log.info(
                "%s leadership of Lease %s/%s (%s)",
                "acquired" if leading else "lost",
                self.namespace,
                self.name,
                self.identity,
            )
            self.changed.set()

    def _spec(self, acquire: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_duration)),
            "acquireTime": acquire,
            "renewTime": _micro_time(datetime.now(UTC)),
            "leaseTransitions": transitions,
        }

    def owner_reference(self) -> dict[str, Any] | None:
        """The ownerReference to the `owner` Deployment, looked up once (None without an owner,
        or while it cannot be read: the Lease is written without one then)."""
        if not self.owner:
            return None
        if self._owner_reference is None:
            try:
                deployment = self.api.request(
                    "GET", _path(DEPLOYMENT, "v1", self.namespace, self.owner)
                )
            except ApiException as exc:
                if not self._owner_warned:  # said once; tried again at every write
                    self._owner_warned = True
                    log.warning(
                        "the Lease's owner, Deployment %s/%s: %s",
                        self.namespace,
                        self.owner,
                        describe(exc),
                    )
                return None
            self._owner_reference = {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": self.owner,
                "uid": deployment["metadata"]["uid"],
            }
        return self._owner_reference

    def _owned(self, metadata: dict[str, Any]) -> None:
        """`metadata` with our owner's reference (replacing one to an older Deployment of the
        same name: a reinstall's Lease whose owner is gone)."""
        reference = self.owner_reference()
        if reference is None:
            return
        references = [
            r
            for r in metadata.get("ownerReferences") or []
            if not (r.get("kind") == "Deployment" and r.get("name") == self.owner)
        ]
        metadata["ownerReferences"] = [*references, reference]

    def try_acquire_or_renew(self) -> bool:
        """One round (blocking): True if we hold the Lease afterwards."""
        now = time.monotonic()
        try:
            lease = self.api.request("GET", self.path)
        except ApiException as exc:
            if exc.status != 404:
                raise
            metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
            self._owned(metadata)
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": metadata,
                "spec": self._spec(_micro_time(datetime.now(UTC)), 0),
            }
            self.api.request("POST", _path(LEASE, "v1", self.namespace), body=body)
            return True
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        observed = (holder, str(spec.get("renewTime") or ""))
        if observed != self._observed:
            self._observed, self._observed_at = observed, now
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder and holder != self.identity and now < self._observed_at + duration:
            return False  # held by another, renewed within its lease duration (our clock)
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            acquire = str(spec.get("acquireTime") or _micro_time(datetime.now(UTC)))
        else:
            acquire, transitions = _micro_time(datetime.now(UTC)), transitions + 1
        lease["spec"] = self._spec(acquire, transitions)
        self._owned(lease.setdefault("metadata", {}))
        self.api.request("PUT", self.path, body=lease)  # 409 if another got there first
        return True

    def release(self) -> None:
        """Give the Lease up (blocking): the holder cleared, so another replica takes it now."""
        try:
            lease = self.api.request("GET", self.path)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            now = _micro_time(datetime.now(UTC))
            lease["spec"].update(
                {"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": now}
            )
            self.api.request("PUT", self.path, body=lease)
            log.info("released Lease %s/%s", self.namespace, self.name)
        except Exception as exc:
            log.warning("could not release Lease %s/%s: %s", self.namespace, self.name, exc)

    async def run(self) -> None:
        """Acquire and renew until stopped or cancelled (leadership is dropped then, and the
        Lease released only by `stop`)."""
        try:
            while not self._stopped:
                try:
                    held = await asyncio.to_thread(self.try_acquire_or_renew)
                except Exception as exc:
                    log.debug("leader election round failed: %s", describe(exc))
                    held = False
                if self._stopped:
                    break
                now = time.monotonic()
                if held:
                    self._last_renewal = now
                    self._set_leading(True)
                elif self.leading and now - self._last_renewal > self.renew_deadline:
                    self._set_leading(False)
                elif self.leading and self._observed and self._observed[0] != self.identity:
                    self._set_leading(False)
                await asyncio.sleep(self.retry_period * random.uniform(1.0, 1.2))
        finally:
            self._set_leading(False)

    async def stop(self, release: bool = True) -> None:
        """No more rounds; give the Lease up if we held it and `release`."""
        self._stopped = True
        was_leading = self.leading
        self._set_leading(False)
        if release and was_leading:
            await asyncio.to_thread(self.release)
