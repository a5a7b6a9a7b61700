"""Memory profiling's user side without BPF: which otel_memory probes the program can read and how
each is described to it (receivers/profiling/memory/probes.py), the live heap's reading and
pruning over fake maps (memory/live.py), and the attacher's bookkeeping over fake maps and links
(memory/attach.py: one link per program and file, an exec told from the same image announced
again, a file mapped again elsewhere, pid reuse, exit)."""

from __future__ import annotations

import collections
import ctypes as ct
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import pytest

from receivers.profiling.elf.stapsdt import Probe, parse_argument
from receivers.profiling.kernel.samples import ORIGIN_INUSE_OBJECTS, ORIGIN_INUSE_SPACE
from receivers.profiling.memory import attach as attach_module, probes
from receivers.profiling.memory.attach import MemoryProbes
from receivers.profiling.memory.live import LiveHeap
from receivers.profiling.processes.proc import Credentials, Mapping, ProcessInfo

NATIVE = Path(__file__).resolve().parent.parent / "sdk" / "native"


def probe(name: str, *args: str) -> Probe:
    return Probe("otel_memory", name, 0x1000, 0x1000, 0, 0, tuple(parse_argument(text) for text in args), " ".join(args))


# bpf/profile.h's struct memory_probe, as BCC lays it out.
class Arg(ct.Structure):
    _fields_ = [("offset", ct.c_int64), ("kind", ct.c_uint8), ("size", ct.c_uint8), ("is_signed", ct.c_uint8), ("base", ct.c_uint8),
                ("index", ct.c_uint8), ("scale", ct.c_uint8), ("reserved", ct.c_uint16)]


class Described(ct.Structure):
    _fields_ = [("kind", ct.c_uint32), ("reserved", ct.c_uint32), ("args", Arg * 3)]


@pytest.mark.parametrize("name, args, readable", [
    ("alloc", ("8@%r13", "8@%rbp", "8@%r12"), True),  # (what gcc made of the sampler's)
    ("alloc", ("8@%rax", "-4@-8(%rbp)", "8@16(%rsp,%rcx,8)"), True),
    ("alloc", ("8@%rax", "8@$4096", "8@%rdx"), True),
    ("free", ("8@%rbx",), True),
    ("alloc", ("8@%rax", "8@%rdx"), False),  # too few arguments
    ("alloc", ("8@%rax", "8@sizes+8(%rip)", "8@%rdx"), False),  # a symbol: an address in the process
    ("alloc", ("8@%rax", "8@16(%rip)", "8@%rdx"), False),  # relative to the next instruction
    ("alloc", ("8@%rax", "8@%xmm0", "8@%rdx"), False),  # unparseable
    ("malloc", ("8@%rax",), False),  # not the contract's
])
def test_which_probes_the_program_can_read(name, args, readable):
    assert probes.readable(probe(name, *args)) is readable


def test_a_probe_is_described_word_by_word_of_pt_regs():
    found = probe("alloc", "8@%r13", "-4@-8(%rbp)", "2@16(%rsp,%rcx,8)")
    leaf = probes.describe(Described(), probes.MemoryProbe("alloc", found.offset, 0, found.args))
    assert leaf.kind == 1
    ptr, size, weight = leaf.args
    assert (ptr.kind, ptr.size, ptr.base) == (1, 8, probes.PT_REGS.index("r13"))
    assert (size.kind, size.size, size.is_signed, size.base, size.index, size.offset) == (2, 4, 1, probes.PT_REGS.index("bp"), 0xFF, -8)
    assert (weight.kind, weight.size, weight.base, weight.index, weight.scale, weight.offset) == (2, 2, probes.PT_REGS.index("sp"),
                                                                                                  probes.PT_REGS.index("cx"), 8, 16)
    assert len(probes.PT_REGS) == 21 and probes.PT_REGS.index("ip") == 16  # (x86-64's struct pt_regs; profile.h PT_REGS_WORDS)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is missing")
def test_the_native_samplers_probes_are_readable():
    subprocess.run(["make", "-s", "-C", str(NATIVE)], check=True, capture_output=True)
    stats: dict[str, int] = {}
    fd = os.open(NATIVE / "build" / "libpycollector_heap.so", os.O_RDONLY)
    try:
        found = probes.read_file_probes(fd, stats)
    finally:
        os.close(fd)
    assert sorted(p.name for p in found) == ["alloc", "free"] and not stats
    assert all(p.semaphore_offset for p in found), "both guarded by a semaphore"
    assert [len(p.args) for p in sorted(found, key=lambda p: p.name)] == [3, 1]


