"""One budget a report for the runtimes' reads that name frames, all processes together (issue 42,
"budgets that hold for the whole agent"): budgets per process let N hostile processes cost N
budgets a report (six forged JVMs: 10-15 s between reports due every 2; eight Node processes
whose names are deep cons strings: 10.5 s). Here many processes are driven through the real
namers with memory doubles that count every read: the report's reads stay within its budget
however many overspend, a process within its share is still named, and what was refused is
named in later reports (receivers/profiling/processes/report_budget.py)."""

from __future__ import annotations

import bisect
import struct
import subprocess
import types

import pytest

from receivers.profiling.kernel.samples import Interval, StackCount
from receivers.profiling.processes.memory import MemoryReadError
from receivers.profiling.processes.report_budget import READ_COST, REFUSED_STAT, BudgetedMemory, NamingBudgetSpent, ReportBudget


class CountingMemory:
    """A process's memory (ProcessMemory's interface) over ``blocks`` ({address: bytes}), each
    read counted; ``clock``, if given, moves on ``read_s`` a read (a slow process)."""

    def __init__(self, pid: int, blocks: dict, clock=None, read_s: float = 0.0) -> None:
        self.pid, self.exited, self.clock, self.read_s = pid, False, clock, read_s
        self.waited = read_s > 0  # (a slow process's pages: not in memory, read from a disk)
        self._starts = sorted(blocks)
        self._blocks = blocks
        self.reads = self.bytes = 0

    def read(self, address: int, size: int) -> bytes:
        self.reads += 1
        self.bytes += size
        if self.clock is not None:
            self.clock.now += self.read_s
        at = bisect.bisect_right(self._starts, address) - 1
        if at >= 0:
            start = self._starts[at]
            data = self._blocks[start]
            if address + size <= start + len(data):
                return bytes(data[address - start: address - start + size])
        raise MemoryReadError(self.pid, address, size, "not mapped")

    @property
    def cost(self) -> int:
        """What the reads cost the report's budget."""
        return self.bytes + READ_COST * self.reads

    def close(self) -> None:
        pass


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


# -- the budget alone ----------------------------------------------------------------------------

def _read_all(budget: ReportBudget, memories: list) -> None:
    budget.share_among([memory.pid for memory in memories])
    for memory in memories:
        budget.begin(memory.pid)
        for _ in range(1000):
            try:
                budget.read(memory, 0x1000, 8)
            except NamingBudgetSpent:
                pass


def test_slow_reads_stop_when_the_reports_seconds_are_spent():
    """Eight processes whose every read takes 15 ms of the report thread's own time: the
    report's reads stop once its seconds are spent (the read under way finishes), whatever its
    bytes allow."""
    clock = Clock()
    budget = ReportBudget(read_bytes=1 << 30, read_seconds=0.5, clock=clock, cpu_clock=clock)
    slow = [CountingMemory(100 + n, {0x1000: bytes(64)}, clock, read_s=1 / 64) for n in range(8)]
    for memory in slow:
        memory.waited = False  # (its pages in memory: timed by the thread's CPU)
    _read_all(budget, slow)
    assert sum(memory.reads for memory in slow) == 32 and 0.5 <= clock.now < 0.5 + 1 / 64, clock.now
    assert budget.refused == {memory.pid for memory in slow if memory.reads < 1000}


def test_reads_of_pages_not_in_memory_stop_at_half_the_reports_seconds():
    """Eight processes whose every read waits 15 ms by the clock (pages in swap, or not faulted
    in yet: a slow check first reads the process's maps): those reads stop at half the report's
    seconds (WAITED_SHARE), so that the report ends within its interval. At all of it, a process
    pointing its code objects at such pages, its maps 3.9 MB, made every report 1.12-1.23 s long,
    due every 1 (test_hostile_runtimes). Reads of pages in memory after them are refused too:
    whether a read waits is known only once it is made."""
    clock = Clock()
    budget = ReportBudget(read_bytes=1 << 30, read_seconds=0.5, clock=clock, cpu_clock=lambda: 0.0)
    slow = [CountingMemory(100 + n, {0x1000: bytes(64)}, clock, read_s=1 / 64) for n in range(8)]
    resident = CountingMemory(1, {0x1000: bytes(64)})
    _read_all(budget, [*slow, resident])
    assert sum(memory.reads for memory in slow) == 16 and 0.25 <= clock.now < 0.25 + 1 / 64, clock.now
    assert budget.waited == budget.spent[1] == clock.now
    assert resident.reads == 0 and budget.refused == {memory.pid for memory in slow if memory.reads < 1000} | {1}


