"""The bpf(2) system call, the few commands the offload uses, through ctypes.

No libbpf: a fresh machine or image has none, and the offload needs only map create, lookup,
update, delete and walk, program load (with the verifier's log on a refusal), a test run, and a
link (tcx or XDP) that detaches when its last descriptor closes. Each command fills the part of
`union bpf_attr` it uses (linux/bpf.h), by offset; the kernel zero-extends a shorter attr.

Every descriptor returned is the caller's to close (`os.close`); none is ever pinned, so an
exited process leaves nothing behind.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from collections.abc import Iterator
from dataclasses import dataclass

# The bpf(2) system call's number on the architectures stunnerd's images are built for.
SYSCALL_NUMBERS = {"x86_64": 321, "aarch64": 280}

# Commands (enum bpf_cmd).
MAP_CREATE = 0
MAP_LOOKUP_ELEM = 1
MAP_UPDATE_ELEM = 2
MAP_DELETE_ELEM = 3
MAP_GET_NEXT_KEY = 4
PROG_LOAD = 5
PROG_TEST_RUN = 10
LINK_CREATE = 28

# The program types (enum bpf_prog_type) and attach types (enum bpf_attach_type) the offload
# uses, and an XDP link's modes (linux/if_link.h).
PROG_TYPE_SCHED_CLS = 3
PROG_TYPE_XDP = 6
ATTACH_XDP = 37
ATTACH_TCX_INGRESS = 46  # kernel 6.6
XDP_FLAGS_SKB_MODE = 1 << 1  # generic: on the skb, any interface
XDP_FLAGS_DRV_MODE = 1 << 2  # driver: before the skb, where the driver supports it

# Map types whose values are per CPU (enum bpf_map_type): PERCPU_HASH, PERCPU_ARRAY,
# LRU_PERCPU_HASH.
PERCPU_MAP_TYPES = frozenset({5, 6, 10})

ATTR_SIZE = 144  # union bpf_attr as far as these commands go
LOG_SIZE = 1 << 20

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class BpfError(OSError):
    """A bpf(2) command the kernel refused; `log` is the verifier's, for a program load."""

    def __init__(self, command: str, code: int, log: str = "") -> None:
        super().__init__(code, f"bpf {command}: {os.strerror(code)}")
        self.log = log

    def __str__(self) -> str:
        return str(self.strerror)  # without OSError's "[Errno N]" prefix: it is in the words


def syscall_number() -> int | None:
    return SYSCALL_NUMBERS.get(platform.machine())


def _call(command: int, name: str, attr: ctypes.Array[ctypes.c_char]) -> int:
    number = syscall_number()
    if number is None:
        raise BpfError(name, errno.ENOSYS)
    result = _libc.syscall(number, command, attr, len(attr))
    if result < 0:
        raise BpfError(name, ctypes.get_errno())
    return int(result)


def _attr() -> ctypes.Array[ctypes.c_char]:
    return ctypes.create_string_buffer(ATTR_SIZE)


def _address(buffer: ctypes.Array[ctypes.c_char] | None) -> int:
    return ctypes.addressof(buffer) if buffer is not None else 0


def map_create(
    map_type: int, key_size: int, value_size: int, max_entries: int, flags: int, name: str
) -> int:
    attr = _attr()
    struct.pack_into("=5I", attr, 0, map_type, key_size, value_size, max_entries, flags)
    struct.pack_into("=16s", attr, 28, name.encode()[:15])
    return _call(MAP_CREATE, "map create", attr)


Buffer = ctypes.Array[ctypes.c_char]


def _element(fd: int, key: bytes, value: Buffer | None, flags: int = 0) -> tuple[Buffer, Buffer]:
    attr = _attr()
    key_buffer = ctypes.create_string_buffer(key, len(key))
    struct.pack_into("=IIQQQ", attr, 0, fd, 0, _address(key_buffer), _address(value), flags)
    return attr, key_buffer


def map_update(fd: int, key: bytes, value: bytes, flags: int = 0) -> None:
    """BPF_ANY (0) by default: create or replace."""
    value_buffer = ctypes.create_string_buffer(value, len(value))
    attr, _key = _element(fd, key, value_buffer, flags)
    _call(MAP_UPDATE_ELEM, "map update", attr)


def map_lookup(fd: int, key: bytes, value_size: int) -> bytes | None:
    value_buffer = ctypes.create_string_buffer(value_size)
    attr, _key = _element(fd, key, value_buffer)
    try:
        _call(MAP_LOOKUP_ELEM, "map lookup", attr)
    except BpfError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise
    return value_buffer.raw


