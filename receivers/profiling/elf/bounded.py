"""An ELF file a sampled process maps, read within bounds whatever its headers say.

pyelftools believes a file: it walks as many section and program headers as the header counts
(65,535, or with extended numbering whatever section 0 says), reads the notes of every note
section however many headers point at the same bytes, and makes a section's bytes whatever size
its header says. Every such file is the process's to write, so each reader of one (symbols/,
unwind/, python/, v8/, hotspot/, otel_context/, USDT probes: stapsdt.py) opens it as `BoundedElf`:

- the file as it was when it was opened: nothing past the size fstat gave then is read (a
  sparse ``ftruncate`` to terabytes meanwhile reads as the end of the file), and a file past
  MAX_FILE_BYTES by then is not read at all;
- at most MAX_SECTION_HEADERS section headers and MAX_PROGRAM_HEADERS program headers: a file
  with more is read as if it had none of that kind (no symbols, build id or CFI from its
  sections; no segments: nothing maps to it), as no linker writes one;
- the section and program headers read from the raw tables (`section_headers`, `sections_named`,
  `section_at`, `segment_headers`), never through pyelftools' walks, which a crafted file stalls
  for hours (what they cost: below, before `MAX_SECTION_NAME_BYTES`); BoundedElf refuses them;
- `regions`: the bytes of many headers are read once, however many headers point at them;
- `section_data`: a section's bytes, never more than the file held when it was opened (a
  section without bytes in the file, SHT_NOBITS, or compressed may say it holds any size).

What a reader made a BoundedElf read is in its ``bytes_read`` (the work, for tests and tools).

Every refusal is counted in ``stats``, published as
``pycollector_profiling_symbolization{stat="elf_<reason>"}``; the caller goes on as if the file
had nothing there. (The unwind rows of large files are built in a helper process, whose counts
stay there; runtime detection's helper sends its own back, ``add``.)
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
import threading
import zlib
from collections.abc import Collection, Iterable, Iterator
from typing import BinaryIO, NamedTuple

from elftools.elf.elffile import ELFFile

# As processes/files.py's MAX_ELF_FILE_BYTES, checked again when the file is read: it may have
# grown since it was opened.
MAX_FILE_BYTES = 4 << 30
# A linked file has one section header an output section: of 3,423 ELF files on a development
# host (libc, libpython, node, libjvm, Go programs, debug files), the most had 74, node 41. One
# for each function or datum (-ffunction-sections) is an object file's, which nobody maps. A
# file with 1,024 headers over the same bytes costs about 0.1 s a walk of them (names, notes).
MAX_SECTION_HEADERS = 1024
# Those files had at most 15 program headers; the kernel execs no program whose program headers
# take more than 64 KiB (1,170 of them).
MAX_PROGRAM_HEADERS = 256

stats = dict.fromkeys(("files_grown_past_cap", "files_grown_while_read", "too_many_sections", "too_many_segments", "aliased_headers",
                       "sections_too_large", "too_many_notes", "notes_cut_short", "dynamic_symbols_too_many", "relocations_too_many",
                       # stapsdt.py: USDT probes left out (and why), arguments that do not parse
                       "stapsdt_files_unreadable", "stapsdt_notes_malformed", "stapsdt_probes_repeated", "stapsdt_probes_outside_text",
                       "stapsdt_semaphores_outside_data", "stapsdt_args_unparsed"), 0)
_stats_lock = threading.Lock()


def count(reason: str) -> None:
    with _stats_lock:
        stats[reason] += 1


def add(counts: dict[str, int]) -> None:
    """Counts moved by a parse in a helper process (symbols/detection.py), as if made here."""
    with _stats_lock:
        for reason, n in counts.items():
            if reason in stats:
                stats[reason] += n


class FileTooLarge(ValueError):
    """The file was past MAX_FILE_BYTES when it was read (it grew after it was opened)."""


class SectionTooLarge(ValueError):
    """A section says it holds more than the file did when it was opened, or than its reader's cap."""