def test_a_file_that_is_not_elf_has_no_probes(tmp_path):
    path = tmp_path / "not-elf"
    path.write_bytes(b"#!/bin/sh\necho hello\n" * 100)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert probes.read_file_probes(fd, {}) == ()
    finally:
        os.close(fd)


# --- the live heap over fake maps -------------------------------------------------------------


class FakeMap(dict):
    """A dict with what LiveHeap uses of a BPF map (no batch lookups: the one-by-one path)."""

    def items_lookup_batch(self):
        raise OSError("no batch here")

    def items(self):  # (a list, as BpfMap's: the caller may delete as it goes)
        return list(super().items())


class CountMap(FakeMap):
    """live_counts: tgid -> its entries."""

    @staticmethod
    def Key(tgid):  # noqa: N802 - as a BPF map's
        return tgid


class LiveKey(NamedTuple):  # (struct live_alloc_key's fields)
    tgid: int
    ptr: int


live_key = LiveKey


def live(weight: int, stack: int, pid: int = 7):
    return SimpleNamespace(pid=pid, comm=b"work\0\0", process_start=0, weight=weight, user_stack_hash=stack, user_leaf_return=0)


def stack(*ips: int):
    return SimpleNamespace(len=len(ips), ips=list(ips))


def by_origin(counts) -> dict:
    return {(count.origin, tuple(count.user_addrs)): count.count for count in counts}


def test_the_live_heap_is_counted_by_stack_in_objects_and_bytes():
    allocs, stacks = FakeMap(), FakeMap()
    allocs[live_key(7, 0x10)] = live(4096, 1)
    allocs[live_key(7, 0x20)] = live(8192, 1)
    allocs[live_key(7, 0x30)] = live(100, 2)
    stacks[1], stacks[2] = stack(0x401000, 0x402000), stack(0x403000)
    heap = LiveHeap(SimpleNamespace(live_allocs=allocs, live_stacks=stacks, live_counts=CountMap()))
    assert by_origin(heap.read()) == {(ORIGIN_INUSE_OBJECTS, (0x401000, 0x402000)): 2, (ORIGIN_INUSE_SPACE, (0x401000, 0x402000)): 12288,
                                      (ORIGIN_INUSE_OBJECTS, (0x403000,)): 1, (ORIGIN_INUSE_SPACE, (0x403000,)): 100}
    assert heap.stats["allocations"] == 3 and heap.stats["bytes"] == 12388


def test_stacks_no_allocation_holds_are_pruned_at_the_second_read_and_their_copies_a_read_later():
    allocs, stacks = FakeMap(), FakeMap()
    allocs[live_key(7, 0x10)] = live(4096, 1)
    stacks[1], stacks[2] = stack(0x401000), stack(0x402000)
    heap = LiveHeap(SimpleNamespace(live_allocs=allocs, live_stacks=stacks, live_counts=CountMap()))
    heap.read()
    assert set(stacks) == {1, 2}, "unreferenced once: kept"
    del allocs[live_key(7, 0x10)]  # (freed)
    heap.read()
    assert set(stacks) == {1}, "stack 2 unreferenced at two reads: deleted"
    # A walk that found stack 1 in place just before it goes: its allocation keeps its frames.
    heap.read()
    assert not stacks
    allocs[live_key(7, 0x40)] = live(50, 1)
    assert by_origin(heap.read())[(ORIGIN_INUSE_SPACE, (0x401000,))] == 50
    assert heap.stats["stacks_missing"] == 0


def test_a_detached_process_has_its_allocations_forgotten():
    allocs, stacks = FakeMap(), FakeMap()
    allocs[live_key(7, 0x10)] = live(4096, 0)
    allocs[live_key(8, 0x10)] = live(4096, 0, pid=8)
    counts = CountMap({7: 1, 8: 1})
    heap = LiveHeap(SimpleNamespace(live_allocs=allocs, live_stacks=stacks, live_counts=counts))
    heap.forget(7)
    assert [key.tgid for key in allocs] == [8] and heap.stats["forgotten"] == 1
    assert counts == {8: 1}, "its share of the live heap goes with it"


# --- the attacher's bookkeeping over fake maps and links --------------------------------------

