"""The profiler's BPF program once clang is done with it: each function's instructions, the maps
they use, and the layouts user space reads them with. What the compile cache keeps
(program_cache.py) and the loader loads (loader.py); made by the compiler child (compiler.py).

The instructions refer to maps the way the kernel expects them at load time: a 64-bit immediate
load (``ld_imm64``) whose source register is BPF_PSEUDO_MAP_FD carries a map's file descriptor.
Those descriptors belong to the process that compiled the program, so they are kept as
references (instruction index -> map index) with the immediate zeroed, and the loader writes its
own descriptors there.

``from_json`` reads a cache file as untrusted input: anything malformed is a ValueError, never a
program loaded with a reference pointing somewhere else.
"""

from __future__ import annotations

import base64
import ctypes
import dataclasses
import json
import re
import sys

from receivers.profiling.kernel import ctypes_layout

FORMAT = 1
INSTRUCTION_SIZE = 8
LD_IMM64 = 0x18  # BPF_LD | BPF_IMM | BPF_DW: two instruction slots, the immediate's halves
PSEUDO_MAP_FD = 1  # its source register when the immediate is a map's file descriptor
MAX_INSTRUCTIONS = 1_000_000  # the verifier's own limit on a program
MAX_MAPS = 256
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class ProgramFormatError(ValueError):
    """A compiled program (a cache file, or what the compiler child wrote) that is not well formed."""


@dataclasses.dataclass(frozen=True)
class MapSpec:
    """One map the program declares, as BCC would create it."""

    name: str
    type: int  # enum bpf_map_type
    key_size: int
    value_size: int
    max_entries: int
    flags: int
    key: object  # ctypes_layout of a key
    value: object  # ... of a value (one CPU's, for a per-CPU map)
    event: object | None = None  # ... of an event a perf output map carries, when BCC derived one


@dataclasses.dataclass(frozen=True)
class FunctionSpec:
    name: str
    instructions: bytes  # map descriptors zeroed
    map_references: tuple[tuple[int, int], ...]  # (index of an ld_imm64, index in maps)


