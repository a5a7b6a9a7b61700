"""USDT probes read from .note.stapsdt (receivers/profiling/elf/stapsdt.py), without BPF.

Programs built with <sys/sdt.h> are read as readelf reads them (readelf is the reference: the
probes, their locations, semaphores and arguments, and the segments that give file offsets); the
argument descriptors are checked form by form; and files crafted as a hostile process would
(tests/elf_writer.py) are read within the caps, the work counted (bytes read, notes walked,
arguments parsed), never timed.
"""

from __future__ import annotations

import io
import random
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from receivers.profiling.elf import bounded, headers, stapsdt
from receivers.profiling.elf.bounded import BoundedElf
from receivers.profiling.elf.headers import MAX_NOTE_BYTES, MAX_NOTES
from receivers.profiling.elf.stapsdt import (IMMEDIATE, MAX_ARGS, MAX_PROBES, MEMORY, REGISTER, UNPARSEABLE, Argument, parse_argument,
                                             read_probes)

from tests.elf_writer import PT_LOAD, SHT_NOTE, SHT_PROGBITS, Section, Segment, body_offset, elf_file, note

SDT_H = Path("/usr/include/x86_64-linux-gnu/sys/sdt.h")


def counted(before: dict[str, int]) -> dict[str, int]:
    """The counters that moved since ``before``, by how much."""
    return {name: value - before[name] for name, value in bounded.stats.items() if value != before[name]}


# --- Programs built with <sys/sdt.h>, read as readelf reads them -------------------------------

# Probes with 0, 1, 3, 6 and 12 arguments of many types (registers of every width, immediates, a
# global, an array element, the stack at -O0), without a semaphore...
PLAIN_C = r"""
#include <sys/sdt.h>
volatile long global_long = 7;
static char table[32];
__attribute__((noinline)) int work(int a, long b, char c, short d, unsigned long long e, void *p) {
    DTRACE_PROBE(plain, none);
    DTRACE_PROBE1(plain, one, a);
    DTRACE_PROBE3(plain, three, c, 5, global_long);
    DTRACE_PROBE6(plain, six, a, b, c, d, e, p);
    DTRACE_PROBE3(plain, memory, table[a & 31], ((long *)p)[b & 3], (signed char)c);
    STAP_PROBE12(plain, twelve, a, b, c, d, e, p, a + 1, b * 3, -1, 0x10, table[1], global_long);
    return a + (int)b;
}
"""
# ... and with one (the memory profiler's two probes: a `provider_name_semaphore` in .probes).
SEMAPHORE_C = r"""
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
unsigned short otel_memory_alloc_semaphore __attribute__((section(".probes"))) = 0;
unsigned short otel_memory_free_semaphore __attribute__((section(".probes"))) = 0;
__attribute__((noinline)) void sampled(void *ptr, unsigned long size, unsigned long weight) {
    if (otel_memory_alloc_semaphore) DTRACE_PROBE3(otel_memory, alloc, ptr, size, weight);
    if (otel_memory_free_semaphore) DTRACE_PROBE1(otel_memory, free, ptr);
}
"""
MAIN_C = r"""
int work(int, long, char, short, unsigned long long, void *);
void sampled(void *, unsigned long, unsigned long);
int main(int argc, char **argv) {
    long x[4] = {0};
    sampled(x, 8, 512);
    return work(argc, argc, argv[0][0], (short)argc, (unsigned long long)argv, x);
}
"""
BUILDS = {  # name -> gcc's flags
    "libprobes.so": ["-O2", "-fPIC", "-shared", "plain.c", "semaphore.c"],
    "pie": ["-O2", "-pie", "-fPIE", "main.c", "plain.c", "semaphore.c"],
    "no-pie": ["-O2", "-no-pie", "main.c", "plain.c", "semaphore.c"],
    "pie-O0": ["-O0", "-pie", "-fPIE", "main.c", "plain.c", "semaphore.c"],  # (the arguments on the stack: -N(%rbp))
}
PROBES = {("plain", "none"): 0, ("plain", "one"): 1, ("plain", "three"): 3, ("plain", "six"): 6, ("plain", "memory"): 3,
          ("plain", "twelve"): 12, ("otel_memory", "alloc"): 3, ("otel_memory", "free"): 1}