class BudgetTable(dict):
    """memory_budgets: Key(tgid) -> a process's allocations walked this second, and what the
    throttled ones owe (struct memory_budget's owed_objects and owed_weight)."""

    Key = int

    @staticmethod
    def Leaf(owed_objects: int = 0, owed_weight: int = 0):  # noqa: N802 - as a BPF map's
        return SimpleNamespace(owed_objects=owed_objects, owed_weight=owed_weight)


class ProbeTable(dict):
    """memory_probes: Key(tgid, 0, ip) -> a struct memory_probe."""

    @staticmethod
    def Key(tgid, reserved, ip):  # noqa: N802 - as a BPF map's
        return (tgid, ip)

    Leaf = Described


SAMPLER = ("08:01", 77)  # the sampler library's (dev, inode)
SAMPLER_PROBES = (probes.MemoryProbe("alloc", 0x1A8B, 0x40B2, probe("alloc", "8@%r13", "8@%rbp", "8@%r12").args),
                  probes.MemoryProbe("free", 0x1556, 0x40B0, probe("free", "8@%rbx").args))


def process(program: int, *starts: int, start_ticks: int = 100, pid: int = 4321, uid: int | None = None) -> ProcessInfo:
    info = ProcessInfo(pid=pid, program=program, start_time_ticks=start_ticks,
                       credentials=Credentials(uid, uid) if uid is not None else None)
    info.set_mappings([Mapping(0x400000, 0x401000, 0, "r-xp", "08:01", 5, "/bin/work")]
                      + [Mapping(start, start + 0x2000, 0x1000, "r-xp", *SAMPLER, "/lib/libpycollector_heap.so") for start in starts])
    return info


@pytest.fixture
def attacher(monkeypatch):
    links: list[tuple] = []  # (program, offsets, pid) of each link made
    closed: list[int] = []
    monkeypatch.setattr(attach_module, "open_mapped_file", lambda info, mapping: os.open(os.devnull, os.O_RDONLY))

    def attach_multi(program, fd, offsets, ref_ctr_offsets, pid):
        links.append((program, tuple(offsets), tuple(ref_ctr_offsets), pid))
        return os.open(os.devnull, os.O_RDONLY)

    def detach_multi(fd):
        closed.append(fd)
        os.close(fd)

    monkeypatch.setattr(attach_module.uprobes, "attach_multi", attach_multi)
    monkeypatch.setattr(attach_module.uprobes, "detach_multi", detach_multi)
    forgotten: list[int] = []
    maps = SimpleNamespace(alloc_program=10, free_program=11, probes=ProbeTable(), budgets=BudgetTable(), multi=True)
    memory = MemoryProbes(maps, on_detached=forgotten.append)
    memory._files[SAMPLER] = SAMPLER_PROBES
    memory._files[("08:01", 5)] = ()
    yield SimpleNamespace(memory=memory, maps=maps, links=links, closed=closed, forgotten=forgotten)
    memory.close()


def test_a_process_gets_one_link_per_program_and_file_and_its_probes_described(attacher):
    attacher.memory._on_changed(process(1, 0x7F0000000000))
    assert attacher.links == [(10, (0x1A8B,), (0x40B2,), 4321), (11, (0x1556,), (0x40B0,), 4321)]
    base = 0x7F0000000000 - 0x1000  # (the mapping's start less its file offset)
    assert set(attacher.maps.probes) == {(4321, base + 0x1A8B), (4321, base + 0x1556)}
    assert attacher.maps.probes[(4321, base + 0x1A8B)].kind == 1 and attacher.memory.attached(4321) == 2


def test_announced_again_the_same_image_keeps_its_links_and_live_heap(attacher):
    attacher.memory._on_changed(process(1, 0x7F0000000000))
    attacher.memory._on_changed(process(2, 0x7F0000000000))  # a second snapshot of the same image
    assert len(attacher.links) == 2 and not attacher.closed and not attacher.forgotten
    assert attacher.memory.stats["same_image_again"] == 1


def test_mapped_again_elsewhere_the_probes_are_described_there_without_a_second_link(attacher):
    attacher.memory._on_changed(process(1, 0x7F0000000000))
    attacher.memory._on_changed(process(1, 0x7F0000000000, 0x7E0000000000))
    assert len(attacher.links) == 2
    assert (4321, 0x7E0000000000 - 0x1000 + 0x1A8B) in attacher.maps.probes


