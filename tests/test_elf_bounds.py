"""Files a sampled process maps are read within bounds (elf/bounded.py), whatever their headers say.

Each file here is crafted as a hostile process would (tests/elf_writer.py): many headers over the
same bytes, counts past the caps, a file that grows while it is read, section names without their
NUL, a hash table of any size, PT_DYNAMIC headers by the hundred. The checks are on the work done
(bytes read, entries decoded, pyelftools objects made) and on the counters, never on time: with
pyelftools' own walks, the note bomb took 2.6 s, 65,535 section headers hours, the relocation
bomb 4.8 s, 64 names without a NUL over 4 MiB 4.8 s a build id, 200 PT_DYNAMIC headers 4.45 s a
walk of the segments.
"""

from __future__ import annotations

import glob
import hashlib
import io
import os
import random
import shutil
import struct
import sys
import zlib
from pathlib import Path

import pytest
import structlog
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from receivers.profiling.elf import bounded
from receivers.profiling.elf.bounded import (MAX_SECTION_HEADERS, BoundedElf, FileTooLarge, SectionUnreadable, section_data,
                                             section_headers, sections_named, segment_headers)
from receivers.profiling.elf.headers import MAX_NOTES, ElfHeaders, elf_build_id
from receivers.profiling.elf.stapsdt import read_probes
from receivers.profiling.elf.symbols import defined_symbols, load_segments
from receivers.profiling.hotspot.runtimes import libjvm_symbols
from receivers.profiling.otel_context.thread_context import MAX_DYNAMIC_SYMBOLS, MAX_RELOCATIONS, read_definition
from receivers.profiling.processes.files import MAX_ELF_FILE_BYTES
from receivers.profiling.python.detect import detect_cpython
from receivers.profiling.symbols.elf_symbols import ElfSymbols
from receivers.profiling.symbols.gopclntab import GoFunctions
from receivers.profiling.symbols.symbolizer import Symbolizer
from receivers.profiling.unwind import registry
from receivers.profiling.unwind.registry import RowSource
from receivers.profiling.unwind.rows import NoRows, build_rows_at, cfi_of
from receivers.profiling.v8.detect import detect_v8

from tests.elf_writer import (PT_DYNAMIC, PT_LOAD, PT_TLS, R_X86_64_TPOFF64, RELA, SHF_COMPRESSED, SHT_DYNSYM, SHT_GNU_HASH, SHT_NOTE,
                              SHT_PROGBITS, SHT_RELA, SHT_STRTAB, STB_GLOBAL, STT_TLS, SYM, Section, Segment, body_offset, elf_file,
                              note)

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
    """pyelftools' ELFFile is made only by BoundedElf, and nothing else of pyelftools is used (its
    sections, segments, symbol tables): no reader walks a file's headers unbounded."""
    root = Path(__file__).resolve().parent.parent / "receivers"
    offenders = [str(path) for path in root.rglob("*.py") if path.name != "bounded.py"
                 and any(used in path.read_text() for used in ("ELFFile(", "from elftools", "import elftools"))]
    assert offenders == []


# --------------------------------------------------------------------------------------------
# Headers pyelftools' walks stall on: each reader reads them raw (bounded.section_headers,
# sections_named, section_at, segment_headers)


def names_without_nul(sections: int = 64, size: int = 4 << 20) -> bytes:
    """``sections`` - 1 headers and a build id note after them, every name (.shstrtab's too) in a
    string table of ``size`` bytes without a NUL: pyelftools read each to the end of the file, 64
    bytes a read."""
    build_id = note(b"GNU", 3, BUILD_ID)
    headers = [Section("", SHT_PROGBITS, name_at=i) for i in range(sections - 1)]
    headers.append(Section("", SHT_NOTE, body_offset(0), len(build_id), align=4, name_at=sections))
    return elf_file(headers, [], build_id, strings=b"A" * size)


