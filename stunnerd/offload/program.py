"""The offload program: read from the object the install compiled, loaded through the verifier.

relay.bpf.c is compiled by the install (setup.py, with clang's BPF target) into relay.bpf.o
beside this module; nothing compiled is in the repository. It holds two programs over the same
maps, one per hook (`HOOKS`: TC's section `tc`, XDP's `xdp`). `read_object` takes from it what
a loader needs for one hook (pyelftools reads the ELF): the program's instructions, its map
definitions (the `maps` section: type, key size, value size, entries, flags) and the
instructions that refer to them (relocations against map symbols). `load` creates the maps,
writes their descriptors into those instructions and loads the program; the kernel's verifier
decides, and its log comes back in the error when it refuses.

The descriptors (the program's, each map's) belong to the `LoadedProgram`: `close()` closes
them, and nothing is pinned, so a process that exits, however it exits, takes them with it.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from elftools.elf.elffile import ELFFile
from elftools.elf.relocation import RelocationSection
from elftools.elf.sections import SymbolTableSection

from . import bpf, layout

OBJECT = Path(__file__).with_name("relay.bpf.o")
MAP_DEFINITION = struct.Struct("=5I")  # relay.bpf.c's struct map_definition
INSTRUCTION_SIZE = 8
LOAD_IMM64 = 0x18
PSEUDO_MAP_FD = 1


class ObjectError(ValueError):
    """The object is not what this loader reads (a build that went wrong, or a mismatch)."""


@dataclass(frozen=True)
class Hook:
    """Where a program of the object runs: its ELF section, program type and kernel name."""

    section: str
    prog_type: int
    name: str


HOOKS = {
    "TC": Hook("tc", bpf.PROG_TYPE_SCHED_CLS, "stunner_relay"),
    "XDP": Hook("xdp", bpf.PROG_TYPE_XDP, "stunner_xdp"),
}


@dataclass(frozen=True)
class MapSpec:
    name: str
    map_type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int


@dataclass(frozen=True)
class ObjectFile:
    instructions: bytes
    license: str
    maps: tuple[MapSpec, ...]
    map_references: tuple[tuple[int, str], ...]  # (instruction index, map name)


def read_object(path: Path | None = None, section: str = "tc") -> ObjectFile:
    """The object's program in `section`, its maps and map references (`path`: the installed
    object)."""
    path = path or OBJECT
    with path.open("rb") as stream:
        elf = ELFFile(stream)
        program = elf.get_section_by_name(section)
        maps = elf.get_section_by_name("maps")
        license_section = elf.get_section_by_name("license")
        symbols = elf.get_section_by_name(".symtab")
        if program is None or maps is None or license_section is None:
            raise ObjectError(f"{path}: no {section!r}, 'maps' or 'license' section")
        if not isinstance(symbols, SymbolTableSection):
            raise ObjectError(f"{path}: no symbol table")
        maps_index = elf.get_section_index("maps")
        specs: dict[int, MapSpec] = {}
        for symbol in symbols.iter_symbols():
            if symbol["st_shndx"] != maps_index or symbol["st_info"]["type"] != "STT_OBJECT":
                continue
            offset = symbol["st_value"]
            values = MAP_DEFINITION.unpack_from(maps.data(), offset)
            specs[offset] = MapSpec(symbol.name, *values)
        references = []
        relocations = elf.get_section_by_name(f".rel{section}")
        if relocations is not None and not isinstance(relocations, RelocationSection):
            raise ObjectError(f"{path}: .rel{section} is no relocation section")
        for relocation in relocations.iter_relocations() if relocations else ():
            symbol = symbols.get_symbol(relocation["r_info_sym"])
            spec = specs.get(symbol["st_value"]) if symbol["st_shndx"] == maps_index else None
            if spec is None:
                raise ObjectError(f"{path}: a reference to {symbol.name!r}, which is no map")
            references.append((relocation["r_offset"] // INSTRUCTION_SIZE, spec.name))
        text = license_section.data().split(b"\0", 1)[0].decode()
        return ObjectFile(
            program.data(), text, tuple(specs[k] for k in sorted(specs)), tuple(references)
        )


def possible_cpus() -> int:
    """The kernel's per-CPU value count: the possible CPUs (0-N), not the online ones."""
    text = Path("/sys/devices/system/cpu/possible").read_text().strip()
    return max(int(part.split("-")[-1]) for part in text.split(",")) + 1


