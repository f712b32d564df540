"""Relay address discovery's last resort: ask a STUN server for this node's public address.

The reconciler hands a host-network stunnerd its Node's public address as the relay address
(the CDS patches the config); a Node with no ExternalIP, ExternalDNS or operator-named address
gets the pod's own address, `$STUNNER_ADDR`. Where the Gateway names a STUN server (its
`stunner.l7mp.io/relay-address-stun-server` annotation, rendered into the pod's
STUNNER_RELAY_STUN_SERVER), stunnerd asks that server, from the address its sockets bind, what
address it is seen from (XOR-MAPPED-ADDRESS of a Binding request), and hands that out instead:
on the host network its view of its own public address is the right one.

One place: `daemon.Stunner.apply` passes every config through `RelayDiscovery.patched` (every
listener whose address is the pod's own gets the discovered address, when there is one) and
then `follow`, which starts the question in the background the first time a config needs it.
The listeners are never held up: they start at the pod address, and when the answer comes the
daemon applies the same config again, patched (a listener whose relay address changes
restarts; at start-up it has no allocations yet). A question is a Binding request retransmitted
with doubling timeouts (`PROBE_TIMEOUTS`, RFC 8489 §6.2.1's schedule, cut short); a failure is
logged, the pod address stays, and the question is asked again every `RETRY_AFTER` seconds
(logged once until it is answered). Once answered it is asked again every `RECHECK_AFTER`
seconds: a node's public address can change under a long-lived host-network pod (a NAT
gateway's address replaced, a dynamic address), and a new answer is applied as the first was
(the listeners whose relay address changes restart: allocations at the old address reached no
one any more). A re-check that fails keeps the address last discovered.

Pure parts (`discovery_listeners`, `patch`) and the I/O edge (`mapped_address`, one UDP socket
per question, plain asyncio: nothing on the packet path).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence

from stunner_api.annotations import Refused, host_port
from stunner_api.dataplane import StunnerConfig
from stunner_api.vocabulary import RELAY_STUN_SERVER_ENV

from .stun import Class, Message, Method, StunError, parse_message
from .turn import local_bind_address

log = logging.getLogger("stunner.relay-discovery")

# Seconds to wait for an answer after each transmission of the Binding request: four tries,
# 7.5 s in all (RFC 8489's default is 7 tries from an RTO of 500 ms: 39.5 s).
PROBE_TIMEOUTS: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
RETRY_AFTER = 30.0  # seconds between questions while the server does not answer
RECHECK_AFTER = 300.0  # seconds between questions once it did
POD_ENV = "STUNNER_ADDR"  # the pod's own address: what the CDS falls back to


class DiscoveryError(Exception):
    """The STUN server gave no usable answer."""


def discovery_listeners(config: StunnerConfig, pod_address: str) -> list[str]:
    """The listeners whose relay address is the pod's own (what the CDS falls back to)."""
    return [lc.name for lc in config.listeners if pod_address and lc.address == pod_address]


def patch(config: StunnerConfig, pod_address: str, discovered: str) -> StunnerConfig:
    """`config` with the relay address of every listener at `pod_address` set to `discovered`
    (same IP family only: an IPv4 answer cannot serve an IPv6 listener)."""
    family = ipaddress.ip_address(discovered).version
    listeners = [
        lc.model_copy(update={"address": discovered})
        if lc.address == pod_address and ipaddress.ip_address(lc.address).version == family
        else lc
        for lc in config.listeners
    ]
    if listeners == config.listeners:
        return config
    return config.model_copy(update={"listeners": listeners})