needs_sdt = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("readelf") is None or not SDT_H.exists(),
                               reason="gcc, readelf or <sys/sdt.h> is missing (scripts/setup.sh installs systemtap-sdt-dev)")


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("sdt")
    for name, source in (("plain.c", PLAIN_C), ("semaphore.c", SEMAPHORE_C), ("main.c", MAIN_C)):
        (work / name).write_text(source)
    for name, flags in BUILDS.items():
        subprocess.run(["gcc", *flags, "-o", name], cwd=work, check=True, capture_output=True)
    return {name: work / name for name in BUILDS}


def readelf(*args: str) -> str:
    return subprocess.run(["readelf", "--wide", *args], check=True, capture_output=True, text=True).stdout


_NOTE = re.compile(r"Provider: (\S+)\n\s+Name: (\S+)\n\s+Location: (0x[0-9a-f]+), Base: (0x[0-9a-f]+), Semaphore: (0x[0-9a-f]+)\n"
                   r"\s+Arguments: ?(.*)$", re.M)


def readelf_probes(path: Path) -> list[tuple[str, str, int, int, int, str]]:
    """(provider, name, location, base, semaphore, arguments) of each note, as readelf -n shows it."""
    return [(p, n, int(loc, 16), int(base, 16), int(sem, 16), args.strip()) for p, n, loc, base, sem, args in _NOTE.findall(readelf("-n", str(path)))]


def readelf_sections(path: Path) -> dict[str, tuple[int, int, int]]:
    """name -> (address, file offset, size), as readelf -S shows them."""
    out = {}
    for line in readelf("-S", str(path)).splitlines():
        match = re.match(r"\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]+) ([0-9a-f]+) ([0-9a-f]+)", line)
        if match:
            out[match[1]] = (int(match[2], 16), int(match[3], 16), int(match[4], 16))
    return out


def readelf_loads(path: Path) -> list[tuple[int, int, int, str]]:
    """(offset, vaddr, filesz, flags) of each PT_LOAD, as readelf -l shows them."""
    out = []
    for line in readelf("-l", str(path)).splitlines():
        match = re.match(r"\s*LOAD\s+0x([0-9a-f]+) 0x([0-9a-f]+) 0x[0-9a-f]+ 0x([0-9a-f]+) 0x[0-9a-f]+ ([RWE ]+?) +0x", line)
        if match:
            out.append((int(match[1], 16), int(match[2], 16), int(match[3], 16), match[4]))
    return out


def file_offset(loads, address: int, flag: str) -> int:
    (offset,) = [off + address - vaddr for off, vaddr, filesz, flags in loads if flag in flags and vaddr <= address < vaddr + filesz]
    return offset


def read(path: Path, *args, **kwargs):
    with open(path, "rb") as stream:
        return read_probes(BoundedElf(stream), *args, **kwargs)


