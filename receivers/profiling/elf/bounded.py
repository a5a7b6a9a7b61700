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
- `regions`: the bytes of many headers are read once, however many headers point at them;
- `section_data`: a section's bytes, never more than the file held when it was opened (a
  section without bytes in the file, SHT_NOBITS, or compressed may say it holds any size).

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
            found = super().num_segments()
            if found > MAX_PROGRAM_HEADERS:
                count("too_many_segments")
                found = 0
            self._segments = found
        return self._segments

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
        return self._stream.read(left if size is None or size < 0 else min(size, left))


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
    """``size`` bytes at file offset ``offset`` (fewer where the file ends)."""
    elf.stream.seek(offset)
    return elf.stream.read(size)


def section_data(elf: ELFFile, section, max_bytes: int | None = None) -> bytes:
    """The bytes of ``section`` (decompressed, as pyelftools' ``data()``), if it holds no more
    than the file did when it was opened (``stream_len``: a BoundedElf's size at open), nor than
    ``max_bytes``; else SectionTooLarge, counted. (pyelftools makes the zeros of an SHT_NOBITS
    section, and inflates a compressed one, to whatever size the header says.)"""
    limit = elf.stream_len if max_bytes is None else min(max_bytes, elf.stream_len)
    if section.data_size > limit:
        count("sections_too_large")
        raise SectionTooLarge(f"{section.name} of {section.data_size} bytes, over {limit}")
    return section.data()


_SHDR = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr, little-endian (x86-64)
_PHDR = struct.Struct("<IIQQQQQQ")  # Elf64_Phdr
_SHN_XINDEX = 0xFFFF


class SectionHeader(NamedTuple):
    name: str
    type: int  # sh_type's number (SHT_NOTE is 7)
    addr: int
    offset: int
    size: int


class SegmentHeader(NamedTuple):
    type: int  # p_type's number (PT_LOAD is 1)
    flags: int
    offset: int
    vaddr: int
    filesz: int


def sections_named(elf: BoundedElf, names: Collection[str]) -> tuple[SectionHeader, ...]:
    """The section headers called one of ``names``, in the table's order, read from the raw table
    (at most MAX_SECTION_HEADERS; () for a file not 64-bit little-endian), each header's name read
    no further than the longest of ``names``, no section made. pyelftools' walk (iter_sections,
    get_section_by_name) makes each section: it reads each name to its NUL however far that is
    (a string table without one: to the end of the file for every header, 4.8 s for 64 headers
    over 4 MiB) and parses what the type says the section holds (a GNU hash table's buckets, as
    many as its header says: 0.3 s for 200,000)."""
    if elf.elfclass != 64 or not elf.little_endian:
        return ()
    entries, entry_size = elf.num_sections(), elf.header["e_shentsize"]
    if not entries or entry_size < _SHDR.size:
        return ()
    table = read_region(elf, elf.header["e_shoff"], entries * entry_size)
    headers = [_SHDR.unpack_from(table, at) for at in range(0, len(table) - _SHDR.size + 1, entry_size)]
    strings = elf.header["e_shstrndx"]
    if strings == _SHN_XINDEX and headers:
        strings = headers[0][6]  # (extended numbering: section 0's sh_link)
    if not 0 < strings < len(headers):
        return ()
    strings_at, strings_size = headers[strings][4], headers[strings][5]
    wanted = {name.encode() + b"\0": name for name in names}
    longest = max(map(len, wanted), default=0)
    out = []
    for sh_name, sh_type, _flags, sh_addr, sh_offset, sh_size, *_ in headers:
        if sh_name >= strings_size:
            continue
        spelled = read_region(elf, strings_at + sh_name, min(longest, strings_size - sh_name))
        name = wanted.get(spelled[: spelled.find(b"\0") + 1]) if b"\0" in spelled else None
        if name is not None:
            out.append(SectionHeader(name, sh_type, sh_addr, sh_offset, sh_size))
    return tuple(out)


def segment_headers(elf: BoundedElf) -> tuple[SegmentHeader, ...]:
    """The program headers, read from the raw table (at most MAX_PROGRAM_HEADERS; () for a file
    not 64-bit little-endian), no segment made: pyelftools makes a PT_DYNAMIC segment by making
    every section to find the one at its offset (4.5 s for 200 PT_DYNAMIC headers over a file of
    1,000 section headers, 75 KB), each as dear as sections_named says."""
    if elf.elfclass != 64 or not elf.little_endian:
        return ()
    entries, entry_size = elf.num_segments(), elf.header["e_phentsize"]
    if not entries or entry_size < _PHDR.size:
        return ()
    table = read_region(elf, elf.header["e_phoff"], entries * entry_size)
    return tuple(SegmentHeader(p_type, p_flags, p_offset, p_vaddr, p_filesz)
                 for p_type, p_flags, p_offset, p_vaddr, _paddr, p_filesz, _memsz, _align
                 in (_PHDR.unpack_from(table, at) for at in range(0, len(table) - _PHDR.size + 1, entry_size)))
