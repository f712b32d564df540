"""Whole UDP frames (Ethernet, IPv4 or IPv6, UDP) built and checked byte by byte, for the tests
that run the offload program on packets (BPF_PROG_TEST_RUN): checksums computed here, from
the RFCs (791, 768, 8200), independently of the program under test."""

from __future__ import annotations

import ipaddress
import struct

Address = tuple[str, int]

ETHERTYPE = {4: 0x0800, 6: 0x86DD}
MAC_HEADER = bytes(12)  # as on the loopback interface: both addresses zero


def ones_complement_sum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def internet_checksum(data: bytes) -> int:
    return ~ones_complement_sum(data) & 0xFFFF


def _pseudo_header(src: bytes, dst: bytes, length: int, version: int) -> bytes:
    if version == 4:
        return src + dst + struct.pack("!BBH", 0, 17, length)
    return src + dst + struct.pack("!IxxxB", length, 17)


def udp_frame(
    src: Address,
    dst: Address,
    payload: bytes,
    *,
    ttl: int = 64,
    ident: int = 0x1234,
    tos: int = 0,
    udp_checksum: bool = True,
) -> bytes:
    """A frame from `src` to `dst` (one family), every checksum right (or the UDP one 0)."""
    source, destination = ipaddress.ip_address(src[0]), ipaddress.ip_address(dst[0])
    version = source.version
    assert destination.version == version, "one family per frame"
    length = 8 + len(payload)
    udp = struct.pack("!HHHH", src[1], dst[1], length, 0) + payload
    if udp_checksum:
        pseudo = _pseudo_header(source.packed, destination.packed, length, version)
        check = internet_checksum(pseudo + udp) or 0xFFFF
        udp = udp[:6] + struct.pack("!H", check) + udp[8:]
    if version == 4:
        header = struct.pack(
            "!BBHHHBBH4s4s",
            0x45,
            tos,
            20 + length,
            ident,
            0x4000,
            ttl,
            17,
            0,
            source.packed,
            destination.packed,
        )
        header = header[:10] + struct.pack("!H", internet_checksum(header)) + header[12:]
    else:
        header = struct.pack(
            "!IHBB16s16s",
            (6 << 28) | (tos << 20),
            length,
            17,
            ttl,
            source.packed,
            destination.packed,
        )
    return MAC_HEADER + struct.pack("!H", ETHERTYPE[version]) + header + udp


def checksums_valid(frame: bytes) -> bool:
    """Whether the IPv4 header checksum (when IPv4) and the UDP checksum of `frame` hold."""
    ethertype = struct.unpack_from("!H", frame, 12)[0]
    packet = frame[14:]
    if ethertype == ETHERTYPE[4]:
        header, udp = packet[:20], packet[20:]
        if ones_complement_sum(header) != 0xFFFF:
            return False
        src, dst, version = header[12:16], header[16:20], 4
    else:
        src, dst, udp, version = packet[8:24], packet[24:40], packet[40:], 6
    if version == 4 and udp[6:8] == b"\0\0":
        return True  # no checksum
    return ones_complement_sum(_pseudo_header(src, dst, len(udp), version) + udp) == 0xFFFF
