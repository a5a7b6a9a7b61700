"""Symbolizer against real binaries: each test program prints the runtime addresses of its own
functions, and the symbolizer must name them from the process's mappings and ELF files."""

from __future__ import annotations

import lzma
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from receivers.profiling.processes.table import ProcessTable
from receivers.profiling.symbols.table import SymbolTable, SymbolTableBuilder
from receivers.profiling.elf.headers import parse_build_id_notes
from receivers.profiling.symbols.elf_symbols import ElfSymbols, demangle
from receivers.profiling.symbols.kernel import KernelSymbols
from receivers.profiling.symbols.symbolizer import Symbolizer

from tests.conftest import WORKLOADS

PROGRAM_C = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((noinline)) int target_function(int x) { return x * 7 + 1; }
#ifdef WITH_LIB
void *lib_function_address(void);
#endif
int main(void) {
    printf("%lx\n", (unsigned long)&target_function);
#ifdef WITH_LIB
    printf("%lx\n", (unsigned long)lib_function_address());
#endif
    fflush(stdout);
    char c;
    read(0, &c, 1);  /* until the test closes stdin */
    return target_function(0) == 1 ? 0 : 1;
}
"""

LIB_C = r"""
__attribute__((noinline)) static int lib_static_function(int x) { return x + 3; }
void *lib_function_address(void) { return (void *)&lib_static_function; }
int lib_use(int x) { return lib_static_function(x); }
"""

PROGRAM_CXX = r"""
#include <cstdio>
#include <unistd.h>
namespace outer {
template <typename T> struct Box {
    __attribute__((noinline)) T compute(T x, double y) { return x * 2 + (T)y; }
};
}
int main() {
    auto fn = &outer::Box<int>::compute;
    outer::Box<int> box;
    union { decltype(fn) member; unsigned long addr; } u;
    u.member = fn;
    std::printf("%lx\n", u.addr);
    std::fflush(stdout);
    char c;
    read(0, &c, 1);
    return (box.*fn)(1, 2.0) == 4 ? 0 : 1;
}
"""


def need(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")


def compile_c(tmp: Path, name: str, source: str, *flags: str, cxx: bool = False) -> Path:
    compiler = "g++" if cxx else "gcc"
    need(compiler)
    src = tmp / (name + (".cc" if cxx else ".c"))
    src.write_text(source)
    out = tmp / name
    subprocess.run([compiler, "-O2", str(src), "-o", str(out), *flags], check=True,
                   capture_output=True)
    return out


def build_id_of(path: Path) -> str:
    with open(path, "rb") as f:
        for note in ELFFile(f).get_section_by_name(".note.gnu.build-id").iter_notes():
            return note["n_desc"]
    raise AssertionError("no build id")


class Running:
    """A started test program and the addresses it printed."""

    def __init__(self, exe: Path, lines: int = 1, env=None, prefix: tuple[str, ...] = ()) -> None:
        """``prefix``: what runs the program (setpriv's arguments, say)."""
        self.proc = subprocess.Popen([*prefix, str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        self.addrs = [int(self.proc.stdout.readline(), 16) for _ in range(lines)]
        self.pid = self.proc.pid

    def stop(self) -> None:
        self.proc.stdin.close()
        assert self.proc.wait(10) == 0


@pytest.fixture
def table():
    return ProcessTable()


@pytest.mark.parametrize("flags", [["-fPIE", "-pie"], ["-fno-pie", "-no-pie"]],
                         ids=["pie", "non-pie"])
def test_executable_function(tmp_path, table, flags):
    exe = compile_c(tmp_path, "prog", PROGRAM_C, *flags)
    run = Running(exe)
    try:
        table.on_new_process(run.pid, run.pid, "prog")
        sym = Symbolizer(table)
        addr = run.addrs[0]
        [leaf] = sym.symbolize_user(run.pid, [addr + 2])
        assert (leaf.name, leaf.offset, leaf.kind) == ("target_function", 2, "native")
        assert leaf.file == str(exe) and leaf.build_id == build_id_of(exe)
        assert leaf.mapping_start <= addr + 2 < leaf.mapping_limit
        # the ELF address is what `nm` shows: stable across runs and ASLR
        with open(exe, "rb") as f:
            symtab = ELFFile(f).get_section_by_name(".symtab")
            [nm] = [s["st_value"] for s in symtab.iter_symbols() if s.name == "target_function"]
        assert leaf.file_address == nm + 2
        # a caller frame holds a return address: looked up at address - 1, so the address just
        # past target_function's end still belongs to target_function
        size = [s["st_size"] for s in ELFFile(open(exe, "rb")).get_section_by_name(".symtab")
                .iter_symbols() if s.name == "target_function"][0]
        frames = sym.symbolize_user(run.pid, [addr, addr + size])
        assert [f.name for f in frames] == ["target_function", "target_function"]
    finally:
        run.stop()


def test_shared_library_static_function_and_file_cache(tmp_path, table):
    lib = compile_c(tmp_path, "libthing.so", LIB_C, "-shared", "-fPIC")
    exe = compile_c(tmp_path, "prog", PROGRAM_C, "-DWITH_LIB", f"-L{tmp_path}", "-lthing",
                    f"-Wl,-rpath,{tmp_path}")
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path)}
    runs = [Running(exe, lines=2, env=env) for _ in range(2)]
    try:
        sym = Symbolizer(table)
        for run in runs:
            table.on_new_process(run.pid, run.pid, "prog")
            frames = sym.symbolize_user(run.pid, [run.addrs[1], run.addrs[0] + 1])
            assert frames[0].name == "lib_static_function" and frames[0].file == str(lib)
            assert frames[0].build_id == build_id_of(lib)
            assert frames[0].mapping_offset <= frames[0].file_address
            assert frames[1].name == "target_function"
        # two processes, one parse per file; the second process hit the address cache
        assert sym.stats["files_parsed"] == 2, sym.stats
        assert sym.stats["address_cache_hits"] >= 2
    finally:
        for run in runs:
            run.stop()


def test_stripped_binary_with_debuglink(tmp_path, table):
    need("objcopy")
    exe = compile_c(tmp_path, "prog", PROGRAM_C, "-g")
    subprocess.run(["objcopy", "--only-keep-debug", exe, f"{exe}.debug"], check=True)
    subprocess.run(["strip", "--strip-all", exe], check=True)
    subprocess.run(["objcopy", f"--add-gnu-debuglink={exe}.debug", exe], check=True, cwd=tmp_path)
    run = Running(exe)
    try:
        table.on_new_process(run.pid, run.pid, "prog")
        sym = Symbolizer(table, debug_dirs=[str(tmp_path / "nowhere")])
        [frame] = sym.symbolize_user(run.pid, [run.addrs[0]])
        assert frame.name == "target_function" and frame.build_id == build_id_of(exe)
    finally:
        run.stop()


MINI_C = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((noinline)) static int static_function(int x) { return x * 7 + 1; }
__attribute__((noinline)) int exported_function(int x) { return static_function(x) + 2; }
int main(void) {
    printf("%lx\n%lx\n", (unsigned long)&static_function, (unsigned long)&exported_function);
    fflush(stdout);
    char c;
    read(0, &c, 1);  /* until the test closes stdin */
    return exported_function(0) == 3 ? 0 : 1;
}
"""


def with_mini_debuginfo(exe: Path, section: bytes | None = None) -> Path:
    """``exe`` stripped with a MiniDebugInfo, as Fedora's find-debuginfo makes one (gdb's manual,
    "MiniDebugInfo"): the function symbols .dynsym does not hold, in an xz-compressed ELF in
    .gnu_debugdata; or ``section`` as that section's bytes."""
    work = exe.parent
    symbols = lambda *flags: {line.split()[0]: line.split()[1] for line in subprocess.run(  # noqa: E731
        ["nm", *flags, "--format=posix", "--defined-only", str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()}
    dynamic = symbols("-D")
    (work / "keep").write_text("".join(f"{name}\n" for name, kind in symbols().items() if kind in "Tt" and name not in dynamic))
    subprocess.run(["objcopy", "--only-keep-debug", exe, work / "debug"], check=True)
    subprocess.run(["objcopy", "-S", "--remove-section", ".gdb_index", "--remove-section", ".comment", f"--keep-symbols={work / 'keep'}",
                    work / "debug", work / "mini"], check=True)
    subprocess.run(["xz", "-f", work / "mini"], check=True)
    if section is not None:
        (work / "mini.xz").write_bytes(section)
    subprocess.run(["strip", "--strip-all", "-R", ".comment", exe], check=True)
    subprocess.run(["objcopy", f"--add-section=.gnu_debugdata={work / 'mini.xz'}", exe], check=True)
    return exe


def test_a_stripped_file_with_mini_debuginfo_has_its_static_functions_named(tmp_path, table):
    """Fedora's and RHEL's binaries: no debug file installed, the static function named from the
    .gnu_debugdata it carries, the exported one from .dynsym (what the MiniDebugInfo leaves out)."""
    need("objcopy")
    need("xz")
    exe = with_mini_debuginfo(compile_c(tmp_path, "prog", MINI_C, "-g", "-rdynamic"))
    run = Running(exe, lines=2)
    try:
        table.on_new_process(run.pid, run.pid, "prog")
        sym = Symbolizer(table, debug_dirs=[str(tmp_path / "nowhere")])
        assert [frame.name for frame in sym.symbolize_user(run.pid, [run.addrs[0] + 1, run.addrs[1] + 1])] == ["static_function", "exported_function"]
        assert sym.stats["mini_debuginfo_read"] == 1 and sym.stats["mini_debuginfo_unreadable"] == 0, sym.stats
    finally:
        run.stop()


@pytest.mark.parametrize("section", ["bomb", "garbage", "cut"])
def test_a_mini_debuginfo_past_its_bounds_or_broken_names_from_dynsym_alone(tmp_path, table, section):
    """The section is the process's to write: one that inflates past 16 MiB (17 MiB of zeros, 2.5
    KB of xz), one that is not xz, one cut short: counted, and the file named from .dynsym."""
    need("objcopy")
    need("xz")
    bomb = lzma.compress(bytes(17 << 20), format=lzma.FORMAT_XZ)
    content = {"bomb": bomb, "garbage": b"\x7fELF" + bytes(4000), "cut": bomb[:len(bomb) // 2]}[section]
    exe = with_mini_debuginfo(compile_c(tmp_path, "prog", MINI_C, "-g", "-rdynamic"), content)
    run = Running(exe, lines=2)
    try:
        table.on_new_process(run.pid, run.pid, "prog")
        sym = Symbolizer(table, debug_dirs=[str(tmp_path / "nowhere")])
        assert [frame.name for frame in sym.symbolize_user(run.pid, [run.addrs[0] + 1, run.addrs[1] + 1])] == [None, "exported_function"]
        assert sym.stats["mini_debuginfo_unreadable"] == 1 and sym.stats["mini_debuginfo_read"] == 0, sym.stats
    finally:
        run.stop()


def test_stripped_binary_with_build_id_debug_dir(tmp_path, table):
    need("objcopy")
    exe = compile_c(tmp_path, "prog", PROGRAM_C, "-g")
    bid = build_id_of(exe)
    debug_dir = tmp_path / "debug"
    target = debug_dir / ".build-id" / bid[:2] / f"{bid[2:]}.debug"
    target.parent.mkdir(parents=True)
    subprocess.run(["objcopy", "--only-keep-debug", exe, target], check=True)
    subprocess.run(["strip", "--strip-all", exe], check=True)
    run = Running(exe)
    try:
        table.on_new_process(run.pid, run.pid, "prog")
        [frame] = Symbolizer(table, debug_dirs=[str(debug_dir)]).symbolize_user(
            run.pid, [run.addrs[0]])
        assert frame.name == "target_function"
        # without the debug file the function has no symbol, but the frame keeps its mapping
        [bare] = Symbolizer(table, debug_dirs=[]).symbolize_user(run.pid, [run.addrs[0]])
        assert bare.name is None and bare.file == str(exe) and bare.build_id == bid
        assert bare.mapping_start <= run.addrs[0] < bare.mapping_limit
    finally:
        run.stop()


def test_cplusplus_names_are_demangled(tmp_path, table):
    exe = compile_c(tmp_path, "prog", PROGRAM_CXX, cxx=True)
    run = Running(exe)
    try:
        table.on_new_process(run.pid, run.pid, "prog")
        [frame] = Symbolizer(table).symbolize_user(run.pid, [run.addrs[0]])
        assert frame.name == "outer::Box<int>::compute(int, double)"
    finally:
        run.stop()
    assert demangle("_ZN3foo3barEv") == "foo::bar()"
    assert demangle("not_mangled") == "not_mangled"
    assert demangle("_Zbroken") == "_Zbroken"


@pytest.mark.parametrize("scheme", ["legacy", "v0"])
def test_rust_names_are_demangled_without_their_hash(tmp_path, scheme):
    """Both of rustc's symbol schemes, as rustc writes them for known_split.rs: the functions
    are named as the source has them (legacy's ::h<hash> suffix dropped, as perf shows it)."""
    need("rustc")
    binary = tmp_path / f"known_split_{scheme}"
    scheme_flags = [] if scheme == "legacy" else ["-C", "symbol-mangling-version=v0"]  # legacy: stable rustc's default
    subprocess.run(["rustc", "-O", *scheme_flags, "-o", str(binary), str(WORKLOADS / "known_split.rs")], check=True, capture_output=True)
    with open(binary, "rb") as stream:
        elf = ELFFile(stream)
        raw = {symbol.name: symbol["st_value"] for symbol in elf.get_section_by_name(".symtab").iter_symbols()
               if "known_split" in symbol.name and symbol["st_info"]["type"] == "STT_FUNC"}
        headers = ElfSymbols.read_headers(elf, str(binary))
        assert headers.read_symbols(elf, ".symtab", demangle)
    assert raw and all(name.startswith("_ZN" if scheme == "legacy" else "_R") for name in raw), raw
    names = {headers.lookup(address)[0] for address in raw.values()}
    assert {"known_split::spin_heavy", "known_split::spin_light", "known_split::main"} <= names, names
    assert not [name for name in names if re.search(r"::h[0-9a-f]{16}$", name)], names


def test_files_stay_readable_after_exit_and_delete(tmp_path, table):
    exe = compile_c(tmp_path, "prog", PROGRAM_C)
    sym = Symbolizer(table)  # registers itself: files of new snapshots get pinned
    run = Running(exe)
    table.on_new_process(run.pid, run.pid, "prog")
    assert sym.stats["files_pinned"] >= 1
    run.stop()
    exe.unlink()
    [frame] = sym.symbolize_user(run.pid, [run.addrs[0]])
    assert frame.name == "target_function"


def test_unknown_process_and_unmapped_address(table):
    sym = Symbolizer(table)
    assert sym.symbolize_user(999_999_999, [0x1234]) == [sym.symbolize_user(999_999_999,
                                                                            [0x1234])[0]]
    [frame] = sym.symbolize_user(999_999_999, [0x1234])
    assert frame.name is None and frame.file is None and frame.kind == "native"
    table.on_new_process(os.getpid(), os.getpid(), "pytest")
    [frame] = sym.symbolize_user(os.getpid(), [0x10])
    assert frame.name is None and frame.file is None


def test_kernel_symbols_from_kallsyms():
    ks = KernelSymbols()
    ks.load()
    if not ks.available:
        pytest.skip("kallsyms addresses are hidden (kernel.kptr_restrict)")
    wanted = {}
    with open("/proc/kallsyms") as f:
        for line in f:
            addr, kind, name = line.split()[:3]
            if name in ("do_syscall_64", "schedule") and kind in "Tt":
                wanted[name] = int(addr, 16)
    sym = Symbolizer()
    frames = sym.symbolize_kernel([wanted["do_syscall_64"] + 5, wanted["schedule"] + 1])
    assert [(f.name, f.offset) for f in frames] == [("do_syscall_64", 5), ("schedule", 1)]
    assert all(f.kind == "kernel" and f.file == "[kernel.kallsyms]" for f in frames)
    notes = open("/sys/kernel/notes", "rb").read() if os.path.exists("/sys/kernel/notes") else b""
    assert frames[0].build_id == (parse_build_id_notes(notes) if notes else None)
    # a user-space address is not a kernel symbol
    assert sym.symbolize_kernel([0x400000])[0].name is None


def test_kallsyms_parsing_modules_aliases_and_bounds(tmp_path):
    """The kallsyms format itself (this machine's kernel has no modules to look at)."""
    (tmp_path / "kallsyms").write_text(
        "ffffffff81000000 T _stext\n"
        "ffffffff81000000 T startup_64\n"
        "ffffffff81000100 t __pfx_do_thing\n"
        "ffffffff81000110 T do_thing\n"
        "ffffffff81000200 D some_data\n"
        "ffffffff81000300 T _etext\n"
        "ffffffffc0100000 t ext4_fill_super\t[ext4]\n"
        "ffffffffc0100400 T ext4_iget\t[ext4]\n"
        "ffffffffc0200000 t bpf_prog_6deef7357e7b4530_on_cpu_sample\t[bpf]\n"
    )
    (tmp_path / "modules").write_text("ext4 4096 1 - Live 0xffffffffc0100000\n")
    ks = KernelSymbols(str(tmp_path / "kallsyms"), str(tmp_path / "modules"), str(tmp_path))
    ks.load()
    look = lambda a: (ks.lookup(a).name, ks.lookup(a).offset, ks.lookup(a).file)  # noqa: E731
    assert look(0xFFFFFFFF81000000) == ("startup_64", 0, "[kernel.kallsyms]")  # not _stext
    assert look(0xFFFFFFFF81000115) == ("do_thing", 5, "[kernel.kallsyms]")
    assert look(0xFFFFFFFF81000250) == ("do_thing", 0x140, "[kernel.kallsyms]")  # data skipped
    assert look(0xFFFFFFFF81000400)[0] is None  # past _etext
    assert look(0xFFFFFFFFC0100404) == ("ext4_iget", 4, "[ext4]")
    assert look(0xFFFFFFFFC0101000)[0] is None  # past the end of the module
    assert look(0xFFFFFFFFC0200010)[2] == "[bpf]"
    frame = ks.lookup(0xFFFFFFFFC0100010)
    assert (frame.mapping_start, frame.mapping_limit) == (0xFFFFFFFFC0100000, 0xFFFFFFFFC0101000)


def test_symbol_table_ranges_sizeless_symbols_and_lazy_demangling():
    demangled = []

    def demangle_and_note(name):
        demangled.append(name)
        return name.upper()

    builder = SymbolTableBuilder()
    builder.add(0x1000, 0x10, b"sized")
    builder.add(0x1100, 0, "sizeless_\u00e9".encode())  # hand-written asm: up to the next symbol
    builder.add(0x1180, 0x8, b"last")
    builder.add(0xFFFF_FFFF_FFFF_FF00, 0x1000, b"malformed")  # its size runs past the top of the address space
    table = builder.build(demangle_and_note)
    assert len(table) == 4 and demangled == []  # nothing decoded until asked
    assert table.lookup(0x100F) == ("SIZED", 0x1000)
    assert table.lookup(0x1010) is None  # between a sized symbol's end and the next
    assert table.lookup(0x117F) == ("SIZELESS_\u00c9", 0x1100)
    assert table.lookup(0x1188) is None and table.lookup(0xFFF) is None
    assert table.lookup(0xFFFF_FFFF_FFFF_FFF0) == ("MALFORMED", 0xFFFF_FFFF_FFFF_FF00)
    assert table.lookup(0x1000) == ("SIZED", 0x1000)
    assert demangled == ["sized", "sizeless_\u00e9", "malformed"], "a name once decoded is kept"
    assert SymbolTable.empty().lookup(0x1000) is None


def test_file_ids_match_what_other_tools_compute(tmp_path):
    """A mapping's ids: the GNU build id as readelf prints it, a Go program's build id as `go
    tool buildid` prints it, and the OTel profiling file id (htlhash) as coreutils compute the
    spec's recipe: SHA-256 of the first and last 4096 bytes and the big-endian length, 16 bytes."""
    libc = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
    go = os.path.realpath(shutil.which("go") or "")
    if not go or not os.path.exists(go):
        pytest.skip("no go toolchain (golang-go) to read a Go program's build id")
    for path in (libc, go):
        length = tmp_path / "length"
        length.write_bytes(os.path.getsize(path).to_bytes(8, "big"))
        recipe = f"(head -c 4096 '{path}'; tail -c 4096 '{path}'; cat '{length}') | sha256sum"
        expected = subprocess.run(["sh", "-c", recipe], capture_output=True, text=True, check=True).stdout[:32]
        assert headers_of(path).htlhash == expected, path
    readelf = subprocess.run(["readelf", "-n", libc], capture_output=True, text=True, check=True).stdout
    assert headers_of(libc).build_id == readelf.split("Build ID: ")[1].split()[0]
    assert headers_of(libc).go_build_id is None
    buildid = subprocess.run(["go", "tool", "buildid", go], capture_output=True, text=True, check=True).stdout.strip()
    assert buildid and headers_of(go).go_build_id == buildid


def headers_of(path: str) -> ElfSymbols:
    with open(path, "rb") as stream:
        return ElfSymbols.read_headers(ELFFile(stream), path, mapping_ids=True)


def test_a_symbol_table_past_its_caps_or_its_time_is_not_read(tmp_path, table, monkeypatch):
    """A .symtab larger than the caps is passed over for .dynsym (the exported names), counted;
    one that takes longer than its deadline leaves the file unnamed, counted, and is not read
    again for the next frames."""
    from receivers.profiling.symbols import elf_symbols, symbolizer

    exe = compile_c(tmp_path, "prog", PROGRAM_C, "-rdynamic")  # target_function in .dynsym too
    run = Running(exe)
    try:
        table.on_new_process(run.pid, run.pid, "prog")
        with open(exe, "rb") as f:
            entries = ELFFile(f).get_section_by_name(".symtab").num_symbols()
        monkeypatch.setattr(elf_symbols, "MAX_SYMBOL_ENTRIES", entries - 1)
        sym = Symbolizer(table)
        [leaf] = sym.symbolize_user(run.pid, [run.addrs[0]])
        assert leaf.name == "target_function" and sym.stats["symbol_tables_too_large"] == 1, sym.stats
        assert sym._elf_for(table.lookup(run.pid), table.find_mapping(run.pid, run.addrs[0])).symbol_source == ".dynsym"

        monkeypatch.setattr(elf_symbols, "MAX_SYMBOL_ENTRIES", entries)
        monkeypatch.setattr(symbolizer, "MAX_PARSE_S", -1.0)  # every deadline already past
        slow = Symbolizer(table)
        assert slow.symbolize_user(run.pid, [run.addrs[0]])[0].name is None
        assert slow.symbolize_user(run.pid, [run.addrs[0] + 1])[0].name is None
        assert slow.stats["files_over_time"] == 1 and slow.stats["files_parsed"] == 0, slow.stats
    finally:
        run.stop()


class SlowSymbolizer(Symbolizer):
    """A symbolizer whose every file takes 0.3 s to read, and a report that waits 50 ms for one:
    the report holds a process back while its file is read."""

    def __init__(self, table) -> None:
        super().__init__(table)
        self.loads.wait_s = self.loads.report_wait_s = 0.05

    def _open_and_load(self, info, m):
        time.sleep(0.3)
        return super()._open_and_load(info, m)


def test_a_held_process_has_its_live_heap_counted_once(tmp_path, table):
    """A process held back a report (a file still being read) has its CPU samples carried to the
    next report, but not its in-use counts: those are what was alive at the first report, and the
    next one reads the live heap again (carried, a block alive at both showed twice)."""
    from receivers.profiling.kernel.samples import ORIGIN_INUSE_SPACE, Interval, StackCount
    from receivers.profiling.report import ReportBuilder
    from pycollector.pdata import iter_samples, sample_type

    exe = compile_c(tmp_path, "prog", PROGRAM_C)
    run = Running(exe)
    try:
        table.on_new_process(run.pid, run.pid, "prog")
        reports = ReportBuilder(table, SlowSymbolizer(table))
        cpu = StackCount(run.pid, run.pid, "prog", [], [run.addrs[0]], 5)
        alive = StackCount(run.pid, run.pid, "prog", [], [run.addrs[0]], 4096, origin=ORIGIN_INUSE_SPACE)
        assert not reports.build(Interval([cpu, alive], 0, 1, 0, 1, frequency_hz=100)).resource_profiles
        time.sleep(1.0)  # the file is read meanwhile
        second = reports.build(Interval([alive], 0, 1, 0, 1, frequency_hz=100))
        totals = {}
        for view in iter_samples(second):
            kind = sample_type(second, view.profile)[0]
            totals[kind] = totals.get(kind, 0) + sum(view.values)
        assert totals == {"samples": 5, "inuse_space": 4096}, totals
    finally:
        run.stop()


def test_a_process_whose_file_is_still_being_read_is_reported_once_it_is_named(tmp_path, table):
    """The report does not wait for a file past its allowance: the process's samples wait for the
    next report instead, and arrive there named (once: never past the final report)."""
    from receivers.profiling.kernel.samples import Interval, StackCount
    from receivers.profiling.report import ReportBuilder
    from pycollector.pdata import iter_samples

    exe = compile_c(tmp_path, "prog", PROGRAM_C)
    run = Running(exe)
    try:
        table.on_new_process(run.pid, run.pid, "prog")
        reports = ReportBuilder(table, SlowSymbolizer(table))

        def interval(*stacks):
            return Interval(list(stacks), 0, 1, 0, 1, frequency_hz=100)

        sample = StackCount(run.pid, run.pid, "prog", [], [run.addrs[0]], 5)
        first = reports.build(interval(sample))
        assert not first.resource_profiles and reports.stats["samples_carried"] == 5
        time.sleep(1.0)  # the file is read meanwhile
        second = reports.build(interval())
        assert [(view.frames[0].function, view.values) for view in iter_samples(second)] == [("target_function", [5])]
        # The final report holds nothing back, named or not.
        cold = SlowSymbolizer(table)
        assert len(ReportBuilder(table, cold).build(interval(sample), final=True).resource_profiles) == 1
    finally:
        run.stop()


def test_lasting_frames_are_reused_until_the_process_perf_map_changes(tmp_path, table):
    """Frames a report may keep for the next ones (Symbolizer.symbolize_process's ``lasting``):
    one named from the file is made once and given again; the state they last under
    (names_state, the process's perf map) changes once a perf map appears, and again when it
    grows, so that frames a map could name are made again then."""
    from receivers.profiling.jit.names import JitNames
    from receivers.profiling.jit.perfmap import PerfMaps

    exe = compile_c(tmp_path, "prog", PROGRAM_C)
    run = Running(exe)
    now = [100.0]
    perf_map = Path(f"/tmp/perf-{run.pid}.map")
    try:
        info = table.on_new_process(run.pid, run.pid, "prog")
        sym = Symbolizer(table, jit=JitNames(PerfMaps(clock=lambda: now[0]), set()))
        lasting = {}
        [first] = sym.symbolize_user(run.pid, [run.addrs[0] + 2], {}, info=info, lasting=lasting)
        assert first.name == "target_function" and list(lasting.values()) == [first]
        lookups = sym.stats["address_lookups"]
        [again] = sym.symbolize_user(run.pid, [run.addrs[0] + 2], {}, info=info, lasting=lasting)  # (another report's memo)
        assert again is first and sym.stats["address_lookups"] == lookups
        [unmapped] = sym.symbolize_user(run.pid, [0x1000], {}, info=info, lasting=lasting)  # (a library mapped since may hold it)
        assert unmapped.name is None and list(lasting.values()) == [first]
        without = sym.names_state(info)
        assert sym.names_state(info) == without  # (nothing changed)
        perf_map.write_text("7f0000001000 40 jitted_function\n")
        now[0] += 2
        appeared = sym.names_state(info)
        assert appeared != without
        with perf_map.open("a") as f:
            f.write("7f0000002000 40 jitted_later\n")
        now[0] += 2
        assert sym.names_state(info) not in (without, appeared)
    finally:
        perf_map.unlink(missing_ok=True)
        run.stop()
