"""Defined symbols of an ELF file picked by name, the initialized data they name, read from the
file, and where the file is loaded: what the runtime detectors (python/, v8/, hotspot/) look a
file up by."""

from __future__ import annotations

import struct
from collections.abc import Iterable

from .bounded import PT_LOAD, SYMBOL_TABLE_TYPES, BoundedElf, SectionTooLarge, section_at, section_data, segment_headers, sections_named

_SYM64 = struct.Struct("<IBBHQQ")  # Elf64_Sym, little-endian (x86-64)
# A symbol table is the file's to write, and the file is the process's: a larger table than these
# is not read (the file's .dynsym, or nothing, instead), so that reading one costs at most about
# 0.6 s and 80 MiB at its peak whatever the file holds (measured: 500,000 functions, 530 ms,
# 81 MiB). 524,288 entries are 12 MB of .symtab: six times libLLVM's functions. The symbolizer
# (symbols/elf_symbols.py) and the runtime detectors (python/, v8/, hotspot/) hold to them.
MAX_SYMBOL_ENTRIES = 1 << 19
MAX_STRING_TABLE_BYTES = 32 << 20
_PF_X = 1


def defined_symbols(elf: BoundedElf, names: Iterable[str] = (), prefixes: Iterable[str] = (), sizes: dict[str, int] | None = None,
                    tables: tuple[str, ...] = (".symtab", ".dynsym")) -> dict[str, int]:
    """name -> ELF virtual address of the defined symbols called one of ``names`` or starting with
    one of ``prefixes``, from ``tables`` in order (and their sizes into ``sizes``, if given); with
    no prefixes, the tables after the one where the last name was found are not read. The raw
    table is scanned for the string-table offsets that spell a wanted name (a name may share its
    bytes with the end of a longer one): pyelftools' lookup by name decodes every symbol, 0.3 s
    for libpython and 10 s for node."""
    out: dict[str, int] = {}
    if elf.elfclass != 64 or not elf.little_endian:
        return out  # the callers' offsets are x86-64's
    names, prefixes = list(names), [prefix.encode() for prefix in prefixes]
    found = {section.name: section for section in sections_named(elf, tables)}  # (the last of a name, as pyelftools took it)
    for section_name in tables:
        if names and not prefixes and all(name in out for name in names):
            break
        section = found.get(section_name)
        if section is None or section.type not in SYMBOL_TABLE_TYPES:
            continue
        strings = section_at(elf, section.link)
        if strings is None:
            continue  # (pyelftools raised: no table of names)
        if section.size // 24 > MAX_SYMBOL_ENTRIES or strings.size > MAX_STRING_TABLE_BYTES:
            continue  # (too large to read: the next table, or nothing)
        try:
            strtab = section_data(elf, strings, MAX_STRING_TABLE_BYTES)
            data = section_data(elf, section, MAX_SYMBOL_ENTRIES * 24)
        except SectionTooLarge:  # (compressed to say less than it holds)
            continue
        wanted = name_offsets(strtab, names)
        for prefix in prefixes:
            at = strtab.find(prefix)
            while at >= 0:
                end = strtab.find(b"\0", at)
                if end < 0:
                    break
                if at == 0 or strtab[at - 1] == 0:  # the start of a name, not the middle of one
                    wanted[at] = strtab[at:end].decode("ascii", "replace")
                at = strtab.find(prefix, end)
        for st_name, _info, _other, shndx, value, size in _SYM64.iter_unpack(data[: len(data) // 24 * 24]):
            name = wanted.get(st_name)
            if name is not None and name not in out and shndx != 0 and value:
                out[name] = value
                if sizes is not None:
                    sizes[name] = size
    return out


def name_offsets(strtab: bytes, names: Iterable[str]) -> dict[int, str]:
    """The offsets in the string table ``strtab`` that spell one of ``names`` (a name may share
    its bytes with the end of a longer one), each with the name it spells."""
    wanted: dict[int, str] = {}
    for name in names:
        key = name.encode() + b"\0"
        at = strtab.find(key)
        while at >= 0:
            wanted[at] = name
            at = strtab.find(key, at + 1)
    return wanted


def read_at(elf: BoundedElf, segments, vaddr: int, size: int) -> bytes | None:
    """``size`` bytes of initialized data at ELF virtual address ``vaddr``, from the file;
    ``segments``: its PT_LOADs as (p_offset, p_filesz, p_vaddr, ...)."""
    for p_offset, p_filesz, p_vaddr, *_ in segments:
        if p_vaddr <= vaddr and vaddr + size <= p_vaddr + p_filesz:
            elf.stream.seek(p_offset + vaddr - p_vaddr)
            data = elf.stream.read(size)
            return data if len(data) == size else None
    return None


def load_segments(elf: BoundedElf) -> tuple[tuple[int, int, int, int], ...]:
    """The file's PT_LOAD segments: (p_offset, p_filesz, p_vaddr, p_flags)."""
    return tuple((s.offset, s.filesz, s.vaddr, s.flags) for s in segment_headers(elf) if s.type == PT_LOAD)


def load_bias(segments, mapping_start: int, mapping_offset: int, executable: bool = True) -> int | None:
    """The load bias (process address - ELF virtual address) from one of the file's mappings: its
    start and file offset, and whether it is the executable one. The segment is chosen by that
    too: a read-only segment may end on the page where the code begins."""
    for p_offset, p_filesz, p_vaddr, p_flags in segments:
        if bool(p_flags & _PF_X) == executable and p_offset - p_offset % 4096 <= mapping_offset < p_offset + p_filesz:
            return mapping_start - mapping_offset - (p_vaddr - p_offset)
    return None
