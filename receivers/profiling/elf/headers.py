"""The headers of an ELF file that every reader starts from, and the ids that name the file."""

from __future__ import annotations

import hashlib
import itertools
import os
import struct
from collections.abc import Iterable, Iterator, Sequence

from .bounded import (PT_LOAD, PT_NOTE, SHT_NOBITS, SHT_NOTE, BoundedElf, SectionTooLarge, count, read_region, regions, section_data,
                      section_headers, section_named, segment_headers)

NT_GO_BUILD_ID = 4
NT_GNU_BUILD_ID = 3
# A file's notes are read until its build id: the linker puts .note.gnu.build-id among the first
# sections (after .note.gnu.property at most), so real files have it within their first five
# notes. Past these, a file is taken to have none: libjvm's SystemTap probes are 52 KB of notes
# (after its build id), a crafted file 50 headers over 4,000 notes (2.6 s with pyelftools).
MAX_NOTES = 1024
MAX_NOTE_BYTES = 1 << 20
# .gnu_debuglink: a file name (NAME_MAX is 255), padding and a CRC.
MAX_DEBUGLINK_BYTES = 4096


class ElfHeaders:
    """What every reader of an ELF file needs first: PT_LOAD segments, build ids, debug link."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.build_id: str | None = None
        self.go_build_id: str | None = None
        self.htlhash: str | None = None
        self.debuglink: str | None = None
        self.machine = ""  # e_machine, as pyelftools names it ("EM_X86_64")
        self.loads: list[tuple[int, int, int]] = []  # (p_offset, p_filesz, p_vaddr)

    @property
    def ids(self) -> dict[str, str | None]:
        """The file's ids, as Frame fields."""
        return {"build_id": self.build_id, "go_build_id": self.go_build_id, "htlhash": self.htlhash}

    def vaddr(self, file_offset: int) -> int | None:
        for off, size, vaddr in self.loads:
            if off <= file_offset < off + size:
                return file_offset - off + vaddr
        return None

    @classmethod
    def read_headers(cls, elf: BoundedElf, path: str, *, mapping_ids: bool = False):
        """Segments, build id and debug link; with ``mapping_ids`` also the ids a profile's
        mapping carries (Go build id, htlhash: more reading, which only reports need)."""
        out = cls(path)
        out.loads = [(seg.offset, seg.filesz, seg.vaddr) for seg in segment_headers(elf) if seg.type == PT_LOAD and seg.filesz]
        out.build_id = elf_build_id(elf)
        out.machine = elf["e_machine"]
        if mapping_ids:
            out.go_build_id = go_build_id(elf)
            out.htlhash = file_htlhash(elf.stream)
        link = section_named(elf, ".gnu_debuglink")
        if link is not None:
            try:
                data = section_data(elf, link, MAX_DEBUGLINK_BYTES)
            except SectionTooLarge:
                data = b""  # (no debug link: the file's own symbols, or none)
            out.debuglink = data[: data.find(b"\0")].decode("utf-8", "replace") or None
        return out


def find_note(data: bytes, owner: bytes, note_type: int) -> bytes | None:
    """The descriptor of the first note from ``owner`` of ``note_type`` in a raw ELF note blob
    (little-endian, 4-byte aligned as x86-64's are)."""
    return next((desc for name, ntype, desc in iter_notes(data) if ntype == note_type and name == owner), None)


def iter_notes(data: bytes) -> Iterator[tuple[bytes, int, bytes]]:
    """(owner, type, descriptor) of each note of a raw ELF note blob, up to one cut short (one
    that says it holds more than the blob has left: counted, notes_cut_short)."""
    pos = 0
    while pos + 12 <= len(data):
        namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
        name_at = pos + 12
        desc_at = name_at + ((namesz + 3) & ~3)
        if desc_at + descsz > len(data):
            count("notes_cut_short")
            return
        yield data[name_at:name_at + namesz].rstrip(b"\0"), ntype, data[desc_at:desc_at + descsz]
        pos = desc_at + ((descsz + 3) & ~3)


def parse_build_id_notes(data: bytes) -> str | None:
    """The GNU build id in a raw ELF note blob (/sys/kernel/notes, .note.gnu.build-id)."""
    found = find_note(data, b"GNU", NT_GNU_BUILD_ID)
    return found.hex() if found is not None else None


