"""GoFunctions (receivers/profiling/symbols/gopclntab.py) names the functions of stripped Go binaries as
the Go toolchain's own readers name them.

Names and entries are checked against `go tool nm` on a plain build of the same program (its
.symtab), file and line against `go tool addr2line`, which reads the pclntab through go1.19's
debug/gosym.  known_split.go is built here plain and stripped, internally and externally linked,
as an executable and as a PIE; Debian's own go binary and the binaries of other Go versions found
on this machine (go1.21 to go1.25, Google Cloud SDK's tools and Docker's CLI) are read as shipped.

go1.19's tools need two edits to read a newer binary, both made to a copy: the magic 0xfffffff1
(Go 1.20+) becomes 0xfffffff0, since gosym refuses the newer magic although every field it reads
is where Go 1.18 put it; and in an externally linked binary .text's address becomes runtime.text
(from the pclntab header), which go1.19's objfile takes .text's address for.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from receivers.profiling.symbols.gopclntab import GoFunctions, GoTableError
from tests.conftest import WORKLOADS, build_go_program

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="go (Debian golang-go) is not installed")

SOURCE = WORKLOADS / "known_split.go"
# known_split builds: name -> go build flags.  Each stripped build has a plain twin (no -s -w)
# whose symbol table is the reference; -s -w leaves the code where it was.
LINKING = {
    "internal": [],
    "pie": ["-buildmode=pie"],  # the table is in .data.rel.ro.gopclntab
    "external": ["-ldflags=-linkmode=external"],  # runtime.text is not where .text starts
    "external-pie": ["-buildmode=pie", "-ldflags=-linkmode=external"],  # merged into .data.rel.ro
}
# Go binaries of other versions that this machine ships, read as they are.  Skipped when absent.
OTHER_GO_VERSIONS = [
    "/usr/lib/google-cloud-sdk/bin/cloud_spanner_emulator/gateway_main",  # go1.21.11, external
    "/usr/lib/google-cloud-sdk/platform/google_appengine/go-app-stager",  # go1.22
    "/usr/lib/google-cloud-sdk/bin/gke-gcloud-auth-plugin",  # go1.23.1
    "/usr/lib/google-cloud-sdk/bin/gcloud-crc32c",  # go1.24.4
    "/usr/lib/google-cloud-sdk/bin/local-extract",  # go1.25, external, 49 MB
]
DOCKER = "/usr/local/bin/docker"  # go1.24, its table merged into .data.rel.ro, .symtab kept
SAMPLED_FUNCTIONS = 3000  # per binary of another version: addr2line and lookups stay in seconds


# --------------------------------------------------------------------------------------------
# the Go toolchain as the reference


@pytest.fixture(scope="module")
def go_build(tmp_path_factory):
    """build(flags) -> path of known_split built with those flags (once per flag set)."""
    out = tmp_path_factory.mktemp("go")
    built: dict[tuple[str, ...], Path] = {}

    def build(flags: list[str]) -> Path:
        key = tuple(flags)
        if key not in built:
            if any("external" in flag for flag in flags) and shutil.which("gcc") is None:
                pytest.skip("external linking needs gcc")
            built[key] = build_go_program(SOURCE, out / f"known_split{len(built)}", *flags)
        return built[key]

    return build


def stripped_flags(flags: list[str]) -> list[str]:
    """The same build with -s -w (go build takes one -ldflags)."""
    ldflags = [f for f in flags if f.startswith("-ldflags=")]
    others = [f for f in flags if not f.startswith("-ldflags=")]
    return [*others, " ".join(["-ldflags=-s -w", *(f[len("-ldflags="):] for f in ldflags)])]


def nm_functions(path: Path | str) -> tuple[set[tuple[int, str]], list[str]]:
    """(entry, name) of the Go functions `go tool nm` lists: the text symbols from runtime.text
    up to runtime.etext, without those two markers; and the names of the T symbols outside them,
    C functions the host linker placed when linking externally, which are not in Go's table."""
    out = subprocess.run(["go", "tool", "nm", str(path)], capture_output=True, text=True, check=True).stdout
    symbols = []  # (address, type, name)
    for line in out.splitlines():
        fields = line.split(None, 2)
        if len(fields) == 3 and fields[1] in ("T", "t"):
            symbols.append((int(fields[0], 16), fields[1], fields[2]))
    address = {name: addr for addr, _type, name in symbols}
    low, high = address["runtime.text"], address["runtime.etext"]
    go = {(addr, symbol_name(name)) for addr, _type, name in symbols
          if low <= addr < high and name not in ("runtime.text", "runtime.etext")}
    return go, [name for addr, kind, name in symbols if kind == "T" and not low <= addr < high]