@needs_sdt
@pytest.mark.parametrize("build", list(BUILDS))
def test_probes_are_what_readelf_shows(builds, build):
    path = builds[build]
    before = dict(bounded.stats)
    probes = read(path)
    expected = readelf_probes(path)
    sections, loads = readelf_sections(path), readelf_loads(path)
    base = sections[".stapsdt.base"][0]
    probes_at, probes_size = sections[".probes"][0], sections[".probes"][2]
    assert {(p.provider, p.name): len(p.args) for p in probes} == PROBES
    assert len(probes) == len(expected)
    for probe, (provider, name, location, note_base, semaphore, arguments) in zip(probes, expected):
        assert (probe.provider, probe.name, probe.semaphore, probe.arguments) == (provider, name, semaphore, arguments)
        assert probe.address == location + base - note_base == location  # (not prelinked: the same)
        # Where a uprobe attaches: through the executable PT_LOAD; the semaphore through the writable one.
        assert probe.offset == file_offset(loads, probe.address, "E")
        if provider == "otel_memory":
            assert probes_at <= probe.semaphore < probes_at + probes_size
            assert probe.semaphore_offset == file_offset(loads, probe.semaphore, "W")
            assert probe.semaphore_offset == probe.semaphore - probes_at + sections[".probes"][1]
        else:
            assert (probe.semaphore, probe.semaphore_offset) == (0, 0)
        # Every argument the compiler wrote is read: its size and sign from its text, its kind
        # from its location's form (what each form means: test_argument_descriptors).
        for arg, text in zip(probe.args, arguments.split(), strict=True):
            size, location = text.split("@", 1)
            assert (arg.text, arg.size, arg.signed) == (text, abs(int(size)), size.startswith("-"))
            assert arg.kind == {"%": REGISTER, "$": IMMEDIATE}.get(location[0], MEMORY), text
    assert counted(before) == {}
    if build == "no-pie":
        assert all(p.address > 0x400000 and p.offset < 0x400000 for p in probes)  # (an ET_EXEC's addresses are not its offsets)
    if build == "pie-O0":
        assert {a.register for p in probes if p.provider == "otel_memory" for a in p.args} == {"bp"}


@needs_sdt
def test_the_memory_profilers_probes_by_provider(builds):
    path = builds["libprobes.so"]
    before = dict(bounded.stats)
    assert [p.name for p in read(path, "otel_memory")] == ["alloc", "free"]
    assert [p.name for p in read(path, "otel_memory", names={"free"})] == ["free"]
    assert read(path, "nobody") == ()
    alloc = read(path, "otel_memory", names={"alloc"})[0]
    assert [(a.kind, a.size, a.signed) for a in alloc.args] == [(REGISTER, 8, False)] * 3  # ptr, size, weight
    assert alloc.semaphore and alloc.semaphore_offset
    assert counted(before) == {}


@needs_sdt
def test_a_prelinked_file_is_read_at_its_new_addresses(builds, tmp_path):
    """prelink moves a file's sections but not its notes (they are not loaded): .stapsdt.base
    says by how much. Moved here by hand: the base section's address and the PT_LOADs', by 1 MiB."""
    data = bytearray(builds["libprobes.so"].read_bytes())
    delta = 1 << 20
    e_phoff, e_shoff = struct.unpack_from("<QQ", data, 32)
    e_phentsize, e_phnum, e_shentsize, e_shnum = struct.unpack_from("<HHHH", data, 54)
    for i in range(e_phnum):
        at = e_phoff + i * e_phentsize
        if struct.unpack_from("<I", data, at)[0] == PT_LOAD:
            vaddr, paddr = struct.unpack_from("<QQ", data, at + 16)
            struct.pack_into("<QQ", data, at + 16, vaddr + delta, paddr + delta)
    base_at = readelf_sections(builds["libprobes.so"])[".stapsdt.base"][1]
    for i in range(e_shnum):
        at = e_shoff + i * e_shentsize
        if struct.unpack_from("<Q", data, at + 24)[0] == base_at and struct.unpack_from("<I", data, at + 4)[0] == 1:  # sh_offset, SHT_PROGBITS
            struct.pack_into("<Q", data, at + 16, struct.unpack_from("<Q", data, at + 16)[0] + delta)  # sh_addr
    moved = tmp_path / "libmoved.so"
    moved.write_bytes(bytes(data))
    original, probes = read(builds["libprobes.so"]), read(moved)
    assert [p.address for p in probes] == [p.address + delta for p in original]
    assert [p.offset for p in probes] == [p.offset for p in original]  # the same bytes of the file
    # The semaphores moved with the file (libbpf would find none at the notes' addresses).
    assert [p.semaphore for p in probes] == [p.semaphore and p.semaphore + delta for p in original]
    assert [p.semaphore_offset for p in probes] == [p.semaphore_offset for p in original]
    assert [p.name for p in original if p.semaphore] == ["alloc", "free"]


