"""The sampled processes that run V8 (Node.js): told to the kernel's walker, and their JavaScript
frames named in reports.

When a process is snapshotted (and again when its maps are read again), a mapped file named like
a Node.js binary is checked for V8's metadata (detect.py, once per file, read off this thread by
symbols/detection.py: a process whose binary is not read yet is registered once it is). For one
found, the kernel gets where a frame keeps its function (``v8_processes``, bpf/profile.h ``struct
v8_process``), and the unwind registry the process's V8 code: every anonymous executable mapping
(V8's JIT code space) and the builtins inside the binary (``code_ranges``). The report turns the
SharedFunctionInfos the kernel recorded into ``function`` and script, read from the process's heap
(heap.py), checked again every report before a name read earlier is used: the collector moves
objects, so an address may hold another function by then. A V8 whose layout is not known (a
build with pointer compression) is profiled natively, with perf maps where the process writes
them, said once per file.

Threading: ``register`` and ``forget`` come from the sampler's and the report's threads;
``name`` from the report's. One lock guards the bookkeeping; reading memory happens
outside it."""

from __future__ import annotations

import array
import bisect
import dataclasses
import struct
import threading
from typing import Any

from pycollector.logs import log_once

from ..processes.memory import MemoryReadError, ProcessMemory
from ..processes.proc import Mapping, ProcessInfo
from ..processes.runtime_processes import RuntimeProcesses
from ..processes.report_budget import REFUSED_STAT, UNBUDGETED, BudgetedMemory, ReportBudget
from ..symbols import runtime_stacks
from ..symbols.detection import PENDING, FileDetector
from ..symbols.frame import Frame
from . import positions
from .detect import V8Build, may_be_node
from .code import CodeIndex
from .heap import BudgetSpent, FunctionInfo, HeapReadError, ReadBudget, V8Heap, still_there

MAPPING_V8_CODE, MAPPING_V8_BUILTINS = 1, 2  # profile.h: struct unwind_mapping.kind
FRAME_KIND = "v8js"  # profile.frame.type, as the OpenTelemetry eBPF profiler names these frames
INTERPRETED, COMPILED, COMPILED_NO_PC = 1, 2, 3  # profile.h V8_FRAME_*: a compiled frame's pc follows it
POINTER_MASK = (1 << 47) - 1
# Bytes of heap one report may read from one process to name its functions (a name costs a few
# hundred; names read before cost one check of 48 bytes each), and to find the Code objects of
# optimized frames' pcs (code.py: a scan reads up to 256 KiB; a Code found is checked with 8), and
# to learn lines (a script's line ends: up to 256 KiB once, then 8 bytes a report; a function's
# source positions).
READ_BUDGET_PER_PROCESS = 256 * 1024
CODE_READ_BUDGET_PER_PROCESS = 1024 * 1024
LINE_READ_BUDGET_PER_PROCESS = 512 * 1024
MAX_FUNCTIONS_PER_PROCESS = 65536  # names kept per process between reports
# A function whose name could not be read after more than POSTPONE_AFTER_READS reads (a name takes
# a few: a cons-string DAG forged to take thousands, which a budget cuts or which ends in no
# string) is not read again for 1 report, then 2, 4... up to MAX_POSTPONED_REPORTS. Read every
# report, such a name would spend its process's share each time, and the functions named after it
# in the report's order never would be (a Node process's hot function stayed unnamed behind its
# caller's forged name for a whole attack). Of MAX_POSTPONED_PER_PROCESS functions at most, the
# oldest forgotten first. (Kept by address: another function the heap puts there meanwhile waits
# with it; and names that fail within fewer reads are read again each report, at that cost.)
POSTPONE_AFTER_READS = 64
MAX_POSTPONED_REPORTS = 32
MAX_POSTPONED_PER_PROCESS = 1024
MAX_SCRIPTS_PER_PROCESS = 4096  # scripts whose line ends are kept
MAX_HELD_BYTES_PER_PROCESS = 8 << 20  # line ends and source positions kept, in all
LINE_END_BYTES, POSITION_BYTES = 4, 120  # what each holds (an array's item; a tuple of two large ints)
BYTECODE_OFFSET_SHIFT, BYTECODE_OFFSET_MAX = 47, 0x1FFF  # profile.h V8_FRAME_OFFSET_*: an interpreted frame's

