"""TURN-UDP on the native relay engine (issue 16): the engine carries the media, Python keeps
the protocol.

`NativeUdpTransport` is the TURN-UDP transport when `stunnerd.transport.native` is available
(built, and
STUNNER_NATIVE is not 0). The listener binds one socket per usable CPU (`-u`) in one
SO_REUSEPORT group, and an engine (`native.NativeRelay`) on each, all in this process (issue
30: one interpreter answers every request; a relay thread per CPU carries the media). An engine
owns the receive path of its listener socket and of the relay sockets of the allocations whose
clients the kernel steers to that socket (`Downstream.engine`), in its own thread:

- it relays ChannelData and plain Send indications from clients, and peers' datagrams back as
  ChannelData or Data indications, deciding each packet from tables this module mirrors into
  it: allocations (`NativeRelayPath.open`), permissions and channels (`NativeAllocation`, the
  allocation's `AllocationMirror`), and the router's per-peer verdicts;
- every other packet is handed up and goes through today's Python path unchanged
  (`UdpListenerProtocol.datagram_received`: every STUN request, authentication, lifetimes,
  permissions, channels, quota). A relayed packet is handed up when the engine has no verdict
  for its peer yet: the router decides here, the verdict is installed and the packet
  re-injected; the router's cache drops (`Router.watch`, on every reconcile and DNS change)
  clear the engine's verdicts, so a route change that forbids a peer stops its packets at the
  next one.
- Python still sends its answers on the listener socket; a packet Python relays itself (a
  Send indication of another shape, a channel the engine saw expire first) goes out through
  `NativeRelay.send` on the engine's duplicate of the relay socket.
- Counting: the engine counts the packets it consumes, Python the ones it handles; `counters()`
  gives the engine's share, which `Listener` adds to the TURN server's once.
- The kernel offload (issue 30), when `admin.offload_engine` turns it on: every change to an
  allocation's permissions, channels or lifetime, and every route change, re-syncs its routes
  in the kernel, and its end empties them (`offloaded.OffloadedAllocations`). The process's
  one program carries every engine's allocations: they share the listener's address.

TURN-TCP has its own engine (`native_tcp`); TURN-TLS and -DTLS stay in Python (TLS and DTLS
sessions).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import time

from stunner_api.stun import Address

from ..turn.allocation import Allocation, RelaySocket
from ..turn.server import TurnServer
from . import native
from .native_glue import NativeAllocation, NativeEngines, relayed_peer
from .offloaded import OffloadedAllocations
from .transports import STRANGER_IPS, ListenerSocket, UdpListenerProtocol, UdpTransport

log = logging.getLogger("stunner.listener")

# Places one source IP may hold in the engine's strangers' queue (of 4096; issue 20): above the
# burst of unsigned messages --unauthenticated-rate lets through (100 by default), so that the
# bucket, not the queue, decides those; a flood of messages with a forged MESSAGE-INTEGRITY is
# held to 3 % of the queue, leaving the rest to everyone else.
STRANGER_QUEUE_SHARE = 128


class NativeUdpTransport(NativeEngines, UdpTransport):
    """TURN-UDP with the native relay engine (see the module docstring): one engine, with its
    thread, per socket of the listener's SO_REUSEPORT group (`sockets`, by default one per
    usable CPU), all in this process; a UDP worker process's copy (`given`) runs one."""

    def __init__(self, server: TurnServer, sockets: int, given: socket.socket | None) -> None:
        super().__init__(server, sockets, given)
        self._socks: list[socket.socket] = []
        # today's path, for what each engine hands up (the engine has spent strangers' tokens)
        self._pythons: list[UdpListenerProtocol] = []
        # the process's one kernel program carries every engine's allocations (issue 30)
        self._offloaded = OffloadedAllocations(server, self._listener_address)

    async def start(self, port: int) -> None:
        socks = [self.listener_socket(port), *self.worker_sockets]
        self.worker_sockets = []  # every socket of the group is served here, by its engine
        relays: list[native.NativeRelay] = []
        try:
            limits = self.server.context.limits
            for sock in socks:
                relay = native.NativeRelay(
                    sock,
                    max_message=limits.max_udp_message,
                    stranger_rate=limits.unauthenticated_rate,
                    stranger_ips=STRANGER_IPS,
                    per_source=STRANGER_QUEUE_SHARE,
                    unsigned_rate=limits.unauthenticated_rate_total,
                    max_attributes=limits.max_attributes,
                )
                relays.append(relay)
                self._answer_unsigned(relay)
                relay.watch_relay_ports(self.server.router.relay_ports)
                relay.start()
        except (OSError, RuntimeError) as exc:
            for relay in relays:
                relay.close()
            for held in socks:
                held.close()
            raise OSError(f"the native relay engine cannot start: {exc}") from None
        self._socks, self.relays = socks, relays
        loop = asyncio.get_running_loop()
        for engine, (sock, relay) in enumerate(zip(socks, relays, strict=True)):
            python = UdpListenerProtocol(self.server, engine_limits_strangers=True, engine=engine)
            python.connection_made(ListenerSocket(sock))
            self._pythons.append(python)
            relay.attach(loop, functools.partial(self._handed_up, engine))
            self.unwatch_on_stop.append(self.server.router.watch(relay.clear_verdicts))
        self.server.scope.relay_path = self
        self.unwatch_on_stop.append(self.server.router.watch(self._sync_every_offload))

    def _answer_unsigned(self, relay: native.NativeRelay) -> None:
        """Let the engine answer strangers' unsigned Allocates with a stateless 401 (issue 28):
        with this process's nonce key, so the signed retry verifies here, in Python, and in
        every other process. Not in STUN-only mode (403 there), nor with a realm too long for
        the engine's answer (Python answers those). A realm or mode change restarts the
        listener (`stunner_api.restart`), so this holds for the listener's life."""
        context = self.server.context
        if context.stun_only or len(context.realm.encode()) > native.MAX_ANSWER_REALM:
            return
        nonces = context.nonces
        relay.answer_unsigned(nonces.secret, nonces.lifetime, self.server.name, context.realm)

    async def stop(self) -> None:
        self._offloaded.close()
        self.stop_engines()
        for sock in self._socks:
            sock.close()
        self._socks = []

    # --- RelayPath ----------------------------------------------------------------------------

    async def open(self, allocation: Allocation, sock: socket.socket) -> RelaySocket:
        engine = allocation.downstream.engine  # where the kernel steers the client's packets
        if engine >= len(self.relays):
            raise OSError("the listener is stopping")
        relay = self.relays[engine]
        try:
            with sock:  # the engine keeps a duplicate: one descriptor per allocation
                sockname = sock.getsockname()
                handle = relay.add_allocation(
                    allocation.downstream.remote, sock, allocation.expires_at
                )
        except ValueError as exc:  # this client has an allocation in the engine already
            raise OSError(str(exc)) from None
        relayed = NativeAllocation(
            relay,
            handle,
            sockname,
            functools.partial(self._forget, engine),
            functools.partial(self._sync_offload, engine),
        )
        allocation.mirror = relayed
        self.engine_allocations[(engine, handle)] = allocation
        return relayed

    def _forget(self, engine: int, handle: int) -> None:
        self.engine_allocations.pop((engine, handle), None)
        self._offloaded.forget((engine, handle))

    # --- the kernel offload (stunnerd.transport.offloaded) ----------------------------------

    def _sync_offload(self, engine: int, handle: int) -> None:
        if self._offloaded.idle((engine, handle)):
            return
        allocation = self.engine_allocations.get((engine, handle))
        relay = allocation.relay if allocation is not None else None
        bound = relay.get_extra_info("sockname") if isinstance(relay, NativeAllocation) else None
        self._offloaded.sync((engine, handle), allocation, (bound[0], bound[1]) if bound else None)

    def _sync_every_offload(self) -> None:
        """A route or config change: every allocation's routes again (a refused peer's go)."""
        for engine, handle in list(self.engine_allocations):
            self._sync_offload(engine, handle)

    def _listener_address(self) -> Address | None:
        """The address every socket of the listener's group shares (the program's key)."""
        return self._socks[0].getsockname()[:2] if self._socks else None

    def sweep(self) -> None:
        self._offloaded.sweep()

    # --- packets the engines handed up --------------------------------------------------------

    def _handed_up(self, engine: int, batch: list[native.HandedUp]) -> None:
        for packet in batch:
            try:
                if packet.source == native.SOURCE_CLIENT:
                    self._from_client(engine, packet)
                else:
                    self.from_peer(engine, packet)
            except Exception:  # a bug must not take the listener down
                log.exception("listener %s: error handling a packet", self.server.name)

    def _from_client(self, engine: int, packet: native.HandedUp) -> None:
        data, addr = packet.data, packet.address
        allocation = self.server.allocations.get(addr)
        if allocation is not None and allocation.mirror is not None:
            peer = relayed_peer(allocation, data)
            if peer is not None and self.decided(engine, peer, packet) != native.UP:
                return
        stats = self.server.stats
        limited = stats.rate_limited
        self._pythons[engine].datagram_received(data, addr)
        if stats.rate_limited != limited and allocation is None and engine < len(self.relays):
            # A stranger over its error budget: the engine drops it until the budget refills.
            wait = self.server.context.error_answers.seconds_to_token(addr)
            if wait > 0:
                self.relays[engine].mute(addr, time.monotonic() + wait)