# --- The argument descriptors, form by form --------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    # registers, every width, the pt_regs field named
    ("8@%rdi", Argument(REGISTER, "8@%rdi", 8, False, "di")),
    ("-4@%eax", Argument(REGISTER, "-4@%eax", 4, True, "ax")),
    ("2@%ax", Argument(REGISTER, "2@%ax", 2, False, "ax")),
    ("-1@%al", Argument(REGISTER, "-1@%al", 1, True, "ax")),
    ("1@%sil", Argument(REGISTER, "1@%sil", 1, False, "si")),
    ("1@%dil", Argument(REGISTER, "1@%dil", 1, False, "di")),
    ("8@%rbp", Argument(REGISTER, "8@%rbp", 8, False, "bp")),
    ("8@%rsp", Argument(REGISTER, "8@%rsp", 8, False, "sp")),
    ("8@%r8", Argument(REGISTER, "8@%r8", 8, False, "r8")),
    ("-4@%r8d", Argument(REGISTER, "-4@%r8d", 4, True, "r8")),
    ("2@%r11w", Argument(REGISTER, "2@%r11w", 2, False, "r11")),
    ("1@%r15b", Argument(REGISTER, "1@%r15b", 1, False, "r15")),
    ("8@%rip", Argument(REGISTER, "8@%rip", 8, False, "ip")),
    ("%rdx", Argument(REGISTER, "%rdx", 8, False, "dx")),  # (no size: a long)
    # immediates
    ("4@$5", Argument(IMMEDIATE, "4@$5", 4, False, offset=5)),
    ("-4@$-1", Argument(IMMEDIATE, "-4@$-1", 4, True, offset=-1)),
    ("8@$0x10", Argument(IMMEDIATE, "8@$0x10", 8, False, offset=16)),
    ("8@$18446744073709551615", Argument(IMMEDIATE, "8@$18446744073709551615", 8, False, offset=(1 << 64) - 1)),
    ("8@$table", Argument(IMMEDIATE, "8@$table", 8, False, symbol="table")),  # (its address)
    # memory: base + offset, base + index * scale, %rip and a symbol, absolute
    ("8@-16(%rbp)", Argument(MEMORY, "8@-16(%rbp)", 8, False, "bp", -16)),
    ("-4@112(%rsp)", Argument(MEMORY, "-4@112(%rsp)", 4, True, "sp", 112)),
    ("8@(%rdi)", Argument(MEMORY, "8@(%rdi)", 8, False, "di")),
    ("8@0x20(%r12)", Argument(MEMORY, "8@0x20(%r12)", 8, False, "r12", 32)),
    ("8@8(%rax,%rdx,8)", Argument(MEMORY, "8@8(%rax,%rdx,8)", 8, False, "ax", 8, "dx", 8)),
    ("-8@(%r9,%rsi,8)", Argument(MEMORY, "-8@(%r9,%rsi,8)", 8, True, "r9", 0, "si", 8)),
    ("1@(%rax,%rbx)", Argument(MEMORY, "1@(%rax,%rbx)", 1, False, "ax", 0, "bx", 1)),
    ("4@-4(,%rcx,4)", Argument(MEMORY, "4@-4(,%rcx,4)", 4, False, None, -4, "cx", 4)),
    ("8@foo(%rip)", Argument(MEMORY, "8@foo(%rip)", 8, False, "ip", symbol="foo")),
    ("8@0x10(%rip)", Argument(MEMORY, "8@0x10(%rip)", 8, False, "ip", 16)),
    ("-4@52+CheckpointStats(%rip)", Argument(MEMORY, "-4@52+CheckpointStats(%rip)", 4, True, "ip", 52, symbol="CheckpointStats")),
    ("-8@buf-8(%rip)", Argument(MEMORY, "-8@buf-8(%rip)", 8, True, "ip", -8, symbol="buf")),
    ("-1@table(%rax)", Argument(MEMORY, "-1@table(%rax)", 1, True, "ax", symbol="table")),
    ("4@counter", Argument(MEMORY, "4@counter", 4, False, symbol="counter")),
    ("8@0x601040", Argument(MEMORY, "8@0x601040", 8, False, offset=0x601040)),
])
def test_argument_descriptors(text, expected):
    before = dict(bounded.stats)
    assert parse_argument(text) == expected
    assert counted(before) == {}