@dataclass
class BpfMap:
    """A map this process created: its descriptor and its shape."""

    spec: MapSpec
    fd: int

    @property
    def per_cpu(self) -> bool:
        return self.spec.map_type in bpf.PERCPU_MAP_TYPES

    def update(self, key: bytes, value: bytes) -> None:
        bpf.map_update(self.fd, key, value)

    def delete(self, key: bytes) -> bool:
        return bpf.map_delete(self.fd, key)

    def lookup(self, key: bytes) -> bytes | None:
        return bpf.map_lookup(self.fd, key, self.spec.value_size)

    def lookup_per_cpu(self, key: bytes) -> list[bytes]:
        """A per-CPU map's values for `key`, one per possible CPU."""
        stride = (self.spec.value_size + 7) // 8 * 8
        packed = bpf.map_lookup(self.fd, key, stride * possible_cpus()) or b""
        return [packed[i : i + self.spec.value_size] for i in range(0, len(packed), stride)]

    def keys(self) -> list[bytes]:
        return list(bpf.map_keys(self.fd, self.spec.key_size))


@dataclass
class LoadedProgram:
    fd: int
    maps: dict[str, BpfMap] = field(default_factory=dict)
    hook: str = "TC"

    def close(self) -> None:
        for descriptor in [self.fd, *(m.fd for m in self.maps.values())]:
            if descriptor >= 0:
                os.close(descriptor)
        self.fd = -1
        self.maps.clear()

    def outcomes(self) -> dict[str, int]:
        """The kernel's count of each outcome, over every CPU."""
        counts = self.maps["outcomes"]
        return {
            name: sum(
                int.from_bytes(v, "little") for v in counts.lookup_per_cpu(layout.SLOT.pack(i))
            )
            for i, name in enumerate(layout.OUTCOMES)
        }


def load(
    path: Path | None = None, entries: Mapping[str, int] | None = None, hook: str = "TC"
) -> LoadedProgram:
    """Creates the maps (with `entries` overriding a map's size) and loads the program for
    `hook` (a key of HOOKS).

    Raises ObjectError for an object this loader cannot read, BpfError for what the kernel
    refuses (`.log` holds the verifier's reasons)."""
    path = path or OBJECT
    kind = HOOKS[hook]
    obj = read_object(path, kind.section)
    for spec in obj.maps:
        expected = layout.KEY_AND_VALUE.get(spec.name)
        if expected is not None and expected != (spec.key_size, spec.value_size):
            raise ObjectError(
                f"{path}: map {spec.name} has key/value sizes {spec.key_size}/{spec.value_size},"
                f" stunnerd.offload.layout expects {expected[0]}/{expected[1]}"
            )
    loaded = LoadedProgram(-1, hook=hook)
    try:
        for spec in obj.maps:
            size = (entries or {}).get(spec.name, spec.max_entries)
            fd = bpf.map_create(
                spec.map_type, spec.key_size, spec.value_size, size, spec.flags, spec.name
            )
            loaded.maps[spec.name] = BpfMap(MapSpec(**{**spec.__dict__, "max_entries": size}), fd)
        instructions = bytearray(obj.instructions)
        for index, name in obj.map_references:
            at = index * INSTRUCTION_SIZE
            if instructions[at] != LOAD_IMM64:
                raise ObjectError(f"{path}: instruction {index} refers to {name} but is no load")
            registers = instructions[at + 1]
            instructions[at + 1] = (registers & 0x0F) | (PSEUDO_MAP_FD << 4)
            struct.pack_into("=i", instructions, at + 4, loaded.maps[name].fd)
        loaded.fd = bpf.prog_load(kind.prog_type, bytes(instructions), obj.license, kind.name)
    except BaseException:
        loaded.close()
        raise
    return loaded
