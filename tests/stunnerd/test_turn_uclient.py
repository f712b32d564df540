"""coturn's own test client against stunnerd: `turnutils_uclient` in its default mode.

By default it opens an RTP/RTCP pair per client: the first Allocate carries EVEN-PORT with the
R bit, the second the RESERVATION-TOKEN it got back (RFC 8656 §7.2, §14.6, §14.9). Skipped where
coturn's client is not installed (`apt-get install coturn`); the raw-client tests in
test_turn_protocol.py cover the same exchange everywhere.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil

import pytest

from tests.support.turnclient import (
    HOST,
    PASSWORD,
    USERNAME,
    Peer,
    free_port,
    make_config,
    running_stunner,
    start_peer,
)

pytestmark = pytest.mark.usefixtures("relay_path")  # both relay paths: conftest.py

UCLIENT = shutil.which("turnutils_uclient")
MESSAGES = 5

pytestmark = pytest.mark.skipif(UCLIENT is None, reason="coturn's turnutils_uclient is absent")


async def peer_pair() -> tuple[Peer, Peer]:
    """Echo peers on an even port and the next one: uclient sends RTCP to the peer port + 1."""
    for _ in range(50):
        rtp = await start_peer()
        if rtp.port % 2 == 0:
            try:
                return rtp, await start_peer(port=rtp.port + 1)
            except OSError:
                pass
        rtp.close()
    raise RuntimeError("no free pair of peer ports")


@pytest.mark.parametrize("flags", [[], ["-s"]], ids=["channel-data", "send-indications"])
def test_uclient_default_rtp_rtcp_pairs_relay_every_message(
    flags: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="stunner.turn")

    async def main() -> None:
        port, (peer, rtcp_peer) = free_port(), await peer_pair()
        config = make_config(port, [f"{HOST}/32"], protocols=("TURN-UDP",))
        async with running_stunner(config):
            assert UCLIENT is not None
            process = await asyncio.create_subprocess_exec(
                UCLIENT,
                *flags,
                *("-u", USERNAME, "-w", PASSWORD, "-p", str(port)),
                *("-e", HOST, "-r", str(peer.port), "-n", str(MESSAGES), "-m", "1", "-z", "5"),
                HOST,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            output, _ = await asyncio.wait_for(process.communicate(), 30)
            text = output.decode(errors="replace")
            assert process.returncode == 0, text
            totals = re.findall(r"tot_send_msgs=(\d+), tot_recv_msgs=(\d+)", text)
            assert totals[-1] == (str(2 * MESSAGES), str(2 * MESSAGES)), text  # RTP + RTCP
            assert "Total lost packets 0 " in text, text
            # The pair: an even relay port, and the reserved one after it taken with the token.
            relays = {int(p) for p in re.findall(r"relay 127\.0\.0\.1:(\d+)", caplog.text)}
            assert any(p % 2 == 0 and p + 1 in relays for p in relays), relays
            relayed_from = {addr[1] for _, addr in peer.received + rtcp_peer.received}
            assert relayed_from <= relays
        peer.close()
        rtcp_peer.close()

    asyncio.run(main())