FileKey = tuple[str, int]


@dataclasses.dataclass
class V8Process:
    info: ProcessInfo
    build: V8Build
    binary: FileKey  # the mapped file V8 is in (its builtins may be mapped more than once)
    heap: V8Heap
    code: CodeIndex | None  # finds the functions inlined at a pc (None: the layout is not known)
    functions: dict[int, FunctionInfo] = dataclasses.field(default_factory=dict)  # by SharedFunctionInfo
    checked: set[int] = dataclasses.field(default_factory=set)  # of those, checked again this report
    bytecode_positions: dict[int, tuple] = dataclasses.field(default_factory=dict)  # by SharedFunctionInfo, as functions
    lines: dict[int, tuple[int, array.array]] = dataclasses.field(default_factory=dict)  # Script -> (its source, line ends)
    held: int = 0  # bytes of line ends and source positions kept, in all
    lines_checked: set[int] = dataclasses.field(default_factory=set)
    builtins: tuple[tuple[int, int], ...] = ()  # where its builtins are mapped, as of builtins_of (its maps)
    builtins_of: ProcessInfo | None = None
    lines_heap: V8Heap | None = None  # the reads for lines: a budget of their own, so that lines never cost names
    missed: set[int] = dataclasses.field(default_factory=set)  # scripts and functions whose lines failed this report
    # SharedFunctionInfo -> (the report its name is read again in, the reports it waited last)
    postponed: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)


class NamePostponed(HeapReadError):
    """A function whose name could not be read at a cost is not read this report (MAX_POSTPONED_REPORTS)."""