@pytest.mark.parametrize("text", [
    "", "@", "8@", "8@%", "4@%ah", "8@%xmm0", "-8@%st", "4@%eip", "8@%fs:0x28", "4@%rax)", "16@%rdi", "0@%rdi", "3@%rdi",
    "999@%rdi", "8@%RAX", "8@%rax,%rbx", "8@(%eax)", "8@(%rax,%eax,2)", "8@(%rax,%rsp,2)", "8@(%rip,%rax,1)",
    "8@(%rax,%rbx,3)", "8@(%rax,%rbx,16)", "8@()", "8@(,)", "8@((%rax))", "8@8(%rax", "8@x@tpoff", "8@x@GOTPCREL(%rip)",
    "8@a+b(%rip)", "8@-sym(%rip)", "8@010(%rbp)", "8@$", "8@$$5", "8@$--1", "8@$0x", "8@$0x10000000000000000",
    "8@$18446744073709551616", "8@99999999999999999999(%rax)", "8@1e5(%rax)", "8@$5 ", "8@\u00e9(%rax)", "8@%r16",
    "8@%r8l", "8@ %rax", "-8@-16 (%rbp)", "(" * 1024, "8@" + "1+" * 500 + "(%rax)", "\x1b[31m8@%rax",
])
def test_garbage_descriptors_are_unparseable_and_counted(text):
    before = dict(bounded.stats)
    found = parse_argument(text)
    assert (found.kind, found.text) == (UNPARSEABLE, text)
    assert counted(before) == {"stapsdt_args_unparsed": 1}


# --- Files a hostile process could map ---------------------------------------------------------

TEXT = 0x401000  # the executable PT_LOAD: file offset 0x1000, 0x1000 bytes at TEXT
DATA = 0x603000  # the writable one: file offset 0x2000, 0x1000 bytes at DATA
BASE = 0x402000  # .stapsdt.base's address in these files


def sdt_note(pc: int = TEXT + 0x10, provider: bytes = b"otel_memory", name: bytes = b"alloc", args: bytes = b"8@%rdi 8@%rsi 8@%rdx",
             semaphore: int = 0, base: int = BASE, strings: bytes | None = None) -> bytes:
    desc = struct.pack("<QQQ", pc, base, semaphore) + (strings if strings is not None else provider + b"\0" + name + b"\0" + args + b"\0")
    return note(b"stapsdt", 3, desc)


def usdt_file(blob: bytes, aliases: int = 1, shift: int = 0, note_size: int | None = None) -> bytes:
    """A file with a text and a data segment and ``aliases`` .note.stapsdt headers over ``blob``
    (each ``shift`` bytes further on, when given; of ``note_size`` bytes, when given)."""
    segments = [Segment(PT_LOAD, 0x1000, 0x1000, TEXT, flags=5), Segment(PT_LOAD, 0x2000, 0x1000, DATA, flags=6)]
    body = bytes(0x3000 - body_offset(len(segments)))
    at = body_offset(len(segments)) + len(body)
    sections = [Section(".stapsdt.base", SHT_PROGBITS, 0x1800, 1, addr=BASE, flags=2)]
    sections += [Section(".note.stapsdt", SHT_NOTE, at + i * shift, note_size if note_size is not None else len(blob) - i * shift, align=4)
                 for i in range(aliases)]
    return elf_file(sections, segments, body + blob)


class Counting(io.BytesIO):
    """A file in memory that counts the bytes read from it."""

    bytes_read = 0

    def read(self, size=-1):
        data = super().read(size)
        self.bytes_read += len(data)
        return data


def read_counting(data: bytes, *args, **kwargs):
    """(probes, bytes read) of a file of ``data``."""
    stream = Counting(data)
    return read_probes(BoundedElf(stream), *args, **kwargs), stream.bytes_read


