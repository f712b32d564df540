"""The TURN-DTLS transport (certificates: `certificates.py`).

TURN-DTLS is `DtlsListenerProtocol`: one UDP socket, one pyOpenSSL `Connection` with memory BIOs
per client address, and the same TURN demultiplexing as TURN-UDP. A client gets a session only
after it echoed a stateless cookie (RFC 6347 §4.2.1 HelloVerifyRequest), so a spoofed source
cannot make the server keep state or do public-key work.

A stranger's datagram is judged on its bytes and source alone (`_stranger`, as stateless.py
judges a stranger's unsigned STUN): only a whole epoch-0 ClientHello (`client_hello_cookie`),
within its source IP's budget (--unauthenticated-rate, as unsigned STUN over UDP spends it),
goes on. If its cookie verifies it starts a session in OpenSSL; else, within the listener's
budget for all sources (--unauthenticated-rate-total's share) and never while the socket is
behind (it is read in batches, transports.read_batch), it gets a HelloVerifyRequest built here
(`hello_verify_request`: what OpenSSL's DTLSv1_listen writes, byte for byte, at a third of its
cost), without state. A cookieless ClientHello flood from one source, or from many spoofed
ones, so costs a budget lookup or an HMAC per datagram, and a client that echoed its cookie
gets a socket of its own (`pins`), so the rest of its handshake does not queue behind the
flood (before: 0 of 3 honest handshakes under one source's flood, coturn 4 of 4).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import struct
import time
from typing import Any, Protocol, cast

from OpenSSL import SSL

from ..turn.allocation import Downstream, canonical_address
from ..turn.server import TurnServer
from ..turn.stateless import STRANGER_IPS, UnsignedBudget
from .certificates import load_certificate

log = logging.getLogger("stunner.listener")

DTLS1_2_VERSION = 0xFEFD  # pyOpenSSL has no constant for it
HANDSHAKE_TIMEOUT = 10.0  # a DTLS handshake not done by then is freed
IDLE_TIMEOUT = 3600.0  # an established DTLS session with no traffic for this long is closed
COOKIE_LIFETIME = 60  # seconds per cookie secret bucket; the previous bucket is still valid
MAX_DATAGRAM = 1400  # handshake flights are packed into datagrams of at most this many bytes
RECORD_HEADER = 13  # DTLS record: type, version, epoch, sequence number (6), length


# ---- DTLS


class Pinner(Protocol):
    """A socket of its own for a client address (transports.ClientPins)."""

    def pin(self, addr: Any) -> None: ...


class CookieJar:
    """Stateless DTLS cookies: HMAC(secret, client address, time bucket)."""

    def __init__(self, lifetime: int = COOKIE_LIFETIME) -> None:
        self.secret = secrets.token_bytes(32)
        self.lifetime = lifetime

    def make(self, remote: Any, bucket: int | None = None) -> bytes:
        if bucket is None:
            bucket = int(time.time()) // self.lifetime
        message = f"{remote[0]}|{remote[1]}|{bucket}".encode()
        return hmac.new(self.secret, message, hashlib.sha256).digest()[:20]

    def check(self, remote: Any, cookie: bytes) -> bool:
        bucket = int(time.time()) // self.lifetime
        return any(hmac.compare_digest(self.make(remote, b), cookie) for b in (bucket, bucket - 1))


def dtls_context(cert_b64: str, key_b64: str, cookies: CookieJar) -> SSL.Context:
    """A DTLS >= 1.2 server context whose cookies are bound to the client address, kept as
    each connection's app data (memory BIOs do not know it)."""
    chain, key = load_certificate(cert_b64, key_b64)
    context = SSL.Context(SSL.DTLS_METHOD)
    context.set_min_proto_version(DTLS1_2_VERSION)
    context.set_options(SSL.OP_NO_QUERY_MTU)
    context.use_certificate(chain[0])
    for extra in chain[1:]:
        context.add_extra_chain_cert(extra)
    context.use_privatekey(key)
    context.set_cookie_generate_callback(lambda conn: cookies.make(conn.get_app_data()))
    context.set_cookie_verify_callback(
        lambda conn, cookie: cookies.check(conn.get_app_data(), cookie)
    )
    return context