class BoundedElf(ELFFile):
    """pyelftools' ELFFile over ``stream`` as it was when this was made, its header counts capped.
    Raises FileTooLarge for a file past MAX_FILE_BYTES, and what pyelftools raises for one that
    is not ELF."""

    def __init__(self, stream: BinaryIO) -> None:
        try:
            size = os.fstat(stream.fileno()).st_size
        except (AttributeError, OSError, io.UnsupportedOperation):  # (a stream in memory: tests, tools)
            size = stream.seek(0, os.SEEK_END)
        if size > MAX_FILE_BYTES:
            count("files_grown_past_cap")
            raise FileTooLarge(f"{size} bytes, over {MAX_FILE_BYTES}")
        self.opened_size = size
        self._file = stream
        super().__init__(AsOpened(stream, size))
        self._sections: int | None = None
        self._segments: int | None = None

    def num_sections(self) -> int:
        if self._sections is None:
            found = super().num_sections()
            if found > MAX_SECTION_HEADERS:
                count("too_many_sections")
                found = 0
            self._sections = found
        return self._sections

    def num_segments(self) -> int:
        if self._segments is None:
            # (pyelftools' takes an extended count from section 0 as it makes it: with its name)
            found = self["e_phnum"]
            if found == _PN_XNUM:
                found = self._get_section_header(0)["sh_info"] if self["e_shoff"] else 0
            if found > MAX_PROGRAM_HEADERS:
                count("too_many_segments")
                found = 0
            self._segments = found
        return self._segments

    @property
    def bytes_read(self) -> int:
        """What was read of the file through this (its headers, sections, notes) so far."""
        return self.stream.bytes_read

    def _walk_refused(self, *args, **kwargs):
        raise NotImplementedError("pyelftools' walk of a process's file: read its headers with bounded.section_headers, "
                                  "sections_named, section_at or segment_headers")

    # pyelftools makes a section or segment object for each header these walk past (see above
    # MAX_SECTION_NAME_BYTES): none is made of a file a process maps.
    iter_sections = get_section = get_section_by_name = get_section_index = has_section = _walk_refused
    iter_segments = get_segment = get_dwarf_info = has_dwarf_info = get_ehabi_infos = _walk_refused

    def digest(self) -> str:
        """SHA-256 of the file's bytes as it was opened (to its size then, not to wherever it has
        grown since), in hex."""
        digest = hashlib.sha256()
        self.stream.seek(0)
        while chunk := self.stream.read(1 << 20):
            digest.update(chunk)
        return digest.hexdigest()

    def grew(self) -> bool:
        """Whether the file's size is not what it was when it was opened (counted): what was read
        of it may not be what it holds now."""
        try:
            changed = os.fstat(self._file.fileno()).st_size != self.opened_size
        except (AttributeError, OSError, io.UnsupportedOperation):
            changed = False
        if changed:
            count("files_grown_while_read")
        return changed


class AsOpened:
    """``stream`` read no further than ``size`` bytes (the file's size when it was opened): its
    end is there, whatever the file has become since. What pyelftools asks of a stream."""

    def __init__(self, stream: BinaryIO, size: int) -> None:
        self._stream = stream
        self.size = size
        self.bytes_read = 0

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_END:
            return self._stream.seek(self.size + offset)
        return self._stream.seek(offset, whence)

    def tell(self) -> int:
        return self._stream.tell()

    def read(self, size: int | None = -1) -> bytes:
        left = self.size - self._stream.tell()
        if left <= 0:
            return b""
        data = self._stream.read(left if size is None or size < 0 else min(size, left))
        self.bytes_read += len(data)
        return data