@pytest.fixture
def work(monkeypatch):
    """How many notes were walked and arguments parsed."""
    walked = {"notes": 0, "arguments": 0}
    iter_notes, parse = headers.iter_notes, stapsdt.parse_argument

    def counting_notes(data):
        for found in iter_notes(data):
            walked["notes"] += 1
            yield found

    def counting_parse(text):
        walked["arguments"] += 1
        return parse(text)

    monkeypatch.setattr(headers, "iter_notes", counting_notes)
    monkeypatch.setattr(stapsdt, "parse_argument", counting_parse)
    return walked


def test_the_crafted_files_layout_reads_as_a_compilers():
    before = dict(bounded.stats)
    # (A note recorded at a base 0x100 below where .stapsdt.base is now: pc and semaphore move.)
    (probe,) = read_counting(usdt_file(sdt_note(pc=0x401234 - 0x100, base=BASE - 0x100, semaphore=DATA + 0x10 - 0x100)))[0]
    assert (probe.provider, probe.name, probe.address, probe.offset) == ("otel_memory", "alloc", 0x401234, 0x1234)
    assert (probe.semaphore, probe.semaphore_offset) == (DATA + 0x10, 0x2010)
    assert [a.register for a in probe.args] == ["di", "si", "dx"]
    assert counted(before) == {}


def test_thousands_of_probes_are_read_to_the_notes_cap(work):
    blob = b"".join(sdt_note(pc=TEXT + i % 0x1000, args=b"8@%rdi " * MAX_ARGS) for i in range(5000))
    data = usdt_file(blob)
    before = dict(bounded.stats)
    probes, read_bytes = read_counting(data)
    assert len(probes) == MAX_PROBES == MAX_NOTES
    assert work["notes"] <= MAX_NOTES + 1 and work["arguments"] == MAX_NOTES * MAX_ARGS
    assert read_bytes < 2 * len(data)  # (the notes once, the headers)
    assert counted(before) == {"too_many_notes": 1}
    # With a provider asked for, the others' arguments are not parsed; the walk has the same cap.
    work.update(notes=0, arguments=0)
    blob = b"".join(sdt_note(provider=b"other", pc=TEXT + i) for i in range(5000))
    assert read_counting(usdt_file(blob + sdt_note()), "otel_memory")[0] == ()
    assert work["notes"] <= MAX_NOTES + 1 and work["arguments"] == 0
    # At the cap exactly: every probe, nothing counted.
    before = dict(bounded.stats)
    assert len(read_counting(usdt_file(b"".join(sdt_note(pc=TEXT + i) for i in range(MAX_NOTES))))[0]) == MAX_NOTES
    assert counted(before) == {}


def test_probes_outside_text_and_semaphores_outside_data_are_left_out():
    inside = [sdt_note(pc=TEXT), sdt_note(pc=TEXT + 0xFFF, semaphore=DATA), sdt_note(semaphore=DATA + 0xFFE)]
    outside = [sdt_note(pc=TEXT - 1), sdt_note(pc=TEXT + 0x1000), sdt_note(pc=DATA + 8), sdt_note(pc=0), sdt_note(pc=(1 << 64) - 1),
               sdt_note(base=BASE + 0x10_0000)]  # (a base that moves the pc out)
    no_data = [sdt_note(semaphore=TEXT + 8), sdt_note(semaphore=DATA + 0xFFF), sdt_note(semaphore=DATA - 2), sdt_note(semaphore=1)]
    before = dict(bounded.stats)
    probes = read_counting(usdt_file(b"".join(outside + inside + no_data)))[0]
    assert [(p.address, p.semaphore) for p in probes] == [(TEXT, 0), (TEXT + 0xFFF, DATA), (TEXT + 0x10, DATA + 0xFFE)]
    assert counted(before) == {"stapsdt_probes_outside_text": len(outside), "stapsdt_semaphores_outside_data": len(no_data)}


