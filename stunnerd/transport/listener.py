"""A running listener: its TURN server, its transport and its housekeeping timer.

The transport (`transports.py`, `native_udp.py`) is the socket side of the listener's protocol,
built by the protocol's entry in `TRANSPORTS`, the transport registry; the TURN server
(`turn.py`) is the same for every protocol. A new protocol is one row of
`stunner_api.vocabulary.LISTENER_PROTOCOL_TABLE`, one transport class and one entry here.

A listener has a generation: a UDP worker process builds its copy of a listener around the
socket the primary handed it, under the primary's generation, so both sides know which copy is
current.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import itertools
import logging
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

from stunner_api.dataplane import ListenerConfig
from stunner_api.vocabulary import ListenerProtocol

from ..surface.runtime import port_holders
from ..turn.counters import ClusterCounters, ListenerCounters
from ..turn.server import ServerContext, TurnServer
from ..turn.sockets import local_bind_address
from . import native
from .native_glue import NativeEngines
from .native_tcp import NativeTcpTransport
from .native_udp import NativeUdpTransport
from .transports import DtlsTransport, TcpTransport, Transport, UdpTransport

log = logging.getLogger("stunner.listener")

SWEEP_INTERVAL = 1.0
POD_ENV = "STUNNER_ADDR"  # the pod's own address (status.podIP), where sockets bind behind NAT


def _relay_note(address: str, bind_note: str) -> str:
    """What the start-up line says of a relay address: where the sockets bind when it is not
    this host's (a public address behind NAT), and that a private one reaches only clients in
    its network (the pod address relay address discovery falls back to)."""
    notes = [bind_note.strip()] if bind_note else []
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        ip = None
    if ip is not None and ip.is_private and not (ip.is_loopback or ip.is_unspecified):
        notes.append("a private address: only clients that reach its network can use it")
    return f" ({'; '.join(notes)})" if notes else ""


_GENERATIONS = itertools.count(1)


class Listener:
    """A TURN listener. A TURN-UDP listener with `udp_sockets` > 1 keeps the sockets of the UDP
    workers in `worker_sockets`; a worker passes the socket it was handed as `sock`."""

    def __init__(
        self,
        config: ListenerConfig,
        context: ServerContext,
        udp_sockets: int = 1,
        sock: socket.socket | None = None,
        generation: int | None = None,
        configured_address: str | None = None,
    ) -> None:
        self.config = config
        self.server = TurnServer(config.name, config.address, context)
        # The sockets bind the local address of the listener's configured address: its relay
        # address, which clients are told, unless relay address discovery replaced that with
        # a STUN server's answer, which is only advertised (`configured_address`, the pod's).
        # A relay address that is not this host's (a node's public address behind NAT) binds
        # the pod's own address; a worker's listener binds where the primary's socket is.
        self.configured_address = configured_address or config.address
        if sock is not None:
            bind_ip, self._bind_note = sock.getsockname()[0], ""
        else:
            pod = os.environ.get(POD_ENV)
            bind_ip, self._bind_note = local_bind_address(self.configured_address, pod)
        if self.configured_address != config.address:
            self._bind_note = f"a STUN server's answer, only advertised: sockets bind {bind_ip} "
        self.server.bind_ip = bind_ip
        self.generation = generation if generation is not None else next(_GENERATIONS)
        self.transport: Transport | None = None
        self._udp_sockets = udp_sockets
        self._given_socket = sock
        self._sweeper: asyncio.TimerHandle | None = None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def worker_sockets(self) -> list[socket.socket]:
        return self.transport.worker_sockets if self.transport is not None else []

    def replica(self) -> Listener:
        """A new, unstarted listener like this one (a rollback brings a stopped one back)."""
        return Listener(
            self.config,
            self.server.context,
            self._udp_sockets,
            configured_address=self.configured_address,
        )

    async def start(self) -> None:
        try:
            transport = self._transport()
            await transport.start(self.config.port)
        except (OSError, ValueError) as exc:
            if self._given_socket is not None:
                self._given_socket.close()  # a worker's listener owns the socket it was given
            if not isinstance(exc, OSError) or exc.errno != errno.EADDRINUSE:
                raise
            facts = self.config.facts
            holders = port_holders(self.config.port, facts.stream)
            held = f" (held by process {', '.join(holders)})" if holders else ""
            busy = OSError(f"{facts.transport} port {self.config.port} is already in use{held}")
            busy.errno = exc.errno  # str() without the "[Errno 98]" prefix
            raise busy from None
        self.transport = transport
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_INTERVAL, self._sweep)
        log.log(  # a UDP worker's copy of a listener is the primary's, already logged
            self._log_level,
            "listener %s (%s) serving on port %d, relay address %s%s",
            self.name,
            self.config.protocol,
            self.config.port,
            self.config.address,
            _relay_note(self.config.address, self._bind_note),
        )

    def _transport(self) -> Transport:
        """The transport of the listener's protocol, from the registry; ValueError for a bad
        certificate or a protocol with no transport."""
        build = TRANSPORTS.get(self.config.protocol)
        if build is None:
            raise ValueError(
                f"listener {self.name}: protocol {self.config.protocol} is not supported yet"
            )
        return build(self.config, self.server, self._udp_sockets, self._given_socket)

    def stats(self) -> ListenerCounters:
        """The listener's counters: the TURN server's plus what the native engine relayed."""
        transport = self.transport
        if not isinstance(transport, NativeEngines):
            return self.server.stats
        total = ListenerCounters()
        total.add(self.server.stats)
        total.add(transport.listener_counters())
        return total

    def cluster_counters(self) -> Mapping[str, ClusterCounters]:
        """Per cluster, what the native engine relayed (Python's count is the context's)."""
        transport = self.transport
        return transport.cluster_counters() if isinstance(transport, NativeEngines) else {}

    def offload_state(self) -> dict[str, Any]:
        """Whether the kernel offload relays this listener's ChannelData, and if not, why:
        {"on": true, "engine", "interfaces", "modes", "code"} or {"on": false, "reason", "code"}
        (`code`: the metric's label, the engine and mode when on: tc, xdp_driver, xdp_generic,
        xdp_mixed)."""
        offload = self.server.context.offload
        if self.config.protocol != ListenerProtocol.TURN_UDP.value:
            reason = f"{self.config.protocol}: the offload relays TURN-UDP ChannelData only"
            return {"on": False, "reason": reason, "code": "protocol"}
        if not offload.active:
            return {"on": False, "reason": offload.reason, "code": offload.reason_code}
        if not isinstance(self.transport, NativeUdpTransport):
            reason = f"TURN-UDP relays in Python here: {native.unavailable_reason()}"
            return {"on": False, "reason": reason, "code": "native"}
        modes = offload.modes
        kinds = sorted(set(modes.values()))
        code = (
            "tc" if offload.engine == "TC" else "xdp_" + (kinds[0] if len(kinds) == 1 else "mixed")
        )
        return {
            "on": True,
            "engine": offload.engine,
            "interfaces": offload.interfaces,
            "modes": modes,
            "code": code,
        }

    @property
    def _log_level(self) -> int:
        return logging.DEBUG if self._given_socket is not None else logging.INFO

    def _sweep(self) -> None:
        self.server.sweep()
        if self.transport is not None:
            self.transport.sweep()
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_INTERVAL, self._sweep)

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.transport is not None:
            await self.transport.stop()
        self.server.close()
        log.log(self._log_level, "listener %s stopped", self.name)


_told: set[str] = set()


def _tell_python_relay(reason: str) -> None:
    """Say once per process why TURN-UDP and TURN-TCP relay in Python: a warning if the
    extension did not build, an info line when STUNNER_NATIVE=0 asked for it."""
    if reason in _told:
        return
    _told.add(reason)
    level = logging.INFO if "STUNNER_NATIVE" in reason else logging.WARNING
    log.log(level, "TURN-UDP and TURN-TCP relay in Python: %s", reason)


# --- the transport registry: protocol -> the function that builds its transport ---------------

# (the listener's config, its TURN server, the UDP sockets per listener (1 + UDP workers), the
# socket a UDP worker was handed) -> an unstarted transport. A TLS or DTLS transport loads its
# certificate when built, so a bad certificate is refused before the port is taken.
TransportFactory = Callable[[ListenerConfig, TurnServer, int, socket.socket | None], Transport]


def _udp(
    config: ListenerConfig, server: TurnServer, udp_sockets: int, given: socket.socket | None
) -> Transport:
    """TURN-UDP on the native relay engine where it is available, else in Python."""
    reason = native.unavailable_reason()
    if reason is None:
        return NativeUdpTransport(server, udp_sockets, given)
    _tell_python_relay(reason)
    return UdpTransport(server, udp_sockets, given)


def _tcp(
    config: ListenerConfig, server: TurnServer, udp_sockets: int, given: socket.socket | None
) -> Transport:
    """TURN-TCP on the native relay engine where it is available, else in Python."""
    reason = native.unavailable_reason()
    if reason is None:
        return NativeTcpTransport(server, engines=udp_sockets)  # an engine per UDP process
    _tell_python_relay(reason)
    return TcpTransport(server)


def _tls(
    config: ListenerConfig, server: TurnServer, udp_sockets: int, given: socket.socket | None
) -> Transport:
    from .certificates import server_ssl_context  # cryptography only for a TLS listener

    return TcpTransport(server, server_ssl_context(config.cert, config.key))


def _dtls(
    config: ListenerConfig, server: TurnServer, udp_sockets: int, given: socket.socket | None
) -> Transport:
    return DtlsTransport(server, config.cert, config.key)


# One entry per row of the vocabulary's LISTENER_PROTOCOL_TABLE (a test checks they agree).
TRANSPORTS: Mapping[str, TransportFactory] = {
    ListenerProtocol.TURN_UDP: _udp,
    ListenerProtocol.TURN_TCP: _tcp,
    ListenerProtocol.TURN_TLS: _tls,
    ListenerProtocol.TURN_DTLS: _dtls,
}
