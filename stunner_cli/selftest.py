"""`stunner selftest`: the chart's `helm test`. For every Gateway config the CDS serves, through
each TURN-UDP and TURN-TCP listener's public address: allocate with a real TURN client, and,
given an echo peer a route admits, relay a few packets to it and back. A STUN-only Gateway
(auth type none) is tested for what it serves: a Binding request is answered and an Allocate
gets 403 (no relay, so no echo).

The echo peer is either one that runs elsewhere (`--peer IP:PORT`) or one the selftest runs
itself (`--echo IP:PORT`: bound on the port, reached at the address, which is how the chart's
test pod proves a relay with nothing but the chart: its test hooks route each Gateway named by
`--gateway` to the pod). Gateways named by `--gateway` must show up in the CDS, and a route to
the peer must reach their stunnerd, within `--timeout` seconds; with a peer and no `--gateway`,
every Gateway must echo.

`--target k8s://NS/SVC:PORT` (repeatable; Go STUNner v2's `mediactl` addresses Services so) is a
media check against a Service of the cluster that echoes UDP: its name is resolved as the pod
resolves any Service (`SVC.NS.svc.<--cluster-domain>`, the ClusterIP, or a headless Service's
first pod), and through every listener of the Gateways named by `--gateway` (every Gateway
without one) packets are relayed to it and must come back. A target no route admits fails
(403), and so does one that does not echo.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence

from stunner_api.cds import CONFIGS_PATH
from stunner_api.dataplane import StunnerConfig, uri_host_port, validate_config
from stunner_api.ice import credentials
from stunner_client.cds import CdsClient
from stunner_client.echo import EchoPeer
from stunner_client.turn import allocate, relay

from .targets import DEFAULT_CLUSTER_DOMAIN, Resolver, Target, resolve

TRANSPORTS = {"TURN-UDP": "udp", "TURN-TCP": "tcp"}
RETRY_PAUSE = 0.5  # seconds between two tries of a listener whose route is not there yet
ECHO_WAIT = 2.0  # seconds one try waits for the echoes


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def _fetch(cds: CdsClient, timeout: float) -> list[StunnerConfig]:
    # The chart runs this pod as the CDS's reader account, with its projected token
    # (STUNNER_CDS_TOKEN_FILE, which the CDS client reads).
    items = json.loads(cds.get(CONFIGS_PATH, timeout=timeout)).get("items", [])
    return [validate_config(item) for item in items]


def _testable(config: StunnerConfig) -> bool:
    return any(lc.protocol in TRANSPORTS and lc.public_address for lc in config.listeners)


async def _configs(cds_url: str, gateways: Sequence[str], deadline: float) -> list[StunnerConfig]:
    """The CDS's configs, once every named Gateway has a listener to test (or at the deadline)."""
    cds = CdsClient(cds_url)
    while True:
        configs = await asyncio.to_thread(_fetch, cds, max(1.0, deadline - time.monotonic()))
        ready = {c.admin.name for c in configs if _testable(c)}
        if set(gateways) <= ready or time.monotonic() >= deadline:
            return configs
        await asyncio.sleep(RETRY_PAUSE)


async def _try(
    transport: str, server: tuple[str, int], creds: tuple[str, str], peer: str, timeout: float
) -> str:
    """One allocation, and one echo through it when there is a peer."""
    if peer:
        result = await asyncio.wait_for(
            relay(transport, server, _address(peer), 5, creds, wait=min(ECHO_WAIT, timeout)),
            timeout + ECHO_WAIT,
        )
        if not result["received"]:
            raise RuntimeError(f"allocated {result['relayed_address']}, no echo from {peer}")
        return f"echoed {result['received']}/{result['sent']} via {result['relayed_address']}"
    return f"allocated {await allocate(transport, server, creds, timeout)}"