DEBUG_DIRS = ("/usr/lib/debug",)


def debug_file_candidates(build_id: str | None, debuglink: str | None, path: str, debug_dirs: Sequence[str] = DEBUG_DIRS) -> list[str]:
    """Where the separate debug file of the file at ``path`` may be, as gdb looks: by build id
    under each debug directory, then by its .gnu_debuglink name beside it, in .debug/ beside it,
    and under each debug directory's copy of its directory."""
    out = []
    if build_id and len(build_id) > 2:
        for d in debug_dirs:
            out.append(f"{d}/.build-id/{build_id[:2]}/{build_id[2:]}.debug")
    # A debug link names a file beside the one that carries it: a name with a '/' or a '..'
    # would send the search anywhere the process names.
    if debuglink and "/" not in debuglink and debuglink not in (".", ".."):
        directory = os.path.dirname(path)
        out.append(f"{directory}/{debuglink}")
        out.append(f"{directory}/.debug/{debuglink}")
        for d in debug_dirs:
            out.append(f"{d}{directory}/{debuglink}")
    return out


def elf_build_id(elf: BoundedElf) -> str | None:
    """The GNU build id: the first GNU NT_GNU_BUILD_ID note of the note sections, else of the
    PT_NOTE segments, within read_notes' caps (a file with more notes before its build id has
    none)."""
    if not elf.little_endian:
        return None  # (x86-64's notes: none of the files sampled here is big-endian)
    spans = itertools.chain(((s.offset, s.size) for s in section_headers(elf) if s.type == SHT_NOTE),
                            ((s.offset, s.filesz) for s in segment_headers(elf) if s.type == PT_NOTE))
    for owner, note_type, desc in read_notes(elf, spans):
        if note_type == NT_GNU_BUILD_ID and owner == b"GNU":
            return desc.hex()
    return None


def read_notes(elf: BoundedElf, spans: Iterable[tuple[int, int]]) -> Iterator[tuple[bytes, int, bytes]]:
    """(owner, type, descriptor) of each note in the file's (offset, size) ``spans``, read lazily:
    bytes that many headers point at are read once, and at most MAX_NOTES notes and
    MAX_NOTE_BYTES of them in all; the walk ends at either cap (counted: too_many_notes)."""
    notes_left, bytes_left = MAX_NOTES, MAX_NOTE_BYTES
    for offset, size in regions(spans):
        if notes_left <= 0 or bytes_left < size:
            count("too_many_notes")
            return
        data = read_region(elf, offset, size)
        bytes_left -= len(data)
        for found in itertools.islice(iter_notes(data), notes_left + 1):
            notes_left -= 1
            if notes_left < 0:
                count("too_many_notes")
                return
            yield found


def go_build_id(elf: BoundedElf) -> str | None:
    """The Go toolchain's build id: the note of .note.go.buildid (owner "Go", type 4)."""
    section = section_named(elf, ".note.go.buildid")
    if section is None or section.type == SHT_NOBITS or not elf.little_endian:
        return None
    try:
        found = find_note(section_data(elf, section, MAX_NOTE_BYTES), b"Go", NT_GO_BUILD_ID)
    except SectionTooLarge:
        return None
    return found.decode("ascii", "replace") if found else None


HTLHASH_PAGE = 4096


def file_htlhash(stream) -> str | None:
    """The file id OpenTelemetry's profiling conventions define for mappings
    (``process.executable.build_id.htlhash``, the one id every file has): the first 16 bytes of
    SHA-256 over the file's first and last 4096 bytes (overlapping in a small file) and its
    length as a big-endian uint64, in hex. Backends match it with what other profilers send."""
    try:
        stream.seek(0, os.SEEK_END)
        size = stream.tell()
        stream.seek(0)
        head = stream.read(HTLHASH_PAGE)
        stream.seek(max(0, size - HTLHASH_PAGE))
        tail = stream.read(HTLHASH_PAGE)
    except OSError:
        return None
    return hashlib.sha256(head + tail + size.to_bytes(8, "big")).digest()[:16].hex()
