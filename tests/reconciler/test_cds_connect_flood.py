"""The CDS under a connect flood (the red team's finding B): its listen queue must not
overflow, so honest stunnerds connect and watch without waiting for a SYN retransmission.

Before, the CDS listened with a backlog of 128 and accepted one connection per turn of the
event loop, awaiting each one's transport before the next accept: a flood of connections from
one source (refused past its per-source cap, but each accepted first) filled the queue, the
kernel dropped honest SYNs, and honest connects waited for TCP's retransmission (1 s, then 3 s:
p99 up to 4.36 s, 1 of 5 watches timed out). A flood (tests/support/flood.py, `connect`) runs
while honest clients from other IPs connect in rounds and five stunnerd-like watchers open a
watch each; what is counted is honest connections whose SYN had to be retransmitted (TCP_INFO,
tcpi_total_retrans: the server's queue dropped it) and watches that got their config.
"""

from __future__ import annotations

import asyncio
import socket
import struct

import aiohttp

from reconciler.cds.server import CDS_LIMITS, cds_app
from reconciler.cds.store import ConfigStore
from stunner_http.server import LIMITS_KEY, serve
from tests.reconciler.test_cds import make_config
from tests.support import flood

ID = "ns1/gw-a"
WATCH = f"/api/v1/configs/{ID}?watch=true"
FLOOD_RATE = 8000  # connections/s from one source IP
FLOOD_SECONDS = 60  # at most; stopped once the honest clients are done
ROUNDS, PER_ROUND = 6, 8  # honest connects
FLOOD_STEP = 1000  # flood connections accepted (or refused) before each round
WATCHERS = 5
WATCH_WAIT = 15.0  # seconds a watcher waits for its config (a lost watch: never)
TCPI_TOTAL_RETRANS = 100  # struct tcp_info: 8 bytes, then tcpi_total_retrans the 24th u32


async def retransmitted_syns(port: int, ip: str) -> int:
    """Connect from `ip`; how many segments TCP retransmitted to get there (SYNs)."""
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)
        sock.bind((ip, 0))
        await loop.sock_connect(sock, ("127.0.0.1", port))
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        return int(struct.unpack_from("I", info, TCPI_TOTAL_RETRANS)[0])


async def watched(url: str, ip: str) -> bool:
    """A watch from `ip` that receives its config."""
    connector = aiohttp.TCPConnector(local_addr=(ip, 0))
    async with aiohttp.ClientSession(connector=connector) as session:
        try:
            async with asyncio.timeout(WATCH_WAIT):
                async with session.ws_connect(url) as ws:
                    return "realm" in await ws.receive_str()
        except TimeoutError:
            return False


def test_a_connect_flood_leaves_honest_connects_and_watches_through() -> None:
    async def main() -> None:
        store = ConfigStore()
        store.set(ID, make_config(ID, realm="v0"))
        app = cds_app(store)
        app[LIMITS_KEY] = CDS_LIMITS
        async with serve(app) as served:
            url = served.address.replace("http://", "ws://") + WATCH
            flooder = await asyncio.to_thread(
                flood.start, served.port, FLOOD_RATE, FLOOD_SECONDS, 1, "connect"
            )
            try:
                watches = [
                    asyncio.create_task(watched(url, f"127.0.0.{10 + i}")) for i in range(WATCHERS)
                ]
                retransmits = []
                for round in range(ROUNDS):
                    # Each round once the flood has made another FLOOD_STEP connections.
                    while served.stats.accepted + served.stats.refused < (round + 1) * FLOOD_STEP:
                        assert flooder.poll() is None, "the flood ended before the rounds"
                        await asyncio.sleep(0.01)
                    retransmits += await asyncio.gather(
                        *(
                            retransmitted_syns(served.port, f"127.0.1.{1 + round * PER_ROUND + i}")
                            for i in range(PER_ROUND)
                        )
                    )
                received = await asyncio.gather(*watches)
                flooding = flooder.poll() is None
            finally:
                flooder.terminate()
                await asyncio.to_thread(flooder.communicate)
            assert flooding, "the flood ended first: it did not overlap the honest clients"
            assert received == [True] * WATCHERS
            assert sum(retransmits) == 0, retransmits
            assert served.stats.refused > 0  # the flood was there, past its source's cap

    asyncio.run(main())
