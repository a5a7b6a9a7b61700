"""Reading a Go program's goroutines from its memory (receivers/profiling/threads/), without BPF:
the g layout against the DWARF of what Debian's go builds, a real program's goroutines against its
own runtime/pprof profile, and a process's forged runtime (its memory is its own to write) bounded
in goroutines, frames and time, every goroutine not read still counted."""

from __future__ import annotations

import collections
import struct
import subprocess
import time
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from receivers.profiling.processes.memory import MemoryReadError
from receivers.profiling.processes.table import ProcessTable
from receivers.profiling.threads import goroutines
from receivers.profiling.threads.go_programs import GoPrograms
from receivers.profiling.threads.go_runtime import detect_file, layout_for
from receivers.profiling.threads.goroutines import DAMAGED, NOT_READ, RUNNING, LayoutMismatch, read_goroutines
from tests.conftest import build_go_program, loaded
from tests.test_thread_profiles import read_pprof_profile

SOURCE = Path(__file__).parent / "testdata" / "goroutines" / "parked_goroutines.go"


@pytest.fixture(scope="module")
def go_program(tmp_path_factory):
    return build_go_program(SOURCE, tmp_path_factory.mktemp("goroutines") / "parked_goroutines")


def dwarf_members(path: Path, wanted: set[str]) -> dict[str, dict[str, int]]:
    """{struct: {member: offset}} of the runtime's structures, from the binary's own DWARF."""
    out: dict[str, dict[str, int]] = {}
    with path.open("rb") as stream:
        for unit in ELFFile(stream).get_dwarf_info().iter_CUs():
            top = unit.get_top_DIE()
            if top.attributes.get("DW_AT_name") is None or top.attributes["DW_AT_name"].value != b"runtime":
                continue
            for die in top.iter_children():
                name = die.attributes.get("DW_AT_name")
                if die.tag == "DW_TAG_structure_type" and name is not None and name.value.decode() in wanted:
                    out[name.value.decode()] = {member.attributes["DW_AT_name"].value.decode(): member.attributes["DW_AT_data_member_location"].value
                                                for member in die.iter_children() if member.tag == "DW_TAG_member"}
    return out


def test_the_g_layout_of_this_go_release_is_what_its_dwarf_says(go_program):
    import os

    program = detect_file(str(go_program), os.open(go_program, os.O_RDONLY), None)
    layout = layout_for(program.version)
    members = dwarf_members(go_program, {"runtime.g", "runtime.gobuf", "runtime.stack"})
    g, gobuf, stack = members["runtime.g"], members["runtime.gobuf"], members["runtime.stack"]
    assert (layout.stack_lo, layout.stack_hi) == (g["stack"] + stack["lo"], g["stack"] + stack["hi"])
    assert (layout.sched_sp, layout.sched_pc) == (g["sched"] + gobuf["sp"], g["sched"] + gobuf["pc"])
    assert (layout.syscall_sp, layout.syscall_pc, layout.status, layout.goid) == (g["syscallsp"], g["syscallpc"], g["atomicstatus"], g["goid"])