def test_a_process_named_first_cannot_take_the_shares_of_those_after_it():
    budget = ReportBudget(read_bytes=10 * (1000 + READ_COST), read_seconds=1e9)
    greedy, modest = CountingMemory(2, {0x1000: bytes(1000)}), CountingMemory(1, {0x1000: bytes(1000)})
    budget.share_among([greedy.pid, modest.pid])
    budget.begin(greedy.pid)
    with pytest.raises(NamingBudgetSpent):
        for _ in range(100):
            budget.read(greedy, 0x1000, 1000)
    budget.begin(modest.pid)
    for _ in range(5):  # its share, kept for it
        budget.read(modest, 0x1000, 1000)
    assert greedy.reads == modest.reads == 5
    stats = {}
    memory = BudgetedMemory(modest, stats)
    memory.budget = budget
    with pytest.raises(MemoryReadError):  # (what every namer leaves a frame unnamed for)
        memory.read(0x1000, 1000)
    assert stats[REFUSED_STAT] == 1


# -- V8: Node processes whose names are deep cons strings, through the report builder -----------

def _v8_world():
    """The V8 runtime with fake processes registered, and a heap of functions: a name that is a
    cons-string DAG (a thousand pieces, each a few reads), many ordinary names, and one."""
    import structlog

    from receivers.profiling.v8.heap import ReadBudget, V8Heap
    from receivers.profiling.v8.runtimes import (LINE_READ_BUDGET_PER_PROCESS, READ_BUDGET_PER_PROCESS, V8Process,
                                                 V8Runtimes)
    from tests.test_profiling_v8 import FakeHeap

    fake = FakeHeap()
    layout = fake.layout
    undefined = fake.object(layout.first_nonstring_type)

    def function(name: int) -> int:
        script = fake.object(layout.script_type, {layout.script_name: undefined, layout.script_source: undefined,
                                                  layout.script_line_ends: undefined}, size=256)
        return fake.object(layout.shared_type, {layout.shared_name_or_scope_info: name, layout.shared_script_or_debug_info: script,
                                                layout.shared_function_data: undefined}, size=256)

    dag = fake.seq("a")
    for depth in range(1, 11):  # 1,024 characters, each leaf read through 10 cons strings
        dag = fake.string(layout.cons_string_tag | layout.one_byte_string_tag, 1 << depth, {layout.cons_first: dag, layout.cons_second: dag})
    hostile = [function(dag) for _ in range(8)]
    many = [function(fake.seq(f"work{n}")) for n in range(60)]
    one = function(fake.seq("benign"))
    small = fake.seq("a")
    for depth in range(1, 7):  # 64 characters, then what no string is: read in hundreds of reads, and no name
        small = fake.string(layout.cons_string_tag | layout.one_byte_string_tag, 1 << depth, {layout.cons_first: small, layout.cons_second: small})
    failing = function(fake.string(layout.cons_string_tag | layout.one_byte_string_tag, 128, {layout.cons_first: small, layout.cons_second: undefined}))

    class Table(dict):
        Key = int

        class Leaf:
            pass

    runtimes = V8Runtimes(Table(), structlog.get_logger())
    memories = {}

    def add(pid: int) -> None:
        memory = memories[pid] = CountingMemory(pid, fake.memory.blocks)
        budgeted = BudgetedMemory(memory, runtimes.stats)
        info = types.SimpleNamespace(pid=pid, program=("node", pid), kernel_thread=False, exited=False, mappings=[])
        runtimes._processes._processes[pid] = V8Process(
            info, types.SimpleNamespace(layout=layout), ("node", 1), V8Heap(budgeted, layout, ReadBudget(READ_BUDGET_PER_PROCESS)),
            None, lines_heap=V8Heap(budgeted, layout, ReadBudget(LINE_READ_BUDGET_PER_PROCESS)))

    return runtimes, memories, add, hostile, many, one, failing


def _interpreted(pid: int, shared_functions: list[int]) -> StackCount:
    """A stack of interpreted JavaScript frames (bytecode offset unknown: no line read)."""
    from receivers.profiling.symbols.runtime_stacks import KIND_SHIFT, TAG
    from receivers.profiling.v8.runtimes import BYTECODE_OFFSET_MAX, BYTECODE_OFFSET_SHIFT, INTERPRETED
    return StackCount(pid, pid, "node", [], [TAG | INTERPRETED << KIND_SHIFT | BYTECODE_OFFSET_MAX << BYTECODE_OFFSET_SHIFT | shared
                                             for shared in shared_functions], 1)