def split_records(data: bytes, limit: int = MAX_DATAGRAM) -> list[bytes]:
    """Pack the DTLS records a memory BIO gives back to back into datagrams of <= `limit`."""
    datagrams: list[bytes] = []
    current = b""
    offset = 0
    while offset < len(data):
        if len(data) - offset < RECORD_HEADER:
            end = len(data)
        else:
            (length,) = struct.unpack_from("!H", data, offset + 11)
            end = min(len(data), offset + RECORD_HEADER + length)
        record = data[offset:end]
        offset = end
        if current and len(current) + len(record) > limit:
            datagrams.append(current)
            current = b""
        current += record
    if current:
        datagrams.append(current)
    return datagrams


def client_hello_random(data: bytes) -> bytes | None:
    """The client random of a datagram that starts with an epoch-0 ClientHello, else None.

    Record header (13 bytes), handshake header (12), client_version (2), random (32).
    """
    if len(data) < 59 or data[0] != 22 or data[3:5] != b"\0\0" or data[13] != 1:
        return None
    return data[27:59]


def hello_verify_request(hello: bytes, cookie: bytes) -> bytes:
    """The HelloVerifyRequest to the epoch-0 ClientHello `hello` (RFC 6347 §4.2.1), as OpenSSL's
    DTLSv1_listen writes it: record and server version DTLS 1.0, the ClientHello's record
    sequence number, message_seq 0, one fragment."""
    body = b"\xfe\xff" + bytes((len(cookie),)) + cookie
    length = len(body).to_bytes(3, "big")
    message = b"\x03" + length + b"\0\0\0\0\0" + length + body
    return b"\x16\xfe\xff" + hello[3:11] + len(message).to_bytes(2, "big") + message


def client_hello_cookie(data: bytes) -> bytes | None:
    """The cookie (b"" for none) of a datagram that starts with a whole, unfragmented epoch-0
    ClientHello, else None. After the random: session_id (1-byte length), cookie (the same)."""
    # handshake header: type (13), length (14-16), message_seq, fragment offset (19-21) and
    # length (22-24): a whole message is one fragment at offset 0 (OpenSSL takes no other)
    if client_hello_random(data) is None or data[19:22] != b"\0\0\0" or data[14:17] != data[22:25]:
        return None
    offset = 60 + data[59] if len(data) > 59 else len(data)
    if offset >= len(data):
        return None
    cookie = data[offset + 1 : offset + 1 + data[offset]]
    return cookie if len(cookie) == data[offset] else None


class DtlsSession:
    """One client's DTLS connection: handshake, retransmission, records in and out."""

    def __init__(
        self, protocol: DtlsListenerProtocol, remote: Any, conn: SSL.Connection, hello: bytes
    ) -> None:
        self.protocol = protocol
        self.remote = remote
        self.conn = conn
        self.hello_random = client_hello_random(hello)
        self.established = False
        self.pending = True  # counted in the listener's pending handshakes until established
        self.source = canonical_address(remote)[0]
        self.closed = False
        self.created = self.last_seen = time.monotonic()
        self.downstream = Downstream(remote, self.send, stream=False)
        self.timer: asyncio.TimerHandle | None = None

    def flush(self) -> None:
        transport = self.protocol.transport
        try:
            data = self.conn.bio_read(65536)
        except SSL.WantReadError:
            return
        if transport is not None:
            for datagram in split_records(data):
                transport.sendto(datagram, self.remote)

    def send(self, data: bytes) -> None:
        """Downstream send: one TURN message or ChannelData per DTLS record."""
        if not self.established or self.closed:
            return
        try:
            self.conn.send(data)
        except SSL.Error as exc:
            log.debug("listener %s: DTLS send to %s: %s", self.protocol.name, self.remote, exc)
            self.protocol.close_session(self)
            return
        self.flush()

    def handshake(self) -> None:
        try:
            self.conn.do_handshake()
        except SSL.WantReadError:
            self.flush()
            self._schedule_retransmit()
            return
        self.flush()
        self.established = True
        self.protocol.handshake_over(self)
        self._cancel_timer()
        log.debug("listener %s: DTLS session with %s established", self.protocol.name, self.remote)

    def _schedule_retransmit(self) -> None:
        self._cancel_timer()
        delay = self.conn.DTLSv1_get_timeout()
        if delay is not None:
            loop = asyncio.get_running_loop()
            self.timer = loop.call_later(max(delay, 0.0), self._retransmit)

    def _retransmit(self) -> None:
        self.timer = None
        if self.closed or self.established:
            return
        try:
            self.conn.DTLSv1_handle_timeout()
        except SSL.Error:
            self.protocol.close_session(self)
            return
        self.flush()
        self._schedule_retransmit()

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def received(self, data: bytes) -> None:
        self.last_seen = time.monotonic()
        self.conn.bio_write(data)
        if not self.established:
            self.handshake()
            if not self.established:
                return
        server = self.protocol.server
        while not self.closed:
            try:
                message = self.conn.recv(65536)
            except SSL.WantReadError:
                break
            except SSL.ZeroReturnError:  # close_notify
                self.protocol.close_session(self)
                return
            if not message:
                break
            server.handle_frame(message, self.downstream)
        self.flush()  # alerts, renegotiation refusal

    def close(self, notify: bool = True) -> None:
        if self.closed:
            return
        self.closed = True
        self._cancel_timer()
        if notify and self.established:
            try:
                self.conn.shutdown()
            except SSL.Error:
                pass
            self.flush()


