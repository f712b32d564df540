"""Relay address discovery's last resort: ask a STUN server for this node's public address.

A host-network stunnerd whose Node has no public address gets the pod's own, `$STUNNER_ADDR`,
as its listeners' relay address (the CDS's fallback). Where the Gateway names a STUN server
(`stunner.l7mp.io/relay-address-stun-server`, the pod's STUNNER_RELAY_STUN_SERVER), stunnerd
asks it, from the pod address, what address it is seen from (the XOR-MAPPED-ADDRESS of a
Binding request) and hands that out instead. `daemon.Stunner.apply` passes every config through
`RelayDiscovery.patched` (the listeners at the pod address get the adopted address) and
`follow` (which starts asking in the background). The listeners start at once at the pod
address; when an address is adopted the daemon applies the config again, patched (a listener
whose relay address changes restarts). The answer is only *advertised*: each listener binds its
configured address, the pod's (`Listener(configured_address=...)`), never the answer.

Nothing in an answer is trusted unchecked (security issue 28, finding 4):
- The question's socket is *connected* to the server: the kernel drops datagrams from any other
  address or port. A response must be a Binding success with the request's transaction id.
- The address must be one a client can be sent to, of the listeners' family (`refusal`, the
  table `REFUSED`): not unspecified (0.0.0.0/8, ::), loopback, link-local, multicast, broadcast
  (255.255.255.255, or that of an IPv4 network of this host's), reserved (240.0.0.0/4, IPv6's
  reserved blocks, site-local), nor IPv4-mapped for IPv6 listeners. Private addresses (RFC 1918,
  100.64.0.0/10, IPv6 ULAs) are accepted: a STUN server inside a private network (on premises, a
  test cluster) rightly sees the node's private address, which that network's clients reach.
- A change, the first address too, needs two agreeing answers: two questions in a row, each with
  its own socket and transaction id. The second is asked at once after an answer that differs
  from the address handed out; when it disagrees the address stays, and the next question, on
  the usual schedule, may confirm the latest.
Refused and unconfirmed answers change nothing; each kind is logged as a WARNING once, then at
DEBUG until the server answers well again (confirms the address handed out, or a new one).

A question is a Binding request retransmitted with doubling timeouts (`PROBE_TIMEOUTS`, RFC 8489
§6.2.1's schedule, cut short). Until an address is adopted, questions come every `RETRY_AFTER`
seconds (an unanswered one logged once); then every `RECHECK_AFTER` seconds, since a node's
public address can change (a NAT gateway's replaced, a dynamic address): a failed or refused
re-check keeps the address. Pure parts (`discovery_listeners`, `patch`, `refusal`), I/O edges
(`mapped_address`: one connected UDP socket per question, plain asyncio, nothing on the packet
path; `host_broadcasts`: this host's interfaces through ifaddr).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence

import ifaddr

from stunner_api.annotations import Refused, host_port
from stunner_api.dataplane import StunnerConfig
from stunner_api.stun import Class, Message, Method, StunError, parse_message
from stunner_api.vocabulary import RELAY_STUN_SERVER_ENV

from ..turn.sockets import local_bind_address

log = logging.getLogger("stunner.relay-discovery")

# Seconds to wait for an answer after each transmission of the Binding request: four tries,
# 7.5 s in all (RFC 8489's default is 7 tries from an RTO of 500 ms: 39.5 s).
PROBE_TIMEOUTS: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
RETRY_AFTER = 30.0  # seconds between questions while no address is adopted
RECHECK_AFTER = 300.0  # seconds between questions once one is
POD_ENV = "STUNNER_ADDR"  # the pod's own address: what the CDS falls back to

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")  # RFC 1122: "this host on this network"
LIMITED_BROADCAST = ipaddress.IPv4Address("255.255.255.255")

# The answers refused whatever the listeners' family, checked in this order: (the kind, as a
# log line says it, whether `address` is one, given this host's broadcast addresses).
REFUSED: tuple[tuple[str, Callable[[Address, Collection[Address]], bool]], ...] = (
    ("an unspecified address", lambda ip, _b: ip.is_unspecified or ip in THIS_NETWORK),
    ("a loopback address", lambda ip, _b: ip.is_loopback),
    ("a link-local address", lambda ip, _b: ip.is_link_local),
    ("a multicast address", lambda ip, _b: ip.is_multicast),
    ("a broadcast address", lambda ip, broadcasts: ip == LIMITED_BROADCAST or ip in broadcasts),
    (
        "a reserved address",
        lambda ip, _b: ip.is_reserved or (ip.version == 6 and ip.is_site_local),
    ),
)


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


def refusal(answer: str, family: int, broadcasts: Collection[Address] = ()) -> str | None:
    """Why `answer` (an IP address) cannot be the relay address of listeners of IP version
    `family` (4 or 6), as a log line says it; None when it can. `broadcasts`: this host's
    IPv4 broadcast addresses (`host_broadcasts`)."""
    ip = ipaddress.ip_address(answer)
    mapped = isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None
    if ip.version != family or mapped:
        return f"not an IPv{family} address, the listeners' family"
    for kind, refused in REFUSED:
        if refused(ip, broadcasts):
            return kind
    return None


def host_broadcasts() -> frozenset[ipaddress.IPv4Address]:
    """The broadcast address of each IPv4 network this host has an address in, from its
    interfaces (ifaddr: getifaddrs(3)); a /31 or /32 has none."""
    found = set()
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str) and ip.network_prefix <= 30:
                network = ipaddress.IPv4Network(f"{ip.ip}/{ip.network_prefix}", strict=False)
                found.add(network.broadcast_address)
    return frozenset(found)


class _Answers(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.queue.put_nowait(data)


async def mapped_address(
    server: tuple[str, int], bind_ip: str, timeouts: Sequence[float] = PROBE_TIMEOUTS
) -> str:
    """The address a STUN `server` (host, port) sees a Binding request from `bind_ip` (any
    port) come from: its XOR-MAPPED-ADDRESS (or MAPPED-ADDRESS), unchecked. The socket is
    connected to the server: the kernel drops what another source sends. DiscoveryError when
    the server does not resolve or answer within the tries of `timeouts`."""
    loop = asyncio.get_running_loop()
    family = socket.AF_INET6 if ":" in bind_ip else socket.AF_INET
    host, port = server
    try:
        infos = await loop.getaddrinfo(host, port, family=family, type=socket.SOCK_DGRAM)
    except OSError as exc:
        raise DiscoveryError(f"cannot resolve {host}: {exc}") from None
    target = (str(infos[0][4][0]), int(infos[0][4][1]))
    request = Message(Method.BINDING, Class.REQUEST)
    try:
        transport, answers = await loop.create_datagram_endpoint(
            _Answers, local_addr=(bind_ip, 0), remote_addr=target, family=family
        )
    except OSError as exc:
        raise DiscoveryError(f"cannot bind {bind_ip}: {exc.strerror or exc}") from None
    try:
        for timeout in timeouts:
            transport.sendto(request.encode())
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
    if (
        message.transaction_id != transaction_id
        or message.method != Method.BINDING
        or message.message_class != Class.SUCCESS
    ):
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
        self.discovered: str | None = None  # the address adopted (two agreeing answers)
        self._warned: set[str] = set()  # the kinds of trouble logged as a WARNING
        self._task: asyncio.Task[None] | None = None

    def patched(self, config: StunnerConfig) -> StunnerConfig:
        """`config` with the discovered address where it has the pod's (unchanged until one
        is discovered)."""
        if self.discovered is None:
            return config
        return patch(config, self.pod_address, self.discovered)

    def follow(self, config: StunnerConfig, changed: Callable[[], Awaitable[None]]) -> None:
        """Start asking, in the background, if `config` has listeners at the pod address and
        no question is under way yet; `changed` is awaited whenever an address is adopted
        (see the module)."""
        if self._task is not None:
            return
        if not discovery_listeners(config, self.pod_address):
            return
        self._task = asyncio.get_running_loop().create_task(self._ask(changed))
        self._task.add_done_callback(_report)

    async def _ask(self, changed: Callable[[], Awaitable[None]]) -> None:
        bind_ip, _ = local_bind_address(self.pod_address, self.pod_address)
        family = ipaddress.ip_address(self.pod_address).version
        candidate: str | None = None  # an answer that differs from `discovered`, to confirm
        while True:
            answer = await self._answer(bind_ip, family)
            delay = self.retry_after if self.discovered is None else self.recheck_after
            if answer is None:  # none, or refused: a change starts over
                candidate = None
            elif answer == candidate:
                self._adopt(answer, bind_ip)
                candidate, delay = None, self.recheck_after
                await changed()
            elif candidate is not None:  # the two disagree
                self._warn_once(
                    "unconfirmed",
                    "relay address discovery: STUN server %s answered %s, then %s: a change "
                    "needs two agreeing answers, the relay address stays %s",
                    self.server_text,
                    candidate,
                    answer,
                    self.discovered or self.pod_address,
                )
                candidate = None if answer == self.discovered else answer
            elif answer == self.discovered:
                self._warned.clear()  # a clean confirmation: the server answers well again
            else:
                candidate, delay = answer, 0.0  # a new address: ask again at once to confirm
            await asyncio.sleep(delay)

    async def _answer(self, bind_ip: str, family: int) -> str | None:
        """One question's answer, when the server gave one that can be a relay address; else
        None (logged)."""
        try:
            found = await mapped_address(self.server, bind_ip, self.timeouts)
        except DiscoveryError as exc:
            if self.discovered is not None:  # a re-check: the last answer stays
                log.debug("relay address discovery: re-check failed: %s", exc)
                return None
            self._warn_once(
                "no answer",
                "relay address discovery: STUN server %s: %s (from %s); the relay address stays "
                "the pod's own, %s (likely private); asking again every %gs",
                self.server_text,
                exc,
                bind_ip,
                self.pod_address,
                self.retry_after,
            )
            return None
        refused = refusal(found, family, host_broadcasts())
        if refused is not None:
            self._warn_once(
                refused,
                "relay address discovery: STUN server %s answered %s, %s: refused, the relay "
                "address stays %s",
                self.server_text,
                found,
                refused,
                self.discovered or self.pod_address,
            )
        return found if refused is None else None

    def _adopt(self, address: str, bind_ip: str) -> None:
        self._warned.clear()
        if self.discovered is None:
            log.info(
                "relay address discovery: STUN server %s sees %s as %s, twice: the relay "
                "address of the listeners at %s, whose sockets stay there",
                self.server_text,
                bind_ip,
                address,
                self.pod_address,
            )
        else:
            log.warning(
                "relay address discovery: STUN server %s now sees %s as %s (was %s), twice: "
                "the listeners at %s restart with the new relay address",
                self.server_text,
                bind_ip,
                address,
                self.discovered,
                self.pod_address,
            )
        self.discovered = address

    def _warn_once(self, kind: str, message: str, *args: object) -> None:
        """Log `message` as a WARNING the first time trouble of this `kind` comes, at DEBUG
        after that until the server answers well again."""
        log.log(logging.DEBUG if kind in self._warned else logging.WARNING, message, *args)
        self._warned.add(kind)

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
