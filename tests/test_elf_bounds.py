"""Files a sampled process maps are read within bounds (elf/bounded.py), whatever their headers say.

Each file here is crafted as a hostile process would (tests/elf_writer.py): many headers over the
same bytes, counts past the caps, a file that grows while it is read. The checks are on the work
done (bytes read, entries decoded) and on the counters, never on time: with pyelftools' own
walks, the note bomb took 2.6 s, 65,535 section headers hours, the relocation bomb 4.8 s.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
import structlog
from elftools.elf.sections import SymbolTableSection

from receivers.profiling.elf import bounded
from receivers.profiling.elf.bounded import MAX_SECTION_HEADERS, BoundedElf, FileTooLarge
from receivers.profiling.elf.headers import MAX_NOTES, ElfHeaders, elf_build_id
from receivers.profiling.otel_context.thread_context import MAX_DYNAMIC_SYMBOLS, MAX_RELOCATIONS, read_definition
from receivers.profiling.processes.files import MAX_ELF_FILE_BYTES
from receivers.profiling.python.detect import detect_cpython
from receivers.profiling.symbols.symbolizer import Symbolizer
from receivers.profiling.unwind.registry import RowSource
from receivers.profiling.unwind.rows import NoRows, build_rows_at
from receivers.profiling.v8.detect import detect_v8

from tests.elf_writer import (PT_LOAD, PT_TLS, R_X86_64_TPOFF64, RELA, SHT_DYNSYM, SHT_NOTE, SHT_PROGBITS, SHT_RELA, SHT_STRTAB,
                              STB_GLOBAL, STT_TLS, SYM, Section, Segment, body_offset, elf_file, note)

BUILD_ID = bytes(range(20))


def bytes_read() -> int:
    """What this process has read from files so far (/proc/self/io rchar): the work a parse did."""
    with open("/proc/self/io") as io:
        return int(next(line for line in io if line.startswith("rchar")).split()[1])


def written(folder: Path, data: bytes) -> Path:
    path = folder / f"lib{len(list(folder.iterdir()))}.so"
    path.write_bytes(data)
    return path


def counted(before: dict[str, int]) -> dict[str, int]:
    """The counters that moved since ``before``, by how much."""
    return {name: value - before[name] for name, value in bounded.stats.items() if value != before[name]}


def note_bomb(aliases: int = 50, notes: int = 4000, build_id_at: int | None = None) -> bytes:
    """``aliases`` SHT_NOTE section headers over the same ``notes`` notes (the GNU build id the
    one at ``build_id_at``, if given)."""
    blob = [note(b"XYZ", 1, b"")] * notes
    if build_id_at is not None:
        blob[build_id_at] = note(b"GNU", 3, BUILD_ID)
    blob = b"".join(blob)
    return elf_file([Section(f".note.{i}", SHT_NOTE, body_offset(0), len(blob), align=4) for i in range(aliases)], [], blob)


def test_a_note_bomb_is_read_once_and_no_further_than_its_notes_cap(tmp_path):
    path = tmp_path / "libpython3.12.so"  # (a CPython's name: detected on the events thread)
    path.write_bytes(data := note_bomb())
    before, read = dict(bounded.stats), bytes_read()
    assert detect_cpython(str(path)) is None
    with open(path, "rb") as stream:
        assert elf_build_id(BoundedElf(stream)) is None
    # Each of the two read the first MAX_NOTES notes of the one region (pyelftools read it all 50
    # times: 2.6 MB), and gave up there.
    assert bytes_read() - read < 4 * len(data)
    assert counted(before) == {"too_many_notes": 2}
    # Fewer notes than the cap: each region is read once, whatever points at it.
    path.write_bytes(data := note_bomb(notes=MAX_NOTES - 24))
    before, read = dict(bounded.stats), bytes_read()
    with open(path, "rb") as stream:
        assert elf_build_id(BoundedElf(stream)) is None
    assert bytes_read() - read < 2 * len(data)
    assert counted(before) == {"aliased_headers": 49}


def test_a_build_id_among_aliased_notes_is_found_within_the_cap(tmp_path):
    for at, found in ((0, BUILD_ID.hex()), (MAX_NOTES - 1, BUILD_ID.hex()), (MAX_NOTES, None)):
        path = tmp_path / f"lib{at}.so"
        path.write_bytes(note_bomb(aliases=3, notes=MAX_NOTES + 10, build_id_at=at))
        with open(path, "rb") as stream:
            assert elf_build_id(BoundedElf(stream)) == found, at


def test_a_file_of_65535_section_headers_is_read_as_having_none(tmp_path):
    blob = b"".join(note(b"XYZ", 1, b"") for _ in range(8))
    data = elf_file([Section(".note", SHT_NOTE, body_offset(0), len(blob), align=4)] * 65533, [], blob)
    path = tmp_path / "node"  # (V8's name: detection reads its symbols)
    path.write_bytes(data)
    before, read = dict(bounded.stats), bytes_read()
    fd = os.open(path, os.O_RDONLY)
    try:
        assert detect_v8(str(path), fd) is None
        symbols = Symbolizer(debug_dirs=())._load(fd, str(path), None)
        assert symbols.symbol_count == 0 and symbols.build_id is None
        with pytest.raises(NoRows):
            build_rows_at(str(path))
    finally:
        os.close(fd)
    # No walk of the 4 MB of headers: each read the file's header and section 0 (the count).
    assert bytes_read() - read < len(data) // 4
    assert counted(before)["too_many_sections"] == 3
    assert 65535 > MAX_SECTION_HEADERS


def relocation_bomb(aliases: int, relocations: int, symbols: int = 8) -> bytes:
    """A library that defines otel_thread_ctx_v1 (the last of ``symbols`` in .dynsym), with
    ``aliases`` .rela.dyn headers over ``relocations`` relocations that reach it."""
    dynstr = b"\0otel_thread_ctx_v1\0"
    dynsym = SYM.pack(0, 0, 0, 0, 0, 0) * (symbols - 1) + SYM.pack(1, STB_GLOBAL << 4 | STT_TLS, 0, 5, 0, 8)
    rela = RELA.pack(0x3000, (symbols - 1) << 32 | R_X86_64_TPOFF64, 0) * relocations
    segments = [Segment(PT_LOAD, 0, 0x1000, 0, flags=5), Segment(PT_TLS, 0, 8, 0x2000)]
    start = body_offset(len(segments))
    body = dynstr + bytes(-len(dynstr) % 8)
    dynsym_at, rela_at = start + len(body), start + len(body) + len(dynsym)
    sections = [Section(".dynstr", SHT_STRTAB, start, len(dynstr)),
                Section(".dynsym", SHT_DYNSYM, dynsym_at, len(dynsym), link=1, entsize=24, align=8)]
    sections += [Section(".rela.dyn", SHT_RELA, rela_at, len(rela), link=2, entsize=24, align=8)] * aliases
    return elf_file(sections, segments, body + dynsym + rela)


def test_a_relocation_bomb_gives_no_definition(tmp_path):
    before = dict(bounded.stats)
    with open(written(tmp_path, relocation_bomb(aliases=100, relocations=2000)), "rb") as stream:
        assert read_definition(stream.fileno()) is None  # (pyelftools' walk kept 200,000 of them)
    assert counted(before) == {"relocations_too_many": 1}
    # Aliases alone cost nothing: the table is read once, its one relocation kept once.
    before = dict(bounded.stats)
    with open(written(tmp_path, relocation_bomb(aliases=100, relocations=1)), "rb") as stream:
        definition = read_definition(stream.fileno())
    assert definition.relocations == ((R_X86_64_TPOFF64, 0x3000),)
    assert counted(before) == {"aliased_headers": 99}
    assert MAX_RELOCATIONS < 2000


def test_a_large_dynsym_is_searched_without_decoding_its_symbols(tmp_path, monkeypatch):
    def decoded(*args):
        raise AssertionError("a symbol decoded one by one")
    monkeypatch.setattr(SymbolTableSection, "iter_symbols", decoded)
    monkeypatch.setattr(SymbolTableSection, "get_symbol", decoded)
    with open(written(tmp_path, relocation_bomb(aliases=1, relocations=1, symbols=200_000)), "rb") as stream:
        definition = read_definition(stream.fileno())
    assert definition is not None and definition.relocations == ((R_X86_64_TPOFF64, 0x3000),)
    # One past the cap is not read at all (counted).
    before = dict(bounded.stats)
    data = bytearray(relocation_bomb(aliases=1, relocations=1))
    at = int.from_bytes(data[40:48], "little") + 2 * 64 + 32  # e_shoff, then .dynsym's sh_size (the third header)
    data[at:at + 8] = ((MAX_DYNAMIC_SYMBOLS + 1) * 24).to_bytes(8, "little")
    with open(written(tmp_path, bytes(data)), "rb") as stream:
        assert read_definition(stream.fileno()) is None
    assert counted(before) == {"dynamic_symbols_too_many": 1}


def test_a_section_of_any_size_is_not_made(tmp_path):
    """pyelftools makes an SHT_NOBITS section's zeros to the size its header says (16 TiB here)."""
    link = Section(".gnu_debuglink", 8, body_offset(0), 1 << 44)  # SHT_NOBITS
    path = tmp_path / "libcrafted.so"
    path.write_bytes(elf_file([link], [], b"x.debug\0"))
    before = dict(bounded.stats)
    with open(path, "rb") as stream:
        assert ElfHeaders.read_headers(BoundedElf(stream), str(path)).debuglink is None
    assert counted(before) == {"sections_too_large": 1}


