"""Is a mapped file a Node.js binary (or libnode) with V8's debugger metadata, which V8, and where
its builtins are.

A file is a candidate by its name (``node``, ``nodejs``, ``node20``, ``nsolid``, ``libnode.so.*``)
and is confirmed by its ``v8dbg_*`` symbols (initialized int32 data, read from the file: they are
constants) and the version V8 records in ``v8::internal::Version``. The builtins V8 embeds in the
binary (``v8_Default_embedded_blob_code_``, its size in ``..._size_``) hold the interpreter: a
JavaScript frame that runs there runs bytecode. Addresses are ELF virtual addresses."""

from __future__ import annotations

import dataclasses
import os
import re
import struct
from dataclasses import dataclass

from ..elf.bounded import BoundedElf
from ..elf.symbols import defined_symbols, load_segments, read_at
from .layout import CodeLayout, UnknownLayout, V8Layout, canonical_names

_NAME = re.compile(r"(node(js)?\d*|nsolid|libnode\.so(\.\d+)*)")
PREFIX = "v8dbg_"
BUILTINS = "v8_Default_embedded_blob_code_"
BUILTINS_SIZE = "v8_Default_embedded_blob_code_size_"
# Up to V8 10, the name above is a pointer (in .data) to the builtins, which are this symbol.
BUILTINS_DATA = "v8_Default_embedded_blob_code_data_"
_VERSION = tuple(f"_ZN2v88internal7Version6{part}_E" for part in ("major", "minor", "build"))
# uint8_t Bytecodes::kBytecodeSizes[3][kBytecodeCount]: each bytecode's size with its operands, at
# each operand scale (the walk through a function's bytecodes that baseline code's pcs need).
BYTECODE_SIZES = "_ZN2v88internal11interpreter9Bytecodes14kBytecodeSizesE"
MAX_BYTECODE_KINDS = 256  # (a bytecode is one byte: a larger table is not this one)


def may_be_node(path: str) -> bool:
    return bool(_NAME.fullmatch(os.path.basename(path)))


@dataclass(frozen=True)
class V8Build:
    path: str
    version: tuple[int, int, int]
    layout: V8Layout | None  # None: refused (``refusal`` says why)
    builtins: tuple[int, int]  # (ELF virtual address, size) of the embedded builtins
    segments: tuple[tuple[int, int, int, int], ...]  # PT_LOAD (p_offset, p_filesz, p_vaddr, p_flags)
    refusal: str = ""
    code_layout: CodeLayout | None = None  # None: the functions inlined into optimized code are not read

    def builtins_file_range(self) -> tuple[int, int] | None:
        """The builtins' [start, end) as offsets in the file."""
        start, size = self.builtins
        for p_offset, p_filesz, p_vaddr, _flags in self.segments:
            if p_vaddr <= start < p_vaddr + p_filesz:
                return start - p_vaddr + p_offset, start - p_vaddr + p_offset + size
        return None


def detect_v8(path: str, fd: int) -> V8Build | None:
    """The V8 in the file open on ``fd`` (mapped at ``path``), or None when it is not one (or is
    unreadable). A V8 whose layout is not known comes back with ``layout`` None and why."""
    if not may_be_node(path):
        return None
    with os.fdopen(os.dup(fd), "rb", buffering=1 << 16) as stream:
        try:
            return _read(path, BoundedElf(stream))
        except Exception:  # noqa: BLE001 - the file is the process's to write; pyelftools raises many kinds
            return None


def detect_file(path: str, fd: int, _open_debug) -> V8Build | None:
    """detect_v8 as symbols/detection.py's readers are called (in its helper process)."""
    return detect_v8(path, fd)


def _read(path: str, elf: BoundedElf) -> V8Build | None:
    segments = load_segments(elf)
    sizes: dict[str, int] = {}
    symbols = defined_symbols(elf, (BUILTINS, BUILTINS_DATA, BUILTINS_SIZE, BYTECODE_SIZES, *_VERSION), (PREFIX,), sizes)

    def int32(name: str) -> int | None:
        data = read_at(elf, segments, symbols[name], 4) if name in symbols else None
        return struct.unpack("<i", data)[0] if data is not None else None

    values = {name[len(PREFIX):]: int32(name) for name in symbols if name.startswith(PREFIX)}
    values = canonical_names({name: value for name, value in values.items() if value is not None})
    version = tuple(int32(name) for name in _VERSION)
    if not values or None in version or BUILTINS not in symbols or BUILTINS_SIZE not in symbols:
        return None
    builtins = (symbols.get(BUILTINS_DATA, symbols[BUILTINS]), int32(BUILTINS_SIZE) or 0)
    code_layout = CodeLayout.from_symbols(values, version)
    if code_layout is not None:
        code_layout = dataclasses.replace(code_layout, bytecode_sizes=_bytecode_sizes(elf, segments, symbols, sizes))
    try:
        return V8Build(path, version, V8Layout.from_symbols(values, version), builtins, segments, code_layout=code_layout)
    except UnknownLayout as refusal:
        return V8Build(path, version, None, builtins, segments, refusal=str(refusal))


def _bytecode_sizes(elf: BoundedElf, segments, symbols: dict[str, int], sizes: dict[str, int]) -> tuple[bytes, bytes, bytes] | None:
    """The three rows of Bytecodes::kBytecodeSizes (single, double and quadruple operand scale),
    or None where the binary does not have the table's symbol."""
    size = sizes.get(BYTECODE_SIZES, 0)
    if BYTECODE_SIZES not in symbols or not 0 < size <= 3 * MAX_BYTECODE_KINDS or size % 3:
        return None
    data = read_at(elf, segments, symbols[BYTECODE_SIZES], size)
    if data is None:
        return None
    count = size // 3
    return data[:count], data[count:2 * count], data[2 * count:]