class _Answers(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.queue.put_nowait(data)


async def mapped_address(
    server: tuple[str, int], bind_ip: str, timeouts: Sequence[float] = PROBE_TIMEOUTS
) -> str:
    """The address a STUN `server` (host, port) sees a Binding request from `bind_ip` (any
    port) come from: its XOR-MAPPED-ADDRESS (or MAPPED-ADDRESS). DiscoveryError when it does
    not resolve or answer within the tries of `timeouts`."""
    loop = asyncio.get_running_loop()
    family = socket.AF_INET6 if ":" in bind_ip else socket.AF_INET
    host, port = server
    try:
        infos = await loop.getaddrinfo(host, port, family=family, type=socket.SOCK_DGRAM)
    except OSError as exc:
        raise DiscoveryError(f"cannot resolve {host}: {exc}") from None
    target = infos[0][4][:2]
    request = Message(Method.BINDING, Class.REQUEST)
    try:
        transport, answers = await loop.create_datagram_endpoint(
            _Answers, local_addr=(bind_ip, 0), family=family
        )
    except OSError as exc:
        raise DiscoveryError(f"cannot bind {bind_ip}: {exc.strerror or exc}") from None
    try:
        for timeout in timeouts:
            transport.sendto(request.encode(), target)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    while True:
                        answer = _mapped(await answers.queue.get(), request.transaction_id)
                        if answer is not None:
                            return answer
    finally:
        transport.close()
    raise DiscoveryError(f"no answer to {len(timeouts)} Binding requests")


def _mapped(data: bytes, transaction_id: bytes) -> str | None:
    """The mapped address of a Binding success response to our request, else None."""
    try:
        message = parse_message(data)
    except StunError:
        return None
    if message.transaction_id != transaction_id or message.message_class != Class.SUCCESS:
        return None
    address = message.attributes.get("XOR-MAPPED-ADDRESS") or message.attributes.get(
        "MAPPED-ADDRESS"
    )
    return str(address[0]) if address else None


def _report(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("relay address discovery stopped: %r", task.exception())


class RelayDiscovery:
    """Asks the STUN server `server` (host:port) for the public address of the listeners whose
    relay address is `pod_address`; see the module."""

    def __init__(
        self,
        server: str,
        pod_address: str,
        *,
        timeouts: Sequence[float] = PROBE_TIMEOUTS,
        retry_after: float = RETRY_AFTER,
        recheck_after: float = RECHECK_AFTER,
    ) -> None:
        parsed = host_port(server)
        if isinstance(parsed, Refused):
            raise ValueError(f"STUN server: {parsed.reason}")
        try:
            ipaddress.ip_address(pod_address)
        except ValueError:
            raise ValueError(f"the pod address {pod_address!r} is not an IP address") from None
        self.server_text = server
        self.server = parsed
        self.pod_address = pod_address
        self.timeouts = tuple(timeouts)
        self.retry_after = retry_after
        self.recheck_after = recheck_after
        self.discovered: str | None = None
        self._task: asyncio.Task[None] | None = None

    def patched(self, config: StunnerConfig) -> StunnerConfig:
        """`config` with the discovered address where it has the pod's (unchanged until one
        is discovered)."""
        if self.discovered is None:
            return config
        return patch(config, self.pod_address, self.discovered)

    def follow(self, config: StunnerConfig, changed: Callable[[], Awaitable[None]]) -> None:
        """Start asking, in the background, if `config` has listeners at the pod address and
        no question is under way yet; `changed` is awaited on the first answer and on every
        answer that differs from the last (see the module)."""
        if self._task is not None:
            return
        if not discovery_listeners(config, self.pod_address):
            return
        self._task = asyncio.get_running_loop().create_task(self._ask(changed))
        self._task.add_done_callback(_report)

    async def _ask(self, changed: Callable[[], Awaitable[None]]) -> None:
        bind_ip, _ = local_bind_address(self.pod_address, self.pod_address)
        failed = False
        while True:
            if self.discovered is not None:
                await asyncio.sleep(self.recheck_after)
            try:
                found = await mapped_address(self.server, bind_ip, self.timeouts)
            except DiscoveryError as exc:
                if self.discovered is not None:  # a re-check: the last answer stays
                    log.debug("relay address discovery: re-check failed: %s", exc)
                    continue
                if not failed:
                    log.warning(
                        "relay address discovery: STUN server %s: %s (from %s); the relay "
                        "address stays the pod's own, %s (likely private); asking again every "
                        "%gs",
                        self.server_text,
                        exc,
                        bind_ip,
                        self.pod_address,
                        self.retry_after,
                    )
                    failed = True
                await asyncio.sleep(self.retry_after)
                continue
            if ipaddress.ip_address(found).version != ipaddress.ip_address(bind_ip).version:
                log.warning("relay address discovery: ignoring %s (another family)", found)
                if self.discovered is None:
                    await asyncio.sleep(self.retry_after)
                continue
            if found == self.discovered:
                continue
            if self.discovered is None:
                log.info(
                    "relay address discovery: STUN server %s sees %s as %s: the relay address "
                    "of the listeners at %s",
                    self.server_text,
                    bind_ip,
                    found,
                    self.pod_address,
                )
            else:
                log.warning(
                    "relay address discovery: STUN server %s now sees %s as %s (was %s): the "
                    "listeners at %s restart with the new relay address",
                    self.server_text,
                    bind_ip,
                    found,
                    self.discovered,
                    self.pod_address,
                )
            self.discovered = found
            await changed()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


def relay_discovery_from_env(env: Mapping[str, str]) -> RelayDiscovery | None:
    """The discovery STUNNER_RELAY_STUN_SERVER asks for, at the pod address STUNNER_ADDR; None
    without it, or (logged) when either is unusable."""
    server = env.get(RELAY_STUN_SERVER_ENV, "").strip()
    if not server:
        return None
    try:
        return RelayDiscovery(server, env.get(POD_ENV, "").strip())
    except ValueError as exc:
        log.error("%s=%r: no relay address discovery: %s", RELAY_STUN_SERVER_ENV, server, exc)
        return None
