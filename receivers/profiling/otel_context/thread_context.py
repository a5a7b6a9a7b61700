"""Where a process keeps its OpenTelemetry thread context (OTEP 4947), for the kernel to read.

An SDK exports the TLS variable ``otel_thread_ctx_v1`` in the .dynsym of the executable or of one
of its libraries: in each thread, a pointer to the record of the span the thread runs in. The BPF
program reads it at sample time, so what it needs is where the variable is relative to the
sampled thread's thread pointer (x86-64's fs base), in one of two forms:

- static TLS: at ``tp + tp_offset`` in every thread. The executable's own variable (local-exec:
  its block ends at the thread pointer, TLS variant II), a library's reached by initial-exec (its
  GOT holds the offset, R_X86_64_TPOFF64) or by a TLS descriptor that the dynamic linker resolved
  to static TLS (R_X86_64_TLSDESC: the GOT pair is (resolver, offset), the offset negative);
- dynamic TLS (a library loaded by dlopen): in the block the thread's DTV holds for the module,
  ``dtv[module] + offset``; the GOT holds (module, offset) for a general dynamic reference
  (R_X86_64_DTPMOD64 then DTPOFF64), or the descriptor's argument points at them (TLSDESC).

A TLS descriptor is resolved lazily, by the first thread that reads the variable: until then its
argument points into the library's relocations, and the location is not known yet (`locate`
returns None: ask again later). The GOT and the arguments are the process's memory, so each value
is checked for being plausible before it is used.
"""

from __future__ import annotations

import os
import struct
from array import array
from dataclasses import dataclass

from ..elf.bounded import (PT_LOAD, PT_TLS, SHT_RELA, SYMBOL_TABLE_TYPES, BoundedElf, count, read_region, regions, section_at, section_data,
                           section_headers, section_named, segment_headers)
from ..elf.symbols import MAX_STRING_TABLE_BYTES, name_offsets
from ..processes.memory import ProcessMemory
from ..processes.proc import Mapping

SYMBOL = "otel_thread_ctx_v1"
# threadlocal.schema_version values whose thread records this reader knows (OTEP 4947).
SCHEMAS = ("tlsdesc_v1_dev", "tls_v1")

_R_X86_64_DTPMOD64, _R_X86_64_DTPOFF64, _R_X86_64_TPOFF64, _R_X86_64_TLSDESC = 16, 17, 18, 36
MAX_DYNAMIC_SYMBOLS = 1 << 19  # as symbols/elf_symbols.py's cap on a symbol table
# A module reaches its TLS variable through one GOT slot for each access model it uses (initial
# exec, a descriptor, general dynamic): one or two relocations. Only a file whose .dynsym defines
# the variable has its relocation tables read: libLLVM's hold 354,000 entries, libjvm's 100,000;
# a million take about 0.4 s to search.
MAX_RELOCATIONS = 16
MAX_RELOCATION_ENTRIES = 1 << 20
_LOCATING = (_R_X86_64_TPOFF64, _R_X86_64_TLSDESC, _R_X86_64_DTPMOD64)
_SYM = struct.Struct("<IBBHQQ")  # Elf64_Sym
_RELA = struct.Struct("<QQq")  # Elf64_Rela: r_offset, r_info, r_addend
_STT_TLS = 6
_MAX_STATIC_OFFSET = 1 << 30  # static TLS lies within this of the thread pointer
_MAX_MODULES = 1 << 16
_MAX_BLOCK_OFFSET = 1 << 30
_PAGE = 4096


@dataclass(frozen=True)
class TlsLocation:
    """Where the variable is in a thread: ``tp + tp_offset`` (static), else ``dtv[module] + offset``."""

    tp_offset: int | None = None
    module: int = 0
    offset: int = 0


@dataclass(frozen=True)
class Definition:
    """What an ELF file says of the variable it defines."""

    value: int  # its offset in the module's TLS block
    tls_size: int  # PT_TLS: memory size, alignment and address
    tls_align: int
    tls_vaddr: int
    relocations: tuple[tuple[int, int], ...]  # (type, offset) of the relocations that reach it
    code_segments: tuple[tuple[int, int, int], ...]  # executable PT_LOADs: (offset, vaddr, size)


