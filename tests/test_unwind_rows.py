"""Unwind rows against binutils: every rule `readelf --debug-dump=frames-interp` prints for a file
is the rule our rows give at that address (rows.py interprets the CFI itself; readelf is an
independent reader of the same bytes). And the row cache: a hit, and damaged files rebuilt."""

from __future__ import annotations

import bisect
import glob
import hashlib
import io
import multiprocessing
import os
import re
import shutil
import subprocess
import struct
import threading
import time
import tracemalloc

import pytest
import structlog
from elftools.elf.elffile import ELFFile

from receivers.profiling.unwind import cache as cache_module
from receivers.profiling.unwind.cache import RowCache
from receivers.profiling.unwind.builder_process import BuilderProcess, BuildTimeout, HelperDied
from receivers.profiling.unwind import registry as registry_module
from receivers.profiling.unwind.registry import QUICK_CFI_BYTES, SMALL_CFI_BYTES, NeedsHelper, RowSource
from receivers.profiling.unwind.rows import (
    CFA_END, CFA_PLT, CFA_RBP, CFA_RBP_DEREF, CFA_RSP, CFA_RSP_DEREF, CFA_SIGNAL, CFA_UNSUPPORTED, RBP_AT_CFA, RBP_SAME,
    RBP_UNSUPPORTED, ROW, ROW_SIZE, NoRows, build_rows, read_cfi, rows_from,
)

from tests.elf_writer import SHT_PROGBITS, Section, body_offset, elf_file

pytestmark = pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) is not installed")

_FDE = re.compile(r"^\S+ \S+ \S+ FDE cie=(\S+) pc=([0-9a-f]+)\.\.([0-9a-f]+)")
_CIE = re.compile(r"^(\S+) \S+ \S+ CIE")


def readelf_rules(path: str) -> list[tuple[int, int, str, str, str]]:
    """(pc, end of its FDE, CFA, rbp, ra) as readelf prints them, for each row of each FDE (an FDE
    with no row of its own takes its CIE's last)."""
    # readelf exits 1 for libc without a word (its debug link leads nowhere); the output is whole.
    text = subprocess.run(["readelf", "--debug-dump=frames-interp", path], capture_output=True, text=True).stdout
    assert "FDE" in text, f"readelf printed no FDE for {path}"
    cie_last: dict[str, tuple[str, str, str]] = {}
    rules = []
    current = None  # ("cie", offset) or ("fde", begin, end, cie)
    columns: list[str] = []
    fde_rows: list = []

    def close_fde():
        if current and current[0] == "fde" and not fde_rows and current[3] in cie_last:
            rules.append((current[1], current[2], *cie_last[current[3]]))

    for line in text.splitlines():
        if match := _FDE.match(line):
            close_fde()
            current, columns, fde_rows = ("fde", int(match[2], 16), int(match[3], 16), match[1]), [], []
        elif match := _CIE.match(line):
            close_fde()
            current, columns, fde_rows = ("cie", match[1]), [], []
        elif line.strip().startswith("LOC"):
            columns = line.split()
        elif current and columns and re.match(r"^[0-9a-f]{16} ", line):
            # A register rule prints as "r10 (r10)": one value.
            values = dict(zip(columns, re.sub(r" \(\w+\)", "", line).split()))
            rule = (values["CFA"], values.get("rbp", "u"), values.get("ra", "u"))
            if current[0] == "cie":
                cie_last[current[1]] = rule
            else:
                fde_rows.append(rule)
                rules.append((int(values["LOC"], 16), current[2], *rule))
    close_fde()
    return rules


