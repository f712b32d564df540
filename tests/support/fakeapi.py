"""A small stateful fake kube-apiserver speaking the real REST protocol over HTTP.

Shared test infrastructure: the official ``kubernetes`` client works against it unchanged.

What it does:
- Resource types are registered generically (:class:`ResourceType`: group, version, plural,
  kind, namespaced, status subresource). Core ``v1`` secrets, configmaps, services, endpoints,
  namespaces, nodes, servicecidrs and the Gateway API / STUNner kinds are registered by default.
- Verbs: create (POST, 409 AlreadyExists, ``generateName``), get (404 NotFound), list (label
  and field selectors, ``resourceVersion`` in the list metadata), watch (``?watch=true``:
  newline-delimited JSON events over a chunked response; resumes from ``resourceVersion``;
  ``timeoutSeconds`` ends the stream; a compacted ``resourceVersion`` yields a 410 Gone
  ``ERROR`` event), update (PUT, 409 Conflict on a stale ``metadata.resourceVersion``), patch
  (JSON patch, merge patch; strategic merge is treated as merge patch), delete (honours
  finalizers by setting ``deletionTimestamp``), and the ``/status`` subresource.
- Bookkeeping: ``uid``, ``creationTimestamp``, a global monotonically increasing
  ``resourceVersion``, ``generation`` bumped on changes outside metadata and status.
- Errors are ``kind: Status`` objects with ``code``, ``reason`` and ``message``.
- ``?dryRun=All`` validates and answers but stores nothing.
- Fault injection: :attr:`FakeApiServer.fail_status` answers every request with that error code;
  :attr:`FakeApiServer.delay` stalls every request (cut short by :meth:`FakeApiServer.stop`);
  :meth:`FakeApiServer.refuse` answers one kind of write on one resource with an error code.
  :meth:`FakeApiServer.stop` then :meth:`FakeApiServer.start` again is an API server that went
  away and came back (same port, same state).
- Watch bookmarks: with ``allowWatchBookmarks=true`` a quiet watch gets a ``BOOKMARK`` event
  carrying the current ``resourceVersion`` every :attr:`FakeApiServer.bookmark_interval` seconds.
- Garbage collection as kube-controller-manager does it (in the background there, at once here):
  deleting an object deletes every object whose ``ownerReferences`` all name deleted owners,
  and an object created with only owners that are gone is deleted right after
  (:attr:`FakeApiServer.garbage_collection`, on by default). ``DeleteOptions.preconditions.uid``
  is honoured (409 Conflict on a mismatch).
- A Deployment's pod ``hostNetwork: false`` is not stored (Go's ``omitempty``, as a real API
  server does with every zero value; only this one is modelled).
- Server-side defaults of Services: a ``clusterIP``, ``sessionAffinity: None``, and for NodePort
  and LoadBalancer Services a ``nodePort`` per port and ``externalTrafficPolicy: Cluster``
  (values the API server allocated are kept on update, as a real one does).
- ``coordination.k8s.io/v1`` Leases (leader election).
- The CRDs' structural schemas (ours and Gateway API v1.6.1's; tests/support/crdschema.py): a
  create or update whose body, or a /status write whose status, the schema refuses is answered
  422 Invalid naming the field, as a real API server does (it refused a Dataplane with
  ``replicas: -1`` that this fake stored). CEL rules, formats and pruning are not modelled.
  An update may keep what the stored object already had wrong (validation ratcheting);
  :meth:`FakeApiServer.seed` is not checked: a seeded object is one already stored.
- Discovery: ``/api``, ``/apis``, ``/api/v1``, ``/apis/{group}/{version}``, ``/version``.
- The proxy to Services and pods (``.../services/NAME:PORT/proxy/PATH``, GETs and body-less
  POSTs): a test maps
  it to a real server on loopback with :meth:`FakeApiServer.proxy`.
- Authorization, for playing a user without rights: :meth:`FakeApiServer.forbid` answers 403
  Forbidden to every request on a resource (the caller's own RBAC), and ``POST
  /apis/authorization.k8s.io/v1/subjectaccessreviews`` answers from the rules given to
  :meth:`FakeApiServer.allow` (everything else is denied); the reviews asked are kept in
  :attr:`FakeApiServer.access_reviews`.
- ServiceAccount tokens, as the API server and the kubelet issue them: ``POST
  /api/v1/namespaces/NS/serviceaccounts/SA/token`` (TokenRequest: the account must exist, at
  least 600 s, default 3600 s) and :meth:`FakeApiServer.issue_token` (what the kubelet does for a
  projected volume) issue JWT-shaped tokens with ``aud``, ``exp`` and ``sub``; ``POST
  /apis/authentication.k8s.io/v1/tokenreviews`` answers authenticated only for a token this
  server issued, not expired and not revoked (:meth:`FakeApiServer.revoke_token`), whose
  ServiceAccount, when the fake held it at issue, is still there with the same uid (deleted or
  made anew, its tokens no longer authenticate, as kube-apiserver's token validator checks; the
  namespaces' ``default`` accounts, made by kube-controller-manager, are not modelled), with one of
  the audiences asked (none asked: the API server's own), ``status.audiences`` the ones in
  common, as kube-apiserver does; the reviews are counted in :attr:`FakeApiServer.token_reviews`.
  A token bound to a pod (``issue_token(..., pod=NAME)``, as the kubelet's projected volume
  holds, or a TokenRequest with ``boundObjectRef`` kind Pod) carries the pod's claims, and its
  review answers them in ``status.user.extra`` (``authentication.kubernetes.io/pod-name``,
  ``pod-uid``, ``credential-id``, and ``node-name`` once the pod is scheduled), as kube-apiserver
  1.30+ does; it stops authenticating once its pod is gone (deleted, or replaced by another of
  that name).
  The Service proxy passes the request's headers on except ``Authorization``, which the real
  one strips (kubernetes/kubernetes#38775).

- Validating admission webhooks, on creates only: :attr:`FakeApiServer.webhooks` holds callables
  (tests/support/admission.py calls a real webhook over HTTPS with an AdmissionReview, as
  kube-apiserver does) asked after the schema check; the first error one returns is the answer.

Not implemented: server-side apply, list pagination, deletecollection, webhooks on other verbs.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import secrets
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonpatch
import kubernetes.client

from tests.support import crdschema

JSON = dict[str, Any]


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status_subresource: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.group, self.version, self.plural)

    @property
    def storage_key(self) -> tuple[str, str]:
        """Every served version of a kind reads and writes the same objects."""
        return (self.group, self.plural)


CORE_TYPES = (
    ResourceType("", "v1", "namespaces", "Namespace", namespaced=False, status_subresource=True),
    ResourceType("", "v1", "secrets", "Secret"),
    ResourceType("", "v1", "configmaps", "ConfigMap"),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount"),
    ResourceType("", "v1", "services", "Service", status_subresource=True),
    ResourceType("", "v1", "endpoints", "Endpoints"),
    ResourceType("", "v1", "pods", "Pod", status_subresource=True),
    ResourceType("apps", "v1", "deployments", "Deployment", status_subresource=True),
    ResourceType("apps", "v1", "daemonsets", "DaemonSet", status_subresource=True),
    ResourceType("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice"),
    ResourceType("", "v1", "nodes", "Node", namespaced=False, status_subresource=True),
    ResourceType(
        "networking.k8s.io",
        "v1",
        "servicecidrs",
        "ServiceCIDR",
        namespaced=False,
        status_subresource=True,
    ),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease"),
)


def _served(
    group: str, versions: tuple[str, ...], plural: str, kind: str, **flags: bool
) -> tuple[ResourceType, ...]:
    """A kind at every version its CRD serves (the first one is the group's preferred)."""
    return tuple(ResourceType(group, v, plural, kind, **flags) for v in versions)


# Gateway API's TCPRoute, of its experimental channel, which the chart does not ship: a fake serves
# it only where a test registers it, as a cluster serves it once tests/data/crds/tcproutes.yaml
# (or the experimental channel) is applied.
TCP_ROUTE_TYPES = _served(
    "gateway.networking.k8s.io", ("v1alpha2",), "tcproutes", "TCPRoute", status_subresource=True
)


# As the CRDs serve them: charts/stunner/crds and Gateway API v1.6.1 (UDPRoute as its
# experimental channel serves it: v1 and v1alpha2; the standard channel serves v1 only).
# tests/support/test_fakeapi.py checks this against the CRD files.
GATEWAY_TYPES = (
    *_served(
        "gateway.networking.k8s.io",
        ("v1", "v1beta1"),
        "gatewayclasses",
        "GatewayClass",
        namespaced=False,
        status_subresource=True,
    ),
    *_served(
        "gateway.networking.k8s.io",
        ("v1", "v1beta1"),
        "gateways",
        "Gateway",
        status_subresource=True,
    ),
    *_served(
        "gateway.networking.k8s.io",
        ("v1", "v1alpha2"),
        "udproutes",
        "UDPRoute",
        status_subresource=True,
    ),
    *_served("gateway.networking.k8s.io", ("v1", "v1beta1"), "referencegrants", "ReferenceGrant"),
    *_served(
        "stunner.l7mp.io",
        ("v1", "v1alpha1"),
        "gatewayconfigs",
        "GatewayConfig",
        status_subresource=True,
    ),
    *_served("stunner.l7mp.io", ("v1",), "udproutes", "UDPRoute", status_subresource=True),
    *_served(
        "stunner.l7mp.io",
        ("v1", "v1alpha1"),
        "dataplanes",
        "Dataplane",
        namespaced=False,
        status_subresource=True,
    ),
    *_served(
        "stunner.l7mp.io",
        ("v1", "v1alpha1"),
        "staticservices",
        "StaticService",
        status_subresource=True,
    ),
)


SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
TOKEN_REQUEST_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/serviceaccounts/([^/]+)/token$")
API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"  # the API server's own audience
MIN_TOKEN_SECONDS = 600
# Request headers the proxy does not pass on: hop-by-hop ones, and Authorization (stripped).
UNPROXIED_HEADERS = frozenset(
    {
        "authorization",
        "host",
        "connection",
        "content-length",
        "transfer-encoding",
        "keep-alive",
        "upgrade",
        "proxy-authorization",
        "te",
        "trailer",
        "accept-encoding",
    }
)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass(frozen=True)
class IssuedToken:
    username: str
    audiences: tuple[str, ...]
    expires: float  # epoch seconds
    account_uid: str = ""  # of the ServiceAccount when issued ("": one the fake does not hold)
    pod: tuple[str, str] | None = None  # (name, uid) of the pod it is bound to
    node: str = ""  # that pod's node
    jti: str = ""  # the token's id (its review's credential-id)


PROXY_PATH = re.compile(
    r"^/api/v1/namespaces/([^/]+)/(services|pods)/([^/:]+)(?::([^/]+))?/proxy(/.*)?$"
)
# Kinds whose DELETE answers with the deleted object (the API server's ReturnDeletedObject; the
# typed client of these expects it), not with a Status.
RETURN_DELETED_OBJECT = {("", "v1", "services"), ("", "v1", "pods"), ("", "v1", "namespaces")}


@dataclass(frozen=True)
class AccessRule:
    """One permission for SubjectAccessReviews: `user` (or a group of the user) may `verb` the
    `resource` of `group` in `namespace` ("" = every namespace), named `name` ("" = any)."""

    user: str
    verb: str
    resource: str
    namespace: str = ""
    name: str = ""
    group: str = ""

    def allows(self, spec: JSON) -> bool:
        attributes = spec.get("resourceAttributes") or {}
        who = {spec.get("user"), *(spec.get("groups") or [])}
        return (
            self.user in who
            and self.verb == attributes.get("verb")
            and self.resource == attributes.get("resource")
            and self.group == (attributes.get("group") or "")
            and self.namespace in ("", attributes.get("namespace"))
            and self.name in ("", attributes.get("name"))
        )


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: JSON | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> JSON:
        return status_object(self.code, self.reason, self.message, self.details)


def status_object(code: int, reason: str, message: str, details: JSON | None = None) -> JSON:
    body: JSON = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


# --- label and field selectors ---------------------------------------------------------------

_SET_RE = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\((.*)\)\s*$")


def _split_top_level(selector: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def label_selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Kubernetes label selector basics: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``,
    ``a notin (x,y)``, ``a`` (exists), ``!a`` (does not exist). Raises ValueError if malformed."""
    for term in _split_top_level(selector):
        if m := _SET_RE.match(term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if op == "in" and labels.get(key) not in values:
                return False
            if op == "notin" and key in labels and labels[key] in values:
                return False
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif re.fullmatch(r"[A-Za-z0-9./_-]+", term):
            if term not in labels:
                return False
        else:
            raise ValueError(f"unable to parse requirement: {term!r}")
    return True


def field_selector_matches(selector: str, obj: JSON) -> bool:
    """Equality field selectors over dotted paths (``metadata.name=x``, ``spec.type!=y``)."""
    for term in _split_top_level(selector):
        negate = "!=" in term
        path, value = (s.strip() for s in term.replace("==", "=").replace("!=", "=").split("=", 1))
        cur: Any = obj
        for part in path.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        actual = "" if cur is None else str(cur)
        if (actual == value) == negate:
            return False
    return True


# --- patches ---------------------------------------------------------------------------------


def _check_string_maps(rt: ResourceType, meta: Any) -> None:
    """Labels and annotations map strings to strings: the API server's decoder refuses anything
    else in the request body (a YAML ``true`` written unquoted), before admission."""
    for field in ("labels", "annotations"):
        values = meta.get(field) if isinstance(meta, dict) else None
        if values is None:
            continue
        bad = (
            [type(values).__name__]
            if not isinstance(values, dict)
            else [type(v).__name__ for v in values.values() if not isinstance(v, str)]
        )
        if bad:
            raise ApiError(
                400,
                "BadRequest",
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: json: '
                f"cannot unmarshal {bad[0]} into Go struct field ObjectMeta.metadata.{field} "
                "of type string",
            )


def _check_schema(
    rt: ResourceType, obj: JSON, old: JSON | None = None, status_only: bool = False
) -> None:
    """What the kind's CRD schema refuses, refused as the API server does (422 Invalid), before
    anything is stored (tests/support/crdschema.py says what is checked). On an update, what
    the stored object already had is let through (the API server's validation ratcheting, on
    by default since Kubernetes 1.33)."""
    had = set() if old is None else set(crdschema.problems(old, status_only=status_only))
    found = [
        problem
        for problem in crdschema.problems(_at_version(rt, obj), status_only=status_only)
        if problem not in had
    ]
    if found:
        name = (obj.get("metadata") or {}).get("name", "")
        kind = f"{rt.kind}.{rt.group}" if rt.group else rt.kind
        listed = found[0] if len(found) == 1 else "[" + ", ".join(found) + "]"
        raise ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {listed}')


def _at_version(rt: ResourceType, obj: JSON) -> JSON:
    """A copy of a stored object as `rt`'s version serves it. The CRDs convert with strategy
    None: only apiVersion changes."""
    out = copy.deepcopy(obj)
    out["apiVersion"] = rt.api_version
    return out


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Event:
    rv: int
    rtype: ResourceType
    type: str
    obj: JSON


class FakeApiServer:
    """The state and the HTTP front end. Use as a context manager or call start()/stop()."""

    history_limit = 1000

    def __init__(self, types: tuple[ResourceType, ...] = CORE_TYPES + GATEWAY_TYPES) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        for rt in types:
            self.register(rt)
        # (group, plural), namespace, name -> the object, at the version it was last written
        self._objects: dict[tuple[tuple[str, str], str, str], JSON] = {}
        self._rv = 0
        self._events: list[_Event] = []
        self._oldest_rv = 0  # watches from below this get 410 Gone
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self.fail_status: int | None = None
        self.delay: float = 0.0
        self.requests: list[tuple[str, str]] = []  # (method, path) log
        self.forbidden: set[tuple[str, str]] = set()  # (group, plural) answered with 403
        self.access_rules: list[AccessRule] = []
        self.access_reviews: list[JSON] = []  # the SubjectAccessReview specs asked
        self.tokens: dict[str, IssuedToken] = {}  # every token issued, by its text
        self.token_reviews = 0  # TokenReviews answered
        # (namespace, "services"|"pods", name, port) -> a real backend (host, port) on loopback
        self.proxied: dict[tuple[str, str, str, str], tuple[str, int]] = {}
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port = 0
        self.bookmark_interval = 1.0
        self.garbage_collection = True
        self.refusals: dict[tuple[str, str], int] = {}  # (method, plural) -> HTTP status
        # Validating webhooks on creates: (operation, resource type, object, dry run) -> an
        # ApiError to answer with, or None (admitted).
        self.webhooks: list[Any] = []
        self._next_ip = 1
        self._next_node_port = 30000

    # --- lifecycle ---------------------------------------------------------------------------

    def register(self, rt: ResourceType) -> None:
        self._types[rt.key] = rt

    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeApiServer:
        """Serve (again, after stop(): on the same port, with the same state)."""
        self._stopping.clear()
        self._httpd = _Server(("127.0.0.1", self._port), _Handler)
        self._port = self._httpd.server_address[1]
        self._httpd.fake = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            with self._conns_lock:
                for conn in list(self._conns):
                    try:
                        conn.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                with self._conns_lock:
                    if not self._conns:
                        break
                time.sleep(0.01)
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def api_client(self, **config: Any) -> kubernetes.client.ApiClient:
        """An official-client ApiClient pointed at this server (close it when done)."""
        configuration = kubernetes.client.Configuration(host=self.url)
        for key, value in config.items():
            setattr(configuration, key, value)
        return kubernetes.client.ApiClient(configuration)

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig file for this server (JSON is valid YAML)."""
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "fake", "user": {"token": "fake-token"}}],
                    "contexts": [
                        {
                            "name": "fake",
                            "context": {"cluster": "fake", "user": "fake", "namespace": namespace},
                        }
                    ],
                    "current-context": "fake",
                }
            )
        )
        return path

    # --- the API server's proxy to Services and pods ------------------------------------------

    def proxy(self, namespace: str, resource: str, name: str, port: int | str, to: Any) -> None:
        """Make `.../namespaces/NS/{services|pods}/NAME:PORT/proxy/PATH` reach `to` (host, port),
        as a kube-apiserver reaches a Service or pod inside the cluster."""
        self.proxied[(namespace, resource, name, str(port))] = (str(to[0]), int(to[1]))

    def forward(
        self, path: str, query: str, headers: Any = None, method: str = "GET"
    ) -> tuple[int, str, bytes] | None:
        """The backend's answer to a GET (or a POST without a body) through the proxy; None when
        the path is no proxy's."""
        match = PROXY_PATH.match(urllib.parse.unquote(path))  # "name%3A13478" as the client sends
        if match is None:
            return None
        namespace, resource, name, port, rest = match.groups()
        backend = self.proxied.get((namespace, resource, name, port or ""))
        if backend is None:
            raise ApiError(
                503, "ServiceUnavailable", f'no endpoints available for {resource[:-1]} "{name}"'
            )
        url = f"http://{backend[0]}:{backend[1]}{rest or '/'}" + (f"?{query}" if query else "")
        passed = {k: v for k, v in (headers or {}).items() if k.lower() not in UNPROXIED_HEADERS}
        try:
            with urllib.request.urlopen(
                urllib.request.Request(
                    url, headers=passed, method=method, data=b"" if method == "POST" else None
                ),
                timeout=10,
            ) as answer:
                return answer.status, answer.headers.get("Content-Type", ""), answer.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Type", ""), e.read()
        except OSError as e:
            raise ApiError(
                503, "ServiceUnavailable", f"error trying to reach {name}: {e}"
            ) from None

    # --- writes -------------------------------------------------------------------------------

    def writes(self) -> list[tuple[str, str]]:
        """The write requests received so far (method, path), SubjectAccessReviews excepted."""
        return [
            (method, path)
            for method, path in self.requests
            if method in ("POST", "PUT", "PATCH", "DELETE")
            and path not in (SUBJECT_ACCESS_REVIEWS, TOKEN_REVIEWS)
        ]

    def refuse(self, method: str, plural: str, code: int | None) -> None:
        """Answer every `method` request on `plural` with `code` (None: stop refusing)."""
        if code is None:
            self.refusals.pop((method, plural), None)
        else:
            self.refusals[method, plural] = code

    # --- authorization -----------------------------------------------------------------------

    def forbid(self, group: str, plural: str) -> None:
        """Answer 403 Forbidden to every request on that resource (the caller lacks RBAC)."""
        self.forbidden.add((group, plural))

    def allow(self, user: str, verb: str, resource: str, **where: str) -> None:
        """Let SubjectAccessReviews answer allowed for that user (or group) and access."""
        self.access_rules.append(AccessRule(user, verb, resource, **where))

    def review_access(self, review: Any) -> JSON:
        """The answered SubjectAccessReview."""
        if not isinstance(review, dict) or not isinstance(review.get("spec"), dict):
            raise ApiError(400, "BadRequest", "a SubjectAccessReview needs a spec")
        spec = review["spec"]
        self.access_reviews.append(copy.deepcopy(spec))
        allowed = any(rule.allows(spec) for rule in self.access_rules)
        status: JSON = {"allowed": allowed}
        if not allowed:
            status["reason"] = "no rule allows it (fake API server)"
        return {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": status,
        }

    # --- ServiceAccount tokens -------------------------------------------------------------------

    def issue_token(
        self,
        namespace: str,
        account: str,
        audiences: tuple[str, ...] = (API_AUDIENCE,),
        seconds: int = 3600,
        pod: str = "",
    ) -> str:
        """A token of `namespace/account` for `audiences`, as a projected volume holds it;
        `pod`: the name of the pod (of `namespace`, stored here) it is bound to."""
        username = f"system:serviceaccount:{namespace}:{account}"
        held = self.get_object("v1", "ServiceAccount", namespace, account)
        account_uid = str(held["metadata"]["uid"]) if held else ""
        now = time.time()
        kubernetes: JSON = {
            "namespace": namespace,
            "serviceaccount": {"name": account} | ({"uid": account_uid} if held else {}),
        }
        bound: tuple[str, str] | None = None
        node = ""
        if pod:
            stored = self.get_object("v1", "Pod", namespace, pod)
            if stored is None:
                raise ApiError(404, "NotFound", f'pods "{pod}" not found')
            bound = (pod, str(stored["metadata"]["uid"]))
            node = str((stored.get("spec") or {}).get("nodeName") or "")
            kubernetes["pod"] = {"name": bound[0], "uid": bound[1]}
            if node:
                kubernetes["node"] = {"name": node}
        claims = {
            "aud": list(audiences),
            "exp": int(now + seconds),
            "iat": int(now),
            "iss": API_AUDIENCE,
            "jti": str(uuid.uuid4()),
            "sub": username,
            "kubernetes.io": kubernetes,
        }
        header = _b64(json.dumps({"alg": "RS256", "kid": "fake"}).encode())
        token = f"{header}.{_b64(json.dumps(claims).encode())}.{_b64(secrets.token_bytes(32))}"
        self.tokens[token] = IssuedToken(
            username,
            tuple(audiences),
            now + seconds,
            account_uid=account_uid,
            pod=bound,
            node=node,
            jti=str(claims["jti"]),
        )
        return token

    def _pod_alive(self, issued: IssuedToken) -> bool:
        """Whether the pod a token is bound to is still the one it was issued for."""
        assert issued.pod is not None
        namespace = issued.username.split(":")[2]
        stored = self.get_object("v1", "Pod", namespace, issued.pod[0])
        return stored is not None and stored["metadata"]["uid"] == issued.pod[1]

    def revoke_token(self, token: str) -> None:
        """The token's pod is gone: it no longer authenticates."""
        self.tokens.pop(token, None)

    def request_token(self, namespace: str, account: str, body: Any) -> JSON:
        """The answered TokenRequest (POST .../serviceaccounts/NAME/token)."""
        if ("", "serviceaccounts/token") in self.forbidden:
            raise ApiError(
                403,
                "Forbidden",
                f'serviceaccounts "{account}" is forbidden: User "fake" cannot create resource '
                f'"serviceaccounts/token" in API group "" in the namespace "{namespace}"',
            )
        if self.get_object("v1", "ServiceAccount", namespace, account) is None:
            raise ApiError(404, "NotFound", f'serviceaccounts "{account}" not found')
        spec = body.get("spec") if isinstance(body, dict) else None
        if not isinstance(spec, dict):
            raise ApiError(400, "BadRequest", "a TokenRequest needs a spec")
        seconds = int(spec.get("expirationSeconds") or 3600)
        if seconds < MIN_TOKEN_SECONDS:
            raise ApiError(
                422,
                "Invalid",
                f'TokenRequest.authentication.k8s.io "{account}" is invalid: '
                "spec.expirationSeconds: Invalid value: "
                f"{seconds}: may not specify a duration less than 10 minutes",
            )
        audiences = tuple(spec.get("audiences") or (API_AUDIENCE,))
        bound = spec.get("boundObjectRef") or {}
        if bound and bound.get("kind") != "Pod":
            raise ApiError(422, "Invalid", "this fake binds tokens to Pods only")
        pod = str(bound.get("name") or "")
        token = self.issue_token(namespace, account, audiences, seconds, pod)
        expires = datetime.fromtimestamp(self.tokens[token].expires, UTC)
        return {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "metadata": {"name": account, "namespace": namespace, "creationTimestamp": _now()},
            "spec": {"audiences": list(audiences), "expirationSeconds": seconds},
            "status": {
                "token": token,
                "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
        }

    def review_token(self, review: Any) -> JSON:
        """The answered TokenReview."""
        if not isinstance(review, dict) or not isinstance(review.get("spec"), dict):
            raise ApiError(400, "BadRequest", "a TokenReview needs a spec")
        spec = review["spec"]
        self.token_reviews += 1
        asked = tuple(spec.get("audiences") or (API_AUDIENCE,))
        issued = self.tokens.get(str(spec.get("token") or ""))
        status: JSON = {"user": {}}
        if issued is None or issued.expires <= time.time():
            status["error"] = (
                "[invalid bearer token, square/go-jose: error in cryptographic primitive]"
            )
        elif not (common := [a for a in asked if a in issued.audiences]):
            status["error"] = "[invalid bearer token, token audiences is invalid]"
        elif gone := self._account_gone(issued):
            status["error"] = f"[invalid bearer token, {gone}]"
        elif issued.pod is not None and not self._pod_alive(issued):
            status["error"] = (
                f'[invalid bearer token, pod "{issued.pod[0]}" is not found or was recreated]'
            )
        else:
            namespace, account = issued.username.split(":")[2:]
            user: JSON = {
                "username": issued.username,
                "groups": [
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{namespace}",
                    "system:authenticated",
                ],
            }
            if issued.pod is not None:
                prefix = "authentication.kubernetes.io/"
                user["extra"] = {
                    prefix + "credential-id": [f"JTI={issued.jti}"],
                    **({prefix + "node-name": [issued.node]} if issued.node else {}),
                    prefix + "pod-name": [issued.pod[0]],
                    prefix + "pod-uid": [issued.pod[1]],
                }
            status = {"authenticated": True, "user": user, "audiences": common}
        return {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "metadata": {"creationTimestamp": None},
            "spec": {"audiences": list(spec.get("audiences") or [])},  # the token is not echoed
            "status": status,
        }

    def _account_gone(self, issued: IssuedToken) -> str:
        """Why a token's ServiceAccount no longer backs it ("" while it does)."""
        if not issued.account_uid:
            return ""
        namespace, account = issued.username.split(":")[2:]
        held = self.get_object("v1", "ServiceAccount", namespace, account)
        if held is None:
            return f'serviceaccounts "{account}" not found'
        if held["metadata"]["uid"] != issued.account_uid:
            return (
                f"service account UID ({held['metadata']['uid']}) does not match claim "
                f"({issued.account_uid})"
            )
        return ""

    # --- direct state access for tests (no HTTP) -----------------------------------------------

    def resource_type(self, api_version: str, kind: str) -> ResourceType:
        group, _, version = api_version.rpartition("/")
        for rt in self._types.values():
            if rt.group == group and rt.version == version and rt.kind == kind:
                return rt
        raise KeyError(f"no resource type {api_version} {kind}")

    def seed(self, obj: JSON) -> JSON:
        """Create an object directly (apiVersion and kind pick the resource type). It is not
        checked against its CRD's schema: a seeded object is one already stored, as under an
        older, laxer CRD, which a reconciler must survive; requests are checked."""
        rt = self.resource_type(obj["apiVersion"], obj["kind"])
        ns = obj.get("metadata", {}).get("namespace", "default") if rt.namespaced else ""
        return self.create(rt, ns, obj, check_schema=False)

    def get_object(self, api_version: str, kind: str, namespace: str, name: str) -> JSON | None:
        rt = self.resource_type(api_version, kind)
        with self._cond:
            obj = self._objects.get(self._key(rt, namespace, name))
            return _at_version(rt, obj) if obj is not None else None

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._rv

    def compact(self) -> None:
        """Forget the event history: watches from an older resourceVersion now get 410 Gone."""
        with self._cond:
            self._events.clear()
            self._oldest_rv = self._rv

    # --- the store ---------------------------------------------------------------------------

    def _stored_type(self, storage_key: tuple[str, str], obj: JSON) -> ResourceType:
        """The type an object is stored as: its own version where served, else its kind's first."""
        of_kind = [rt for rt in self._types.values() if rt.storage_key == storage_key]
        same = [rt for rt in of_kind if rt.api_version == obj.get("apiVersion")]
        return (same or of_kind)[0]

    def _record(self, rt: ResourceType, type_: str, obj: JSON) -> None:
        self._events.append(_Event(self._rv, rt, type_, copy.deepcopy(obj)))
        if len(self._events) > self.history_limit:
            dropped = self._events[: len(self._events) - self.history_limit]
            del self._events[: len(dropped)]
            self._oldest_rv = dropped[-1].rv
        self._cond.notify_all()

    def _bump(self, obj: JSON) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)

    def create(
        self,
        rt: ResourceType,
        ns: str,
        body: JSON,
        dry_run: bool = False,
        check_schema: bool = True,
    ) -> JSON:
        obj = copy.deepcopy(body)
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the body of the request was not a JSON object")
        meta = obj.setdefault("metadata", {})
        _check_string_maps(rt, meta)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name")
        if not name:
            raise ApiError(
                422,
                "Invalid",
                f"{rt.kind} is invalid: metadata.name: Required value: name or "
                "generateName is required",
            )
        if rt.namespaced:
            if meta.get("namespace", ns) != ns:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match "
                    "the namespace sent on the request",
                )
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        for field in ("resourceVersion", "deletionTimestamp"):
            meta.pop(field, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta["generation"] = 1
        if rt.status_subresource:
            obj.pop("status", None)
        if check_schema:
            _check_schema(rt, obj)
        for webhook in list(self.webhooks):
            if (refusal := webhook("CREATE", rt, obj, dry_run)) is not None:
                raise refusal
        with self._cond:
            self._default(rt, obj, None)
            key = self._key(rt, ns, name)
            if key in self._objects:
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'{rt.plural}{"." + rt.group if rt.group else ""} "{name}" already exists',
                    {"name": name, "group": rt.group, "kind": rt.plural},
                )
            if dry_run:
                return obj
            self._bump(obj)
            self._objects[key] = obj
            self._record(rt, "ADDED", obj)
            if self.garbage_collection and meta.get("ownerReferences"):
                self.collect_garbage()  # created with an owner already gone: collected
            return copy.deepcopy(obj)

    def _key(self, rt: ResourceType, ns: str, name: str) -> tuple[tuple[str, str], str, str]:
        return (rt.storage_key, ns if rt.namespaced else "", name)

    def _not_found(self, rt: ResourceType, name: str) -> ApiError:
        resource = rt.plural + ("." + rt.group if rt.group else "")
        return ApiError(
            404,
            "NotFound",
            f'{resource} "{name}" not found',
            {"name": name, "group": rt.group, "kind": rt.plural},
        )

    def get(self, rt: ResourceType, ns: str, name: str) -> JSON:
        with self._cond:
            obj = self._objects.get(self._key(rt, ns, name))
            if obj is None:
                raise self._not_found(rt, name)
            return _at_version(rt, obj)

    def list(self, rt: ResourceType, ns: str | None, query: dict[str, str]) -> JSON:
        with self._cond:
            items = [
                _at_version(rt, o)
                for (k, ons, _), o in sorted(self._objects.items())
                if k == rt.storage_key and (ns is None or ons == ns) and self._selected(o, query)
            ]
            rv = self._rv
        return {
            "apiVersion": rt.api_version,
            "kind": rt.kind + "List",
            "metadata": {"resourceVersion": str(rv)},
            "items": items,
        }

    @staticmethod
    def _selected(obj: JSON, query: dict[str, str]) -> bool:
        try:
            labels = obj.get("metadata", {}).get("labels") or {}
            if sel := query.get("labelSelector"):
                if not label_selector_matches(sel, labels):
                    return False
            if sel := query.get("fieldSelector"):
                if not field_selector_matches(sel, obj):
                    return False
        except ValueError as e:
            raise ApiError(400, "BadRequest", str(e)) from e
        return True

    def replace(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        body: JSON,
        subresource: str = "",
        dry_run: bool = False,
        check_rv: bool = True,
    ) -> JSON:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of the request was not a JSON object")
        with self._cond:
            key = self._key(rt, ns, name)
            old = self._objects.get(key)
            if old is None:
                raise self._not_found(rt, name)
            meta = body.get("metadata") or {}
            _check_string_maps(rt, meta)
            if meta.get("name", name) != name:
                raise ApiError(
                    400, "BadRequest", "the name of the object does not match the name on the URL"
                )
            want_rv = meta.get("resourceVersion")
            if check_rv and want_rv and want_rv != old["metadata"]["resourceVersion"]:
                resource = rt.plural + ("." + rt.group if rt.group else "")
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {resource} "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                    {"name": name, "group": rt.group, "kind": rt.plural},
                )
            new = copy.deepcopy(old)
            if subresource == "status":
                if "status" in body:
                    new["status"] = copy.deepcopy(body["status"])
                else:
                    new.pop("status", None)
            else:
                new = {k: copy.deepcopy(v) for k, v in body.items() if k != "metadata"}
                if rt.status_subresource:
                    new.pop("status", None)
                    if "status" in old:
                        new["status"] = copy.deepcopy(old["status"])
                new_meta = copy.deepcopy(meta)
                for field in (
                    "uid",
                    "creationTimestamp",
                    "generation",
                    "deletionTimestamp",
                    "namespace",
                    "name",
                ):
                    new_meta.pop(field, None)
                    if field in old["metadata"]:
                        new_meta[field] = old["metadata"][field]
                new["metadata"] = new_meta
                new["apiVersion"], new["kind"] = old["apiVersion"], rt.kind  # stored as it was
                self._default(rt, new, old)
                if self._spec_changed(rt, old, new):
                    new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
            new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            _check_schema(rt, new, _at_version(rt, old), status_only=subresource == "status")
            if new == old or dry_run:
                return _at_version(rt, new)
            if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
                del self._objects[key]
                self._bump(new)
                self._record(rt, "DELETED", new)
                return _at_version(rt, new)
            self._bump(new)
            self._objects[key] = new
            self._record(rt, "MODIFIED", new)
            return _at_version(rt, new)

    def _default(self, rt: ResourceType, obj: JSON, old: JSON | None) -> None:
        """What a real API server fills in (Services) or leaves out (a Deployment's pod
        `hostNetwork: false`: Go's omitempty); allocated values are kept."""
        if rt.key == ("apps", "v1", "deployments"):
            pod = ((obj.get("spec") or {}).get("template") or {}).get("spec")
            if isinstance(pod, dict) and pod.get("hostNetwork") is False:
                del pod["hostNetwork"]
            return
        if rt.key != ("", "v1", "services") or not isinstance(obj.get("spec"), dict):
            return
        spec, old_spec = obj["spec"], (old or {}).get("spec") or {}
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        if not spec.get("clusterIP"):
            spec["clusterIP"] = old_spec.get("clusterIP") or f"10.96.0.{self._next_ip}"
            if not old_spec.get("clusterIP"):
                self._next_ip += 1
        if spec["type"] in ("NodePort", "LoadBalancer"):
            spec.setdefault("externalTrafficPolicy", "Cluster")
            old_ports = {p.get("name"): p for p in old_spec.get("ports") or []}
            for port in spec.get("ports") or []:
                if isinstance(port, dict) and not port.get("nodePort"):
                    allocated = (old_ports.get(port.get("name")) or {}).get("nodePort")
                    if not allocated:
                        allocated = self._next_node_port
                        self._next_node_port += 1
                    port["nodePort"] = allocated
        else:
            spec.pop("externalTrafficPolicy", None)

    @staticmethod
    def _spec_changed(rt: ResourceType, old: JSON, new: JSON) -> bool:
        ignored = {"metadata", "status"} if rt.status_subresource else {"metadata"}

        def strip(o: JSON) -> JSON:
            return {k: v for k, v in o.items() if k not in ignored}

        return strip(old) != strip(new)

    def patch(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        content_type: str,
        patch: Any,
        subresource: str = "",
        dry_run: bool = False,
    ) -> JSON:
        current = self.get(rt, ns, name)
        if content_type == "application/json-patch+json":
            if not isinstance(patch, list):
                raise ApiError(400, "BadRequest", "json patch must be a JSON array of operations")
            try:
                new = jsonpatch.apply_patch(current, patch)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
                raise ApiError(422, "Invalid", f"the JSON patch could not be applied: {e}") from e
        elif content_type in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ):
            if not isinstance(patch, dict):
                raise ApiError(400, "BadRequest", "merge patch must be a JSON object")
            new = merge_patch(current, patch)
        else:
            raise ApiError(
                415, "UnsupportedMediaType", f"the media type {content_type!r} is not supported"
            )
        # A patch carrying an explicit resourceVersion is a precondition; otherwise it
        # applies to the current version.
        patched_rv = (
            (patch.get("metadata") or {}).get("resourceVersion")
            if isinstance(patch, dict)
            else None
        )
        if not patched_rv:
            new.setdefault("metadata", {})["resourceVersion"] = current["metadata"][
                "resourceVersion"
            ]
        return self.replace(rt, ns, name, new, subresource, dry_run)

    def delete(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        dry_run: bool = False,
        options: JSON | None = None,
    ) -> JSON:
        with self._cond:
            key = self._key(rt, ns, name)
            obj = self._objects.get(key)
            if obj is None:
                raise self._not_found(rt, name)
            want_uid = ((options or {}).get("preconditions") or {}).get("uid")
            if want_uid and want_uid != obj["metadata"]["uid"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f"Precondition failed: UID in precondition: {want_uid}, UID in object meta: "
                    f"{obj['metadata']['uid']}",
                )
            obj = copy.deepcopy(obj)
            if dry_run:
                return _at_version(rt, obj)
            if obj["metadata"].get("finalizers"):
                if not obj["metadata"].get("deletionTimestamp"):
                    obj["metadata"]["deletionTimestamp"] = _now()
                    self._bump(obj)
                    self._objects[key] = obj
                    self._record(rt, "MODIFIED", obj)
                return _at_version(rt, obj)
            del self._objects[key]
            self._bump(obj)
            self._record(rt, "DELETED", obj)
            if self.garbage_collection:
                self.collect_garbage()
            return _at_version(rt, obj)

    def collect_garbage(self) -> list[tuple[str, str, str]]:
        """Delete every object whose owners are all gone (kube-controller-manager's garbage
        collector, background propagation), until none is left; the (kind, namespace, name)
        deleted."""
        deleted = []
        with self._cond:
            while True:
                uids = {o["metadata"]["uid"] for o in self._objects.values()}
                orphans = [
                    (key, o)
                    for key, o in self._objects.items()
                    if o["metadata"].get("ownerReferences")
                    and not any(r.get("uid") in uids for r in o["metadata"]["ownerReferences"])
                ]
                if not orphans:
                    return deleted
                for key, o in orphans:
                    obj = copy.deepcopy(o)
                    del self._objects[key]
                    self._bump(obj)
                    self._record(self._stored_type(key[0], obj), "DELETED", obj)
                    deleted.append((obj["kind"], key[1], key[2]))

    def watch_events(
        self, rt: ResourceType, ns: str | None, query: dict[str, str]
    ) -> Iterator[JSON]:
        """Start a watch: validates now (raises ApiError), then returns the event iterator that
        runs until the timeout, the server stops or the client leaves."""
        timeout = float(query.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        rv_param = query.get("resourceVersion", "")
        with self._cond:
            self._selected({}, query)  # reject a malformed selector up front
            if rv_param in ("", "0"):
                last = self._rv
                initial = [
                    {"type": "ADDED", "object": _at_version(rt, o)}
                    for (k, ons, _), o in sorted(self._objects.items())
                    if k == rt.storage_key
                    and (ns is None or ons == ns)
                    and self._selected(o, query)
                ]
            else:
                try:
                    last = int(rv_param)
                except ValueError as e:
                    raise ApiError(
                        400, "BadRequest", f"invalid resourceVersion {rv_param!r}"
                    ) from e
                if last < self._oldest_rv:
                    gone = status_object(
                        410, "Expired", f"too old resource version: {last} ({self._oldest_rv})"
                    )
                    return iter([{"type": "ERROR", "object": gone}])
                initial = []
        return self._follow(rt, ns, query, initial, last, deadline)

    def _follow(
        self,
        rt: ResourceType,
        ns: str | None,
        query: dict[str, str],
        initial: list[JSON],
        last: int,
        deadline: float,
    ) -> Iterator[JSON]:
        yield from initial
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        next_bookmark = time.monotonic() + self.bookmark_interval
        while not self._stopping.is_set():
            bookmark: JSON | None = None
            with self._cond:
                pending = [e for e in self._events if e.rv > last]
                if not pending:
                    now = time.monotonic()
                    if deadline - now <= 0:
                        return
                    if not bookmarks or now < next_bookmark:
                        wait = min(deadline - now, 0.5)
                        if bookmarks:
                            wait = min(wait, next_bookmark - now)
                        self._cond.wait(wait)
                        continue
                    next_bookmark = now + self.bookmark_interval
                    last = self._rv
                    bookmark = {
                        "kind": rt.kind,
                        "apiVersion": rt.api_version,
                        "metadata": {"resourceVersion": str(last)},
                    }
            if bookmark is not None:
                yield {"type": "BOOKMARK", "object": bookmark}
                continue
            for event in pending:
                last = event.rv
                obj = event.obj
                if event.rtype.storage_key != rt.storage_key:
                    continue
                if ns is not None and obj["metadata"].get("namespace", "") != ns:
                    continue
                if not self._selected(obj, query):
                    continue
                yield {"type": event.type, "object": _at_version(rt, obj)}

    # --- discovery ---------------------------------------------------------------------------

    def _resource_list(self, group: str, version: str) -> JSON | None:
        resources = []
        for rt in self._types.values():
            if rt.group != group or rt.version != version:
                continue
            verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
            resources.append(
                {
                    "name": rt.plural,
                    "singularName": rt.kind.lower(),
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": verbs,
                }
            )
            if rt.status_subresource:
                resources.append(
                    {
                        "name": rt.plural + "/status",
                        "singularName": "",
                        "namespaced": rt.namespaced,
                        "kind": rt.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
        if not resources:
            return None
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }

    def _group_list(self) -> JSON:
        groups: dict[str, list[str]] = {}
        for rt in self._types.values():
            if rt.group and rt.version not in groups.setdefault(rt.group, []):
                groups[rt.group].append(rt.version)
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                    "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                }
                for g, vs in sorted(groups.items())
            ],
        }

    # --- routing -----------------------------------------------------------------------------

    def route(self, path: str) -> tuple[ResourceType, str | None, str, str] | JSON:
        """Map a path to (type, namespace or None, name, subresource) or a discovery document."""
        parts = [p for p in path.split("/") if p]
        if parts == ["version"]:
            return {"major": "1", "minor": "32", "gitVersion": "v1.32.0-fake"}
        if parts == ["api"]:
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if parts == ["apis"]:
            return self._group_list()
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if not rest:
            doc = self._resource_list(group, version)
            if doc is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return doc
        ns: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            ns, rest = rest[1], rest[2:]
        plural, name, sub = rest[0], "", ""
        if len(rest) >= 2:
            name = rest[1]
        if len(rest) == 3:
            sub = rest[2]
        rt = self._types.get((group, version, plural))
        if rt is None or len(rest) > 3 or (ns is not None and not rt.namespaced):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if sub and (sub != "status" or not rt.status_subresource):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return rt, ns, name, sub


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default listen backlog is 5. A burst of connections (two reconcilers' 15
    # watches each, writers, the Lease) while the accepting thread waits for the GIL overflows
    # it: the kernel drops the handshake and the client waits for TCP's retransmission (1 s,
    # then 2, 4, 8...), long enough for a Lease renewal to miss its deadline, or sees a reset.
    # A kube-apiserver listens with the kernel's somaxconn (4096 here).
    request_queue_size = 128
    fake: FakeApiServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes: without TCP_NODELAY, Nagle's algorithm
        # and the client's delayed ACK hold every response ~40 ms (loopback latency is ~0).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.fake._conns_lock:
            self.server.fake._conns.add(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self.server.fake._conns_lock:
                self.server.fake._conns.discard(self.connection)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _send_json(self, code: int, body: JSON) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except json.JSONDecodeError as e:
            raise ApiError(400, "BadRequest", f"the request body is not valid JSON: {e}") from e

    def _dispatch(self, method: str) -> None:
        fake = self.server.fake
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        fake.requests.append((method, url.path))
        try:
            body = self._read_body() if method in ("POST", "PUT", "PATCH", "DELETE") else None
            if fake.delay:
                fake._stopping.wait(fake.delay)
            if fake.fail_status:
                raise ApiError(fake.fail_status, "InternalError", "injected failure")
            if (
                method in ("GET", "POST")
                and (forwarded := fake.forward(url.path, url.query, self.headers, method))
                is not None
            ):
                code, ctype, data = forwarded
                self.send_response(code)
                self.send_header("Content-Type", ctype or "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            if url.path == TOKEN_REVIEWS and method == "POST":
                if ("authentication.k8s.io", "tokenreviews") in fake.forbidden:
                    raise ApiError(403, "Forbidden", "tokenreviews are forbidden")
                self._send_json(201, fake.review_token(body))
                return
            if method == "POST" and (token_path := TOKEN_REQUEST_PATH.match(url.path)):
                self._send_json(201, fake.request_token(*token_path.groups(), body))
                return
            if url.path == SUBJECT_ACCESS_REVIEWS and method == "POST":
                if ("authorization.k8s.io", "subjectaccessreviews") in fake.forbidden:
                    raise ApiError(403, "Forbidden", "subjectaccessreviews are forbidden")
                self._send_json(201, fake.review_access(body))
                return
            routed = fake.route(url.path)
            if not isinstance(routed, dict) and (routed[0].group, routed[0].plural) in (
                fake.forbidden
            ):
                rt = routed[0]
                raise ApiError(
                    403,
                    "Forbidden",
                    f'{rt.plural}.{rt.group or "core"} is forbidden: User "system:serviceaccount:'
                    f'fake:fake" cannot {method.lower()} resource "{rt.plural}"',
                )
            if not isinstance(routed, dict) and (method, routed[0].plural) in fake.refusals:
                code = fake.refusals[method, routed[0].plural]
                reasons = {403: "Forbidden", 409: "Conflict", 422: "Invalid"}
                raise ApiError(
                    code, reasons.get(code, "InternalError"), "refused (fake API server)"
                )
            if isinstance(routed, dict):
                if method != "GET":
                    raise ApiError(405, "MethodNotAllowed", "method not allowed")
                self._send_json(200, routed)
                return
            rt, ns, name, sub = routed
            dry_run = query.get("dryRun") == "All"
            scope = (ns or "") if rt.namespaced else ""
            if method == "GET" and not name:
                if query.get("watch") in ("true", "1"):
                    self._watch(fake, rt, ns, query)
                else:
                    self._send_json(200, fake.list(rt, ns, query))
            elif method == "GET":
                self._send_json(200, fake.get(rt, scope, name))
            elif method == "POST" and not name:
                if rt.namespaced and ns is None:
                    raise ApiError(405, "MethodNotAllowed", "create needs a namespace")
                self._send_json(201, fake.create(rt, scope, body, dry_run))
            elif method == "PUT" and name:
                self._send_json(200, fake.replace(rt, scope, name, body, sub, dry_run))
            elif method == "PATCH" and name:
                ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
                self._send_json(200, fake.patch(rt, scope, name, ctype, body, sub, dry_run))
            elif method == "DELETE" and name and not sub:
                options = body if isinstance(body, dict) else None
                obj = fake.delete(rt, scope, name, dry_run, options)
                if obj["metadata"].get("deletionTimestamp") and obj["metadata"].get("finalizers"):
                    self._send_json(202, obj)
                elif rt.key in RETURN_DELETED_OBJECT:
                    self._send_json(200, obj)
                else:
                    details = {"name": name, "group": rt.group, "kind": rt.plural}
                    details["uid"] = obj["metadata"]["uid"]
                    self._send_json(200, status_object(200, "", "", details))
            else:
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")
        except ApiError as e:
            self._send_json(e.code, e.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _watch(
        self, fake: FakeApiServer, rt: ResourceType, ns: str | None, query: dict[str, str]
    ) -> None:
        events = fake.watch_events(rt, ns, query)  # raises ApiError before the headers go out
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for event in events:
                self._chunk(json.dumps(event).encode() + b"\n")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


@contextmanager
def running(
    types: tuple[ResourceType, ...] = CORE_TYPES + GATEWAY_TYPES,
) -> Iterator[FakeApiServer]:
    server = FakeApiServer(types).start()
    try:
        yield server
    finally:
        server.stop()