def test_an_exec_detaches_the_old_image_and_forgets_its_heap_then_attaches_the_new(attacher):
    attacher.memory._on_changed(process(1, 0x7F0000000000))
    attacher.memory._on_changed(process(2, 0x7D0000000000))  # none of the old mappings is there
    assert len(attacher.closed) == 2 and attacher.forgotten == [4321]
    assert len(attacher.links) == 4 and set(attacher.maps.probes) == {(4321, 0x7D0000000000 - 0x1000 + 0x1A8B),
                                                                      (4321, 0x7D0000000000 - 0x1000 + 0x1556)}


def test_an_exec_into_a_program_without_the_sampler_leaves_nothing(attacher):
    attacher.memory._on_changed(process(1, 0x7F0000000000))
    attacher.memory._on_changed(process(2))
    assert len(attacher.closed) == 2 and not attacher.maps.probes and attacher.memory.attached(4321) == 0


def test_another_process_under_the_pid_and_an_exit_detach(attacher):
    attacher.memory._on_changed(process(1, 0x7F0000000000))
    attacher.memory._on_changed(process(1, 0x7F0000000000, start_ticks=200))  # the pid reused
    assert len(attacher.closed) == 2 and len(attacher.links) == 4
    attacher.memory._detach(4321)  # (what an exit queues)
    assert len(attacher.closed) == 4 and not attacher.maps.probes and attacher.forgotten == [4321, 4321]


def test_without_the_live_heap_free_is_not_attached(attacher):
    attacher.maps.free_program = None
    memory = MemoryProbes(attacher.maps)
    memory._files[SAMPLER] = SAMPLER_PROBES
    memory._files[("08:01", 5)] = ()
    memory._on_changed(process(1, 0x7F0000000000))
    assert attacher.links == [(10, (0x1A8B,), (0x40B2,), 4321)] and memory.attached(4321) == 1
    memory.close()


def test_a_file_without_probes_is_not_opened_again(attacher, monkeypatch):
    opened = []
    monkeypatch.setattr(attach_module, "open_mapped_file", lambda info, mapping: opened.append(mapping.path))
    attacher.memory._on_changed(process(1))
    assert opened == [] and attacher.memory.attached(4321) == 0


def test_a_process_mapping_its_file_again_and_again_takes_a_bounded_share_of_the_probe_table(attacher):
    """A crafted process maps the sampler's file 200 times: each mapping would need its two probes
    described, 400 keys; it gets MAX_DESCRIPTIONS_PER_PROCESS, the rest counted."""
    attacher.memory._on_changed(process(1, *(0x7F0000000000 + i * 0x10000 for i in range(200)), uid=1000))
    assert len(attacher.maps.probes) == attach_module.MAX_DESCRIPTIONS_PER_PROCESS
    assert attacher.memory.stats["descriptions_over_limit"] == 400 - attach_module.MAX_DESCRIPTIONS_PER_PROCESS


def test_one_users_processes_together_take_at_most_their_share_of_the_probe_table(attacher):
    """Three processes of one user, each mapping the file 100 times, fill that user's share (an
    eighth of the table: 256 of 2,048 here) and no more; another user's process and root's get
    theirs whole; a detached process gives its keys back to its user's share."""
    attacher.maps.probes = ProbeTable()
    attacher.maps.probes.max_entries = 2048
    memory = MemoryProbes(attacher.maps)
    memory._files[SAMPLER] = SAMPLER_PROBES
    memory._files[("08:01", 5)] = ()
    many = [0x7F0000000000 + i * 0x10000 for i in range(100)]
    try:
        for pid in (1, 2, 3):
            memory._on_changed(process(1, *many, pid=pid, uid=1000))
        memory._on_changed(process(1, *many, pid=4, uid=1001))
        memory._on_changed(process(1, *many, pid=5, uid=0))
        held = collections.Counter(tgid for tgid, _ip in attacher.maps.probes)
        assert held == {1: 128, 2: 128, 4: 128, 5: 128}, held
        budgets = attacher.maps.budgets
        budgets[1], budgets[2] = budgets.Leaf(owed_objects=3, owed_weight=1536), budgets.Leaf()
        memory._detach(1)
        assert memory._descriptions_by_user == {1000: 128, 1001: 128}
        assert list(budgets) == [2], "its allocation budget goes with it"
        assert (memory.stats["owed_objects_lost"], memory.stats["owed_bytes_lost"]) == (3, 1536), "and what it owed is counted"
    finally:
        memory.close()