def expected(cfa: str, rbp: str, ra: str):
    """What a row must say for readelf's rule; None where readelf does not say enough (exp)."""
    if ra == "u":
        return ("end",)
    if (cfa, rbp, ra) == ("exp", "exp", "exp"):
        return ("signal",)  # a sigreturn trampoline's (checked as such), or unsupported
    if ra != "c-8":
        return ("unsupported",)
    if cfa.startswith("rsp+") or cfa.startswith("rbp+"):
        kind = CFA_RSP if cfa.startswith("rsp") else CFA_RBP
        cfa_rule = (kind, int(cfa[4:]))
    elif cfa == "exp":
        cfa_rule = None  # PLT, a stack slot (both checked separately) or unsupported
    else:
        return ("unsupported",)
    if rbp == "u":
        rbp_rule = (RBP_SAME, 0)
    elif rbp.startswith("c"):
        rbp_rule = (RBP_AT_CFA, int(rbp[1:]))
    else:
        rbp_rule = (RBP_UNSUPPORTED, 0)
    return ("rule", cfa_rule, rbp_rule)


def row_at(rows: list[tuple], starts: list[int], pc: int):
    index = bisect.bisect_right(starts, pc) - 1
    return rows[index] if index >= 0 else None


def cfi_at(path: str):
    with open(path, "rb") as stream:
        return read_cfi(stream)


def unpack(data: bytes) -> list[tuple]:
    return [ROW.unpack_from(data, offset) for offset in range(0, len(data), ROW_SIZE)]


def compare(path: str) -> dict[str, int]:
    with open(path, "rb") as stream:
        rows = unpack(build_rows(stream))
    starts = [row[0] for row in rows]
    assert starts == sorted(starts) and len(set(starts)) == len(starts), "rows must be sorted by a unique pc"
    tally = {"rules": 0, "plt": 0, "signal": 0, "mismatches": 0}
    mismatches = []
    for pc, end, cfa, rbp, ra in readelf_rules(path):
        if pc >= end:
            continue
        row = row_at(rows, starts, pc)
        want = expected(cfa, rbp, ra)
        tally["rules"] += 1
        if want[0] == "end":
            ok = row[1] == CFA_END
        elif want[0] == "unsupported":
            ok = row[1] == CFA_UNSUPPORTED
        elif want[0] == "signal":
            ok = row[1] in (CFA_SIGNAL, CFA_UNSUPPORTED)
            tally["signal"] += row[1] == CFA_SIGNAL
        else:
            cfa_rule, rbp_rule = want[1], want[2]
            if cfa_rule is None:
                ok = row[1] in (CFA_PLT, CFA_UNSUPPORTED, CFA_RSP_DEREF, CFA_RBP_DEREF)
                tally["plt"] += row[1] == CFA_PLT
            else:
                ok = (row[1], row[4]) == cfa_rule
            ok = ok and (cfa_rule is None and row[1] == CFA_UNSUPPORTED or (row[2], row[3]) == rbp_rule)
        if not ok:
            mismatches.append((hex(pc), cfa, rbp, ra, row))
    tally["mismatches"] = len(mismatches)
    assert not mismatches, f"{path}: {len(mismatches)} of {tally['rules']} rules differ from readelf, e.g. {mismatches[:5]}"
    return tally


def test_libc_rows_match_readelf():
    tally = compare(os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6"))
    assert tally["rules"] > 10_000
    assert tally["plt"] >= 1  # libc's .plt has the PLT expression
    assert tally["signal"] == 1  # __restore_rt: the interrupted registers in the ucontext at rsp


def test_python_rows_match_readelf():
    compare(os.path.realpath("/usr/bin/python3"))


def test_optimized_c_program_rows_match_readelf(tmp_path):
    source = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "workloads", "known_split.c")
    source = os.path.realpath(source) if os.path.exists(source) else None
    if source is None or shutil.which("gcc") is None:
        pytest.skip("needs gcc and ../shared/workloads/known_split.c")
    binary = tmp_path / "ks"
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-o", str(binary), source], check=True)
    tally = compare(str(binary))
    with open(binary, "rb") as stream:
        rows = unpack(build_rows(stream))
    # _start says "no return address": the walk ends there, complete.
    assert any(row[1] == CFA_END for row in rows)
    assert tally["rules"] > 5


_ADVANCE = re.compile(r"DW_CFA_advance_loc\d?: \d+ to ([0-9a-f]+)")
_DEREF = re.compile(r"DW_CFA_def_cfa_expression \(DW_OP_breg([67]) \(r[sb]p\): (-?\d+); DW_OP_deref(?:; DW_OP_plus_uconst: (\d+))?\)$")


