"""The TURN credentials and the ICE-server JSON of the STUNner auth service (ANCHORS §5).

Pure: the configs (as served by the CDS), the query parameters and the clock go in, the answer
comes out. The reconciler's HTTP server (`GET /` and `GET /ice`) and the demo use it.

- `GET /?service=turn&...` answers `{"username", "password", "ttl", "uris"}` for the first
  Gateway (in id order) with a matching listener;
- `GET /ice?service=turn&...` answers `{"iceServers": [{"username", "credential", "urls"}, ...],
  "iceTransportPolicy": ...}`, one iceServer per matching Gateway, which a browser passes to
  `new RTCPeerConnection(...)` as is.

Static auth hands out the configured username and password. Ephemeral auth mints TURN REST
credentials: username `<now + ttl>:<username parameter>`, password
`base64(HMAC-SHA1(shared secret, username))`, which stunnerd checks without any state.

A Gateway with relay address discovery runs a stunnerd on every node, each handing out its
node's public address (its listeners' address is the node placeholder): given, per config id,
the public addresses of the nodes it runs on (`node_local`: render's, in a stable order, by Node
name), each such listener has one URI per node, at the port stunnerd binds on the node (`port`:
the host network's, not a Service's), unless the request or the server names one address
(`public-addr`, STUNNER_PUBLIC_ADDR). A node without a public address is left out: its stunnerd
hands out a private address.

A STUN-only Gateway (auth type `none`, GatewayConfig `stunMode: true`) gets `stun:<addr>:<port>`
URIs (RFC 7064) and no username or credential, one per TURN-UDP listener only: a `stun:` URI
carries no transport and browsers send Binding requests over UDP alone (libwebrtc puts
`stun:` and `stuns:` alike into its UDP STUN list, and refuses `stun:...?transport=` as a syntax
error), so a TCP, TLS or DTLS listener's port would only make them wait for answers that never
come. stunnerd still answers Binding on those listeners
for clients configured by hand.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from .cds import listener_parts
from .dataplane import AuthConfig, ListenerConfig, StunnerConfig, uri_host_port
from .vocabulary import NODE_ADDRESS_PLACEHOLDER

DEFAULT_TTL = 86400  # seconds: one day, as the Go auth service
# The longest ttl handed out: a week. Go's auth service sets none (ANCHORS §5 documents only
# the default): ttl=10^12 would mint credentials valid for 31,000 years, and a 4,000-digit
# ttl a 4,000-digit username.
MAX_TTL = 7 * 86400
_TTL_DIGITS = frozenset("0123456789")
SERVICE_TURN = "turn"
ICE_TRANSPORT_POLICIES = ("all", "public", "relay")
DEFAULT_ICE_TRANSPORT_POLICY = "all"
WILDCARD_ADDRESS = "0.0.0.0"
USERNAME_SEPARATOR = ":"


class IceError(Exception):
    """A request the auth service answers with an error: `status` and a message (no secrets)."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def parse_ttl(text: str) -> int:
    """`ttl`: 1 to MAX_TTL seconds in ASCII digits (at most 10 of them), nothing else: no sign,
    space, `_` or other scripts' digits, which Python's int() takes; empty: DEFAULT_TTL. The
    error does not repeat the value (it can be anything, of any length)."""
    if not text:
        return DEFAULT_TTL
    if len(text) <= 10 and not set(text) - _TTL_DIGITS:
        ttl = int(text)
        if 0 < ttl <= MAX_TTL:
            return ttl
    raise IceError(HTTPStatus.BAD_REQUEST, f'"ttl" must be a number of seconds from 1 to {MAX_TTL}')