def test_truncated_descriptors_and_strings_without_nul_are_left_out():
    fixed = struct.pack("<QQQ", TEXT, BASE, 0)
    malformed = [
        note(b"stapsdt", 3, b""),
        note(b"stapsdt", 3, fixed[:20]),  # cut in its addresses
        note(b"stapsdt", 3, fixed),  # no strings
        sdt_note(strings=b"otel_memory\0alloc\08@%rdi"),  # arguments without their NUL
        sdt_note(strings=b"otel_memory\0alloc"),  # name without its NUL, no arguments
        sdt_note(strings=b"otel_memory"),
        sdt_note(strings=b"\0alloc\0\0"),  # an empty provider
        sdt_note(provider=b"p" * 257),  # past the bound (256)
        sdt_note(name=b"n" * 300),
        sdt_note(args=b"8@%rdi " * 2000),  # past the arguments' bound (1,024 bytes)
        sdt_note(args=b" ".join([b"8@%rdi"] * (MAX_ARGS + 1))),  # past SDT's 12
    ]
    valid = [sdt_note(provider=b"p" * 256), sdt_note(args=b""), sdt_note(args=b"  8@%rdi   garb@ge  ")]
    other = [note(b"stapsdt", 4, fixed), note(b"GNU", 3, b"\x01" * 20), note(b"stapsdt\0x", 3, fixed)]  # (not SDT notes: skipped)
    before = dict(bounded.stats)
    probes = read_counting(usdt_file(b"".join(malformed + other + valid)))[0]
    assert [(p.provider[:2], [a.kind for a in p.args]) for p in probes] == [("pp", [REGISTER] * 3), ("ot", []),
                                                                           ("ot", [REGISTER, UNPARSEABLE])]
    assert counted(before) == {"stapsdt_notes_malformed": len(malformed), "stapsdt_args_unparsed": 1}


def test_a_note_cut_short_ends_the_walk():
    before = dict(bounded.stats)
    huge = struct.pack("<III", 8, 0xFFFF_FFF0, 3) + b"stapsdt\0"  # a note that says it holds 4 GiB
    probes = read_counting(usdt_file(sdt_note() + huge + sdt_note(pc=TEXT + 1)))[0]
    assert [p.address for p in probes] == [TEXT + 0x10]
    assert counted(before) == {"notes_cut_short": 1}


def test_a_huge_declared_section_is_not_read():
    """.note.stapsdt saying it holds a terabyte, or more than the notes' bytes cap: not read."""
    blob = b"".join(sdt_note(pc=TEXT + i) for i in range(1000))
    for size in (1 << 40, MAX_NOTE_BYTES + 1):
        before = dict(bounded.stats)
        probes, read_bytes = read_counting(data := usdt_file(blob, note_size=size))
        assert probes == () and read_bytes < len(data) - len(blob)  # (the headers, none of the notes)
        assert counted(before) == {"too_many_notes": 1}
    # Within the cap but past the end of the file: what the file holds.
    before = dict(bounded.stats)
    assert len(read_counting(usdt_file(sdt_note() * 2, note_size=MAX_NOTE_BYTES))[0]) == 1
    assert counted(before) == {"notes_cut_short": 1, "stapsdt_probes_repeated": 1}


def test_aliased_note_sections_are_read_once(work):
    blob = b"".join(sdt_note(pc=TEXT + i) for i in range(100))
    data = usdt_file(blob, aliases=500)
    before = dict(bounded.stats)
    probes, read_bytes = read_counting(data)
    assert [p.address for p in probes] == [TEXT + i for i in range(100)]
    assert work["notes"] == 100 and work["arguments"] == 300
    # Each header and its name (pyelftools reads 64 bytes a name), the notes once: not 500 times (4.2 MB).
    assert read_bytes < 2 * len(blob) + 150 * 500
    assert counted(before) == {"aliased_headers": 499}
    # Headers over overlapping bytes (each a note further on): each note's probe once; the walk
    # within the notes cap however many headers there are.
    work.update(notes=0, arguments=0)
    before = dict(bounded.stats)
    probes = read_counting(usdt_file(blob, aliases=100, shift=len(sdt_note())))[0]
    assert [p.address for p in probes] == [TEXT + i for i in range(100)]
    assert work["notes"] <= MAX_NOTES + 1 and work["arguments"] == 300
    assert counted(before) == {"too_many_notes": 1, "stapsdt_probes_repeated": MAX_NOTES - 100}