def test_a_cfa_read_from_a_stack_slot_is_a_row_of_its_own():
    """OpenSSL's SHA-256 (what hashlib runs) realigns its stack and says so as a CFA expression
    that reads the caller's stack pointer from a slot: each such rule, as readelf prints the raw
    instructions, is a DEREF row with the slot's offset and the addend."""
    path = os.path.realpath("/usr/lib/x86_64-linux-gnu/libcrypto.so.3")
    if not os.path.exists(path):
        pytest.skip("Debian's libcrypto3 is not installed")
    text = subprocess.run(["readelf", "--debug-dump=frames", path], capture_output=True, text=True, check=True).stdout
    wanted, location = [], None
    for line in text.splitlines():
        if (fde := _FDE.match(line)) is not None:
            location = int(fde.group(2), 16)
        elif (advance := _ADVANCE.search(line)) is not None:
            location = int(advance.group(1), 16)
        elif location is not None and (deref := _DEREF.search(line.strip())) is not None:
            kind = CFA_RSP_DEREF if deref.group(1) == "7" else CFA_RBP_DEREF
            wanted.append((location, kind, int(deref.group(2)), int(deref.group(3) or 0)))
    with open(path, "rb") as stream:
        rows = unpack(build_rows(stream))
    starts = [row[0] for row in rows]
    got = []
    for location, *_ in wanted:
        row = row_at(rows, starts, location)
        packed = row[4] & 0xFFFFFFFF
        slot = (packed & 0xFFFF) - (0x10000 if packed & 0x8000 else 0)
        got.append((location, row[1], slot, packed >> 16))
    assert len(wanted) >= 20
    assert got == wanted


def test_a_file_without_cfi_has_no_rows(tmp_path):
    not_elf = tmp_path / "text"
    not_elf.write_text("hello")
    with open(not_elf, "rb") as stream, pytest.raises(NoRows):
        build_rows(stream)


def test_row_cache_hits_and_rejects_damaged_files(tmp_path):
    log = structlog.get_logger()
    cache = RowCache(str(tmp_path), log)
    with open("/lib/x86_64-linux-gnu/libc.so.6", "rb") as stream:
        built = build_rows(stream)
    calls = []

    def build():
        calls.append(1)
        return built

    assert cache.get_or_build("abc", build) == built
    assert cache.get_or_build("abc", build) == built
    assert len(calls) == 1 and cache.stats["hits"] == 1

    path = cache.path("abc")
    data = bytearray(open(path, "rb").read())
    for damage in (lambda d: d[:-5], lambda d: d[:40] + bytes([d[40] ^ 1]) + d[41:], lambda d: b"ELF" + d[3:],
                   lambda d: d[:8] + (cache_module.FORMAT_VERSION + 1).to_bytes(4, "little") + d[12:], lambda d: b""):
        with open(path, "wb") as stream:
            stream.write(bytes(damage(data)))
        assert cache.get_or_build("abc", build) == built
    assert len(calls) == 6 and cache.stats["rejected"] == 5
    assert open(path, "rb").read() == bytes(data)  # rewritten whole
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".rows-")]