@dataclasses.dataclass(frozen=True)
class CompiledProgram:
    license: str
    kern_version: int
    maps: tuple[MapSpec, ...]
    functions: tuple[FunctionSpec, ...]

    def function(self, name: str) -> FunctionSpec:
        for function in self.functions:
            if function.name == name:
                return function
        raise KeyError(f"the program has no function {name!r}")

    def to_json(self) -> bytes:
        return json.dumps({
            "format": FORMAT, "license": self.license, "kern_version": self.kern_version,
            "maps": [dataclasses.asdict(spec) for spec in self.maps],
            "functions": [{"name": function.name, "instructions": base64.b64encode(function.instructions).decode(),
                           "map_references": [list(reference) for reference in function.map_references]}
                          for function in self.functions],
        }, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> CompiledProgram:
        try:
            return cls._from_json(data)
        except ProgramFormatError:
            raise
        except Exception as error:  # (deep nesting, sizes ctypes refuses: whatever a damaged file holds)
            raise ProgramFormatError(f"{type(error).__name__}: {error}") from error

    @classmethod
    def _from_json(cls, data: bytes) -> CompiledProgram:
        try:
            document = json.loads(data)
        except (ValueError, UnicodeDecodeError) as error:
            raise ProgramFormatError(f"not JSON: {error}") from error
        fields = _object(document, "program", {"format", "license", "kern_version", "maps", "functions"})
        if fields["format"] != FORMAT:
            raise ProgramFormatError(f"format {fields['format']!r}, this version reads {FORMAT}")
        maps = tuple(_map_spec(item) for item in _list(fields["maps"], "maps", MAX_MAPS))
        functions = tuple(_function_spec(item, len(maps)) for item in _list(fields["functions"], "functions", 64))
        for kind, names in (("map", [spec.name for spec in maps]), ("function", [function.name for function in functions])):
            if len(set(names)) != len(names):
                raise ProgramFormatError(f"a {kind} name is given twice")
        license = _text(fields["license"], "license")
        if not license.isascii() or not license.isprintable():
            raise ProgramFormatError("license: not printable ASCII")
        return cls(license, _integer(fields["kern_version"], "kern_version", 1 << 32),
                   maps, functions)


def references(instructions: bytes) -> list[tuple[int, int]]:
    """(index, immediate) of every ld_imm64 that loads a map descriptor; ProgramFormatError for an
    ld_imm64 of another kind (the loader knows no other relocation)."""
    if sys.byteorder != "little":  # (the register nibbles and immediates are read as x86-64 and arm64 lay them out)
        raise ProgramFormatError("compiled programs are read on little-endian hosts only")
    found = []
    index, count = 0, len(instructions) // INSTRUCTION_SIZE
    while index < count:
        at = index * INSTRUCTION_SIZE
        if instructions[at] == LD_IMM64:
            source = instructions[at + 1] >> 4
            if source not in (0, PSEUDO_MAP_FD):
                raise ProgramFormatError(f"instruction {index} loads a 64-bit immediate of kind {source}, "
                                         "which the loader does not relocate")
            if index + 1 >= count:
                raise ProgramFormatError(f"instruction {index}: a 64-bit immediate load cut short")
            if source == PSEUDO_MAP_FD:
                found.append((index, int.from_bytes(instructions[at + 4:at + 8], "little", signed=True)))
            index += 2
        else:
            index += 1
    return found


def with_immediates(instructions: bytes, values: dict[int, int]) -> bytes:
    """``instructions`` with the 32-bit immediate of instruction i set to values[i]."""
    patched = bytearray(instructions)
    for index, value in values.items():
        at = index * INSTRUCTION_SIZE + 4
        patched[at:at + 4] = value.to_bytes(4, "little", signed=True)
    return bytes(patched)


def _map_spec(item: object) -> MapSpec:
    fields = _object(item, "map", {field.name for field in dataclasses.fields(MapSpec)})
    name = _name(fields["name"], "map name")
    spec = MapSpec(name, _integer(fields["type"], f"map {name}: type", 64),
                   _integer(fields["key_size"], f"map {name}: key_size", 1 << 16, 1),
                   _integer(fields["value_size"], f"map {name}: value_size", 1 << 24, 1),
                   _integer(fields["max_entries"], f"map {name}: max_entries", 1 << 28, 1),
                   _integer(fields["flags"], f"map {name}: flags", 1 << 32),
                   fields["key"], fields["value"], fields["event"])
    try:
        key, value = ctypes_layout.build(spec.key), ctypes_layout.build(spec.value)
        if spec.event is not None:
            ctypes_layout.build(spec.event)
    except ctypes_layout.LayoutError as error:
        raise ProgramFormatError(f"map {name}: {error}") from error
    # The kernel writes key_size and value_size bytes into buffers of the layouts' sizes.
    if ctypes.sizeof(key) != spec.key_size or ctypes.sizeof(value) != spec.value_size:
        raise ProgramFormatError(f"map {name}: layouts of {ctypes.sizeof(key)} and {ctypes.sizeof(value)} bytes "
                                 f"for a key of {spec.key_size} and a value of {spec.value_size}")
    return spec


def _function_spec(item: object, map_count: int) -> FunctionSpec:
    fields = _object(item, "function", {"name", "instructions", "map_references"})
    name = _name(fields["name"], "function name")
    try:
        instructions = base64.b64decode(_text(fields["instructions"], f"function {name}: instructions"), validate=True)
    except ValueError as error:
        raise ProgramFormatError(f"function {name}: instructions are not base64") from error
    if not instructions or len(instructions) % INSTRUCTION_SIZE or len(instructions) > MAX_INSTRUCTIONS * INSTRUCTION_SIZE:
        raise ProgramFormatError(f"function {name}: {len(instructions)} bytes of instructions")
    given = [tuple(_list(reference, f"function {name}: reference", 2)) for reference in
             _list(fields["map_references"], f"function {name}: map_references", MAX_INSTRUCTIONS)]
    loads = {index for index, _ in references(instructions)}  # (ProgramFormatError for a kind it cannot place)
    found = {}
    for reference in given:
        if len(reference) != 2:
            raise ProgramFormatError(f"function {name}: reference {list(reference)!r}")
        index = _integer(reference[0], f"function {name}: reference", MAX_INSTRUCTIONS)
        found[index] = _integer(reference[1], f"function {name}: map index", map_count)
    if set(found) != loads:
        raise ProgramFormatError(f"function {name}: its map references do not match its map loads")
    return FunctionSpec(name, instructions, tuple(sorted(found.items())))


def _object(value: object, what: str, keys: set[str]) -> dict:
    if not isinstance(value, dict) or set(value) != keys:
        raise ProgramFormatError(f"{what}: expected the keys {sorted(keys)}")
    return value


def _list(value: object, what: str, most: int) -> list:
    if not isinstance(value, list) or len(value) > most:
        raise ProgramFormatError(f"{what}: not a list of at most {most}")
    return value


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ProgramFormatError(f"{what}: not a string")
    return value


def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ProgramFormatError(f"{what}: {value!r} is not a C identifier")
    return value


def _integer(value: object, what: str, below: int, least: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not least <= value < below:
        raise ProgramFormatError(f"{what}: {value!r} is not an integer in [{least}, {below})")
    return value