def read_definition(fd: int) -> Definition | None:
    """The definition of otel_thread_ctx_v1 in the ELF file open as ``fd``, or None when it has
    none (nearly every file: its name is not in .dynstr). Read within bounds (the file is the
    process's): a .dynsym of at most MAX_DYNAMIC_SYMBOLS entries, each relocation table's bytes
    once however many headers point at them, at most MAX_RELOCATION_ENTRIES entries of them and
    MAX_RELOCATIONS that reach the variable; a file past them has none (counted)."""
    with os.fdopen(os.dup(fd), "rb") as stream:
        elf = BoundedElf(stream)
        if elf["e_machine"] != "EM_X86_64" or elf.elfclass != 64 or not elf.little_endian:
            return None
        dynsym = section_named(elf, ".dynsym")
        if dynsym is None or dynsym.type not in SYMBOL_TABLE_TYPES:
            return None
        strings = section_at(elf, dynsym.link)
        if strings is None:
            return None
        if dynsym.size // _SYM.size > MAX_DYNAMIC_SYMBOLS or strings.size > MAX_STRING_TABLE_BYTES:
            count("dynamic_symbols_too_many")
            return None
        wanted = name_offsets(section_data(elf, strings, MAX_STRING_TABLE_BYTES), (SYMBOL,))
        if not wanted:
            return None
        # The symbol's index: the relocations name it by that.
        data = section_data(elf, dynsym, MAX_DYNAMIC_SYMBOLS * _SYM.size)
        index, value = next(((i, value) for i, (st_name, info, _other, shndx, value, _size) in enumerate(_SYM.iter_unpack(data[: len(data) // _SYM.size * _SYM.size]))
                             if st_name in wanted and info & 0xF == _STT_TLS and shndx != 0), (None, None))
        if index is None:
            return None
        tls = next((s for s in segment_headers(elf) if s.type == PT_TLS), None)
        if tls is None:
            return None
        relocations = _relocations(elf, dynsym.index, index)
        if relocations is None:
            return None
        code = tuple((s.offset, s.vaddr, s.filesz) for s in segment_headers(elf) if s.type == PT_LOAD and s.flags & 1)
        return Definition(value, tls.memsz, max(1, tls.align), tls.vaddr, tuple(relocations), code)


def _relocations(elf: BoundedElf, dynsym: int, index: int) -> list[tuple[int, int]] | None:
    """(type, offset) of the relocations of .dynsym's symbol ``index`` that say where it is, from
    the SHT_RELA tables linked to .dynsym (index ``dynsym``); None past the bounds (counted)."""
    spans = ((s.offset, s.size) for s in section_headers(elf) if s.type == SHT_RELA and s.link == dynsym)
    found, entries_left = [], MAX_RELOCATION_ENTRIES
    for offset, size in regions(spans):
        entries = size // _RELA.size
        if entries > entries_left:
            count("relocations_too_many")
            return None
        entries_left -= entries
        data = read_region(elf, offset, entries * _RELA.size)
        words = array("Q", data[: len(data) // _RELA.size * _RELA.size])  # (x86-64's order is this host's)
        infos = words[1::3]
        # r_info (the symbol's index and the type) looked for as a whole: the table is not
        # decoded entry by entry. In the table's order, as locate() takes them.
        here = []
        for kind in _LOCATING:
            at = _index(infos, index << 32 | kind, 0)
            while at is not None and len(found) + len(here) <= MAX_RELOCATIONS:
                here.append((at, kind, words[3 * at]))
                at = _index(infos, index << 32 | kind, at + 1)
        if len(found) + len(here) > MAX_RELOCATIONS:
            count("relocations_too_many")
            return None
        found += [(kind, got) for _at, kind, got in sorted(here)]
    return found


def _index(values: array, value: int, start: int) -> int | None:
    try:
        return values.index(value, start)
    except ValueError:
        return None


def locate(definition: Definition, mapping: Mapping, memory: ProcessMemory, *, main_program: bool,
           module_ranges: list[tuple[int, int]]) -> TlsLocation | None:
    """Where the variable is in the process's threads, or None when it cannot be told yet (a
    descriptor not resolved) or at all. ``mapping``: the module's executable mapping (its load
    bias); ``module_ranges``: the (start, end) of the module's mappings, where an unresolved
    descriptor's argument points."""
    bias = _bias(definition.code_segments, mapping)
    for kind, offset in definition.relocations:
        if bias is None:
            break
        got = bias + offset
        if kind == _R_X86_64_TPOFF64:
            return _static(_signed(memory.u64(got)))
        if kind == _R_X86_64_DTPMOD64:
            return _dynamic(memory.u64(got), memory.u64(got + 8))
        if kind == _R_X86_64_TLSDESC:
            _resolver, argument = struct.unpack("<QQ", memory.read(got, 16))
            if -_MAX_STATIC_OFFSET < _signed(argument) < 0:
                return _static(_signed(argument))
            if any(start <= argument < end for start, end in module_ranges):
                return None  # not resolved yet: the argument is still the relocation's address
            module, block_offset = struct.unpack("<QQ", memory.read(argument, 16))
            return _dynamic(module, block_offset)
    if main_program and not definition.relocations:
        # The executable's own variable (local-exec): module 1, its block the first below the
        # thread pointer, placed as glibc places it (x86-64 keeps the TCB above the TLS blocks).
        align = definition.tls_align
        first_byte = -definition.tls_vaddr & (align - 1)
        block = _round_up(definition.tls_size - first_byte, align) + first_byte
        return _static(definition.value - block)
    return None


def _static(tp_offset: int) -> TlsLocation | None:
    return TlsLocation(tp_offset=tp_offset) if -_MAX_STATIC_OFFSET < tp_offset < 0 else None


def _dynamic(module: int, offset: int) -> TlsLocation | None:
    return TlsLocation(module=module, offset=offset) if 0 < module < _MAX_MODULES and offset < _MAX_BLOCK_OFFSET else None


def _bias(segments: tuple[tuple[int, int, int], ...], mapping: Mapping) -> int | None:
    for offset, vaddr, size in segments:
        if offset - offset % _PAGE <= mapping.offset < offset + size:
            return mapping.start - mapping.offset - (vaddr - offset)
    return None


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _round_up(value: int, align: int) -> int:
    return (value + align - 1) // align * align


def parse_attributes(data: bytes, key_map: tuple[str, ...]) -> tuple[dict[str, str], bool]:
    """A record's attrs-data named by the process context's key map: entries of a key index (one
    byte), a length (one byte) and that many bytes of UTF-8, the last of a key winning (OTEP 4947).
    Also whether an index past the key map was seen (the map grew since it was read: read it
    again); such entries are left out, as is an entry cut short at the end."""
    attributes: dict[str, str] = {}
    unknown, at = False, 0
    while at + 2 <= len(data):
        index, length = data[at], data[at + 1]
        value = data[at + 2:at + 2 + length]
        if len(value) < length:
            break
        at += 2 + length
        if index < len(key_map):
            attributes[key_map[index]] = value.decode("utf-8", "replace")
        else:
            unknown = True
    return attributes, unknown