async def _ask(transport: str, server: tuple[str, int], requests: list[bytes]) -> list[bytes]:
    """Each request's answer, over one UDP socket or one TCP connection."""
    loop = asyncio.get_running_loop()
    answers = []
    if transport == "tcp":
        reader, writer = await asyncio.open_connection(*server)
        try:
            for request in requests:
                writer.write(request)
                header = await reader.readexactly(20)
                answers.append(header + await reader.readexactly(int.from_bytes(header[2:4])))
        finally:
            writer.close()
        return answers
    received: asyncio.Queue[bytes] = asyncio.Queue()

    class Client(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
            received.put_nowait(data)

    udp, _ = await loop.create_datagram_endpoint(Client, remote_addr=server)
    try:
        for request in requests:
            udp.sendto(request)
            answers.append(await received.get())
    finally:
        udp.close()
    return answers


async def _try_stun_only(transport: str, server: tuple[str, int], timeout: float) -> str:
    """A STUN-only listener: Binding answered with the mapped address, an Allocate refused 403."""
    from stunner_api import stun
    from stunner_api.stun import Class, Message, Method

    allocate = Message(Method.ALLOCATE, Class.REQUEST)
    allocate.attributes["REQUESTED-TRANSPORT"] = 17
    requests = [Message(Method.BINDING, Class.REQUEST).encode(), allocate.encode()]
    binding, refusal = [
        stun.parse_message(answer)
        for answer in await asyncio.wait_for(_ask(transport, server, requests), timeout)
    ]
    mapped = binding.attributes.get("XOR-MAPPED-ADDRESS")
    if binding.message_class != Class.SUCCESS or mapped is None:
        raise RuntimeError("the Binding request was not answered with a mapped address")
    code = refusal.attributes.get("ERROR-CODE", (0, ""))[0]
    if refusal.message_class != Class.ERROR or code != 403:
        raise RuntimeError(f"STUN only, yet an Allocate was answered {code or 'with success'}")
    return f"STUN only: Binding answered (mapped {mapped[0]}:{mapped[1]}), Allocate refused 403"


async def _probe(
    transport: str,
    server: tuple[str, int],
    creds: tuple[str, str] | None,
    peer: str,
    deadline: float,
) -> str:
    """`_try` until it succeeds or the deadline passes (the route may still be on its way);
    `_try_stun_only` when there are no credentials (a STUN-only Gateway)."""
    while True:
        left = max(1.0, deadline - time.monotonic())
        try:
            if creds is None:
                return await _try_stun_only(transport, server, left)
            return await _try(transport, server, creds, peer, left)
        except Exception:
            if time.monotonic() + RETRY_PAUSE >= deadline:
                raise
        await asyncio.sleep(RETRY_PAUSE)


async def _selftest(
    cds_url: str,
    peer: str,
    echo: str,
    gateways: Sequence[str],
    timeout: float,
    targets: Sequence[Target] = (),
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN,
) -> int:
    deadline = time.monotonic() + timeout
    echo_server = None
    if echo:
        echo_server = await EchoPeer.bind("0.0.0.0", _address(echo)[1])
        peer = echo
    try:
        configs = await _configs(cds_url, gateways, deadline)
        failed = await _run(configs, peer, gateways, deadline)
        for target in targets:
            failed |= await _check_target(configs, target, cluster_domain, gateways, deadline)
        return failed
    finally:
        if echo_server is not None:
            await echo_server.aclose()


Listener = tuple[str, str, tuple[str, int], tuple[str, str] | None]


def _listeners(config: StunnerConfig) -> list[Listener]:
    """(where, transport, server, credentials) of each TURN listener of a config that has a
    public address; no credentials for a STUN-only Gateway (it relays nothing)."""
    creds = (
        None
        if config.auth.stun_only
        else credentials(config.auth, "helm-test", 3600, int(time.time()))
    )
    out: list[Listener] = []
    for listener in config.listeners:
        transport = TRANSPORTS.get(listener.protocol)
        if transport is None or not listener.public_address:
            continue
        server = (listener.public_address, listener.public_port or listener.port)
        out.append(
            (f"{listener.name} {transport} {uri_host_port(*server)}", transport, server, creds)
        )
    return out


async def _check_target(
    configs: list[StunnerConfig],
    target: Target,
    cluster_domain: str,
    gateways: Sequence[str],
    deadline: float,
    resolver: Resolver = resolve,
) -> int:
    """The media check of one Service: 1 when it failed through some listener (or none)."""
    host = target.host(cluster_domain)
    try:
        address = await asyncio.to_thread(resolver, host, target.port)
    except OSError as e:
        sys.stdout.write(f"FAIL {target}: cannot resolve {host}: {e}\n")
        return 1
    listeners = [
        (where, transport, server, creds)
        for config in configs
        if not gateways or config.admin.name in gateways
        for where, transport, server, creds in _listeners(config)
        if creds is not None
    ]
    if not listeners:
        sys.stdout.write(f"FAIL {target}: no Gateway listener to reach it through\n")
        return 1
    failed = 0
    peer = f"{address}:{target.port}"
    for where, transport, server, creds in listeners:
        try:
            line = await _probe(transport, server, creds, peer, deadline)
            sys.stdout.write(f"ok   {target} ({peer}) via {where}: {line}\n")
        except Exception as e:
            failed = 1
            sys.stdout.write(f"FAIL {target} ({peer}) via {where}: {e or type(e).__name__}\n")
        sys.stdout.flush()
    return failed


async def _run(
    configs: list[StunnerConfig], peer: str, gateways: Sequence[str], deadline: float
) -> int:
    failures = tested = 0
    missing = set(gateways) - {c.admin.name for c in configs if _testable(c)}
    for name in sorted(missing):
        failures += 1
        sys.stdout.write(f"FAIL {name}: no TURN-UDP or TURN-TCP listener with a public address\n")
    for config in configs:
        echo_here = peer if not gateways or config.admin.name in gateways else ""
        for where, transport, server, creds in _listeners(config):
            tested += 1
            try:
                line = await _probe(transport, server, creds, echo_here, deadline)
                sys.stdout.write(f"ok   {where}: {line}\n")
            except Exception as e:
                failures += 1
                sys.stdout.write(f"FAIL {where}: {e or type(e).__name__}\n")
            sys.stdout.flush()
    if not tested and not missing:
        sys.stdout.write("FAIL no TURN-UDP or TURN-TCP listener with a public address\n")
        return 1
    return 1 if failures else 0


def selftest(
    cds_url: str,
    peer: str,
    timeout: float,
    echo: str = "",
    gateways: Sequence[str] = (),
    targets: Sequence[Target] = (),
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN,
) -> int:
    return asyncio.run(_selftest(cds_url, peer, echo, gateways, timeout, targets, cluster_domain))