def gnu_hash_bomb(buckets: int = 200_000, tables: int = 1) -> bytes:
    """A build id, a .dynsym of one symbol and ``tables`` .gnu.hash headers over one GNU hash table
    that says (and holds) ``buckets`` buckets: pyelftools parsed them whenever it walked the
    sections (to find one by name, or the notes)."""
    build_id, dynstr, dynsym = note(b"GNU", 3, BUILD_ID), b"\0" * 8, SYM.pack(0, 0, 0, 0, 0, 0)
    gnu_hash = struct.pack("<IIII", buckets, 1, 1, 6) + bytes(8) + bytes(4 * buckets) + bytes(4)
    start = body_offset(0)
    dynstr_at = start + len(build_id)
    dynsym_at, hash_at = dynstr_at + len(dynstr), dynstr_at + len(dynstr) + len(dynsym)
    sections = [Section(".note.gnu.build-id", SHT_NOTE, start, len(build_id), align=4), Section(".dynstr", SHT_STRTAB, dynstr_at, 1),
                Section(".dynsym", SHT_DYNSYM, dynsym_at, len(dynsym), link=2, entsize=24, align=8)]
    sections += [Section(".gnu.hash", SHT_GNU_HASH, hash_at, len(gnu_hash), link=3, align=8)] * tables
    return elf_file(sections, [], build_id + dynstr + dynsym + gnu_hash)


def dynamic_segment_bomb(segments: int = 200, sections: int = 1000) -> bytes:
    """A PT_LOAD and ``segments`` PT_DYNAMIC program headers over ``sections`` section headers
    (75 KB): pyelftools made every section to make each PT_DYNAMIC segment it walked past."""
    program = [Segment(PT_LOAD, 0, 0x1000, 0x400000, flags=5)] + [Segment(PT_DYNAMIC, 0, 16, 0)] * segments
    return elf_file([Section(f".{i}", SHT_PROGBITS, 0, 16) for i in range(sections)], program)


def every_reader(path: Path) -> dict[str, object]:
    """What each reader of a process's file makes of the file at ``path``."""
    def opened(read):
        with open(path, "rb") as stream:
            return read(BoundedElf(stream))

    def by_fd(read):
        fd = os.open(path, os.O_RDONLY)
        try:
            return read(fd)
        finally:
            os.close(fd)

    def raising(read):
        try:
            return read()
        except NoRows as error:
            return f"NoRows: {error}"

    return {
        "build_id": opened(elf_build_id),
        "headers": opened(lambda elf: vars(ElfHeaders.read_headers(elf, str(path), mapping_ids=True))),
        "segments": opened(load_segments),
        "symbols": opened(lambda elf: defined_symbols(elf, ("otel_thread_ctx_v1", "_PyRuntime"), ("v8dbg_",))),
        "dynsym": opened(lambda elf: ElfSymbols(str(path)).read_symbols(elf, ".dynsym", None)),
        "go": opened(GoFunctions.from_elf),
        "cfi": raising(lambda: opened(lambda elf: cfi_of(elf, ()).size)),
        "probes": opened(read_probes),
        "thread_context": by_fd(read_definition),
        "unwind_segments": by_fd(registry._load_segments),
        "symbolizer": by_fd(lambda fd: Symbolizer(debug_dirs=())._load(fd, str(path), None).symbol_source),
        "cpython": by_fd(lambda fd: detect_cpython("/usr/lib/libpython3.12.so", fd=fd)),
        "v8": by_fd(lambda fd: detect_v8("/usr/bin/node", fd)),
        "jvm": by_fd(lambda fd: libjvm_symbols(str(path), fd, None)),
    }