def symbol_name(name: str) -> str:
    """A name as both tables can be compared by.  The ELF symbol of an assembly function carries
    the suffix .abi0, the pclntab name does not; Go 1.18-1.20 linkers write a generic function's
    type arguments as "[...]" in the pclntab (cmd/link/internal/ld/pcln.go, nameParts), and
    linkers since write the middle dot of generated names where the symbol has a dot."""
    name = name.removesuffix(".abi0").replace("·", ".")
    first, last = name.find("["), name.rfind("]")
    return f"{name[:first]}[...]{name[last + 1:]}" if 0 <= first < last else name


def addr2line(path: Path | str, pcs: list[int]) -> list[tuple[str, str | None, int]]:
    """(function, file, line) for each pc by `go tool addr2line`; no file and line 0 when it
    has none (it prints "?" and "?:0" outside any function, ":-1" past a function's line table)."""
    out = subprocess.run(["go", "tool", "addr2line", str(path)], input="".join(f"{pc:#x}\n" for pc in pcs),
                         capture_output=True, text=True, check=True, timeout=300).stdout.splitlines()
    assert len(out) == 2 * len(pcs), out[-4:]
    result = []
    for name, position in zip(out[0::2], out[1::2]):
        file, line = position.rsplit(":", 1)
        result.append((name, file if file not in ("", "?") else None, max(int(line), 0)))
    return result


def table(path: Path | str) -> GoFunctions:
    with open(path, "rb") as stream:
        found = GoFunctions.from_elf(ELFFile(stream))
    assert found is not None, path
    return found