def test_row_cache_in_an_unwritable_place_still_builds(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = RowCache(str(blocker / "sub"), structlog.get_logger())
    assert cache.get_or_build("k", lambda: b"x" * ROW_SIZE) == b"x" * ROW_SIZE
    assert cache.stats["write_errors"] == 1


def test_code_without_unwind_tables_takes_its_rows_from_the_separate_debug_file(tmp_path):
    """A build with no unwind tables has CFI only in .debug_frame; stripped, that lives in the
    debug file its .gnu_debuglink names. The rows found through the link are the unstripped
    file's, which readelf confirms, and they cover main, which .eh_frame (crt code only) does not."""
    source = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "workloads", "known_split.c"))
    if not os.path.exists(source) or shutil.which("gcc") is None or shutil.which("objcopy") is None:
        pytest.skip("needs gcc, objcopy and ../shared/workloads/known_split.c")
    built = tmp_path / "ks_g"
    subprocess.run(["gcc", "-O2", "-g", "-fomit-frame-pointer", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables",
                    "-o", str(built), source], check=True)
    compare(str(built))
    debug = tmp_path / "ks.debug"
    stripped = tmp_path / "bin" / "ks"
    stripped.parent.mkdir()
    subprocess.run(["objcopy", "--only-keep-debug", str(built), str(debug)], check=True)
    subprocess.run(["objcopy", "--strip-debug", f"--add-gnu-debuglink={debug}", str(built), str(stripped)], check=True)
    shutil.move(debug, stripped.parent / debug.name)  # beside the binary, where the link is looked for
    with open(built, "rb") as stream:
        want = build_rows(stream)
    with open(stripped, "rb") as stream:
        alone = build_rows(stream)
    source_of_rows = RowSource(str(tmp_path / "cache"), structlog.get_logger())
    fd = os.open(stripped, os.O_RDONLY)
    try:
        found = source_of_rows(fd, str(stripped))
    finally:
        os.close(fd)
        source_of_rows.close()
    assert found == want
    main = int(subprocess.run(["nm", str(built)], capture_output=True, text=True, check=True).stdout.split(" T main")[0].split()[-1], 16)
    covered = [row for row in unpack(found) if row[0] <= main]
    assert covered and covered[-1][1] == CFA_RSP, "main's rule comes from the debug file's .debug_frame"
    assert len(unpack(alone)) < len(unpack(found)), "the stripped file alone has only its crt code's rows"


def test_a_file_rewritten_after_it_was_hashed_never_gives_its_rows_under_that_key(tmp_path, monkeypatch):
    """Rows are shared by the hash of what they are built from (SECURITY.md, promise 1). A
    process rewrites its own file (same size, same inode) right after the agent took the hash:
    it held libc's bytes then, and now holds libc with its .eh_frame's address moved, whose rows
    are shifted (wrong for every pc). Its rows must be libc's, the bytes that were hashed: before,
    they were built by reading the file again, so the crafted rows went into the cache under
    libc's key and the next process to map the real libc was given them."""
    libc = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
    real = open(libc, "rb").read()
    with open(libc, "rb") as stream:
        want = build_rows(stream)
    elf_header = ELFFile(io.BytesIO(real))
    index = next(number for number, section in enumerate(elf_header.iter_sections()) if section.name == ".eh_frame")
    address_at = elf_header["e_shoff"] + index * elf_header["e_shentsize"] + 16  # Elf64_Shdr.sh_addr
    crafted = bytearray(real)
    crafted[address_at:address_at + 8] = (int.from_bytes(real[address_at:address_at + 8], "little") + 0x40).to_bytes(8, "little")
    crafted_rows = build_rows(io.BytesIO(bytes(crafted)))
    assert crafted_rows != want
    mine = tmp_path / "libmine.so"
    mine.write_bytes(real)

    sha256 = hashlib.sha256
    rewrites = []

    class RewrittenOnceHashed:  # the process's write lands just after the agent's hash
        def __init__(self, *args):
            self._hash = sha256(*args)

        def update(self, data):
            self._hash.update(data)

        def hexdigest(self):
            digest = self._hash.hexdigest()
            if not rewrites:
                with open(mine, "r+b") as stream:
                    stream.write(crafted)
                rewrites.append(digest)
            return digest

    source = RowSource(str(tmp_path / "cache"), structlog.get_logger())
    try:
        monkeypatch.setattr(hashlib, "sha256", RewrittenOnceHashed)
        fd = os.open(mine, os.O_RDONLY)
        try:
            first = source(fd, str(mine))
        finally:
            os.close(fd)
        monkeypatch.setattr(hashlib, "sha256", sha256)
        assert rewrites and os.stat(mine).st_size == len(real)
        assert first == want, "the rows of the bytes that were hashed"
        fd = os.open(libc, os.O_RDONLY)  # another process, mapping the real libc
        try:
            assert source(fd, libc) == want
        finally:
            os.close(fd)
        for name in os.listdir(tmp_path / "cache"):
            assert cache_module.decode((tmp_path / "cache" / name).read_bytes()) != crafted_rows
    finally:
        source.close()


