"""The WebRTC echo media server: a media-server stand-in for a browser's call through STUNner.

It answers a browser's offer and sends back what it receives: every media track (decoded and
encoded again, as a media server's loopback does) and every data-channel message. It gathers
host candidates only (a media server in a cluster is reached through the relay), so a browser
that allows relay candidates only reaches it through a TURN server whose route admits it. Its
host candidates are this machine's IPv4 addresses but 127.0.0.1 (aioice, aiortc's ICE, leaves
that one out): `media_addresses()` lists them, for a route to admit; traffic to them stays on
this machine (the kernel delivers a packet to its own address locally).

aiortc is the WebRTC stack (ICE, DTLS-SRTP, SCTP, VP8/H.264 through PyAV): a well-kept library
where our own would be thousands of lines; the demo extra installs it, the images do not.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import ifaddr
from aiortc import MediaStreamTrack, RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaRelay

ENDED = ("failed", "closed")
ICE_LEAVES_OUT = "127.0.0.1"


def media_addresses() -> list[str]:
    """The IPv4 addresses the media server's ICE gathers host candidates on (aioice's choice:
    every interface's, but 127.0.0.1)."""
    return sorted(
        {
            str(ip.ip)
            for adapter in ifaddr.get_adapters()
            for ip in adapter.ips
            if isinstance(ip.ip, str) and ip.ip != ICE_LEAVES_OUT
        }
    )


class MediaEcho:
    """Answers offers; each answered peer connection echoes until it fails, closes or `aclose`."""

    def __init__(self) -> None:
        self._relay = MediaRelay()
        self._peers: set[RTCPeerConnection] = set()

    @property
    def calls(self) -> int:
        """Peer connections answered and not yet ended."""
        return len(self._peers)

    async def answer(self, sdp: str, kind: str = "offer") -> dict[str, str]:
        """The answer ({"sdp", "type"}) to an offer; the call runs on in the background."""
        if kind != "offer":
            raise ValueError(f"expected an offer, got {kind!r}")
        peer = RTCPeerConnection()
        self._peers.add(peer)

        @peer.on("track")
        def echo_track(track: MediaStreamTrack) -> None:
            peer.addTrack(self._relay.subscribe(track))

        @peer.on("datachannel")
        def echo_channel(channel: RTCDataChannel) -> None:
            @channel.on("message")
            def echo_message(message: str | bytes) -> None:
                channel.send(message)

        @peer.on("connectionstatechange")
        async def ended() -> None:
            if peer.connectionState in ENDED:
                await self._close(peer)

        try:
            await peer.setRemoteDescription(RTCSessionDescription(sdp=sdp, type=kind))
            await peer.setLocalDescription(await peer.createAnswer())
        except Exception:
            await self._close(peer)
            raise
        local = peer.localDescription
        return {"sdp": local.sdp, "type": local.type}

    async def _close(self, peer: RTCPeerConnection) -> None:
        self._peers.discard(peer)
        with contextlib.suppress(Exception):
            await peer.close()

    async def aclose(self) -> None:
        await asyncio.gather(*(self._close(peer) for peer in list(self._peers)))


def offer_of(body: Any) -> tuple[str, str]:
    """(sdp, type) of a POSTed offer, or ValueError naming what is wrong."""
    if not isinstance(body, dict):
        raise ValueError("the body is not a JSON object")
    sdp, kind = body.get("sdp"), body.get("type")
    if not isinstance(sdp, str) or not sdp.startswith("v=0"):
        raise ValueError("sdp: not a session description")
    if kind != "offer":
        raise ValueError(f"type: expected 'offer', got {kind!r}")
    return sdp, kind
