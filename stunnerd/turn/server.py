"""The TURN server of one listener (RFC 8489 STUN, RFC 8656 TURN), independent of its transport.

A transport (`transports.py`) hands every packet from a client to `TurnServer`: ChannelData
goes straight to the client's allocation, everything else through the (class, method) dispatch
table. Each allocation (`allocation.py`) owns one UDP relay socket towards the peers.

Security: a peer is reachable only if the listener's routes admit it (`Router`), checked when a
permission or channel is installed and again for every relayed packet in both directions.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import secrets
import socket
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from stunner_api import stun
from stunner_api.peer_admission import canonical_peer_ip
from stunner_api.stun import FAMILY_IPV4, FAMILY_IPV6, Address, Class, Message, Method

from ..offload.engine import KernelOffload
from .allocation import (
    Allocation,
    AsyncioRelayPath,
    Downstream,
    ListenerScope,
    address_family,
)
from .auth import Authenticator, NonceManager, nonce_binding
from .counters import ClusterCounters, ListenerCounters
from .ledger import DRAINING, FULL, GRANTED, LocalQuota, Quota, Reservations
from .limits import Limits, RateLimiter
from .relay_addresses import NoRelaySocket, RelayAddresses, default_family
from .router import Router
from .stateless import unauthorized
from .tcp_relay import TRANSPORT_TCP, PeerConnection, TcpRelay

log = logging.getLogger("stunner.turn")

DEFAULT_ALLOCATION_LIFETIME = 600  # RFC 8656 §3.2
MAX_ALLOCATION_LIFETIME = 3600
PERMISSION_LIFETIME = 300  # RFC 8656 §9
CHANNEL_LIFETIME = 600  # RFC 8656 §12
RESPONSE_CACHE_TTL = 40.0  # a client gives up on a transaction after 39.5 s (RFC 8489 §6.2.1)
RESPONSE_CACHE_MAX = 65536

TRANSPORT_UDP = 17
# The 403's reason phrase in STUN-only mode (auth type none): short, as the answer goes to an
# address nobody verified (48 bytes in all; static auth's 401 with REALM and NONCE is ~120).
STUN_ONLY_REASON = "Forbidden: STUN only"


class RequestError(Exception):
    """Answer the request with this error code (and optional extra attributes)."""

    def __init__(
        self, code: int, reason: str | None = None, attributes: dict[str, Any] | None = None
    ) -> None:
        super().__init__(code)
        self.code = code
        self.reason = reason or stun.ERROR_REASONS.get(code, "Error")
        self.attributes = attributes or {}


@dataclass
class ServerContext:
    """What all listeners share and a reconcile swaps in place: auth, nonces, routing, quota."""

    authenticator: Authenticator
    router: Router
    nonces: NonceManager = field(default_factory=NonceManager)
    user_quota: int = 0  # allocations per user id; 0 means no quota
    # auth.revoked_users: user ids refused (403) and their allocations ended (issue 29)
    revoked_users: frozenset[str] = frozenset()
    # auth.strict_expiry: an ephemeral credential's allocation ends at its timestamp
    strict_expiry: bool = False
    # auth.allocation_bandwidth_limit: bits per second each allocation relays each way (0: any)
    allocation_bandwidth_limit: int = 0
    users: Quota = field(default_factory=LocalQuota)
    reservations: Reservations = field(default_factory=Reservations)
    # cluster name -> traffic to and from its peers
    cluster_counters: defaultdict[str, ClusterCounters] = field(
        default_factory=lambda: defaultdict(ClusterCounters)
    )
    limits: Limits = field(default_factory=Limits)
    # The kernel offload of this process (admin.offload_engine; off by default).
    offload: KernelOffload = field(default_factory=KernelOffload)
    # admin.relay_address_family: the families allocations are made in (relay_addresses).
    relay_address_family: str = ""

    def __post_init__(self) -> None:
        limits = self.limits
        # Shared by the listeners of this process: error answers per client address (and in
        # total), new allocations per client IP.
        self.error_answers = RateLimiter(limits.error_rate, limits.error_rate_total)
        self.new_allocations = RateLimiter(limits.allocation_rate)

    @property
    def realm(self) -> str:
        return self.authenticator.realm

    @property
    def stun_only(self) -> bool:
        """Auth type `none`: Binding only, every TURN request refused (Go's pure STUN server)."""
        return self.authenticator.stun_only


class Exchange:
    """One request being served: the message, its client, and the key it was authenticated with."""

    __slots__ = ("request", "downstream", "key")

    def __init__(self, request: Message, downstream: Downstream) -> None:
        self.request = request
        self.downstream = downstream
        self.key: bytes | None = None  # set once authenticated; the answer is signed with it


Handler = Callable[[Exchange], Message | None]
AsyncHandler = Callable[[Exchange], Awaitable[Message]]


class TurnServer:
    """TURN for one listener. Transport-agnostic: listeners feed it packets with a Downstream."""

    def __init__(
        self, name: str, relay_ip: str, context: ServerContext, bind_ip: str | None = None
    ) -> None:
        try:
            ipaddress.ip_address(relay_ip)
        except ValueError:
            raise ValueError(
                f"listener {name}: relay address {relay_ip!r} is not an IP address"
            ) from None
        self.name = name
        # The relay address clients are told (XOR-RELAYED-ADDRESS), and the local address the
        # listener and relay sockets bind: the same, but where the relay address is not one of
        # this host's (a node's public address behind 1:1 NAT: `local_bind_address`).
        self.addresses = RelayAddresses(relay_ip, bind_ip or relay_ip)
        self.context = context
        self.allocations: dict[Any, Allocation] = {}  # Downstream.remote -> allocation
        # A dual allocation's relay in its second family (RFC 8656 §7.2, IPv6): the same
        # client's, with its own socket, permissions and channels; the first one rules its life.
        self.additional: dict[Any, Allocation] = {}
        # Stream clients whose Allocate is between its quota and its registration: False once
        # the connection is lost meanwhile (the allocation is then undone, not left to expire).
        self._opening: dict[Any, bool] = {}
        self.stats = ListenerCounters()
        self.scope = ListenerScope(name, context.router, self.stats, context.cluster_counters)
        self._responses: dict[tuple[Any, bytes], tuple[float, bytes]] = {}
        self._pending: set[tuple[Any, bytes]] = set()  # Allocate/Connect requests being served
        # RFC 6062: peer connections awaiting their ConnectionBind, by CONNECTION-ID.
        self.peer_connections: dict[int, PeerConnection] = {}
        self._unwatch: Callable[[], None] | None = None  # the router, once TCP allocations exist
        self._handlers: dict[tuple[Class, Method], Handler] = {
            (Class.REQUEST, Method.BINDING): self._binding,
            (Class.REQUEST, Method.REFRESH): self._refresh,
            (Class.REQUEST, Method.CREATE_PERMISSION): self._create_permission,
            (Class.REQUEST, Method.CHANNEL_BIND): self._channel_bind,
            (Class.REQUEST, Method.CONNECTION_BIND): self._connection_bind,
            (Class.INDICATION, Method.SEND): self._send_indication,
            (Class.INDICATION, Method.BINDING): _ignore,
        }
        # Requests served in a task: they wait for a socket (a bind, a connection to a peer).
        self._async_handlers: dict[Method, AsyncHandler] = {
            Method.ALLOCATE: self._allocate_steps,
            Method.CONNECT: self._connect,
        }

    @property
    def relay_ip(self) -> str:
        return self.addresses.relay_ip

    @property
    def relay_family(self) -> int:
        return self.addresses.family

    @property
    def bind_ip(self) -> str:
        return self.addresses.local_ip

    @bind_ip.setter
    def bind_ip(self, ip: str) -> None:
        """Where the listener's sockets bind (`Listener` knows it once its socket is bound)."""
        self.addresses.local_ip = ip

    @property
    def router(self) -> Router:
        return self.context.router

    # --- entry points ------------------------------------------------------------------------

    def handle(self, data: bytes, downstream: Downstream) -> None:
        """A STUN message (not ChannelData) from a client. Never raises on bad input."""
        self.stats.rx_packets += 1
        self.stats.rx_bytes += len(data)
        # Garbage costs no more than its first bytes: the two zero bits and the magic cookie,
        # and over UDP a bounded size (issue 15: a flood of random or oversized datagrams).
        if (
            len(data) < stun.HEADER_LENGTH
            or data[0] & 0xC0
            or data[4:8] != stun.COOKIE_BYTES
            or (not downstream.stream and len(data) > self.context.limits.max_udp_message)
        ):
            self.stats.dropped += 1
            return
        if self.context.authenticator.stun_only and (
            data[0] & 0x3E or (data[1] & 0xEF) != Method.BINDING  # the method bits: not Binding
        ):
            self._refuse_turn(data, downstream)
            return
        if data[:2] == stun.SEND_INDICATION_PREFIX:
            relay = stun.parse_send_indication(data)
            if relay is not None:  # the hot path; anything unusual takes the full parser below
                self._relay_send_indication(downstream, *relay)
                return
        if self.context.error_answers.exhausted(downstream.remote) and (
            downstream.remote not in self.allocations
        ):
            # A client without allocation over its error budget is not even parsed (issue
            # 15: a flood of requests from one source costs a dict lookup each).
            self.stats.rate_limited += 1
            return
        try:
            message = stun.parse_message(data, self.context.limits.max_attributes)
        except stun.UnknownMethodError as exc:
            if exc.message_class == Class.REQUEST and self._may_answer_error(downstream):
                header = bytes(data[:20])
                self._send(
                    downstream, stun.error_to_header(header, 400, "Bad Request: unknown method")
                )
            return
        except stun.StunError as exc:
            log.debug(
                "listener %s: dropped malformed packet from %s: %s",
                self.name,
                downstream.address,
                exc,
            )
            return
        if message.message_class not in (Class.REQUEST, Class.INDICATION):
            return  # responses are not ours to handle
        key = (downstream.remote, message.transaction_id)
        cached = self._responses.get(key)
        if cached is not None:
            self._send(downstream, cached[1])  # a retransmission: the same answer (RFC 8489 §6.3.1)
            return
        if key in self._pending:
            return  # the first copy is still being served (an Allocate binding its socket)
        exchange = Exchange(message, downstream)
        steps = self._async_handlers.get(message.method)
        if steps is not None and message.message_class == Class.REQUEST:
            if "MESSAGE-INTEGRITY" not in message.attributes:
                self._answer(exchange, RequestError(401))  # at once: no task for a stranger
                return
            self._pending.add(key)
            task = asyncio.get_running_loop().create_task(self._serve(exchange, steps))
            task.add_done_callback(lambda _: self._pending.discard(key))
            return
        handler = self._handlers.get((message.message_class, message.method))
        if handler is None:
            if message.message_class == Class.REQUEST:
                self._answer(exchange, RequestError(400, "Bad Request: unexpected method"))
            return
        try:
            self._check_attributes(message)
            response = handler(exchange)
        except RequestError as error:
            if message.message_class == Class.REQUEST:
                self._answer(exchange, error)
            return
        except Exception:  # a bug must not take the listener down
            log.exception("listener %s: error handling %s", self.name, message.method.name)
            if message.message_class == Class.REQUEST:
                self._answer(exchange, RequestError(500))
            return
        if response is not None:
            self._answer(exchange, response)

    @staticmethod
    def _check_attributes(message: Message) -> None:
        """RFC 8489 §6.3.1: a request with unknown comprehension-required attributes gets 420
        listing them; an indication with them is discarded."""
        if message.unknown_required:
            raise RequestError(420, attributes={"UNKNOWN-ATTRIBUTES": message.unknown_required})

    def handle_frame(self, data: bytes, downstream: Downstream) -> None:
        """One message from a client, of either kind: the first two bits tell ChannelData (0b01)
        from STUN (0b00), RFC 8656 §12. Every transport demultiplexes here, but TURN-UDP's hot
        path, which sends ChannelData straight to its allocation (transports.py)."""
        if stun.is_channel_data(data):
            self.handle_channel_data(data, downstream.remote)
        else:
            self.handle(data, downstream)

    def handle_channel_data(self, data: bytes, remote: Any) -> None:
        allocation = self.allocations.get(remote)
        if self.additional and allocation is not None and remote in self.additional:
            if int.from_bytes(data[:2], "big") not in allocation.channels:
                allocation = self.additional[remote]  # a channel to a peer of the other family
        if allocation is not None:
            allocation.relay_channel_data(data)
        else:
            self.stats.dropped += 1

    def connection_lost(self, remote: Any) -> None:
        """A stream client went away: its allocation goes with its connection (RFC 8656 §3.1)."""
        allocation = self.allocations.get(remote)
        if allocation is not None:
            self._delete(allocation)
        if remote in self._opening:
            self._opening[remote] = False

    def unauthorized_answer(self, data: bytes, remote: Any) -> bytes | None:
        """The answer to a stranger's unsigned Allocate over UDP (`stateless.unsigned_allocate`,
        within the budgets of `stateless.UnsignedBudget`), for the transport to send: a 401
        with a nonce bound to the client's address, built unparsed and without state (issue 28
        #6), what `handle` answers it with byte for byte, without its per-address error budget
        (the unsigned budgets bound it). None in STUN-only mode (`handle` answers 403 there)."""
        context = self.context
        if context.authenticator.stun_only:
            return None
        nonce = context.nonces.issue(nonce_binding(self.name, (remote[0], remote[1])))
        answer = unauthorized(data, context.realm, nonce)
        stats = self.stats
        stats.rx_packets += 1
        stats.rx_bytes += len(data)
        stats.tx_packets += 1
        stats.tx_bytes += len(answer)
        return answer

    def _refuse_turn(self, data: bytes, downstream: Downstream) -> None:
        """STUN-only mode: a request of any method but Binding gets 403 from its header alone,
        and any other message (an indication, ChannelData has no STUN header) is dropped; no
        parse, nonce, allocation or response-cache entry. The 403 spends the client's error
        budget (--error-rate) like any error answer; one past it is not sent (reason
        rate_limit), every other refusal counts as reason stun_only."""
        if len(data) != stun.HEADER_LENGTH + int.from_bytes(data[2:4], "big") or data[3] & 3:
            self.stats.dropped += 1  # not one STUN message: garbage, as parse_message says
            return
        if data[0] & 0x01 or data[1] & 0x10:  # the class bits: not a request
            self.stats.stun_only += 1
            return
        if not self._may_answer_error(downstream):
            return
        self.stats.stun_only += 1
        log.debug(
            "listener %s: method 0x%03x from %s: 403, STUN only",
            self.name,
            stun.method_bits(data),
            _fmt(downstream.address),
        )
        self._send(downstream, stun.error_to_header(bytes(data[:20]), 403, STUN_ONLY_REASON))

    # --- answering -----------------------------------------------------------------------------

    def _may_answer_error(self, downstream: Downstream) -> bool:
        """Error answers are rate-limited per client address (--error-rate; per address and
        port, as clients behind one NAT share the IP) and per process: past the limit the
        request is dropped unanswered, so a spoofed flood is not reflected."""
        if self.context.error_answers.allow(downstream.remote):
            return True
        self.stats.rate_limited += 1
        return False

    def _nonce_binding(self, downstream: Downstream) -> bytes:
        """What a nonce is bound to: this listener and the client's address and port, i.e. the
        5-tuple (issue 15: a captured request replayed from another port gets 438)."""
        return nonce_binding(self.name, downstream.address)

    def _answer(self, exchange: Exchange, outcome: Message | RequestError) -> None:
        request, downstream, key = exchange.request, exchange.downstream, exchange.key
        if isinstance(outcome, RequestError):
            if not self._may_answer_error(downstream):
                return
            log.log(
                logging.INFO if outcome.code >= 500 else logging.DEBUG,  # ours, not the client's
                "listener %s: %s from %s: %d %s",
                self.name,
                request.method.name,
                _fmt(downstream.address),
                outcome.code,
                outcome.reason,
            )
            response = _error_for(request.transaction_id, request.method, outcome)
            if outcome.code in (401, 438):
                response.attributes["REALM"] = self.context.realm
                nonces = self.context.nonces
                response.attributes["NONCE"] = nonces.issue(self._nonce_binding(downstream))
                key = None  # RFC 8489 §9.2.4: these are not integrity-protected
        else:
            response = outcome
        data = response.encode(integrity_key=key, fingerprint=True)
        if not (isinstance(outcome, RequestError) and outcome.code in (401, 438)):
            self._remember(downstream.remote, request.transaction_id, data)
        self._send(downstream, data)

    def _send(self, downstream: Downstream, data: bytes) -> None:
        downstream.send(data)
        self.stats.tx_packets += 1
        self.stats.tx_bytes += len(data)

    def _remember(self, remote: Any, transaction_id: bytes, data: bytes) -> None:
        if len(self._responses) >= RESPONSE_CACHE_MAX:
            self._responses.pop(next(iter(self._responses)))
        key = (remote, transaction_id)
        self._responses.pop(key, None)  # to the end: the cache stays in order of expiry
        self._responses[key] = (time.monotonic() + RESPONSE_CACHE_TTL, data)

    # --- authentication (RFC 8489 §9.2.4) --------------------------------------------------

    def _authenticate(self, exchange: Exchange, control: Downstream | None = None) -> str:
        """Return the username or raise the RFC's error; keeps the key to sign the answer.
        `control`: a ConnectionBind's, whose nonce may also be its control connection's (RFC
        6062 clients, coturn's among them, sign it with the nonce they already hold)."""
        request = exchange.request
        attrs = request.attributes
        # 1. No MESSAGE-INTEGRITY: 401 with REALM and NONCE.
        if "MESSAGE-INTEGRITY" not in attrs:
            raise RequestError(401)
        # 2. MESSAGE-INTEGRITY without USERNAME, REALM or NONCE: 400.
        username: str | None = attrs.get("USERNAME")
        if username is None or "REALM" not in attrs or "NONCE" not in attrs:
            raise RequestError(400, "Bad Request: missing USERNAME, REALM or NONCE")
        # 3. A NONCE that is no longer valid: 438 with a new one.
        nonces = self.context.nonces
        if not nonces.is_valid(attrs["NONCE"], self._nonce_binding(exchange.downstream)) and (
            control is None or not nonces.is_valid(attrs["NONCE"], self._nonce_binding(control))
        ):
            raise RequestError(438)
        # 4. An unknown username, or a wrong key: 401.
        key = self.context.authenticator.key_for(username)
        if key is None or attrs["REALM"] != self.context.realm:
            log.info(
                "listener %s: authentication failed for user %r: %s",
                self.name,
                username,
                self.context.authenticator.reason_for(username),
            )
            raise RequestError(401)
        if not request.check_integrity(key):
            log.info(
                "listener %s: authentication failed for user %r: bad message integrity",
                self.name,
                username,
            )
            raise RequestError(401)
        exchange.key = key
        return username

    def _allocation_of(self, exchange: Exchange) -> Allocation:
        """Authenticate a request on an existing allocation (RFC 8656 §5)."""
        username = self._authenticate(exchange)
        allocation = self.allocations.get(exchange.downstream.remote)
        if allocation is None:
            raise RequestError(437)
        if username != allocation.username:
            raise RequestError(441)
        return allocation

    # --- handlers --------------------------------------------------------------------------

    def _binding(self, exchange: Exchange) -> Message:
        """RFC 8489 §7.3.1: Binding is answered on every listener, without authentication."""
        response = _response_to(exchange.request)
        response.attributes["XOR-MAPPED-ADDRESS"] = exchange.downstream.address
        return response

    async def _serve(self, exchange: Exchange, steps: AsyncHandler) -> None:
        try:
            self._check_attributes(exchange.request)
            response = await steps(exchange)
        except RequestError as error:
            self._answer(exchange, error)
            return
        except Exception:
            log.exception("listener %s: error handling %s", self.name, exchange.request.method.name)
            self._answer(exchange, RequestError(500))
            return
        self._answer(exchange, response)

    async def _allocate_steps(self, exchange: Exchange) -> Message:
        """RFC 8656 §7.2, step by step."""
        request, downstream = exchange.request, exchange.downstream
        attrs = request.attributes
        # 1. The request must be authenticated.
        username = self._authenticate(exchange)
        # 2. The 5-tuple must not have an allocation already (a retransmission of the request
        #    that created it was answered from the response cache).
        if downstream.remote in self.allocations:
            raise RequestError(437)
        # 3. REQUESTED-TRANSPORT: present, and UDP, or TCP over a TURN-TCP/TLS connection
        #    (RFC 6062 §5.1; a UDP or DTLS listener answers 442, as coturn does).
        transport = attrs.get("REQUESTED-TRANSPORT")
        if transport is None:
            raise RequestError(400, "Bad Request: missing REQUESTED-TRANSPORT")
        if transport == TRANSPORT_TCP and downstream.splice is not None:
            if any(a in attrs for a in _NOT_WITH_TCP):
                raise RequestError(400, "Bad Request: not with a TCP allocation")
            if not self.router.routes_protocol(self.name, "TCP"):
                raise RequestError(403, "Forbidden: the listener routes to no TCP cluster")
            return await self._allocate_relay(exchange, username, None, tcp=True)
        if transport != TRANSPORT_UDP:
            raise RequestError(442)
        # 4. DONT-FRAGMENT is accepted: relayed datagrams are sent as they are.
        # 5. RESERVATION-TOKEN: the port an earlier EVEN-PORT with the R bit reserved.
        reserved: socket.socket | None = None
        token = attrs.get("RESERVATION-TOKEN")
        if token is not None:
            if any(a in attrs for a in ("EVEN-PORT", *_FAMILY_ATTRIBUTES)):
                raise RequestError(400, "Bad Request: RESERVATION-TOKEN with EVEN-PORT or family")
            reserved = await self.context.reservations.claim(token)
            if reserved is None:
                raise RequestError(508, "Insufficient Capacity: unknown or expired token")
        try:
            return await self._allocate_relay(exchange, username, reserved)
        finally:
            if reserved is not None:
                reserved.close()  # the relay transport took a duplicate, if it got that far

    async def _allocate_relay(
        self, exchange: Exchange, username: str, reserved: socket.socket | None, tcp: bool = False
    ) -> Message:
        """RFC 8656 §7.2 from step 6 on: families, quota, lifetime, the relay socket."""
        request, downstream = exchange.request, exchange.downstream
        attrs = request.attributes
        # 6./7. Address families (relay_addresses): the requested one, or both.
        families, extra = self._families(attrs, reserved)
        family = families[0]
        # 8. Quota (admin.user_quota): 486 once the user has that many allocations. 508 while
        #    draining (RFC 8656 §7.2: the client may try another server, which is what a
        #    terminating pod wants), past --max-allocations, or past the source's rate.
        if not self.context.new_allocations.allow(downstream.address[0]):
            self.stats.count_refusal("rate")
            raise RequestError(508, "Insufficient Capacity: too many allocations from this address")
        user_id = self.context.authenticator.user_id(username)
        # 8a. Revoked (auth.revoked_users, ours): 403, an administrative refusal (RFC 8489
        #     §14.8: valid credentials, a request that cannot be performed), not 401 (which
        #     asks the client for other credentials: these are fine, their user is not).
        if user_id in self.context.revoked_users:
            self.stats.count_refusal("revoked")
            raise RequestError(403, "Forbidden: this user's access is revoked")
        # 8b. Strict expiry (auth.strict_expiry, ours): no longer than the credential lasts.
        credential_left = self._credential_left(username)
        users = self.context.users
        if downstream.stream:
            self._opening[downstream.remote] = True
        try:
            refusal = await users.acquire(user_id, self.context.user_quota)
            if refusal != GRANTED:
                self.stats.count_refusal(refusal)
                raise RequestError(*_REFUSALS.get(refusal, (486, None)))
            # 9. The lifetime: at least the default, at most the maximum.
            lifetime = _allocation_lifetime(attrs.get("LIFETIME", DEFAULT_ALLOCATION_LIFETIME))
            if credential_left is not None:
                lifetime = max(1, min(lifetime, int(credential_left)))
            # 10. The relay socket.
            allocation = Allocation(self.scope, downstream, username, user_id, family, lifetime)
            if credential_left is not None:
                allocation.cap_expiry(time.monotonic() + credential_left)
            # EVEN-PORT (RFC 8656 §14.6): an even port; with the R bit, the next one is reserved.
            even_port = attrs.get("EVEN-PORT")
            # The native engine serves a single relay of either family (its client's packets
            # are only its own); a dual allocation is served here.
            native = len(families) == 1
            try:
                if tcp:
                    await self._open_tcp_relay(allocation)
                    token = None
                else:
                    token = await self._bind_relay(allocation, reserved, even_port, native)
            except RequestError:
                users.release(user_id)
                raise
            second = await self._bind_additional(allocation, families, lifetime, extra)
        finally:
            connected = self._opening.pop(downstream.remote, True)
        if not connected or downstream.remote in self.allocations:
            # The client's connection closed meanwhile (its allocation would outlive it, and
            # hold its quota, until it expired), or a concurrent Allocate won the race.
            users.release(user_id)
            allocation.close()
            if second is not None:
                second.close()
            if not connected:
                log.info(
                    "listener %s: allocation for %s undone: its connection closed while it "
                    "was being made",
                    self.name,
                    _fmt(downstream.address),
                )
                raise RequestError(508, "Insufficient Capacity: the connection closed")
            raise RequestError(437)
        self.allocations[downstream.remote] = allocation
        if second is not None:
            self.additional[downstream.remote] = second
        self._limit_bandwidth(allocation)
        if not tcp:  # a UDP relay port: never a peer (router.py); a TCP one: see tcp_relay.py
            self.router.relay_ports[allocation.relayed_address[1]] = 1
        relayed: Any = allocation.relayed_address
        if second is not None:
            self.router.relay_ports[second.relayed_address[1]] = 1
            relayed = stun.Repeated((relayed, second.relayed_address))
        self.stats.allocations_total += 1
        log.info(
            "listener %s: %sallocation created for %s: relay %s:%d, user %r, lifetime %ds",
            self.name,
            "TCP " if tcp else "",
            _fmt(downstream.address),
            *allocation.relayed_address,
            username,
            lifetime,
        )
        response = _response_to(request)
        response.attributes["XOR-RELAYED-ADDRESS"] = relayed
        response.attributes.update(extra)
        if token is not None:
            response.attributes["RESERVATION-TOKEN"] = token
        response.attributes["LIFETIME"] = lifetime
        response.attributes["XOR-MAPPED-ADDRESS"] = downstream.address
        return response

    def _families(
        self, attrs: dict[str, Any], reserved: socket.socket | None
    ) -> tuple[list[int], dict[str, Any]]:
        """RFC 8656 §7.2 steps 6-7: the families to allocate in (the first rules the
        allocation), and a dual request's ADDRESS-ERROR-CODE for a family not relayed here;
        400 for a malformed request, 440 when no family asked for is relayed here."""
        offered = self.addresses.offered(self.context.relay_address_family)
        additional = attrs.get("ADDITIONAL-ADDRESS-FAMILY")
        if reserved is not None:
            families = [FAMILY_IPV6 if reserved.family == socket.AF_INET6 else FAMILY_IPV4]
        elif additional is not None:
            if "REQUESTED-ADDRESS-FAMILY" in attrs or additional != FAMILY_IPV6:
                raise RequestError(400, "Bad Request: invalid ADDITIONAL-ADDRESS-FAMILY")
            families = [f for f in (FAMILY_IPV4, FAMILY_IPV6) if f in offered]
            reason = stun.ERROR_REASONS[440]
            if len(families) == 2 and not isinstance(self.scope.relay_path, AsyncioRelayPath):
                # The native engine holds one relay per client: a dual allocation would lose
                # the second family's Send indications there. Its own family only.
                families = [self.relay_family]
                reason = f"{reason}: no dual allocation on the native engine"
            if len(families) == 1:  # one of the two: say why the other is missing
                missing = FAMILY_IPV6 if families[0] == FAMILY_IPV4 else FAMILY_IPV4
                return families, {"ADDRESS-ERROR-CODE": (missing, 440, reason)}
        else:
            choice = self.context.relay_address_family
            families = [attrs.get("REQUESTED-ADDRESS-FAMILY", default_family(choice, offered))]
        if not families or any(f not in offered for f in families):
            raise RequestError(440)
        return families, {}

    async def _bind_additional(
        self, allocation: Allocation, families: list[int], lifetime: int, extra: dict[str, Any]
    ) -> Allocation | None:
        """A dual allocation's relay in its second family, on the Python path; when its socket
        cannot be had, the allocation is made without it and ADDRESS-ERROR-CODE says 508."""
        if len(families) < 2:
            return None
        downstream = allocation.downstream
        second = Allocation(
            self.scope, downstream, allocation.username, allocation.user_id, families[1], lifetime
        )
        try:
            await self._bind_relay(second, None, None, native=False)
        except RequestError as error:
            extra["ADDRESS-ERROR-CODE"] = (families[1], 508, error.reason)
            return None
        return second

    def _families_of(self, allocation: Allocation) -> tuple[int, ...]:
        second = self.additional.get(allocation.downstream.remote)
        return (allocation.family,) if second is None else (allocation.family, second.family)

    def _by_family(self, allocation: Allocation, ip: str) -> Allocation:
        """The part of a (dual) allocation that relays to peers of `ip`'s family."""
        if allocation.family != address_family(ip):
            return self.additional.get(allocation.downstream.remote, allocation)
        return allocation

    async def _bind_relay(
        self,
        allocation: Allocation,
        reserved: socket.socket | None,
        even_port: bool | None,
        native: bool = True,
    ) -> bytes | None:
        """Open the allocation's relay socket: the reserved one, an even port (and, with the R
        bit, the next port reserved under the token returned), or any port. 508 if none."""
        if reserved is not None:
            await self._open_relay(allocation, reserved.dup(), native)
            return None
        try:
            sock, following = self.addresses.udp_socket(allocation.family, even_port)
        except NoRelaySocket as exc:
            raise RequestError(508, f"Insufficient Capacity: {exc}") from None
        token = None
        if following is not None:
            token = secrets.token_bytes(8)
            await self.context.reservations.reserve(token, following)
        await self._open_relay(allocation, sock, native)
        return token

    async def _open_relay(
        self, allocation: Allocation, sock: socket.socket, native: bool = True
    ) -> None:
        """Serve a bound relay socket on the listener's relay path (which takes it over), or
        on the Python path (`native` False: a relay the native engine does not serve)."""
        allocation.relayed_address = (
            self.addresses.told(allocation.family) or "",
            sock.getsockname()[1],
        )
        path = self.scope.relay_path if native else _PYTHON_RELAY_PATH
        try:
            allocation.relay = await path.open(allocation, sock)
        except OSError as exc:
            sock.close()
            raise RequestError(508, f"Insufficient Capacity: no relay socket: {exc}") from None

    def _credential_left(self, username: str) -> float | None:
        """With auth.strict_expiry and ephemeral credentials: the seconds `username`'s timestamp
        has left (an expired one was refused with 401 by the authentication), else None."""
        if not self.context.strict_expiry:
            return None
        expiry = self.context.authenticator.expiry_of(username)
        return None if expiry is None else max(0.0, expiry - time.time())

    async def _open_tcp_relay(self, allocation: Allocation) -> None:
        """A TCP allocation's relayed address: a listening socket (`tcp_relay.TcpRelay`)."""
        limits = self.context.limits
        relay = TcpRelay(
            allocation,
            self.scope,
            self.peer_connections,
            limits.max_peer_connections,
            limits.peer_connection_timeout,
            limits.stream_high_water,
        )
        try:
            port = await relay.open(self.addresses.bind_address(allocation.family))
        except OSError as exc:
            raise RequestError(508, f"Insufficient Capacity: no relay socket: {exc}") from None
        allocation.relayed_address = (self.addresses.told(allocation.family) or self.relay_ip, port)
        allocation.relay = relay
        if self._unwatch is None:  # a route change re-judges every peer connection
            self._unwatch = self.router.watch(self._recheck_peer_connections)

    def _recheck_peer_connections(self) -> None:
        for allocation in self.allocations.values():
            if isinstance(allocation.relay, TcpRelay):
                allocation.relay.recheck()

    async def _connect(self, exchange: Exchange) -> Message:
        """RFC 6062 §5.2: a connection from the relayed address to a peer a routed TCP cluster
        admits; answered with its CONNECTION-ID once made (447 when it cannot be)."""
        request = exchange.request
        allocation = self._allocation_of(exchange)
        relay = allocation.relay
        if not isinstance(relay, TcpRelay):
            raise RequestError(400, "Bad Request: not a TCP allocation")
        peer = request.attributes.get("XOR-PEER-ADDRESS")
        if peer is None:
            raise RequestError(400, "Bad Request: missing XOR-PEER-ADDRESS")
        peer = (canonical_peer_ip(peer[0]), peer[1])  # ::ffff:10.0.0.1 is 10.0.0.1
        if address_family(peer[0]) != allocation.family:
            raise RequestError(443)
        cluster = self.router.cluster_of(self.name, peer[0], peer[1], "TCP")
        if cluster is None:
            self._log_refusal("connect", allocation, peer[0], peer[1], "TCP")
            raise RequestError(403)
        if relay.busy_with(peer):
            raise RequestError(446)
        if relay.full():
            raise RequestError(508, "Insufficient Capacity: too many peer connections")
        connection_id = await relay.connect(peer, cluster)
        if connection_id is None:
            raise RequestError(447)
        allocation.permit(peer[0], time.monotonic() + PERMISSION_LIFETIME)
        response = _response_to(request)
        response.attributes["CONNECTION-ID"] = connection_id
        return response

    def _connection_bind(self, exchange: Exchange) -> Message:
        """RFC 6062 §5.4: a new connection becomes the data connection of a peer connection."""
        request, downstream = exchange.request, exchange.downstream
        if downstream.splice is None or downstream.remote in self.allocations:
            raise RequestError(400, "Bad Request: ConnectionBind on a TURN-TCP/TLS data connection")
        connection_id = request.attributes.get("CONNECTION-ID")
        if connection_id is None:
            raise RequestError(400, "Bad Request: missing CONNECTION-ID")
        connection = self.peer_connections.get(connection_id)
        if connection is None:
            raise RequestError(400, "Bad Request: unknown CONNECTION-ID")
        username = self._authenticate(exchange, connection.relay.allocation.downstream)
        if username != connection.relay.allocation.username:
            raise RequestError(441)
        del self.peer_connections[connection_id]
        downstream.splice(connection)
        log.info(
            "listener %s: data connection %s bound to peer %s",
            self.name,
            _fmt(downstream.address),
            _fmt(connection.peer),
        )
        return _response_to(request)

    def _log_refusal(
        self, what: str, allocation: Allocation, ip: str, port: int | None, protocol: str
    ) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        # The explanation is computed only here, on a logged refusal (issue 23).
        why = self.router.explain(self.name, ip, port, protocol)
        log.info(
            "%s denied on listener %s for client %s to peer %s: %s: %s%s",
            what,
            self.name,
            _fmt(allocation.downstream.address),
            ip if port is None else _fmt((ip, port)),
            why.code,
            why.reason,
            f" (allowed by: {why.allow})" if why.allow else "",
        )

    def _refresh(self, exchange: Exchange) -> Message:
        """RFC 8656 §7.3."""
        request, downstream = exchange.request, exchange.downstream
        allocation = self._allocation_of(exchange)
        family = request.attributes.get("REQUESTED-ADDRESS-FAMILY")
        if family is not None and family not in self._families_of(allocation):
            raise RequestError(443)
        requested = request.attributes.get("LIFETIME", DEFAULT_ALLOCATION_LIFETIME)
        # RFC 8656 §7.3: 0 deletes; below the default, the default; above the maximum, that.
        lifetime = 0 if requested == 0 else _allocation_lifetime(requested)
        if lifetime == 0:
            self._delete(allocation)
            log.info("listener %s: allocation deleted by %s", self.name, _fmt(downstream.address))
        else:
            allocation.refresh(lifetime)
            second = self.additional.get(allocation.downstream.remote)
            if second is not None:
                second.refresh(lifetime)
            if allocation.hard_expiry < math.inf:  # strict expiry: as long as it has left
                lifetime = max(1, int(allocation.expires_at - time.monotonic()))
        response = _response_to(request)
        response.attributes["LIFETIME"] = lifetime
        return response

    def _peer_addresses(self, request: Message, allocation: Allocation) -> list[Address]:
        peers = [value for name, value in request.attribute_list if name == "XOR-PEER-ADDRESS"]
        if not peers:
            raise RequestError(400, "Bad Request: missing XOR-PEER-ADDRESS")
        if len(peers) > self.context.limits.max_peers_per_request:
            raise RequestError(508, "Insufficient Capacity: too many XOR-PEER-ADDRESS")
        # An IPv4-mapped or IPv4-compatible peer is the IPv4 peer it carries, before any
        # check: it is judged, permitted and relayed to as that address (so a route's refusal
        # of 10.0.0.1 holds for ::ffff:10.0.0.1), and its family is IPv4 (RFC 8656 §10.2,
        # §12.2: the peer's family must be the allocation's, else 443).
        peers = [(canonical_peer_ip(ip), port) for ip, port in peers]
        families = self._families_of(allocation)
        for ip, _ in peers:
            if address_family(ip) not in families:
                raise RequestError(443)
        protocol = "TCP" if isinstance(allocation.relay, TcpRelay) else "UDP"
        for ip, _ in peers:
            if not self.router.permits(self.name, ip, protocol):
                self._log_refusal("permission", allocation, ip, None, protocol)
                raise RequestError(403)
        return peers

    def _create_permission(self, exchange: Exchange) -> Message:
        """RFC 8656 §10.2: all peers are admitted, or none."""
        request = exchange.request
        allocation = self._allocation_of(exchange)
        expiry = time.monotonic() + PERMISSION_LIFETIME
        peers = self._peer_addresses(request, allocation)
        new = {ip for ip, _ in peers if ip not in self._by_family(allocation, ip).permissions}
        held = len(allocation.permissions)
        second = self.additional.get(allocation.downstream.remote)
        if second is not None:
            held += len(second.permissions)
        if held + len(new) > self.context.limits.max_permissions:
            raise RequestError(508, "Insufficient Capacity: too many permissions")
        for ip, _ in peers:
            self._by_family(allocation, ip).permit(ip, expiry)
        return _response_to(request)

    def _channel_bind(self, exchange: Exchange) -> Message:
        """RFC 8656 §12.2."""
        request = exchange.request
        allocation = self._allocation_of(exchange)
        if isinstance(allocation.relay, TcpRelay):
            raise RequestError(400, "Bad Request: no channels on a TCP allocation")  # RFC 6062 §4
        channel = request.attributes.get("CHANNEL-NUMBER")
        if channel is None or not stun.is_valid_channel_number(channel):
            raise RequestError(400, "Bad Request: missing or invalid CHANNEL-NUMBER")
        ip, port = peer = self._peer_addresses(request, allocation)[0]
        if not self.router.admits(self.name, ip, port):
            # The address is permitted but not this port: every packet would be dropped.
            if not log.isEnabledFor(logging.INFO):
                raise RequestError(403, "Forbidden: peer port not admitted")
            why = self.router.explain(self.name, ip, port)
            log.info(
                "channel bind denied on listener %s for client %s to peer %s: %s: %s%s",
                self.name,
                _fmt(allocation.downstream.address),
                _fmt(peer),
                why.code,
                why.reason,
                f" (allowed by: {why.allow})" if why.allow else "",
            )
            raise RequestError(403, "Forbidden: peer port not admitted")
        other = self.additional.get(allocation.downstream.remote)
        if other is not None:  # a dual allocation: the channel is unique across both families
            target = self._by_family(allocation, ip)
            other = allocation if target is other else other
            if channel in other.channels:
                raise RequestError(400, "Bad Request: channel bound to another peer")
            allocation = target
        limits = self.context.limits
        if channel not in allocation.channels and len(allocation.channels) >= limits.max_channels:
            raise RequestError(508, "Insufficient Capacity: too many channels")
        if ip not in allocation.permissions and len(allocation.permissions) >= (
            limits.max_permissions
        ):
            raise RequestError(508, "Insufficient Capacity: too many permissions")
        bound = allocation.channels.get(channel)
        if bound is not None and bound[0] != peer:
            raise RequestError(400, "Bad Request: channel bound to another peer")
        if allocation.channel_by_peer.get(peer, channel) != channel:
            raise RequestError(400, "Bad Request: peer bound to another channel")
        now = time.monotonic()
        allocation.bind(channel, peer, now + CHANNEL_LIFETIME)
        allocation.permit(ip, now + PERMISSION_LIFETIME)  # a binding refreshes it
        return _response_to(request)

    def _send_indication(self, exchange: Exchange) -> None:
        """RFC 8656 §11.2: relay DATA to XOR-PEER-ADDRESS; anything amiss is discarded."""
        request = exchange.request
        peer = request.attributes.get("XOR-PEER-ADDRESS")
        data = request.attributes.get("DATA")
        if peer is None or data is None:
            self.stats.dropped += 1
            return None
        self._relay_send_indication(exchange.downstream, peer, data)
        return None

    def _relay_send_indication(self, downstream: Downstream, peer: Address, data: bytes) -> None:
        allocation = self.allocations.get(downstream.remote)
        if allocation is None:
            self.stats.dropped += 1
            return
        if "." in peer[0] and ":" in peer[0]:  # ::ffff:a.b.c.d: as its permission was made
            peer = (canonical_peer_ip(peer[0]), peer[1])
        if self.additional:
            allocation = self._by_family(allocation, peer[0])
        allocation.relay_to_peer(peer, data)

    # --- housekeeping ------------------------------------------------------------------------

    def _limit_bandwidth(self, allocation: Allocation) -> None:
        """auth.allocation_bandwidth_limit on `allocation` (a dual one's second relay shares its
        cap): each relay path enforces it (the native engine told through the mirror)."""
        allocation.limit_bandwidth(self.context.allocation_bandwidth_limit)
        second = self.additional.get(allocation.downstream.remote)
        if second is not None:
            second.cap = allocation.cap

    def enforce_auth(self) -> None:
        """After a config change: end the allocations of revoked users (auth.revoked_users),
        with auth.strict_expiry hold the others to their credential's expiry, and cap them at
        auth.allocation_bandwidth_limit (in place)."""
        now, wall = time.monotonic(), time.time()
        for allocation in list(self.allocations.values()):
            if allocation.user_id in self.context.revoked_users:
                self.end(allocation, "its user is revoked (auth.revoked_users)")
                continue
            self._limit_bandwidth(allocation)
            expiry = self.context.authenticator.expiry_of(allocation.username)
            if self.context.strict_expiry and expiry is not None:
                allocation.cap_expiry(now + max(0.0, expiry - wall))
                if allocation.mirror is not None:
                    allocation.mirror.refreshed(allocation.expires_at)

    def end(self, allocation: Allocation, why: str) -> None:
        """End `allocation` now (stunnerd.process.sessions: the operator or a revocation says
        so): its relay socket closes, and later requests on its 5-tuple get 437."""
        log.info(
            "listener %s: allocation %s of %s ended: %s",
            self.name,
            allocation.id,
            _fmt(allocation.downstream.address),
            why,
        )
        self._delete(allocation)

    def _delete(self, allocation: Allocation) -> None:
        if self.allocations.get(allocation.downstream.remote) is allocation:
            del self.allocations[allocation.downstream.remote]
            self.context.users.release(allocation.user_id)
            if not isinstance(allocation.relay, TcpRelay):
                self.router.relay_ports[allocation.relayed_address[1]] = 0
            second = self.additional.pop(allocation.downstream.remote, None)
            if second is not None:
                self.router.relay_ports[second.relayed_address[1]] = 0
                second.close()
        allocation.close()

    def sweep(self) -> None:
        """Expire allocations, permissions, channels and cached responses (run every second)."""
        now = time.monotonic()
        for allocation in list(self.allocations.values()):
            if allocation.expire(now):
                log.info(
                    "listener %s: allocation of %s expired",
                    self.name,
                    _fmt(allocation.downstream.address),
                )
                self._delete(allocation)
        for second in self.additional.values():
            second.expire(now)  # its permissions and channels; its life is the first's
        responses = self._responses  # in the order cached, so of expiry (one TTL for all)
        while responses:
            key = next(iter(responses))
            if responses[key][0] > now:
                break
            del responses[key]
        self.context.reservations.sweep()

    def close(self) -> None:
        for allocation in list(self.allocations.values()):
            self._delete(allocation)
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        self._responses.clear()


_FAMILY_ATTRIBUTES = ("REQUESTED-ADDRESS-FAMILY", "ADDITIONAL-ADDRESS-FAMILY")
# RFC 6062 §5.1: a TCP allocation has no even port, reservation or fragmentation flag; and one
# relayed address (REQUESTED-ADDRESS-FAMILY chooses its family; a dual one is not offered).
_NOT_WITH_TCP = ("EVEN-PORT", "RESERVATION-TOKEN", "DONT-FRAGMENT", "ADDITIONAL-ADDRESS-FAMILY")
_PYTHON_RELAY_PATH = AsyncioRelayPath()

_REFUSALS: dict[str, tuple[int, str | None]] = {
    DRAINING: (508, "Insufficient Capacity: this server is shutting down, try another"),
    FULL: (508, "Insufficient Capacity: allocation limit reached"),
}


def _allocation_lifetime(requested: int) -> int:
    """At least the default, at most the maximum (RFC 8656 §7.2 step 9, §7.3)."""
    return max(DEFAULT_ALLOCATION_LIFETIME, min(requested, MAX_ALLOCATION_LIFETIME))


def _ignore(exchange: Exchange) -> None:
    return None  # a Binding indication is a keepalive (RFC 8489 §6.3.2)


def _response_to(request: Message) -> Message:
    return Message(request.method, Class.SUCCESS, request.transaction_id)


def _error_for(transaction_id: bytes, method: Method, error: RequestError) -> Message:
    response = Message(method, Class.ERROR, transaction_id)
    response.attributes["ERROR-CODE"] = (error.code, error.reason)
    response.attributes.update(error.attributes)
    return response


def _fmt(address: Address) -> str:
    ip, port = address
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