def test_rows_through_a_debug_file_are_keyed_by_that_debug_file_too(tmp_path):
    """A stripped program's rows come from the debug file beside it. Two processes map the same
    program, each with its own file of that name: the one a hostile process put beside its copy
    (another build's, its build id removed, so it is taken). Before, the rows were keyed by the
    program's hash alone: whoever came first gave its debug file's rows to the other."""
    if shutil.which("gcc") is None or shutil.which("objcopy") is None:
        pytest.skip("needs gcc and objcopy")
    source_c = tmp_path / "p.c"
    source_c.write_text("int f(int x) { volatile int a[8]; a[x & 7] = x; return a[0]; }\n"
                        "int main(int argc, char **argv) { (void)argv; return f(argc); }\n")
    flags = ["-g", "-fomit-frame-pointer", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"]
    for name, level in (("p", "-O2"), ("other", "-O0")):
        subprocess.run(["gcc", level, *flags, "-o", str(tmp_path / name), str(source_c)], check=True)
    files = {}
    for who, debug_of in (("victim", "p"), ("attacker", "other")):
        folder = tmp_path / who
        folder.mkdir()
        subprocess.run(["objcopy", "--only-keep-debug", "--remove-section=.note.gnu.build-id", str(tmp_path / debug_of),
                        str(folder / "p.debug")], check=True)
        files[who] = folder / "p"
    subprocess.run(["objcopy", "--strip-debug", f"--add-gnu-debuglink={tmp_path / 'victim' / 'p.debug'}", str(tmp_path / "p"),
                    str(files["victim"])], check=True)
    shutil.copyfile(files["victim"], files["attacker"])
    with open(files["victim"], "rb") as stream:
        want = build_rows(stream, [str(tmp_path / "victim" / "p.debug")])
    with open(files["attacker"], "rb") as stream:
        theirs = build_rows(stream, [str(tmp_path / "attacker" / "p.debug")])
    assert want != theirs
    source = RowSource(str(tmp_path / "cache"), structlog.get_logger())
    try:
        for who in ("attacker", "victim"):
            fd = os.open(files[who], os.O_RDONLY)
            try:
                files[who] = source(fd, str(files[who]))
            finally:
                os.close(fd)
    finally:
        source.close()
    assert files == {"attacker": theirs, "victim": want}


def uleb128(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def eh_frame_file(cie_instructions: bytes, fde_instructions: bytes) -> bytes:
    """An ELF file whose .eh_frame is one CIE (no augmentation: absolute 8-byte addresses) and
    one FDE, with these instructions."""
    cie_body = struct.pack("<IB", 0, 1) + b"\0" + uleb128(1) + b"\x78\x10" + cie_instructions  # code 1, data -8, ra 16
    cie = struct.pack("<I", len(cie_body)) + cie_body
    fde_body = struct.pack("<IQQ", len(cie) + 4, 0x1000, 0x100) + fde_instructions  # (its CIE, that many bytes back)
    section = cie + struct.pack("<I", len(fde_body)) + fde_body + bytes(4)
    return elf_file([Section(".eh_frame", SHT_PROGBITS, offset=body_offset(0), size=len(section), addr=0x2000, flags=2)], [], section)


def rule_bomb(registers: int, fde_instructions: bytes) -> bytes:
    """A CIE giving a rule to ``registers`` registers no row holds (DW_CFA_offset_extended of
    r128 up), and an FDE of these instructions."""
    return eh_frame_file(b"".join(b"\x05" + uleb128(128 + n) + b"\x01" for n in range(registers)), fde_instructions)


def test_rules_for_registers_no_row_holds_cost_nothing():
    """The interpreter kept a rule for every register a CIE named and copied them all for each
    FDE and each DW_CFA_remember_state: work and memory quadratic in the section's size (48 KB
    took 0.5 s, 1 MB minutes; remembered states without end, gigabytes), in the collector's own
    process for a file counted as small (64 KB: 31 s and 9.6 GB). Only rbp's and the return
    address's are kept now, and 64 nested states: an FDE that nests deeper has an unsupported row."""
    peaks = []
    for instructions in (b"\x0a\x0b" * 1000, b"\x0a" * 1000):  # remembered and restored; remembered
        tracemalloc.start()
        try:
            rows = unpack(build_rows(io.BytesIO(rule_bomb(1000, instructions))))  # 5 KB
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert rows[0][:2] == (0x1000, CFA_RSP if instructions[1:2] == b"\x0b" else CFA_UNSUPPORTED)
    assert max(peaks) < 4 << 20, f"{peaks} bytes at the peak (a million rules copied: 40 MB)"


def test_where_rows_are_built_goes_by_the_bytes_parsed(tmp_path, monkeypatch):
    """A file's rows are built in this process only when its CFI is small, whatever the size of
    the code it maps (a small program may carry a large .eh_frame, or name a large debug file);
    anything larger goes to a helper, whose build is killed past its time (counted by the
    registry as files_over_time): the small files' worker's (may_wait false) up to
    QUICK_CFI_BYTES, past that it leaves the file to the other worker and the large helper."""
    small = tmp_path / "small"
    small.write_bytes(eh_frame_file(b"", b"\x41\x0e\x10"))  # advance 1, CFA = rsp + 16
    medium = tmp_path / "medium"
    medium.write_bytes(rule_bomb(0, b"\x0a\x0b" * (SMALL_CFI_BYTES // 2 + 1)))
    large = tmp_path / "large"
    large.write_bytes(rule_bomb(0, b"\x0a\x0b" * (QUICK_CFI_BYTES // 2 + 1)))
    built_here = []
    monkeypatch.setattr(registry_module, "rows_from", lambda cfi: built_here.append(cfi.size) or rows_from(cfi))
    source = RowSource("", structlog.get_logger())
    try:
        for path in (small, medium, large):
            fd = os.open(path, os.O_RDONLY)
            try:
                if path == large:
                    with pytest.raises(NeedsHelper):
                        source(fd, str(path), may_wait=False)
                else:
                    assert unpack(source(fd, str(path), may_wait=False))[0][:2] == (0x1000, CFA_RSP)
                    assert unpack(source(fd, str(path)))[0][:2] == (0x1000, CFA_RSP)
            finally:
                os.close(fd)
    finally:
        source.close()
    assert built_here == [built_here[0]] * 2 and built_here[0] <= SMALL_CFI_BYTES, "the others are the helpers'"
    libllvm = sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libLLVM-*.so.1"))
    if not libllvm:
        return
    source = RowSource("", structlog.get_logger(), build_timeout_s=0.5)
    fd = os.open(libllvm[0], os.O_RDONLY)
    try:
        with pytest.raises(BuildTimeout):
            source(fd, libllvm[0])
    finally:
        os.close(fd)
        source.close()
    assert len(built_here) == 2


def building(source: RowSource, path: str) -> tuple[threading.Thread, dict]:
    """The rows of ``path`` built by ``source`` on a thread of their own (started): the thread, and
    what came of it once it ends (rows or error, and when)."""
    outcome: dict = {}

    def build() -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            outcome["rows"] = source(fd, path)
        except Exception as error:  # noqa: BLE001 - the test looks at what it was
            outcome["error"] = error
        finally:
            os.close(fd)
            outcome["at"] = time.monotonic()

    builder = threading.Thread(target=build)
    builder.start()
    return builder, outcome


def test_a_row_builder_that_dies_fails_its_file_and_the_next_file_gets_a_new_one(tmp_path):
    """The helper process that builds a large file's rows is killed mid-build (the OOM killer
    would): the build waiting on it fails at once, rather than waiting forever and leaving every
    large file after it without rows, and the next file is built by a new helper."""
    large = sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libLLVM-*.so.1"))
    if not large:
        pytest.skip("no libLLVM here (BCC's dependency) to take the helper seconds")
    source = RowSource(str(tmp_path / "cache"), structlog.get_logger())
    source.start()
    try:
        builder, outcome = building(source, large[0])
        time.sleep(1.0)  # libLLVM's rows take the helper several seconds
        helpers = multiprocessing.active_children()
        assert helpers and "at" not in outcome, "the helper should be building libLLVM's rows"
        for helper in helpers:
            helper.kill()
        killed = time.monotonic()
        builder.join(timeout=10)
        assert not builder.is_alive(), "the build waits for a helper that is gone"
        assert isinstance(outcome.get("error"), HelperDied), outcome
        assert outcome["at"] - killed < 2
        libc = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
        fd = os.open(libc, os.O_RDONLY)
        try:
            rows = source(fd, libc)
        finally:
            os.close(fd)
        assert len(rows) // ROW_SIZE > 1000, "libc's rows, from a new helper"
    finally:
        source.close()


def test_a_small_files_rows_are_not_built_behind_a_large_ones(tmp_path):
    """While the large helper spends seconds on libLLVM's rows, the small files' worker has a
    file of 64 KB of CFI built by its own helper (session 28: a program started beside one that
    ran in libLLVM walked by frame pointer for 4 s, its library's rows queued behind libLLVM's)."""
    large = sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libLLVM-*.so.1"))
    if not large:
        pytest.skip("no libLLVM here (BCC's dependency) to take the helper seconds")
    medium = tmp_path / "medium"
    medium.write_bytes(rule_bomb(0, b"\x0a\x0b" * (SMALL_CFI_BYTES // 2 + 1)))
    source = RowSource(str(tmp_path / "cache"), structlog.get_logger())
    source.start()
    builder, outcome = building(source, large[0])
    try:
        time.sleep(1.0)  # libLLVM's rows take the helper several seconds
        assert not outcome, "the large helper should be building libLLVM's rows"
        fd = os.open(medium, os.O_RDONLY)
        try:
            rows = source(fd, str(medium), may_wait=False)
        finally:
            os.close(fd)
        assert unpack(rows)[0][:2] == (0x1000, CFA_RSP)
        assert not outcome, "built while libLLVM's rows were"
    finally:
        source.close()
        builder.join(timeout=10)
    assert isinstance(outcome.get("error"), NoRows) and "stopping" in str(outcome["error"]), outcome


def test_a_build_the_agent_stops_as_it_begins_ends_quietly(tmp_path, monkeypatch):
    """The agent stops (RowSource.close(), which ends the helper) right after a worker took the
    helper for a large file and before it sent the file: the build ends as "stopping", not as a
    helper that died (which the registry logs as the file's failure, a traceback at every stop)."""
    large = sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libLLVM-*.so.1"))
    if not large:
        pytest.skip("no libLLVM here (BCC's dependency): a CFI too large to build in the worker")
    source = RowSource(str(tmp_path / "cache"), structlog.get_logger())
    build = BuilderProcess.build

    def closed_first(helper, *args, **kwargs):
        source.close()
        return build(helper, *args, **kwargs)

    monkeypatch.setattr(BuilderProcess, "build", closed_first)
    fd = os.open(large[0], os.O_RDONLY)
    try:
        with pytest.raises(NoRows, match="^stopping$"):
            source(fd, large[0])
    finally:
        os.close(fd)


def test_a_file_past_its_time_budget_is_given_up_and_the_next_file_is_built():
    """A file whose rows take longer than their budget (a crafted .eh_frame, or only a large
    library, here with a budget of 0.3 s) is abandoned, its helper ended, and the next file
    gets a new helper: the queue behind it does not wait."""
    large = sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libLLVM-*.so.1"))
    if not large:
        pytest.skip("no libLLVM here (BCC's dependency) to take the helper seconds")
    helper = BuilderProcess()
    started = time.monotonic()
    with pytest.raises(BuildTimeout):
        helper.build(cfi_at(large[0]), stopping=lambda: False, timeout_s=0.3)
    assert time.monotonic() - started < 5 and not helper.alive()
    again = BuilderProcess()
    try:
        assert again.build(cfi_at("/usr/lib/x86_64-linux-gnu/libc.so.6"), stopping=lambda: False)
    finally:
        again.stop()