@dataclass(frozen=True)
class IceQuery:
    """The query parameters of `GET /` and `GET /ice` (the Go auth service's, same names)."""

    username: str = ""
    ttl: int = DEFAULT_TTL
    namespace: str = ""
    gateway: str = ""
    listener: str = ""
    public_address: str = ""
    ice_transport_policy: str = DEFAULT_ICE_TRANSPORT_POLICY

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> IceQuery:
        """Parse and check the parameters; `IceError` (400) says which one is wrong."""
        service = params.get("service", "")
        if service != SERVICE_TURN:
            raise IceError(HTTPStatus.BAD_REQUEST, '"service" must be "turn"')
        ttl = parse_ttl(params.get("ttl", ""))
        policy = params.get("iceTransportPolicy", "") or DEFAULT_ICE_TRANSPORT_POLICY
        if policy not in ICE_TRANSPORT_POLICIES:
            raise IceError(
                HTTPStatus.BAD_REQUEST,
                f'"iceTransportPolicy" must be one of {", ".join(ICE_TRANSPORT_POLICIES)}',
            )
        query = cls(
            username=params.get("username", ""),
            ttl=ttl,
            namespace=params.get("namespace", ""),
            gateway=params.get("gateway", ""),
            listener=params.get("listener", ""),
            public_address=params.get("public-addr", ""),
            ice_transport_policy=policy,
        )
        if query.gateway and not query.namespace:
            raise IceError(HTTPStatus.BAD_REQUEST, '"gateway" needs "namespace"')
        if query.listener and not query.gateway:
            raise IceError(HTTPStatus.BAD_REQUEST, '"listener" needs "namespace" and "gateway"')
        return query

    def matches(self, listener_name: str) -> bool:
        """Whether a rendered listener `<ns>/<gw>/<listener>` passes the filters."""
        parts = listener_parts(listener_name)
        if parts is None:
            return False
        wanted = (self.namespace, self.gateway, self.listener)
        return all(not want or want == have for want, have in zip(wanted, parts, strict=True))


def ephemeral_password(secret: str, username: str) -> str:
    """The TURN REST password of `username`: base64(HMAC-SHA1(secret, username)), padded
    (coturn's use-auth-secret; stunnerd checks ephemeral credentials with this)."""
    mac = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return base64.b64encode(mac).decode("ascii")


def ephemeral_username(expiry: int, user_id: str = "") -> str:
    """A TURN REST username "<expiry>:<user_id>" (the colon stays when the user id is empty)."""
    return f"{expiry}{USERNAME_SEPARATOR}{user_id}"


def credentials(auth: AuthConfig, user_id: str, ttl: int, now: int) -> tuple[str, str]:
    """(username, password) a client uses with `auth`: the static pair, or an ephemeral pair
    valid for `ttl` seconds from `now` (Unix seconds) for `user_id`; none for STUN only."""
    if auth.stun_only:
        return "", ""
    if auth.type == "ephemeral":
        username = ephemeral_username(now + ttl, user_id)
        return username, ephemeral_password(auth.credentials.get("secret", ""), username)
    return auth.credentials.get("username", ""), auth.credentials.get("password", "")


def _advertised(address: str) -> str:
    """A listener address a client can use; an unexpanded `$STUNNER_ADDR`, a wildcard or the
    node placeholder (each node's stunnerd has its own) is not one."""
    unusable = ("0.0.0.0", "::", NODE_ADDRESS_PLACEHOLDER)
    return "" if not address or "$" in address or address in unusable else address


def _address(listener: ListenerConfig, query: IceQuery, public_address: str) -> str:
    """The address in a listener's URI: the first of the `public-addr` parameter,
    `public_address` (the server's STUNNER_PUBLIC_ADDR), the listener's public address, its
    address; "" when none of them is one a client can use."""
    return (
        query.public_address
        or public_address
        or _advertised(listener.public_address)
        or _advertised(listener.address)
    )


def _offered(config: StunnerConfig, listener: ListenerConfig, query: IceQuery) -> bool:
    """Whether `listener` has a URI in the answer: it passes `query`'s filters and, on a
    STUN-only Gateway, it is plain UDP (the module's docstring says why)."""
    facts = listener.facts
    stun_only_usable = facts.transport == "UDP" and not facts.tls
    return query.matches(listener.name) and (stun_only_usable or not config.auth.stun_only)


def _per_node(listener: ListenerConfig, query: IceQuery, public_address: str) -> bool:
    """Whether a listener is served by a stunnerd on every node at the node's public address
    (relay address discovery: its address is the node placeholder) and no address is named
    for the answer (`public-addr`, STUNNER_PUBLIC_ADDR)."""
    return (
        listener.address == NODE_ADDRESS_PLACEHOLDER
        and not query.public_address
        and not public_address
    )