def map_delete(fd: int, key: bytes) -> bool:
    """Whether the key was there."""
    attr, _key = _element(fd, key, None)
    try:
        _call(MAP_DELETE_ELEM, "map delete", attr)
    except BpfError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise
    return True


def map_keys(fd: int, key_size: int) -> Iterator[bytes]:
    """Every key, in the map's order (a key deleted meanwhile restarts the walk, as the kernel
    does; the caller tolerates a key seen twice)."""
    current: bytes | None = None
    while True:
        next_buffer = ctypes.create_string_buffer(key_size)
        attr = _attr()
        key_buffer = ctypes.create_string_buffer(current, key_size) if current else None
        struct.pack_into("=IIQQ", attr, 0, fd, 0, _address(key_buffer), _address(next_buffer))
        try:
            _call(MAP_GET_NEXT_KEY, "map next key", attr)
        except BpfError as exc:
            if exc.errno == errno.ENOENT:
                return
            raise
        current = next_buffer.raw
        yield current


def prog_load(prog_type: int, instructions: bytes, license_text: str, name: str) -> int:
    """Loads through the verifier; a refusal raises BpfError with the verifier's log."""
    insns = ctypes.create_string_buffer(instructions, len(instructions))
    license_buffer = ctypes.create_string_buffer(license_text.encode())
    log = ctypes.create_string_buffer(LOG_SIZE)
    attr = _attr()
    struct.pack_into(
        "=IIQQIIQ",
        attr,
        0,
        prog_type,
        len(instructions) // 8,
        _address(insns),
        _address(license_buffer),
        1,
        LOG_SIZE,
        _address(log),
    )
    struct.pack_into("=16s", attr, 48, name.encode()[:15])
    try:
        return _call(PROG_LOAD, "program load", attr)
    except BpfError as exc:
        verifier = log.value.decode(errors="replace")
        raise BpfError("program load", exc.errno or errno.EINVAL, verifier) from None


@dataclass(frozen=True)
class TestRun:
    retval: int
    data: bytes
    duration_ns: int  # the kernel's average per run


SKB_CONTEXT_SIZE = 192  # struct __sk_buff
SKB_INGRESS_IFINDEX = 36  # its offsets
SKB_IFINDEX = 40
XDP_CONTEXT = struct.Struct("=6I")  # struct xdp_md: data, data_end, data_meta, ingress_ifindex,
# rx_queue_index, egress_ifindex


def prog_test_run(
    fd: int,
    data: bytes,
    repeat: int = 1,
    out_size: int = 4096,
    ingress_ifindex: int = 0,
    xdp: bool = False,
) -> TestRun:
    """BPF_PROG_TEST_RUN: the program (TC, or XDP with `xdp`) on `data` (a whole frame)
    `repeat` times, as if it had come in on interface `ingress_ifindex` (0: the kernel's
    choice)."""
    data_in = ctypes.create_string_buffer(data, len(data))
    data_out = ctypes.create_string_buffer(out_size)
    context = None
    if xdp and ingress_ifindex:
        packed = XDP_CONTEXT.pack(0, len(data), 0, ingress_ifindex, 0, 0)
        context = ctypes.create_string_buffer(packed, len(packed))
    elif ingress_ifindex:
        context = ctypes.create_string_buffer(SKB_CONTEXT_SIZE)
        struct.pack_into("=II", context, SKB_INGRESS_IFINDEX, ingress_ifindex, ingress_ifindex)
    attr = _attr()
    struct.pack_into(
        "=IIIIQQIIIIQQ",
        attr,
        0,
        fd,
        0,
        len(data),
        out_size,
        _address(data_in),
        _address(data_out),
        repeat,
        0,
        len(context) if context else 0,
        0,
        _address(context),
        0,
    )
    _call(PROG_TEST_RUN, "program test run", attr)
    retval, _, size_out = struct.unpack_from("=III", attr, 4)
    (duration,) = struct.unpack_from("=I", attr, 36)
    return TestRun(ctypes.c_int32(retval).value, data_out.raw[:size_out], duration)


def link_create(prog_fd: int, ifindex: int, attach_type: int, flags: int = 0) -> int:
    """A link of `prog_fd` to interface `ifindex`: it detaches when its last descriptor closes."""
    attr = _attr()
    struct.pack_into("=IIII", attr, 0, prog_fd, ifindex, attach_type, flags)
    return _call(LINK_CREATE, "link create", attr)