class DtlsListenerProtocol(asyncio.DatagramProtocol):
    """TURN over DTLS on one UDP socket: a DTLS session per client address after a cookie."""

    def __init__(
        self,
        server: TurnServer,
        cert_b64: str,
        key_b64: str,
        handshake_timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> None:
        self.server = server
        # Read at construction, not import, so tests (and tuning) can change the defaults.
        self.handshake_timeout = handshake_timeout or HANDSHAKE_TIMEOUT
        self.idle_timeout = idle_timeout or IDLE_TIMEOUT
        self.cookies = CookieJar()
        self.context = dtls_context(cert_b64, key_b64, self.cookies)
        self.sessions: dict[Any, DtlsSession] = {}
        # Handshakes in progress (cookie echoed, not finished), in total and per source IP:
        # capped by --dtls-pending and --dtls-pending-per-source (issue 15).
        self.pending = 0
        self.pending_by_source: dict[str, int] = {}
        # Strangers' ClientHellos, before OpenSSL sees them (the module docstring); the socket
        # is read in batches (transports.read_batch), which sets `behind`.
        self.hellos = UnsignedBudget(server.context.limits, STRANGER_IPS)
        self.full_batches = 0
        self.behind = False
        # A socket of its own per client with a session (DtlsTransport sets it): its handshake
        # and records queue apart from a flood on the listener socket.
        self.pins: Pinner | None = None
        self._listener: SSL.Connection | None = None
        self.transport: asyncio.DatagramTransport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sweeper: asyncio.TimerHandle | None = None

    @property
    def name(self) -> str:
        return self.server.name

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)
        self._schedule_sweep()

    def datagram_received(self, data: bytes, addr: Any) -> None:
        try:
            session = self.sessions.get(addr)
            if session is None:
                self._stranger(data, addr)
            elif client_hello_random(data) not in (None, session.hello_random):
                self._stranger(data, addr)  # a new handshake from the same address: a restart
            else:
                session.received(data)
        except SSL.Error as exc:
            log.debug("listener %s: DTLS from %s: %s", self.name, addr, exc)
            session = self.sessions.get(addr)
            if session is not None:
                session.flush()  # the fatal alert
                self.close_session(session, notify=False)
        except Exception:  # never out of datagram_received: drop the datagram
            log.exception("listener %s: DTLS datagram from %s dropped", self.name, addr)

    def _stranger(self, data: bytes, addr: Any) -> None:
        """A datagram from an address without a session, or a new ClientHello from one with:
        only a whole ClientHello, within its source IP's budget, goes on. One whose cookie
        verifies starts a session (OpenSSL); any other, within the listener's budget for all
        sources and while the socket is not behind, gets a HelloVerifyRequest built here, with
        no state and no OpenSSL. What is not is dropped, counted with a reason."""
        stats = self.server.stats
        cookie = client_hello_cookie(data)
        if cookie is None:
            stats.dropped += 1  # reason="invalid": only a ClientHello opens a session
        elif not self.hellos.admit_source(addr):
            stats.rate_limited += 1
        elif cookie and self.cookies.check(addr, cookie):
            self._listen(data, addr)  # the client answered a HelloVerifyRequest: its address
        elif self.behind or not self.hellos.admit_total():
            stats.rate_limited += 1
        elif self.transport is not None:
            self.transport.sendto(hello_verify_request(data, self.cookies.make(addr)), addr)

    def _listen(self, data: bytes, addr: Any) -> None:
        """A ClientHello whose cookie verified (`_stranger`): start a session (OpenSSL checks
        the cookie again; one that fails there gets OpenSSL's HelloVerifyRequest)."""
        listener = self._listener
        if listener is None:
            listener = self._listener = SSL.Connection(self.context)
            listener.set_accept_state()
            # A memory BIO has no MTU to query (OP_NO_QUERY_MTU): without one, DTLS cannot write.
            listener.set_ciphertext_mtu(MAX_DATAGRAM)
        listener.set_app_data(addr)  # what the cookie is bound to
        try:
            listener.bio_write(data)
            listener.DTLSv1_listen()
        except SSL.WantReadError:
            self._answer(listener, addr)  # HelloVerifyRequest, or nothing for garbage
            return
        except SSL.Error:
            self._listener = None  # unusable now: a fresh one for the next datagram
            return
        self._listener = None  # verified: it holds the ClientHello and becomes the session
        previous = self.sessions.get(addr)
        if previous is not None:  # the client restarted behind the same address
            self.close_session(previous, notify=False)
        session = DtlsSession(self, addr, listener, data)
        limits = self.server.context.limits
        if (
            self.pending >= limits.dtls_pending
            or self.pending_by_source.get(session.source, 0) >= limits.dtls_pending_per_source
        ):
            log.debug("listener %s: DTLS handshake from %s dropped: cap", self.name, addr)
            self.server.stats.dropped += 1
            return
        self.pending += 1
        self.pending_by_source[session.source] = self.pending_by_source.get(session.source, 0) + 1
        self.sessions[addr] = session
        if self.pins is not None:
            self.pins.pin(addr)
        session.handshake()

    def handshake_over(self, session: DtlsSession) -> None:
        """A session left the pending handshakes: established, or closed before."""
        if not session.pending:
            return
        session.pending = False
        self.pending -= 1
        left = self.pending_by_source.get(session.source, 1) - 1
        if left > 0:
            self.pending_by_source[session.source] = left
        else:
            self.pending_by_source.pop(session.source, None)

    def _answer(self, listener: SSL.Connection, addr: Any) -> None:
        try:
            data = listener.bio_read(65536)
        except SSL.WantReadError:
            return
        if self.transport is not None:
            self.transport.sendto(data, addr)

    def close_session(self, session: DtlsSession, notify: bool = True) -> None:
        session.close(notify)
        self.handshake_over(session)
        if self.sessions.get(session.remote) is session:
            del self.sessions[session.remote]
        self.server.connection_lost(session.remote)

    def _schedule_sweep(self) -> None:
        interval = min(1.0, self.handshake_timeout / 2)
        self._sweeper = asyncio.get_running_loop().call_later(interval, self._sweep)

    def _sweep(self) -> None:
        now = time.monotonic()
        for session in list(self.sessions.values()):
            if session.established:
                expired = now - session.last_seen > self.idle_timeout
            else:  # counted from the start: retransmitted hellos do not keep it alive
                expired = now - session.created > self.handshake_timeout
            if expired:
                log.debug("listener %s: DTLS session %s timed out", self.name, session.remote)
                self.close_session(session)
        self._schedule_sweep()

    def error_received(self, exc: Exception) -> None:
        log.debug("listener %s: %s", self.name, exc)

    def close(self) -> None:
        """close_notify to every client (the transport then closes the socket)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        for session in list(self.sessions.values()):
            self.close_session(session)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for session in list(self.sessions.values()):
            self.close_session(session, notify=False)
        if not self.closed.done():
            self.closed.set_result(None)