def sample_pcs(functions: GoFunctions, every: int = 1) -> list[int]:
    """Addresses in every `every`-th function: its entry, the byte after, the middle and the last
    byte before the next function."""
    entries = [entry for entry, _name in functions]
    pcs = []
    for i in range(0, len(entries) - 1, every):
        start, end = entries[i], entries[i + 1]
        pcs += sorted({pc for pc in (start, start + 1, (start + end) // 2, end - 1) if pc < end})
    return pcs


def compare_with_addr2line(functions: GoFunctions, oracle: Path | str, pcs: list[int]) -> None:
    """Every pc's function, file and line equal addr2line's.  Allowed to differ: pcs of functions
    without line tables (C code that cgo links in, linker markers such as go:textfipsstart),
    where go1.19's gosym decodes whatever starts the pc table area and prints an invented line
    (the runtime's pcvalue returns -1 for a table at offset 0, as GoFunctions does).  Those are
    a handful per binary; the bound keeps a reader that found no lines at all from passing."""
    expected = addr2line(oracle, pcs)
    differing, without_tables = [], 0
    for pc, want in zip(pcs, expected):
        found = functions.lookup(pc)
        got = (found.name, found.file, found.line) if found else None
        if got == want:
            continue
        if got is not None and got[0] == want[0] and got[1:] == (None, 0):
            without_tables += 1
        else:
            differing.append((hex(pc), got, want))
    print(f"{len(pcs)} pcs compared, {without_tables} in functions without line tables")
    assert not differing, differing[:10]
    assert without_tables <= len(pcs) // 100


# --------------------------------------------------------------------------------------------
# known_split, built here


@pytest.mark.parametrize("linking", LINKING)
def test_stripped_build_names_every_function_nm_lists(go_build, linking):
    """Every Go function of the plain build's symbol table is found in the stripped build at its
    entry, under its name, and the table holds no other function."""
    plain = go_build(LINKING[linking])
    stripped = go_build(stripped_flags(LINKING[linking]))
    with open(stripped, "rb") as stream:
        assert ELFFile(stream).get_section_by_name(".symtab") is None
    functions = table(stripped)
    expected, outside = nm_functions(plain)
    assert len(expected) > 1000
    assert bool(outside) == ("external" in linking), outside  # only the host linker adds C code
    found = set()
    for entry, _name in expected:
        function = functions.lookup(entry)
        found.add((function.entry, symbol_name(function.name)) if function else (entry, None))
    assert sorted(expected - found)[:10] == []
    assert {(entry, symbol_name(name)) for entry, name in functions} == expected
    assert len(functions) == len(expected)


@pytest.mark.parametrize("linking", LINKING)
def test_main_functions_start_on_their_func_line(go_build, linking):
    """A check of file and line that needs no Go tool: each main.* function's entry is on the line
    of its `func` in known_split.go, and an address in spinHeavy's loop is on the loop's line."""
    functions = table(go_build(stripped_flags(LINKING[linking])))
    source = SOURCE.read_text().splitlines()
    declared = {f"main.{m.group(1)}": number for number, text in enumerate(source, 1)
                if (m := re.match(r"func (\w+)\(", text))}
    entries = {name: entry for entry, name in functions if name in declared}
    assert entries.keys() == declared.keys()
    for name, entry in entries.items():
        function = functions.lookup(entry)
        assert (function.name, function.file, function.line) == (name, str(SOURCE), declared[name])
    heavy = entries["main.spinHeavy"]
    end = min(entry for entry, _name in functions if entry > heavy)
    lines = {functions.lookup(pc).line for pc in range(heavy, end)}
    loop = next(n for n, text in enumerate(source, 1) if "6364136223846793005" in text)
    assert loop in lines and lines <= set(range(declared["main.spinHeavy"], loop + 3)) | {0}


def test_stripped_build_matches_go_tool_addr2line(go_build):
    """File and line of every function's entry, the byte after, its middle and its last byte, as
    go tool addr2line reads them from the plain build."""
    plain = go_build([])
    stripped = table(go_build(stripped_flags([])))
    pcs = []
    out = subprocess.run(["go", "tool", "nm", "-size", str(plain)], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[2] == "T":
            start, size = int(fields[0], 16), int(fields[1])
            pcs += sorted({start, start + 1, start + size // 2, start + max(size - 1, 0)})
    assert len(pcs) > 4000
    compare_with_addr2line(stripped, plain, pcs)


# --------------------------------------------------------------------------------------------
# Go binaries as shipped


def test_debian_go_binary_matches_go_tool_addr2line():
    """Debian's go (go1.19, stripped: no .symtab) against go tool addr2line on itself."""
    go = os.path.realpath(shutil.which("go"))
    functions = table(go)
    assert len(functions) > 5000
    assert "main.main" in {name for _entry, name in functions}
    compare_with_addr2line(functions, go, sample_pcs(functions))


@pytest.mark.parametrize("path", OTHER_GO_VERSIONS, ids=os.path.basename)
def test_other_go_versions_match_go_tool_addr2line(path, tmp_path):
    if not os.path.exists(path):
        pytest.skip(f"{path} is not on this machine")
    version = subprocess.run(["go", "version", path], capture_output=True, text=True).stdout.strip()
    print(version)
    functions = table(path)
    oracle = readable_by_go119(path, tmp_path / "copy")
    compare_with_addr2line(functions, oracle, sample_pcs(functions, max(1, len(functions) // SAMPLED_FUNCTIONS)))


def readable_by_go119(path: str, copy: Path) -> Path:
    """A copy of a Go 1.20+ binary go1.19's addr2line reads (see the module docstring)."""
    shutil.copyfile(path, copy)
    with open(copy, "r+b") as stream:
        elf = ELFFile(stream)
        pclntab = elf.get_section_by_name(".gopclntab")["sh_offset"]
        stream.seek(pclntab)
        header = stream.read(32)
        assert header[:8] == b"\xf1\xff\xff\xff\x00\x00\x01\x08", header
        stream.seek(pclntab)
        stream.write(struct.pack("<I", 0xFFFFFFF0))
        text_start = struct.unpack_from("<Q", header, 24)[0]
        [index] = [i for i, section in enumerate(elf.iter_sections()) if section.name == ".text"]
        stream.seek(elf["e_shoff"] + index * elf["e_shentsize"] + 16)  # Elf64_Shdr.sh_addr
        stream.write(struct.pack("<Q", text_start))
    return copy


def test_docker_cli_names_every_function_its_symtab_lists():
    """Docker's CLI (go1.24, externally linked): no .gopclntab section, the table is found inside
    .data.rel.ro; its symbol table is the reference."""
    if not os.path.exists(DOCKER):
        pytest.skip(f"{DOCKER} is not on this machine")
    with open(DOCKER, "rb") as stream:
        assert ELFFile(stream).get_section_by_name(".gopclntab") is None
    functions = table(DOCKER)
    expected, _c_functions = nm_functions(DOCKER)
    assert len(expected) > 10000
    found = {(f.entry, symbol_name(f.name)) if (f := functions.lookup(entry)) else (entry, None)
             for entry, _name in expected}
    assert sorted(expected - found)[:10] == []
    assert {(entry, symbol_name(name)) for entry, name in functions} == expected


def test_one_table_per_file_while_a_reader_holds_it(go_build):
    """The symbolizer and the goroutine reader each ask for a Go program's table (a third of its
    size): the second gets the first's while it is held, and the file is read again once no one
    holds it. A file without a table shares nothing."""
    path = go_build(["-ldflags=-s -w"])
    key = (os.stat(path).st_dev, os.stat(path).st_ino)
    with open(path, "rb") as stream:
        first = GoFunctions.of_file(key, ELFFile(stream))
    assert first is not None and GoFunctions.held(key) is first
    with open(path, "rb") as stream:
        assert GoFunctions.of_file(key, ELFFile(stream)) is first
    del first
    assert GoFunctions.held(key) is None, "released with its last holder"
    libc = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
    with open(libc, "rb") as stream:
        assert GoFunctions.of_file("libc", ELFFile(stream)) is None and GoFunctions.held("libc") is None


# --------------------------------------------------------------------------------------------
# files without a (readable) table


def test_a_c_library_has_no_table():
    libc = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
    with open(libc, "rb") as stream:
        assert GoFunctions.from_elf(ELFFile(stream)) is None


def damaged_copy(path: Path, copy: Path, damage: str) -> Path:
    """A copy of path with its .gopclntab damaged: cut short in the section header (as a short
    read would leave it), or overwritten."""
    shutil.copyfile(path, copy)
    with open(copy, "r+b") as stream:
        elf = ELFFile(stream)
        [(index, section)] = [(i, s) for i, s in enumerate(elf.iter_sections()) if s.name == ".gopclntab"]
        data, at = section.data(), section["sh_offset"]
        size_field = elf["e_shoff"] + index * elf["e_shentsize"] + 32  # Elf64_Shdr.sh_size
        nfunc, funcdata = struct.unpack_from("<Q", data, 8)[0], struct.unpack_from("<Q", data, 8 + 7 * 8)[0]
        functab = struct.unpack_from(f"<{2 * nfunc}I", data, funcdata)
        last_record = funcdata + max(functab[1::2])
        swapped = struct.pack("<IIII", functab[202], functab[201], functab[200], functab[203])  # entries 100, 101
        edits = {
            "truncated-in-header": (size_field, struct.pack("<Q", 12)),
            "truncated-in-function-table": (size_field, struct.pack("<Q", funcdata + 4 * nfunc)),
            "truncated-in-last-record": (size_field, struct.pack("<Q", last_record + 20)),
            "unknown-magic": (at, struct.pack("<I", 0xFFFFFFF7)),
            "pointer-size-3": (at + 7, b"\x03"),
            "huge-function-count": (at + 8, struct.pack("<Q", 1 << 40)),
            "function-table-past-end": (at + 8 + 7 * 8, struct.pack("<Q", len(data) + 8)),
            "entries-out-of-order": (at + funcdata + 800, swapped),
            "function-table-overwritten": (at + funcdata + 800, random.Random(1).randbytes(4096)),
        }
        offset, value = edits[damage]
        stream.seek(offset)
        stream.write(value)
    return copy


DAMAGE = ["truncated-in-header", "truncated-in-function-table", "truncated-in-last-record", "unknown-magic",
          "pointer-size-3", "huge-function-count", "function-table-past-end", "entries-out-of-order",
          "function-table-overwritten"]


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_table_gives_none(go_build, tmp_path, damage):
    stripped = go_build(stripped_flags([]))
    copy = damaged_copy(stripped, tmp_path / "damaged", damage)
    with open(copy, "rb") as stream:
        assert GoFunctions.from_elf(ELFFile(stream)) is None


def test_random_damage_raises_only_gotableerror_and_lookups_never_raise(go_build):
    """Bytes of the header and the function table overwritten at random: the table is refused
    with GoTableError, or read, and then no lookup raises."""
    with open(go_build(stripped_flags([])), "rb") as stream:
        elf = ELFFile(stream)
        good = elf.get_section_by_name(".gopclntab").data()
        text = elf.get_section_by_name(".text")
        low, high = text["sh_addr"], text["sh_addr"] + text["sh_size"]
    funcdata = struct.unpack_from("<Q", good, 8 + 7 * 8)[0]
    rng = random.Random(7)
    refused = 0
    for _ in range(300):
        data = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            at = rng.choice([rng.randrange(0, 72), rng.randrange(funcdata, funcdata + 4096), rng.randrange(len(data))])
            data[at] = rng.randrange(256)
        try:
            functions = GoFunctions(bytes(data), low)
        except GoTableError:
            refused += 1
            continue
        for _ in range(50):
            functions.lookup(rng.randrange(low - 64, high + 64))
        list(functions)
    assert 0 < refused < 300


# --------------------------------------------------------------------------------------------
# cost


def test_cost_of_reading_the_go_binary():
    """The go binary's table (10k functions) is read in milliseconds; lookups cost microseconds.
    The bounds are generous, against gross regressions rather than jitter: this machine measures
    about 2 ms and 200,000 lookups/s."""
    go = os.path.realpath(shutil.which("go"))
    started = time.perf_counter()
    functions = table(go)
    build = time.perf_counter() - started
    pcs = sample_pcs(functions)
    started = time.perf_counter()
    for pc in pcs:
        functions.lookup(pc)
    per_second = len(pcs) / (time.perf_counter() - started)
    print(f"go binary: {len(functions)} functions read in {build * 1000:.1f} ms, {per_second:,.0f} lookups/s")
    assert build < 0.25
    assert per_second > 20_000