class _Unknown:
    """No /proc snapshot and no native names: only the runtime's frames are named."""

    deferred = 0

    def incarnation(self, tgid, started):
        return None

    def new_report(self):
        pass

    def symbolize_kernel(self, addresses):
        return []


def _names(data) -> dict[int, list]:
    from pycollector.pdata import iter_samples
    out: dict[int, list] = {}
    for view in iter_samples(data):
        out.setdefault(view.resource["process.pid"], []).extend(frame.function for frame in view.frames)
    return out


def test_node_processes_whose_names_are_cons_string_dags_cost_one_budget_a_report():
    """Eight processes whose every function's name is a 1,024-piece cons-string DAG (10,000
    reads a name), a process with 60 functions, then (named last, its pid the lowest) one with
    one: each report reads within the one budget, the last process is named in the first report,
    the hostile ones are refused (counted, carried once, then sent unnamed), and the busy one,
    over its share, is named in full in later reports from what each read."""
    from receivers.profiling.report import ReportBuilder

    runtimes, memories, add, hostile, many, one, _ = _v8_world()
    for pid in (*range(200, 208), 100, 1):
        add(pid)
    reports = ReportBuilder(_Unknown(), _Unknown(), host_name="test")
    reports.runtimes = [runtimes]
    reports.naming_read_bytes = 512 << 10
    stacks = [*(_interpreted(pid, hostile[:3]) for pid in range(200, 208)), _interpreted(100, many), _interpreted(1, [one])]

    def report() -> dict[int, list]:
        before = sum(memory.cost for memory in memories.values())
        data = reports.build(Interval(stacks, 0, 1, 0, 1, frequency_hz=100))
        assert sum(memory.cost for memory in memories.values()) - before <= reports.naming_read_bytes
        return _names(data)

    first = report()
    assert first[1] == ["benign"]  # named at once, after all the others
    assert set(first) == {1}  # the others carried to the next report
    assert runtimes.stats[REFUSED_STAT] > 0 and reports.stats["samples_carried_for_names"] == 9
    assert all(memories[pid].reads < 10_000 for pid in range(200, 208))  # (not one name's worth)
    second = report()
    assert all(second[pid] == [""] * 6 for pid in range(200, 208)), second  # carried once, then sent unnamed
    busy = [second.get(100, [])] + [report().get(100, []) for _ in range(6)]
    assert any(names and "" not in names and set(names) == {f"work{n}" for n in range(60)} for names in busy), busy  # in a later report