def test_headers_are_read_without_pyelftools_walk():
    """Names without a NUL (each would be read to the end of the file), PT_DYNAMIC headers (each
    made by making every section), a GNU hash table that says it has a million buckets: the
    probes are found reading the headers' bytes, the names' first bytes and the notes."""
    blob = sdt_note()
    no_nul = b"A" * (4 << 20)
    segments = [Segment(PT_LOAD, 0x1000, 0x1000, TEXT, flags=5)] + [Segment(2, 0, 16, 0)] * 200  # (PT_DYNAMIC)
    start = body_offset(len(segments))
    body = bytes(0x3000 - start) + blob
    gnu_hash = struct.pack("<IIII", 1_000_000, 1, 0, 6)
    decoys = [Section(f".decoy{i}", SHT_PROGBITS, 0x1000, 16) for i in range(500)] + [Section(".gnu.hash", 0x6FFFFFF6, 0x1000, 16, link=1)]
    sections = [Section(".note.stapsdt", SHT_NOTE, 0x3000, len(blob), align=4), *decoys]
    data = bytearray(elf_file(sections, segments, body + gnu_hash + no_nul))
    # .shstrtab (the last header) from the run without a NUL on: each real name moved past it, each decoy's in it.
    e_shoff = struct.unpack_from("<Q", data, 40)[0]
    headers_at = [e_shoff + 64 * i for i in range(1, len(sections) + 2)]
    for i, at in enumerate(headers_at[:-1]):
        name = struct.unpack_from("<I", data, at)[0]
        struct.pack_into("<I", data, at, name + len(no_nul) if i == 0 else 0)
    strings_at, strings_size = struct.unpack_from("<QQ", data, headers_at[-1] + 24)
    struct.pack_into("<QQ", data, headers_at[-1] + 24, strings_at - len(no_nul), strings_size + len(no_nul))
    struct.pack_into("<I", data, headers_at[-1], struct.unpack_from("<I", data, headers_at[-1])[0] + len(no_nul))
    before = dict(bounded.stats)
    probes, read_bytes = read_counting(bytes(data))
    assert [(p.name, p.offset) for p in probes] == [("alloc", 0x1010)]
    assert read_bytes < 64 * len(headers_at) + 56 * len(segments) + 16 * len(headers_at) + len(blob) + 4096
    assert counted(before) == {}


def test_random_descriptors_never_raise():
    rng = random.Random(39)
    alphabet = b"%$@(),+-0123456789abcdefxrspilt_ \0"
    notes = []
    for _ in range(600):
        strings = bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 80)))
        pc = rng.choice((TEXT + rng.randrange(0x1000), rng.randrange(1 << 64)))
        semaphore = rng.choice((0, DATA + rng.randrange(0x1000), rng.randrange(1 << 64)))
        notes.append(sdt_note(pc=pc, semaphore=semaphore, strings=strings[: rng.randrange(len(strings) + 1)]))
    before = dict(bounded.stats)
    probes = read_counting(usdt_file(b"".join(notes)))[0]
    moved = counted(before)
    assert "stapsdt_files_unreadable" not in moved
    left_out = sum(moved.get(f"stapsdt_{reason}", 0) for reason in ("notes_malformed", "probes_outside_text", "semaphores_outside_data",
                                                                    "probes_repeated"))
    assert len(probes) + left_out == len(notes)
    assert moved.get("stapsdt_args_unparsed", 0) == sum(a.kind == UNPARSEABLE for p in probes for a in p.args)


def test_the_files_on_this_host_read_without_a_count():
    """Every probe of the host's libraries that have some (libjvm's hundreds, libpython's,
    libstdc++'s) is kept and every argument parses."""
    candidates = [Path(p) for p in ("/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
                                    "/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so",
                                    "/usr/lib/jvm/temurin-25-jdk-amd64/lib/server/libjvm.so")]
    present = [path for path in candidates if path.exists()]
    if not present:
        pytest.skip("none of the host's libraries with probes is installed")
    before = dict(bounded.stats)
    for path in present:
        assert len(read(path)) == len(readelf_probes(path)) > 0, path
    assert counted(before) == {}