def _uri(config: StunnerConfig, listener: ListenerConfig, address: str, port: int) -> str:
    if config.auth.stun_only:
        return f"stun:{uri_host_port(address, port)}"
    return listener.model_copy(update={"public_address": address, "public_port": port}).uri()


def listener_uris(
    config: StunnerConfig,
    query: IceQuery,
    public_address: str = "",
    node_addresses: Sequence[str] = (),
) -> list[str]:
    """The URIs of `config`'s offered listeners at `_address`'s address, else 0.0.0.0 (as Go's
    auth service): TURN URIs, or `stun:<addr>:<port>` on a STUN-only Gateway. A listener with
    a stunnerd on every node (`_per_node`) has one URI per node public address in
    `node_addresses` (in their order), at the port stunnerd binds on the node."""
    uris = []
    for listener in config.listeners:
        if not _offered(config, listener, query):
            continue
        if node_addresses and _per_node(listener, query, public_address):
            uris += [_uri(config, listener, node, listener.port) for node in node_addresses]
            continue
        address = _address(listener, query, public_address) or WILDCARD_ADDRESS
        uris.append(_uri(config, listener, address, listener.public_port or listener.port))
    return uris


NodeLocal = Mapping[str, Sequence[str]]  # config id -> the addresses of the nodes it runs on


def unaddressed(
    configs: Mapping[str, StunnerConfig],
    query: IceQuery,
    public_address: str = "",
    node_local: NodeLocal | None = None,
) -> list[tuple[str, ListenerConfig]]:
    """(config id, listener) of each listener passing `query`'s filters whose URI would carry
    0.0.0.0: no address a client can use (`stunner ice` refuses to print those)."""
    nodes = node_local or {}
    return [
        (id, listener)
        for id in sorted(configs)
        for listener in configs[id].listeners
        if _offered(configs[id], listener, query)
        and not (nodes.get(id) and _per_node(listener, query, public_address))
        and not _address(listener, query, public_address)
    ]


def _matching(
    configs: Mapping[str, StunnerConfig],
    query: IceQuery,
    public_address: str,
    node_local: NodeLocal | None,
) -> Iterable[tuple[StunnerConfig, list[str]]]:
    if not configs:
        raise IceError(HTTPStatus.INTERNAL_SERVER_ERROR, "no STUNner configuration available")
    nodes = node_local or {}
    for id in sorted(configs):
        uris = listener_uris(configs[id], query, public_address, nodes.get(id, ()))
        if uris:
            yield configs[id], uris


def turn_auth(
    configs: Mapping[str, StunnerConfig],
    query: IceQuery,
    now: int,
    public_address: str = "",
    node_local: NodeLocal | None = None,
) -> dict[str, Any]:
    """`GET /`: credentials and URIs of the first Gateway (by id) with a matching listener."""
    for config, uris in _matching(configs, query, public_address, node_local):
        username, password = credentials(config.auth, query.username, query.ttl, now)
        return {"username": username, "password": password, "ttl": query.ttl, "uris": uris}
    raise IceError(
        HTTPStatus.NOT_FOUND, "could not generate TURN auth token: no valid listener found"
    )


def ice_config(
    configs: Mapping[str, StunnerConfig],
    query: IceQuery,
    now: int,
    public_address: str = "",
    node_local: NodeLocal | None = None,
) -> dict[str, Any]:
    """`GET /ice`: one iceServer per Gateway (by id) with a matching listener."""
    servers: list[dict[str, Any]] = []
    for config, uris in _matching(configs, query, public_address, node_local):
        if config.auth.stun_only:  # an RTCIceServer of stun: URLs takes no credentials
            servers.append({"urls": uris})
            continue
        username, password = credentials(config.auth, query.username, query.ttl, now)
        servers.append({"username": username, "credential": password, "urls": uris})
    if not servers:
        raise IceError(
            HTTPStatus.NOT_FOUND, "could not generate ICE config: no valid listener found"
        )
    return {"iceServers": servers, "iceTransportPolicy": query.ice_transport_policy}
