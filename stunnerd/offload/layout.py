"""The offload's map entries as bytes: relay.bpf.c's structs, packed and unpacked.

One table per map (`KEY_AND_VALUE`), checked against the object's own map definitions when it
loads (program.py), so a struct changed on one side only is a load error, not a silent miss.
Addresses are (host, port); an IPv4 address is stored IPv4-mapped, a port in network order.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

Address = tuple[str, int]

ENDPOINT = struct.Struct("=16s2s2x")
CLIENT_KEY = struct.Struct("=20s20s2s2x")  # client, listener, channel
PEER_KEY = struct.Struct("=20s20s")  # peer, relay
ROUTE = struct.Struct("=20s20sQII2s6x")  # source, destination, expiry, allocation, ifindex, channel
USAGE = struct.Struct("=4Q")
SLOT = struct.Struct("=I")

# map name -> (key size, value size), as relay.bpf.c declares them.
KEY_AND_VALUE = {
    "from_clients": (CLIENT_KEY.size, ROUTE.size),
    "from_peers": (PEER_KEY.size, ROUTE.size),
    "usage": (SLOT.size, USAGE.size),
    "outcomes": (SLOT.size, 8),
}

# relay.bpf.c's enum outcome, in order.
OUTCOMES = (
    "relayed_to_peer",
    "relayed_to_client",
    "passed_expired",
    "passed_not_loopback",
    "dropped_failed",
    "passed_partial_checksum",
    "passed_no_next_hop",
)

IPV4_MAPPED = b"\x00" * 10 + b"\xff\xff"


def endpoint(address: Address) -> bytes:
    host, port = address
    ip = ipaddress.ip_address(host)
    packed = IPV4_MAPPED + ip.packed if ip.version == 4 else ip.packed
    return ENDPOINT.pack(packed, port.to_bytes(2, "big"))


def address_of(packed: bytes) -> Address:
    raw, port = ENDPOINT.unpack(packed)
    ip = ipaddress.ip_address(raw[12:] if raw.startswith(IPV4_MAPPED) else raw)
    return str(ip), int.from_bytes(port, "big")


def is_ipv4(address: Address) -> bool:
    return ipaddress.ip_address(address[0]).version == 4


def client_key(client: Address, listener: Address, channel: int) -> bytes:
    return CLIENT_KEY.pack(endpoint(client), endpoint(listener), channel.to_bytes(2, "big"))


def peer_key(peer: Address, relay: Address) -> bytes:
    return PEER_KEY.pack(endpoint(peer), endpoint(relay))


@dataclass(frozen=True, slots=True)
class Route:
    """Where the kernel sends a matched datagram: from `source` to `destination`, while
    CLOCK_MONOTONIC is below `expires_ns`, counted in slot `allocation`, out of interface
    `ifindex` (0: a local destination); `channel` is the ChannelData header's, towards a
    client."""

    source: Address
    destination: Address
    expires_ns: int
    allocation: int
    ifindex: int = 0
    channel: int = 0

    def pack(self) -> bytes:
        return ROUTE.pack(
            endpoint(self.source),
            endpoint(self.destination),
            self.expires_ns,
            self.allocation,
            self.ifindex,
            self.channel.to_bytes(2, "big"),
        )

    @classmethod
    def unpack(cls, packed: bytes) -> Route:
        source, destination, expires_ns, allocation, ifindex, channel = ROUTE.unpack(packed)
        return cls(
            address_of(source),
            address_of(destination),
            expires_ns,
            allocation,
            ifindex,
            int.from_bytes(channel, "big"),
        )


@dataclass(frozen=True, slots=True)
class Usage:
    """What the kernel relayed for one allocation: packets and payload bytes each way."""

    to_peer_packets: int = 0
    to_peer_bytes: int = 0
    to_client_packets: int = 0
    to_client_bytes: int = 0

    @classmethod
    def unpack(cls, packed: bytes) -> Usage:
        return cls(*USAGE.unpack(packed))

    def since(self, earlier: Usage) -> Usage:
        return Usage(
            self.to_peer_packets - earlier.to_peer_packets,
            self.to_peer_bytes - earlier.to_peer_bytes,
            self.to_client_packets - earlier.to_client_packets,
            self.to_client_bytes - earlier.to_client_bytes,
        )
