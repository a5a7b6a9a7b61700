"""A small writer of ELF64 little-endian x86-64 files, for tests that craft what a hostile process
could map: headers that alias each other, counts past the caps, tables of any size.

``elf_file(sections, segments, body)``: the file header, then ``body`` (which the sections and
segments point into: offsets are from the start of the file, and ``BODY`` is where the body
starts), then the section header table (a NULL section first, .shstrtab last, the sections' names
in it). Section counts of SHN_LORESERVE (0xff00) and over are written as ELF says: e_shnum 0 and
the count in section 0's sh_size. ``strings``, when given, is .shstrtab's content as it is (a
crafted one: names without their NUL), each section's sh_name its ``name_at`` (.shstrtab's 0)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
SHDR = struct.Struct("<IIQQQQIIQQ")
PHDR = struct.Struct("<IIQQQQQQ")
SYM = struct.Struct("<IBBHQQ")
RELA = struct.Struct("<QQq")
SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_DYNAMIC, SHT_NOTE, SHT_NOBITS, SHT_DYNSYM = 1, 2, 3, 4, 6, 7, 8, 11
SHT_GNU_HASH = 0x6FFFFFF6
SHF_COMPRESSED = 0x800
PT_LOAD, PT_DYNAMIC, PT_NOTE, PT_TLS = 1, 2, 4, 7
STT_TLS, STB_GLOBAL = 6, 1
R_X86_64_TPOFF64 = 18
_SHN_LORESERVE = 0xFF00


@dataclass
class Section:
    name: str
    type: int
    offset: int = 0
    size: int = 0
    link: int = 0
    entsize: int = 0
    addr: int = 0
    flags: int = 0
    align: int = 1
    name_at: int = 0  # sh_name, when elf_file is given the string table's bytes


@dataclass
class Segment:
    type: int
    offset: int = 0
    size: int = 0
    vaddr: int = 0
    flags: int = 4  # PF_R
    align: int = 0x1000


def body_offset(segments: int) -> int:
    """Where the body starts in a file with that many program headers."""
    return EHDR.size + segments * PHDR.size


def elf_file(sections: list[Section], segments: list[Segment] = (), body: bytes = b"", strings: bytes | None = None) -> bytes:
    names = bytearray(b"\0")
    name_at = {}
    for section in [*sections, Section(".shstrtab", SHT_STRTAB)]:
        if section.name not in name_at:
            name_at[section.name] = len(names)
            names += section.name.encode() + b"\0"
    if strings is not None:
        names, name_at = strings, None
    start = body_offset(len(segments))
    strings_at = start + len(body)
    table_at = (strings_at + len(names) + 7) & ~7
    count = len(sections) + 2  # (NULL, the sections, .shstrtab)
    extended = count >= _SHN_LORESERVE
    out = bytearray(EHDR.pack(b"\x7fELF\x02\x01\x01" + bytes(9), 3, 62, 1, 0, EHDR.size if segments else 0, table_at, 0,
                              EHDR.size, PHDR.size, len(segments), SHDR.size, 0 if extended else count,
                              0xFFFF if extended else count - 1))
    for segment in segments:
        out += PHDR.pack(segment.type, segment.flags, segment.offset, segment.vaddr, segment.vaddr, segment.size,
                         segment.size, segment.align)
    out += body + names
    out += bytes(table_at - len(out))
    out += SHDR.pack(0, 0, 0, 0, 0, count if extended else 0, count - 1 if extended else 0, 0, 0, 0)
    for section in sections:
        out += SHDR.pack(name_at[section.name] if name_at is not None else section.name_at, section.type, section.flags, section.addr,
                         section.offset, section.size, section.link, 0, section.align, section.entsize)
    out += SHDR.pack(name_at[".shstrtab"] if name_at is not None else 0, SHT_STRTAB, 0, 0, strings_at, len(names), 0, 0, 1, 0)
    return bytes(out)


def note(owner: bytes, note_type: int, desc: bytes) -> bytes:
    """One ELF note, its name and descriptor padded to 4 bytes."""
    name = owner + b"\0"
    return (struct.pack("<III", len(name), len(desc), note_type) + name + bytes(-len(name) % 4) + desc
            + bytes(-len(desc) % 4))