class V8Runtimes:
    """V8 as a runtime_stacks.Runtime."""

    DETECTION_READER = "receivers.profiling.v8.detect:detect_file"  # (what symbols/detection.py's helper runs)
    kinds = frozenset({INTERPRETED, COMPILED, COMPILED_NO_PC})
    appended = False

    def __init__(self, table: Any, logger: Any, detector: FileDetector | None = None):
        """``table``: the sampler's v8_processes map. ``detector``: where binaries are read (by
        default inline, on the registering thread)."""
        self._table = table
        self.log = logger
        self._lock = threading.Lock()  # (the stats)
        self.files = (detector or FileDetector(in_helper=False)).files("v8", self.DETECTION_READER, self._found)
        self._processes = RuntimeProcesses(table, self._find, self._leaf, lambda process: process.heap.memory.close())
        self._budget = UNBUDGETED  # the report's (new_report), for the processes found meanwhile too
        self._report = 0  # reports begun (new_report)
        self.stats = dict.fromkeys(("processes", "unknown_layout", "unreadable", "frames_named", "frames_unnamed",
                                    "functions_read", "functions_moved", "read_budget_spent", "names_postponed", "inlining_unknown",
                                    REFUSED_STAT), 0)

    # -- processes --------------------------------------------------------------------------------

    def register(self, info: ProcessInfo) -> None:
        """Look for V8 among ``info``'s mappings (again after its maps changed)."""
        self._processes.register(info)
        self.stats["processes"] = len(self._processes)

    def forget(self, tgid: int) -> None:
        self._processes.forget(tgid)
        self.stats["processes"] = len(self._processes)

    def code_ranges(self, info: ProcessInfo) -> list[tuple[int, int, int]]:
        """Where ``info``'s V8 code is: its anonymous executable mappings (the JIT's code space)
        and its builtins, wherever the binary's pages that hold them are mapped (V8 maps them again
        next to its code space, so that code calls them with short calls); nothing for a process
        without V8."""
        process = self._processes.get(info.pid)
        if process is None:
            return []
        ranges = [(m.start, m.end, MAPPING_V8_CODE) for m in info.mappings if _is_anonymous(m)]
        builtins = process.build.builtins_file_range()
        for mapping in info.mappings if builtins is not None else ():
            if mapping.identity == process.binary:
                low = max(builtins[0], mapping.offset)
                high = min(builtins[1], mapping.offset + mapping.end - mapping.start)
                if low < high:
                    ranges.append((mapping.start + low - mapping.offset, mapping.start + high - mapping.offset, MAPPING_V8_BUILTINS))
        return ranges

    def _find(self, info: ProcessInfo) -> V8Process | None:
        for mapping in info.mappings:
            if not mapping.file_backed or not may_be_node(mapping.path):
                continue
            build = self.files.get(info, mapping)
            if build is None or build is PENDING:  # (pending: it is registered again when the binary is read)
                continue
            if build.layout is None:
                with self._lock:
                    self.stats["unknown_layout"] += 1
                log_once(self.log, ("v8-layout", build.path, build.version), "warning",
                         "this V8's object layout is not known; its JavaScript frames are named only from perf maps",
                         path=build.path, reason=build.refusal)
                return None
            try:
                memory = BudgetedMemory(ProcessMemory(info.pid), self.stats)  # (every read within the report's budget)
                memory.budget = self._budget
            except MemoryReadError as error:
                with self._lock:
                    self.stats["unreadable"] += 1
                log_once(self.log, ("v8-memory", info.pid), "warning", "cannot read a Node.js process's memory; "
                         "its JavaScript frames are not named", pid=info.pid, error=str(error))
                return None
            heap = V8Heap(memory, build.layout, ReadBudget(READ_BUDGET_PER_PROCESS))
            code = None
            if build.code_layout is not None:
                code = CodeIndex(V8Heap(memory, build.layout, ReadBudget(CODE_READ_BUDGET_PER_PROCESS)), build.code_layout)
            return V8Process(info, build, mapping.identity, heap, code,
                             lines_heap=V8Heap(memory, build.layout, ReadBudget(LINE_READ_BUDGET_PER_PROCESS)))
        return None

    def _found(self, info: ProcessInfo, mapping: Mapping, build: V8Build) -> None:
        """(Once per file: DetectedFiles.)"""
        if build.layout is not None:
            self.log.info("found V8", version=".".join(map(str, build.version)), path=mapping.path, pid=info.pid)

    def _leaf(self, process: V8Process):
        layout = process.build.layout
        leaf = self._table.Leaf()
        # (a slot at fp - 8 is the last of the 8 words below the frame pointer the kernel reads)
        leaf.context_slot, leaf.function_slot, leaf.bytecode_offset_slot = (
            8 + offset // 8 for offset in (layout.fp_context, layout.fp_function, layout.fp_bytecode_offset))
        leaf.function_shared, leaf.map_instance_type = layout.function_shared, layout.map_instance_type
        leaf.first_function_type, leaf.last_function_type = layout.first_function_type, layout.last_function_type
        return leaf

    # -- reports ----------------------------------------------------------------------------------

    def knows(self, tgid: int, started: int | None = None) -> bool:
        """Whether this runtime names the frames of ``tgid``'s process started at ``started``
        (reads its memory in reports)."""
        return self._processes.get(tgid, started) is not None

    def new_report(self, budget: ReportBudget) -> None:
        """Called once per report: names read before are checked again before they are used,
        each process's budget of heap reads starts again, and every read is within the report's
        ``budget`` (all processes' and runtimes' together)."""
        self._budget = budget
        self._report += 1
        for process in self._processes.new_report():
            process.heap.memory.budget = budget  # (the three heaps' memory)
            process.checked.clear()
            process.lines_checked.clear()
            process.missed.clear()
            process.lines_heap.budget = ReadBudget(LINE_READ_BUDGET_PER_PROCESS)
            process.heap.budget = ReadBudget(READ_BUDGET_PER_PROCESS)
            if process.code is not None:
                process.code.new_report()

    def has_next(self, kind: int) -> bool:
        return kind == COMPILED

    def name(self, tgid: int, stack: runtime_stacks.Stack, started: int | None = None) -> runtime_stacks.Stack:
        """``stack`` with each JavaScript frame the kernel recorded named (runtime_stacks.Runtime)."""
        process = self._processes.get(tgid, started)  # (another process's, of a pid reused since, names nothing)
        if process is None:
            return stack

        def javascript(recorded: runtime_stacks.Recorded) -> list[Frame]:
            shared, pc = recorded.value & POINTER_MASK, recorded.next_slot
            if recorded.kind == INTERPRETED:
                offset = (recorded.value >> BYTECODE_OFFSET_SHIFT) & BYTECODE_OFFSET_MAX
                return [self.frame(process, shared, bytecode_offset=offset - (process.build.layout.bytecode_array_data - 1)
                                   if offset < BYTECODE_OFFSET_MAX else None)]
            inlined, own = (self._scopes(process, pc, return_address=recorded.index > 0) if pc and not self._in_builtins(process, pc)
                            else ([], -1))
            return [*(self.frame(process, function, at) for function, at in inlined), self.frame(process, shared, own)]

        return runtime_stacks.name_recorded(stack, self.kinds, javascript)

    def _in_builtins(self, process: V8Process, pc: int) -> bool:
        """Whether ``pc`` is in V8's builtins (a JavaScript frame's, as a builtin sets it up or
        runs in it): no Code object of the heap holds it, and a scan for one would read 256 KiB
        for nothing."""
        if process.builtins_of is not process.info:
            process.builtins = tuple((low, high) for low, high, kind in self.code_ranges(process.info) if kind == MAPPING_V8_BUILTINS)
            process.builtins_of = process.info
        return any(low <= pc < high for low, high in process.builtins)

    def _scopes(self, process: V8Process, pc: int, return_address: bool) -> tuple[list[tuple[int, int]], int]:
        """The functions optimized code inlined at ``pc``, innermost first, with the script
        offsets they were at, and the offset of the code's own function (code.scopes_at)."""
        if process.code is None:
            return [], -1
        try:
            return process.code.find(pc).scopes_at(pc, return_address)
        except HeapReadError as error:
            with self._lock:
                self.stats["inlining_unknown"] += 1
            log_once(self.log, ("v8-code", process.info.pid), "debug", "the code at a pc of optimized JavaScript could not be "
                     "read: its inlined functions are not shown; counted in pycollector_profiling_v8{stat=\"inlining_unknown\"}",
                     pid=process.info.pid, reason=str(error))
            return [], -1

    def frame(self, process: V8Process, shared: int, script_offset: int = -1, bytecode_offset: int | None = None) -> Frame:
        """The frame of the function ``shared`` at ``script_offset`` in its script, or at the
        ``bytecode_offset`` of an interpreted frame, for its line (neither: no line)."""
        try:
            function = self._function(process, shared)
        except (HeapReadError, struct.error, UnicodeDecodeError) as error:  # (struct: an offset the binary gave, out of a read)
            with self._lock:
                self.stats["frames_unnamed"] += 1
                if isinstance(error, BudgetSpent):
                    self.stats["read_budget_spent"] += 1
                elif isinstance(error, NamePostponed):
                    self.stats["names_postponed"] += 1
            log_once(self.log, ("v8-unnamed", process.info.pid), "debug", "a JavaScript frame could not be named; "
                     "counted in pycollector_profiling_v8{stat=\"frames_unnamed\"}", pid=process.info.pid, reason=str(error))
            return Frame(address=shared, kind=FRAME_KIND)
        with self._lock:
            self.stats["frames_named"] += 1
        if bytecode_offset is not None and function.bytecode:
            script_offset = positions.script_offset(positions.position_at(self._bytecode_positions(process, shared, function), bytecode_offset))
        line = self._line(process, function.script_address, script_offset) if script_offset >= 0 and function.script_address else 0
        return Frame(address=shared, kind=FRAME_KIND, name=function.name or "(anonymous)", source_file=function.script or None, line=line)

    def _bytecode_positions(self, process: V8Process, shared: int, function: FunctionInfo) -> tuple:
        """The interpreted function's source positions, kept with its name (V8 makes them
        lazily: until it has, each report looks again)."""
        known = process.bytecode_positions.get(shared)
        if known is None and shared not in process.missed:
            try:
                known = process.lines_heap.bytecode_positions(function.bytecode)
            except (HeapReadError, struct.error):
                known = ()
            if known:
                self._hold(process, POSITION_BYTES * len(known))
                process.bytecode_positions[shared] = known
            else:
                process.missed.add(shared)  # (again next report)
        return known or ()

    def _hold(self, process: V8Process, size: int) -> None:
        """Room for ``size`` more bytes of line ends or source positions: the oldest scripts' and
        functions' go first, past MAX_HELD_BYTES_PER_PROCESS (the process writes these tables)."""
        while process.held + size > MAX_HELD_BYTES_PER_PROCESS and (process.lines or process.bytecode_positions):
            if process.lines:
                process.held -= LINE_END_BYTES * len(process.lines.pop(next(iter(process.lines)))[1])
            else:
                process.held -= POSITION_BYTES * len(process.bytecode_positions.pop(next(iter(process.bytecode_positions))))
        process.held += size

    def _line(self, process: V8Process, script: int, offset: int) -> int:
        """The line (from 1) of ``offset`` in the Script ``script``; 0 when not known. A script's
        line ends are kept by its address and its source's, checked once a report."""
        heap = process.lines_heap
        if script in process.missed:
            return 0
        try:
            known = process.lines.get(script)
            if known is not None and script not in process.lines_checked:
                if not still_there(heap, lambda: heap.field(script, heap.layout.script_source) == known[0]):
                    known = None
            if known is None:
                source = heap.field(script, heap.layout.script_source)
                try:
                    ends = heap.line_ends(script)
                except BudgetSpent:
                    raise
                except (HeapReadError, struct.error, UnicodeDecodeError):
                    ends = ()  # (for good, while the source is the same: an external string, a source of garbage)
                if len(process.lines) >= MAX_SCRIPTS_PER_PROCESS:
                    process.held -= LINE_END_BYTES * len(process.lines.pop(next(iter(process.lines)))[1])
                self._hold(process, LINE_END_BYTES * len(ends))
                known = process.lines[script] = (source, array.array("I", ends))
            process.lines_checked.add(script)
        except (HeapReadError, struct.error, UnicodeDecodeError):
            process.missed.add(script)  # (again next report)
            return 0
        ends = known[1]
        if not ends or offset > ends[-1]:
            return 0  # (past what was read of a long script)
        return bisect.bisect_left(ends, offset) + 1

    def _function(self, process: V8Process, shared: int) -> FunctionInfo:
        heap = process.heap
        known = process.functions.get(shared)
        if known is not None and shared in process.checked:
            return known
        if known is not None:
            if still_there(heap, lambda: heap.identity(shared) == known.identity):
                process.checked.add(shared)
                return known
            with self._lock:
                self.stats["functions_moved"] += 1
            del process.functions[shared]
            process.held -= POSITION_BYTES * len(process.bytecode_positions.pop(shared, ()))
        postponed = process.postponed.get(shared)
        if postponed is not None and self._report < postponed[0]:
            raise NamePostponed(f"the name of {shared:#x} failed after more than {POSTPONE_AFTER_READS} reads: read again in a later report")
        reads = heap.reads
        try:
            function = heap.function(shared)
        except (HeapReadError, struct.error, UnicodeDecodeError):  # (a budget's cut among them)
            if heap.reads - reads > POSTPONE_AFTER_READS:
                self._postpone(process, shared)
            raise
        process.postponed.pop(shared, None)
        with self._lock:
            self.stats["functions_read"] += 1
        if len(process.functions) >= MAX_FUNCTIONS_PER_PROCESS:
            oldest = next(iter(process.functions))
            del process.functions[oldest]
            process.held -= POSITION_BYTES * len(process.bytecode_positions.pop(oldest, ()))
        process.functions[shared] = function
        process.checked.add(shared)
        return function


    def _postpone(self, process: V8Process, shared: int) -> None:
        """``shared``'s name is read again after twice the reports it waited last (one at first)."""
        _, waited = process.postponed.pop(shared, (0, 0))
        waited = min(MAX_POSTPONED_REPORTS, 2 * waited or 1)
        if len(process.postponed) >= MAX_POSTPONED_PER_PROCESS:
            del process.postponed[next(iter(process.postponed))]
        process.postponed[shared] = (self._report + waited + 1, waited)


def _is_anonymous(mapping: Mapping) -> bool:
    return mapping.inode == 0 and (not mapping.path or mapping.path.startswith("[anon"))