@pytest.mark.parametrize("forged", ["cut by the budget", "no string after hundreds of reads"])
def test_a_name_that_costs_more_than_a_name_waits_while_the_functions_after_it_are_named(forged):
    """A process whose stack reaches a function with a forged name before a benign one: a
    cons-string DAG of 10,000 reads (more than its share: the budget cuts it, and refuses the
    benign name after it, in the same order every report), or one that ends in what is no string
    after hundreds of reads. Neither is read again for 1 report, then 2, 4...: the benign name is
    named in the next report, and the forged one costs 4 of twelve reports, not every one (the
    eight Node processes of tests/test_hostile_runtimes.py stayed unnamed, hot function and all,
    a whole attack)."""
    from receivers.profiling.report import ReportBuilder
    from receivers.profiling.v8.runtimes import MAX_POSTPONED_REPORTS

    runtimes, memories, add, hostile, many, one, failing = _v8_world()
    add(7)
    reports = ReportBuilder(_Unknown(), _Unknown(), host_name="test")
    reports.runtimes = [runtimes]
    reports.naming_read_bytes = 512 << 10
    stack = _interpreted(7, [hostile[0] if forged == "cut by the budget" else failing, one])
    named, costly = [], []
    for _ in range(12):
        reads = memories[7].reads
        named.append(_names(reports.build(Interval([stack], 0, 1, 0, 1, frequency_hz=100))).get(7))
        costly.append(memories[7].reads - reads > 100)
    assert costly == [True, False, True, False, False, True, False, False, False, False, True, False], costly  # waits 1, 2, 4
    # A report whose budget cut the forged name held the process back (its stack named in the
    # next, with its own); the failing name spent no more than its share, and held nothing back.
    held_back = costly if forged == "cut by the budget" else [False] * 12
    assert all((names is None) if held else (names and names == ["", "benign"] * (len(names) // 2)) for names, held in zip(named, held_back)), named
    assert runtimes.stats["names_postponed"] >= sum(len(names) // 2 for names in named if names) - costly.count(True) and MAX_POSTPONED_REPORTS >= 4


def test_a_process_over_its_share_is_named_with_what_the_others_leave():
    """A busy process named first, past its share, and twenty that need a few reads each: the
    busy one is named again after them, with what they left, in the same report (named from its
    share only, it waited reports for budget the others never used: a new JVM's frames stayed
    unnamed while a test suite's Python processes ran)."""
    from receivers.profiling.report import ReportBuilder

    runtimes, memories, add, hostile, many, one, _ = _v8_world()
    for pid in (300, *range(1, 21)):
        add(pid)
    reports = ReportBuilder(_Unknown(), _Unknown(), host_name="test")
    reports.runtimes = [runtimes]
    reports.naming_read_bytes = 512 << 10
    names = _names(reports.build(Interval([_interpreted(300, many), *(_interpreted(pid, [one]) for pid in range(1, 21))], 0, 1, 0, 1,
                                          frequency_hz=100)))
    assert names[300] == [f"work{n}" for n in range(60)] and all(names[pid] == ["benign"] for pid in range(1, 21))
    assert sum(memory.cost for memory in memories.values()) <= reports.naming_read_bytes
    assert reports.stats["samples_carried_for_names"] == 0 and runtimes.stats[REFUSED_STAT] > 0  # (refused once, within its share)


# -- HotSpot: JVMs that stay starting ----------------------------------------------------------

def test_starting_jvms_are_looked_at_a_few_a_report_in_turn():
    """Six JVMs that stay starting: each report looks at two of them again (each look reads the
    tables whole), in turn, and counts the others as deferred."""
    import structlog

    from receivers.profiling.hotspot import runtimes as hotspot

    jvms = hotspot.HotSpotRuntimes({}, structlog.get_logger())
    looked: list[int] = []

    def find(info):
        looked.append(info.pid)
        with jvms._lock:
            jvms._starting.setdefault(info.pid, 0)  # (still starting)
        return None

    jvms._processes._find = find
    infos = {pid: types.SimpleNamespace(pid=pid, program=("java", pid), kernel_thread=False, exited=False) for pid in range(10, 16)}
    jvms.current = infos.get
    for info in infos.values():
        jvms.register(info)
    assert sorted(looked) == list(infos)
    for report in range(3):
        looked.clear()
        jvms.new_report(ReportBudget())
        assert len(looked) == 2, looked
        assert set(looked) == {10 + 2 * report, 11 + 2 * report}  # each in turn
    assert jvms.stats["starting_deferred"] == 3 * 4 and hotspot.STARTING_RETRIES_PER_REPORT == 2


def test_a_jvms_tables_are_read_to_a_bound_in_entries_and_pages():
    """Tables of 16,384 entries each, without their end: reading them stops at MAX_ENTRIES entries
    in all (the four tables' whole was 65,536, 0.3 s a look), within MAX_PAGES pages."""
    from receivers.profiling.hotspot import vmstructs

    stride, base, names = 64, 0x100000, 0x10000
    symbols, words = {}, {}
    for index, name in enumerate(vmstructs.SYMBOLS):
        symbols[name] = 0x1000 + 8 * index
    for table in vmstructs.TABLES:
        words[symbols[table]] = base
    for name in vmstructs.LAYOUT_SYMBOLS:
        words[symbols[name]] = stride if name.endswith("ArrayStride") else 0
    words[symbols["gHotSpotVMStructEntryFieldNameOffset"]] = 8
    end = base + stride * 16384
    pages: set[int] = set()

    def word(address: int) -> int:
        if base <= address < end:  # every entry names the same type and field
            return names if (address - base) % stride in (0, 8) else 0
        return words.get(address, 0)

    def read(address: int, size: int) -> bytes:
        pages.add(address // 4096)
        if names <= address < names + 4096:
            return b"Forged\0".ljust(4096, b"\0")[address - names: address - names + size]
        return b"".join(struct.pack("<Q", word(at)) for at in range(address, address + size, 8))[:size]

    with pytest.raises(vmstructs.VMStructsError, match="no end"):
        vmstructs.read_vmstructs(read, symbols, 0)
    entry_pages = {page for page in pages if base // 4096 <= page < end // 4096}
    assert len(pages) <= vmstructs.MAX_PAGES
    assert len(entry_pages) <= vmstructs.MAX_ENTRIES * stride // 4096 + 1 < 16384 * stride // 4096, len(entry_pages)


# -- CPython: code objects of many processes --------------------------------------------------

def test_code_objects_of_many_processes_are_read_within_the_reports_budget():
    """Seven "processes" (one Python's memory under seven pids) each ask for the code objects
    of 3,000 lines and a 5,000-character name, then one asks for an ordinary one: the report's
    reads stay within its budget, the last is named, a cached code object whose check the budget
    refuses is not named unchecked, and the next report reads on."""
    from receivers.profiling.processes.memory import ProcessMemory
    from receivers.profiling.python.code import BudgetSpent, CodeCache
    from tests.test_cpython_code import hostile_code_process

    with hostile_code_process() as (pid, long_one, ordinary, offsets):
        with ProcessMemory(pid) as real:
            cache = CodeCache()

            class Counted:  # (a pid of its own over the real memory)
                def __init__(self, pid):
                    self.pid, self.exited, self.reads, self.bytes = pid, False, 0, 0

                def read(self, address, size):
                    self.reads, self.bytes = self.reads + 1, self.bytes + size
                    return real.read(address, size)

                @property
                def waited(self):
                    return real.waited

            hostile, benign = [Counted(100 + n) for n in range(7)], Counted(1)
            memories = {memory.pid: BudgetedMemory(memory, cache.stats) for memory in [*hostile, benign]}
            budget = ReportBudget(read_bytes=48 << 10)

            def new_report():
                nonlocal budget
                cache.new_epoch()
                budget = ReportBudget(read_bytes=48 << 10)
                budget.share_among(memories)
                for memory in memories.values():
                    memory.budget = budget

            new_report()
            for memory in hostile:
                budget.begin(memory.pid)
                for address in [long_one, *ordinary]:
                    try:
                        cache.code(memory.pid, memories[memory.pid], offsets, address)
                    except BudgetSpent:
                        pass
            budget.begin(benign.pid)
            assert cache.code(benign.pid, memories[benign.pid], offsets, ordinary[0]).name == "f0"
            assert sum(m.bytes + READ_COST * m.reads for m in [*hostile, benign]) <= 48 << 10
            assert cache.stats[REFUSED_STAT] > 0 and budget.refused == {memory.pid for memory in hostile}
            # The next report: a cached code object is checked before it is named; refused, it is not.
            new_report()
            budget.begin(benign.pid)
            budget._bytes.spent = budget._bytes.amount  # (spent by the processes before it)
            with pytest.raises(BudgetSpent):
                cache.code(benign.pid, memories[benign.pid], offsets, ordinary[0])
            new_report()  # and the next one names it, checked
            budget.begin(benign.pid)
            reads = benign.reads
            assert cache.code(benign.pid, memories[benign.pid], offsets, ordinary[0]).name == "f0" and benign.reads == reads + 1


def test_waits_for_the_interpreter_lock_do_not_spend_the_reports_seconds():
    """Issue 42 (session 21's note): the report's seconds count the report thread's own time.
    Reads of a live process's resident memory while another thread of the agent keeps the
    interpreter lock busy: each read gives the lock up for its system calls and waits to take it
    back, so by the clock they take several times what the thread spends, and only that is
    counted (on the old clock it was all of it, and the seconds ran out for the waits)."""
    import sys
    import threading
    import time

    from receivers.profiling.processes.memory import ProcessMemory

    child = subprocess.Popen([sys.executable, "-c", "import sys, time; b = bytes(range(256)) * 2048; print(id(b), flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE)
    stop = threading.Event()

    def hold_the_lock() -> None:  # (a sort holds it to its end: ~10 ms each)
        numbers = list(range(300_000, 0, -1))
        while not stop.is_set():
            sorted(numbers, key=int)

    hog = threading.Thread(target=hold_the_lock)
    try:
        address = int(child.stdout.readline())
        budget = ReportBudget(read_bytes=1 << 40, read_seconds=1e9)
        hog.start()
        with ProcessMemory(child.pid) as memory:
            began = time.monotonic()
            while time.monotonic() - began < 1.0 and budget.reads < 5000:  # (each long enough for the other thread to take the lock meanwhile)
                assert len(budget.read(memory, address, 1 << 19)) == 1 << 19
            waited = time.monotonic() - began
        assert budget.spent[1] < waited / 2, (budget.spent, budget.reads, waited)
    finally:
        stop.set()
        if hog.is_alive():
            hog.join()
        child.kill()
        child.wait()