def test_a_running_program_goroutines_are_what_its_runtime_pprof_says(go_program):
    process = subprocess.Popen([str(go_program), "100", "10"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        process.stdin.write("go\n")
        process.stdin.flush()
        _, theirs = read_pprof_profile(process.stdout)
        table = ProcessTable()
        programs = GoPrograms(1.0)
        programs.register(table.on_new_process(process.pid, process.pid, "parked_goroutines"))
        programs.read_all()
        ours: collections.Counter = collections.Counter()
        from receivers.profiling.symbols.symbolizer import Symbolizer

        symbolizer = Symbolizer(table)
        for stack in programs.stacks():
            names = [frame.name for frame in symbolizer.symbolize_user(process.pid, stack.user_addrs, {})]
            ours[next((name for name in names if name in ("main.waitInThePool", "main.waitAtTheDoor")), stack.note or None)] += stack.count
        symbolizer.close()
    finally:
        process.stdin.close()
        process.wait(timeout=30)
    assert theirs == {"main.waitInThePool": 100, "main.waitAtTheDoor": 10}
    assert ours["main.waitInThePool"] == 100 and ours["main.waitAtTheDoor"] == 10, ours
    assert programs.stats["damaged"] == programs.stats["not_read"] == programs.stats["truncated"] == 0, programs.stats


# -- a forged runtime -----------------------------------------------------------------------------

LAYOUT = layout_for((1, 19))
ALLGS, ARRAY, GS, STACKS = 0x10000, 0x20000, 0x100000, 0x4000000
FUNCTIONS = {0x401000: ("main.blocked", 24), 0x402000: ("main.caller", 40), 0x403000: ("runtime.goexit", 0)}


class ForgedMemory:
    """A process's memory as it chose to write it: {address: bytes}; anything else unreadable."""

    def __init__(self, regions: dict[int, bytes]):
        self.regions = regions
        self.reads = 0

    def read(self, address: int, size: int) -> bytes:
        self.reads += 1
        for start, data in self.regions.items():
            if start <= address and address + size <= start + len(data):
                return data[address - start: address - start + size]
        raise MemoryReadError(1, address, size, "not mapped")


def frame_of(address: int):
    for entry, (name, size) in FUNCTIONS.items():
        if entry <= address < entry + 0x1000:
            return entry, name, size
    return None


def g_record(goid: int, status: int, pc: int, sp: int, lo: int, hi: int) -> bytes:
    record = bytearray(LAYOUT.size)
    struct.pack_into("<QQ", record, LAYOUT.stack_lo, lo, hi)
    struct.pack_into("<QQ", record, LAYOUT.sched_sp, sp, pc)
    struct.pack_into("<I", record, LAYOUT.status, status)
    struct.pack_into("<Q", record, LAYOUT.goid, goid)
    return bytes(record)


def forged(gs: list[bytes], length: int | None = None, stack: bytes | None = None) -> ForgedMemory:
    """allgs of ``gs`` (claiming ``length``), each g at GS + 0x1000 i, one stack at STACKS."""
    regions = {ALLGS: struct.pack("<QQQ", ARRAY, len(gs) if length is None else length, len(gs)),
               ARRAY: b"".join(struct.pack("<Q", GS + 0x1000 * i) for i in range(len(gs)))}
    for i, record in enumerate(gs):
        regions[GS + 0x1000 * i] = record
    regions[STACKS] = stack if stack is not None else b"\0" * 0x2000
    return ForgedMemory(regions)


def parked(goid: int, stack_bytes: int = 0x2000) -> bytes:
    return g_record(goid, goroutines.G_WAITING, 0x401010, STACKS, STACKS, STACKS + stack_bytes)


def walked_stack() -> bytes:
    """blocked (frame 24) <- caller (frame 40) <- goexit."""
    data = bytearray(0x2000)
    struct.pack_into("<Q", data, 24, 0x402010)  # blocked's return address, at sp + 24
    struct.pack_into("<Q", data, 24 + 8 + 40, 0x403001)
    return bytes(data)


def test_a_forged_runtime_walks_as_go_does_and_counts_what_it_cannot_read():
    gs = [parked(1), parked(2), g_record(3, goroutines.G_RUNNING, 0, 0, 0, 0), g_record(4, goroutines.G_DEAD, 0, 0, 0, 0),
          g_record(5, goroutines.G_WAITING, 0x401010, STACKS - 8, STACKS, STACKS + 0x2000), g_record(6, 77, 0, 0, 0, 0)]
    reading = read_goroutines(forged(gs, stack=walked_stack()), ALLGS, LAYOUT, frame_of, time.monotonic() + 5, 1 << 20)
    assert reading.counts == {((0x401010, 0x402010, 0x403001), ""): 2, ((), RUNNING): 1, ((), DAMAGED): 2}  # (the dead one is none)


def test_a_runtime_claiming_a_billion_goroutines_costs_a_bounded_reading_and_counts_them_all(monkeypatch):
    monkeypatch.setattr(goroutines, "MAX_GOROUTINES", 1000)
    memory = forged([parked(1 + i) for i in range(1000)], length=10 ** 9, stack=walked_stack())
    reading = read_goroutines(memory, ALLGS, LAYOUT, frame_of, time.monotonic() + 5, 1 << 30)
    assert reading.counts[((0x401010, 0x402010, 0x403001), "")] == 1000
    assert reading.counts[((), NOT_READ)] == 10 ** 9 - 1000 and sum(reading.counts.values()) == 10 ** 9
    assert memory.reads < 3 * 1000


def test_a_stack_that_loops_stops_at_the_frame_bound_and_past_the_deadline_nothing_more_is_read():
    data = bytearray(0x10000)
    for at in range(24, len(data) - 8, 32):  # every frame returns into blocked again
        struct.pack_into("<Q", data, at, 0x401010)
    reading = read_goroutines(forged([parked(1, 0x10000)], stack=bytes(data)), ALLGS, LAYOUT, frame_of, time.monotonic() + 5, 1 << 30)
    (stack, note), = reading.counts
    assert len(stack) == goroutines.MAX_FRAMES and note == "" and reading.stats["truncated"] == 1
    late = read_goroutines(forged([parked(1 + i) for i in range(50)]), ALLGS, LAYOUT, frame_of, time.monotonic() - 1, 1 << 30)
    assert late.counts == {((), NOT_READ): 50}
    over_bytes = read_goroutines(forged([parked(1 + i) for i in range(50)]), ALLGS, LAYOUT, frame_of, time.monotonic() + 5, 100)
    assert over_bytes.counts[((), NOT_READ)] == 50


def test_a_first_g_that_is_not_main_refuses_the_layout():
    with pytest.raises(LayoutMismatch):
        read_goroutines(forged([parked(7)]), ALLGS, LAYOUT, frame_of, time.monotonic() + 5, 1 << 20)


def test_a_stripped_go_program_gives_no_goroutines_profile_and_says_so(tmp_path, log_output):
    """Built with -ldflags=-s (no symbol table: runtime.allgs is data, which .gopclntab does not
    name): detected as Go, not registered, counted and logged once."""
    stripped = build_go_program(SOURCE, tmp_path / "stripped", "-ldflags=-s -w")
    process = subprocess.Popen([str(stripped), "3", "2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        loaded(process.pid, str(stripped))  # (announced before the kernel mapped it, it is no Go program yet: ci26, ci7 of session 28)
        programs = GoPrograms(1.0)
        info = ProcessTable().on_new_process(process.pid, process.pid, "stripped")
        programs.register(info)
        programs.read_all()
    finally:
        process.stdin.close()
        process.wait(timeout=30)
    assert not programs.knows(process.pid) and programs.stacks() == []
    seen = {"exe": info.exe_path, "exited": info.exited, "kernel_thread": info.kernel_thread, "exit status": process.returncode,
            "files": [m.path for m in info.mappings if m.file_backed][:4], "detection": programs.files.stats, "go": programs.stats}
    assert programs.stats["go_stripped"] == 1, seen
    assert "a Go program without a symbol table: no goroutines profile" in log_output.getvalue()