def test_a_file_grown_after_it_was_opened_is_read_to_its_size_then(tmp_path, monkeypatch):
    path = tmp_path / "libgrows.so"
    shutil.copyfile("/usr/lib/x86_64-linux-gnu/libc.so.6" if os.path.exists("/usr/lib/x86_64-linux-gnu/libc.so.6")
                    else os.path.realpath("/proc/self/exe"), path)
    original = path.read_bytes()
    read_headers = ElfHeaders.read_headers

    def and_grow(elf, name, **kwargs):  # a sparse ftruncate to a terabyte, between the open and the hash
        found = read_headers(elf, name, **kwargs)
        os.truncate(path, 1 << 40)
        return found

    monkeypatch.setattr(ElfHeaders, "read_headers", and_grow)
    before = dict(bounded.stats)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(NoRows, match="changed while it was read"):
            RowSource(str(tmp_path / "cache"), structlog.get_logger())(fd, str(path))
        assert counted(before) == {"files_grown_while_read": 1}
        # What was hashed: the bytes it had when it was opened, not the terabyte of zeros.
        os.truncate(path, len(original))
        with os.fdopen(os.dup(fd), "rb") as stream:
            elf = BoundedElf(stream)
            os.truncate(path, 1 << 40)
            assert elf.digest() == hashlib.sha256(original).hexdigest()
        # A file past the cap by the time it is read is not read.
        with os.fdopen(os.dup(fd), "rb") as stream, pytest.raises(FileTooLarge):
            BoundedElf(stream)
        assert counted(before) == {"files_grown_while_read": 1, "files_grown_past_cap": 1}
    finally:
        os.close(fd)


def test_the_caps_are_those_of_the_opener():
    assert bounded.MAX_FILE_BYTES == MAX_ELF_FILE_BYTES


def test_every_elf_file_is_read_bounded():
    """pyelftools' ELFFile is made only by BoundedElf: no reader walks a file's headers unbounded."""
    root = Path(__file__).resolve().parent.parent / "receivers"
    offenders = [str(path) for path in root.rglob("*.py") if "ELFFile(" in path.read_text() and path.name != "bounded.py"]
    assert offenders == []