def regions(spans: Iterable[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """Each distinct (offset, size) of ``spans`` once, in order: many headers may point at the
    same bytes, which are read once (the others counted)."""
    seen = set()
    for span in spans:
        if span in seen:
            count("aliased_headers")
            continue
        seen.add(span)
        yield span


def read_region(elf: ELFFile, offset: int, size: int) -> bytes:
    """``size`` bytes at file offset ``offset`` (fewer where the file ends; none for a size or an
    offset below 0: a header's difference gone negative)."""
    if size <= 0 or offset < 0:
        return b""
    elf.stream.seek(offset)
    return elf.stream.read(size)


# Section and program headers, read from the raw tables. pyelftools makes a section object for
# each header it walks (iter_sections; get_section_by_name walks them all once), and a segment
# object for each program header (iter_segments), each as dear as the file makes it:
# - a section's name is read to its NUL however far that is: a string table without one, to the
#   end of the file, for every header (64 headers over 4 MiB: 4.8 s for one build id);
# - a section is parsed as its type says: a GNU hash table's buckets, as many as its header says
#   (200,000: 0.31 s a walk), a symbol table's string table made with it;
# - a PT_DYNAMIC segment is made by making every section, to find the one at its offset (200 of
#   them over 1,000 sections, 75 KB: 4.45 s for one walk of the segments).
# At the caps these multiply to hours. Here a header is its numbers, read once for all the lookups
# of a BoundedElf; a name is read only to compare it with those looked for, no further than the
# longest of them (at most MAX_SECTION_NAME_BYTES); nothing is made of what a section holds. The
# readers read a section's bytes themselves (section_data), with a bound each. ELF32 and
# big-endian files are read too (pyelftools read them): the readers decide what they make of one.

# The most of a section's name read to compare it, with its NUL: the longest name any reader
# looks up is 23 bytes (.data.rel.ro.gopclntab's); the longest of the 2,142 ELF files of the
# development host (libraries, programs, debug files, libjvm, node, Go) 51
# (.gnu.warning.pa_context_get_autoload_info_by_index, libpulse).
MAX_SECTION_NAME_BYTES = 256
# The names a lookup compares are read in one read when they lie within this many bytes (a real
# .shstrtab holds a few hundred), else each on its own, MAX_SECTION_NAME_BYTES at most.
_NAMES_AT_ONCE = 64 << 10
SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_NOTE, SHT_NOBITS, SHT_DYNSYM = 2, 3, 4, 7, 8, 11
SYMBOL_TABLE_TYPES = frozenset((SHT_SYMTAB, SHT_DYNSYM, 0x6FFFFFF3))  # (and SHT_SUNW_LDYNSYM, as pyelftools reads symbols)
PT_LOAD, PT_NOTE, PT_TLS = 1, 4, 7
SHF_COMPRESSED = 0x800
_ELFCOMPRESS_ZLIB = 1
_SHN_XINDEX = 0xFFFF
_PN_XNUM = 0xFFFF
# (class, little-endian) -> Elf_Shdr, Elf_Phdr, Elf_Chdr. Shdr: name, type, flags, addr, offset,
# size, link, info, addralign, entsize in both classes; Phdr's p_flags moved in ELF64.
_LAYOUTS = {(bits, little): tuple(struct.Struct(("<" if little else ">") + layout) for layout in layouts)
            for bits, layouts in ((64, ("IIQQQQIIQQ", "IIQQQQQQ", "IIQQ")), (32, ("IIIIIIIIII", "IIIIIIII", "III")))
            for little in (True, False)}


class SectionHeader(NamedTuple):
    name: str | None  # None where it was not read (section_headers, section_at)
    type: int  # sh_type's number (SHT_NOTE is 7)
    addr: int
    offset: int
    size: int  # in the file (a compressed section's: section_data inflates it)
    flags: int = 0
    link: int = 0
    entsize: int = 0
    index: int = 0  # in the section header table


class SegmentHeader(NamedTuple):
    type: int  # p_type's number (PT_LOAD is 1)
    flags: int
    offset: int
    vaddr: int
    filesz: int
    memsz: int = 0
    align: int = 0


class SectionUnreadable(ValueError):
    """A compressed section that does not inflate to the size it says (or not by zlib)."""


def section_headers(elf: ELFFile) -> tuple[SectionHeader, ...]:
    """Every section header, in the table's order, from the raw table (at most
    MAX_SECTION_HEADERS: a file with more has none), read once a file; names not read (None)."""
    return _section_table(elf)[0]


def _section_table(elf: ELFFile) -> tuple[tuple[SectionHeader, ...], tuple[int, ...]]:
    """The section headers and their sh_names, read once a file (kept on ``elf``)."""
    found = elf.__dict__.get("_raw_sections")
    if found is None:
        found = elf.__dict__["_raw_sections"] = _read_section_table(elf)
    return found


def _read_section_table(elf: ELFFile) -> tuple[tuple[SectionHeader, ...], tuple[int, ...]]:
    shdr = _LAYOUTS[elf.elfclass, elf.little_endian][0]
    entries, entry_size = elf.num_sections(), elf.header["e_shentsize"]
    if not entries or entries > MAX_SECTION_HEADERS or entry_size < shdr.size:  # (a plain ELFFile's count is not capped)
        return (), ()
    table = read_region(elf, elf.header["e_shoff"], entries * entry_size)
    raw = [shdr.unpack_from(table, at) for at in range(0, len(table) - shdr.size + 1, entry_size)]
    headers = tuple(SectionHeader(None, sh_type, sh_addr, sh_offset, sh_size, sh_flags, sh_link, sh_entsize, index)
                    for index, (_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, _info, _align, sh_entsize)
                    in enumerate(raw))
    return headers, tuple(fields[0] for fields in raw)


def section_at(elf: ELFFile, index: int) -> SectionHeader | None:
    """Section header ``index`` (what an sh_link names), its name not read; None past the table."""
    headers = section_headers(elf)
    return headers[index] if 0 <= index < len(headers) else None


def sections_named(elf: ELFFile, names: Collection[str]) -> tuple[SectionHeader, ...]:
    """The section headers called one of ``names``, in the table's order, each header's name read
    no further than the longest of ``names`` (at most MAX_SECTION_NAME_BYTES with its NUL), no
    section made. A header whose name starts past the end of the string table has none."""
    headers, name_offsets = _section_table(elf)
    strings = elf.header["e_shstrndx"]
    if strings == _SHN_XINDEX and headers:
        strings = headers[0].link  # (extended numbering: section 0's sh_link)
    if not 0 < strings < len(headers) or not names:
        return ()
    strings_at, strings_size = headers[strings].offset, headers[strings].size
    wanted = {name.encode() + b"\0": name for name in names}
    longest = max(map(len, wanted))
    if longest > MAX_SECTION_NAME_BYTES:
        raise ValueError(f"no file has a section name of {longest} bytes")
    named = [(header, at) for header, at in zip(headers, name_offsets) if at < strings_size]
    if not named:
        return ()
    low = min(at for _header, at in named)
    high = min(max(at for _header, at in named) + longest, strings_size)
    if high - low <= _NAMES_AT_ONCE:
        window = read_region(elf, strings_at + low, high - low)
        spelled = lambda at: window[at - low:at - low + longest]  # noqa: E731
    else:  # (names scattered over a large table: a crafted file's)
        spelled = lambda at: read_region(elf, strings_at + at, min(longest, strings_size - at))  # noqa: E731
    out = []
    for header, at in named:
        name = spelled(at)
        end = name.find(b"\0")
        name = wanted.get(name[:end + 1]) if end >= 0 else None
        if name is not None:
            out.append(header._replace(name=name))
    return tuple(out)


def section_named(elf: ELFFile, name: str) -> SectionHeader | None:
    """The section header called ``name``: the last of that name, as pyelftools'
    get_section_by_name found it (a real file has one)."""
    found = sections_named(elf, (name,))
    return found[-1] if found else None


def segment_headers(elf: ELFFile) -> tuple[SegmentHeader, ...]:
    """The program headers, in the table's order, from the raw table (at most
    MAX_PROGRAM_HEADERS: a file with more has none), read once a file, no segment made."""
    found = elf.__dict__.get("_raw_segments")
    if found is None:
        found = elf.__dict__["_raw_segments"] = _read_segment_table(elf)
    return found


def _read_segment_table(elf: ELFFile) -> tuple[SegmentHeader, ...]:
    phdr = _LAYOUTS[elf.elfclass, elf.little_endian][1]
    entries, entry_size = elf.num_segments(), elf.header["e_phentsize"]
    if not entries or entries > MAX_PROGRAM_HEADERS or entry_size < phdr.size:
        return ()
    table = read_region(elf, elf.header["e_phoff"], entries * entry_size)
    raw = (phdr.unpack_from(table, at) for at in range(0, len(table) - phdr.size + 1, entry_size))
    if elf.elfclass == 64:
        return tuple(SegmentHeader(p_type, p_flags, p_offset, p_vaddr, p_filesz, p_memsz, p_align)
                     for p_type, p_flags, p_offset, p_vaddr, _paddr, p_filesz, p_memsz, p_align in raw)
    return tuple(SegmentHeader(p_type, p_flags, p_offset, p_vaddr, p_filesz, p_memsz, p_align)
                 for p_type, p_offset, p_vaddr, _paddr, p_filesz, p_memsz, p_flags, p_align in raw)


def section_data(elf: ELFFile, section: SectionHeader, max_bytes: int | None = None) -> bytes:
    """The bytes of ``section``, if it holds no more than the file did when it was opened
    (``stream_len``: a BoundedElf's size at open), nor than ``max_bytes``; else SectionTooLarge,
    counted. A compressed section (SHF_COMPRESSED: zlib, as linkers write debug sections) is
    inflated to the size its header says, no further (SectionUnreadable when that is not what it
    inflates to, or it is not zlib's: pyelftools refused those too); an SHT_NOBITS section has
    no bytes in the file (b"": pyelftools made its zeros, to whatever size the header said)."""
    limit = elf.stream_len if max_bytes is None else min(max_bytes, elf.stream_len)
    size, compressed = section.size, section.flags & SHF_COMPRESSED and section.type != SHT_NOBITS
    if compressed:
        chdr = _LAYOUTS[elf.elfclass, elf.little_endian][2]
        header = read_region(elf, section.offset, chdr.size)
        if len(header) < chdr.size:
            raise SectionUnreadable(f"{section.name}: its compression header cut short")
        fields = chdr.unpack(header)
        kind, size = fields[0], fields[2] if elf.elfclass == 64 else fields[1]  # (Elf64_Chdr has ch_reserved)
    if size > limit:
        count("sections_too_large")
        raise SectionTooLarge(f"{section.name} of {size} bytes, over {limit}")
    if section.type == SHT_NOBITS:
        return b""
    if not compressed:
        return read_region(elf, section.offset, size)
    if kind != _ELFCOMPRESS_ZLIB:
        raise SectionUnreadable(f"{section.name}: compressed by {kind}, not zlib")
    try:
        data = zlib.decompressobj().decompress(read_region(elf, section.offset + chdr.size, section.size - chdr.size), size)
    except zlib.error as error:
        raise SectionUnreadable(f"{section.name}: {error}") from None
    if len(data) != size:
        raise SectionUnreadable(f"{section.name} inflates to {len(data)} bytes, not {size}")
    return data