@pytest.fixture
def work(monkeypatch):
    """What the readers read, through every BoundedElf made, and how many sections and segments
    pyelftools made."""
    done = {"elfs": [], "sections": 0, "segments": 0}
    init, make_section, make_segment = BoundedElf.__init__, ELFFile._make_section, ELFFile._make_segment

    def keeping(self, stream):
        init(self, stream)
        done["elfs"].append(self)

    def counting(kind, make):
        def made(self, header):
            done[kind] += 1
            return make(self, header)
        return made

    monkeypatch.setattr(BoundedElf, "__init__", keeping)
    monkeypatch.setattr(ELFFile, "_make_section", counting("sections", make_section))
    monkeypatch.setattr(ELFFile, "_make_segment", counting("segments", make_segment))
    done["read"] = lambda: sum(elf.bytes_read for elf in done["elfs"])
    return done


def test_names_without_nul_are_read_no_further_than_the_names_looked_for(tmp_path, work):
    path = written(tmp_path, data := names_without_nul())
    found = every_reader(path)
    assert found["build_id"] == found["headers"]["build_id"] == BUILD_ID.hex()
    assert found["headers"]["debuglink"] is None and found["symbolizer"] == ""
    # Per file: its header, the section table (66 headers: 4.2 KB) once, the names as far as the
    # longest looked for, the note, the htlhash's 8 KiB; pyelftools read 64 names of 4 MiB for
    # each walk (4.8 s for one build id).
    assert work["read"]() < len(work["elfs"]) * 16 * 1024 and len(data) > 4 << 20
    assert work["sections"] == work["segments"] == 0


def test_a_gnu_hash_table_is_not_parsed(tmp_path, work):
    path = written(tmp_path, data := gnu_hash_bomb(tables=10))
    found = every_reader(path)
    assert found["build_id"] == BUILD_ID.hex() and found["dynsym"] is False and found["thread_context"] is None
    # No reader reads the 800 KB of buckets (pyelftools parsed them at each walk, each header: 0.31 s each).
    assert work["read"]() < len(work["elfs"]) * 16 * 1024 < len(data)
    assert work["sections"] == work["segments"] == 0


def test_pt_dynamic_headers_make_no_section(tmp_path, work):
    path = written(tmp_path, dynamic_segment_bomb())
    found = every_reader(path)
    assert found["segments"] == ((0, 0x1000, 0x400000, 5),) and found["unwind_segments"] == [(0, 0x400000, 0x1000)]
    assert found["headers"]["loads"] == [(0, 0x1000, 0x400000)]
    # Each read the program headers (11 KB) once and the section table (64 KB) at most once:
    # pyelftools made the 1,000 sections for each of the 200 PT_DYNAMIC headers (4.45 s a walk).
    assert work["read"]() < len(work["elfs"]) * 96 * 1024
    assert work["sections"] == work["segments"] == 0


def test_a_bounded_elf_refuses_pyelftools_walks(tmp_path):
    with open(written(tmp_path, dynamic_segment_bomb(segments=1, sections=1)), "rb") as stream:
        elf = BoundedElf(stream)
        for walk in (elf.iter_sections, elf.iter_segments, lambda: elf.get_section(0), lambda: elf.get_section_by_name(".0")):
            with pytest.raises(NotImplementedError):
                walk()


def test_an_extended_program_header_count_is_read_without_making_section_0(tmp_path, work):
    """e_phnum PN_XNUM: the count is section 0's sh_info; pyelftools made section 0 to read it,
    its name too (here to the end of a 4 MiB string table without a NUL)."""
    data = bytearray(elf_file([Section("", SHT_PROGBITS)], [Segment(PT_LOAD, 0, 0x1000, 0x400000, flags=5)], strings=b"A" * (4 << 20)))
    e_shoff = struct.unpack_from("<Q", data, 40)[0]
    struct.pack_into("<H", data, 56, 0xFFFF)  # e_phnum
    struct.pack_into("<I", data, e_shoff + 44, 1)  # section 0's sh_info
    with open(written(tmp_path, bytes(data)), "rb") as stream:
        elf = BoundedElf(stream)
        assert load_segments(elf) == ((0, 0x1000, 0x400000, 5),)
    assert elf.bytes_read < 4096 and work["sections"] == 0


def test_raw_headers_are_pyelftools_headers():
    """On real files the same fields as pyelftools': this Python, libc, and where Go's sources are
    installed, ELF32 and big-endian ones of its tests."""
    paths = [os.path.realpath(sys.executable), "/usr/lib/x86_64-linux-gnu/libc.so.6",
             *glob.glob("/usr/share/go-*/src/debug/elf/testdata/gcc-386-freebsd-exec"),
             *glob.glob("/usr/share/go-*/src/runtime/pprof/testdata/test32be"),
             *glob.glob("/usr/share/go-*/src/runtime/race/race_linux_s390x.syso")]
    for path in [path for path in paths if os.path.exists(path)]:
        with open(path, "rb") as stream, open(path, "rb") as plain:
            elf, walked = BoundedElf(stream), ELFFile(plain)
            expected = [(s.name, s["sh_addr"], s["sh_offset"], s["sh_size"], s["sh_flags"], s["sh_link"], s["sh_entsize"])
                        for s in walked.iter_sections()]
            names = [name for name, *_ in expected if name]
            assert [(s.name, s.addr, s.offset, s.size, s.flags, s.link, s.entsize) for s in sections_named(elf, names)] == \
                [fields for fields in expected if fields[0]]
            assert [(s.addr, s.offset, s.size) for s in section_headers(elf)] == [fields[1:4] for fields in expected]
            assert [(s.offset, s.vaddr, s.filesz, s.memsz, s.align, s.flags) for s in segment_headers(elf)] == \
                [(s["p_offset"], s["p_vaddr"], s["p_filesz"], s["p_memsz"], s["p_align"], s["p_flags"]) for s in walked.iter_segments()]


def compressed(name: str, content: bytes, says: int | None = None, kind: int = 1) -> bytes:
    """A file of one SHF_COMPRESSED section ``name`` holding ``content`` deflated, its header
    saying it inflates to ``says`` bytes (its length, when None), compressed by ``kind``."""
    chdr = struct.pack("<IIQQ", kind, 0, len(content) if says is None else says, 1)
    blob = chdr + zlib.compress(content)
    return elf_file([Section(name, SHT_PROGBITS, body_offset(0), len(blob), flags=SHF_COMPRESSED, align=8)], [], blob)


def test_a_compressed_section_inflates_as_pyelftools_inflated_it_and_no_further():
    content = random.Random(4).randbytes(4096)  # (what does not deflate: a file holds no less than its sections' bytes)
    data = compressed(".debug_frame", content)
    [section] = sections_named(BoundedElf(io.BytesIO(data)), (".debug_frame",))
    inflated = ELFFile(io.BytesIO(data)).get_section_by_name(".debug_frame").data()
    assert section_data(BoundedElf(io.BytesIO(data)), section) == content == inflated
    # A deflate bomb (64 MiB of zeros in 65 KB) that says it is small inflates no further than that.
    elf = BoundedElf(io.BytesIO(compressed(".debug_frame", bytes(64 << 20), says=4096)))
    assert section_data(elf, sections_named(elf, (".debug_frame",))[0]) == bytes(4096)
    # One that inflates to less than it says is refused, as pyelftools refused it.
    elf = BoundedElf(io.BytesIO(compressed(".debug_frame", content, says=len(content) + 1)))
    with pytest.raises(SectionUnreadable, match="not 4097"):
        section_data(elf, sections_named(elf, (".debug_frame",))[0])
    # One that says it is larger than its cap is not inflated (counted); another compression refused.
    elf = BoundedElf(io.BytesIO(data := compressed(".debug_frame", content, says=1 << 40)))
    before = dict(bounded.stats)
    with pytest.raises(bounded.SectionTooLarge):
        section_data(elf, sections_named(elf, (".debug_frame",))[0])
    assert counted(before) == {"sections_too_large": 1}
    elf = BoundedElf(io.BytesIO(compressed(".debug_frame", content, kind=2)))
    with pytest.raises(SectionUnreadable, match="not zlib"):
        section_data(elf, sections_named(elf, (".debug_frame",))[0])
