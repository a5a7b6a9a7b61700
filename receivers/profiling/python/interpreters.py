"""The sampled processes that run CPython: told to the kernel's walker, and named in reports.

When a process is snapshotted (and again when its maps are read again), its mapped files are
checked for a CPython (detect.py, once per file, read off this thread by symbols/detection.py:
a process whose file is not read yet is registered without it, and again once it is read). For
one found, the kernel gets where to start and which offsets to use (``python_processes``,
bpf/profile.h ``struct python_process``); the report later turns the code objects the kernel recorded into function, file and line, read from
the process's memory (code.py). A version whose layout is not known (a CPython newer than the
table, or 3.14, whose tagged frame pointers the kernel walker does not untag yet) is profiled
natively, said once per file.

Threading: ``register`` and ``forget`` come from the sampler's and the report's threads; ``frame``
from the report's. One lock guards the bookkeeping; reading memory happens outside it.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from pycollector.logs import log_once

from receivers.profiling.processes.proc import Mapping, ProcessInfo, same_incarnation
from receivers.profiling.symbols.detection import PENDING, FileDetector
from receivers.profiling.symbols import runtime_stacks
from receivers.profiling.symbols.frame import Frame

from .code import BudgetSpent, CodeCache, CodeReadError
from .detect import RUNTIME, CPython, may_be_cpython
from .frames import KINDS, PythonFrame, calls, eval_loop_test, interleave, split
from ..processes.memory import MemoryReadError, ProcessMemory
from .offsets import InstructionKind, EntryKind, Offsets, UnknownLayout
from ..processes.report_budget import UNBUDGETED, BudgetedMemory, ReportBudget

FRAME_KIND = "cpython"  # profile.frame.type, as the OpenTelemetry eBPF profiler names these frames
NO_OFFSET = 0xFFFF  # profile.h PYTHON_NO_OFFSET
FRAME_OBJECTS, INTERPRETER_FRAMES = 1, 2  # enum python_frame_layout
OWNER_NONE, OWNER_IS_ENTRY, OWNER_BYTE = 0, 1, 2  # enum python_owner_kind


@dataclasses.dataclass
class PythonProcess:
    info: ProcessInfo  # its latest snapshot: another `program` means the process exec()ed
    cpython: CPython
    bias: int  # the process's address of the file's ELF address 0
    offsets: Offsets
    memory: ProcessMemory
    is_eval_loop: Any  # name -> bool (frames.eval_loop_test)
    named_from: BudgetedMemory  # its memory as reports read it: within their budget


class PythonInterpreters:
    """CPython as a runtime_stacks.Runtime."""

    DETECTION_READER = "receivers.profiling.python.detect:detect_file"  # (what symbols/detection.py's helper runs)
    kinds = KINDS
    appended = True  # (the kernel appends its frames after the walk)

    def __init__(self, table: Any, logger: Any, detector: FileDetector | None = None):
        """``table``: the sampler's python_processes map. ``detector``: where candidate files are
        read (by default inline, on the registering thread)."""
        self._table = table
        self.log = logger
        self.code = CodeCache()
        self._lock = threading.Lock()
        # One registration at a time: the sampler's thread (a new process) and the report's (maps
        # read again) may register the same process at once, and the kernel's entry must end up
        # as the bookkeeping says.
        self._registering = threading.Lock()
        # Every file looked at, CPython or not.
        self.files = (detector or FileDetector(in_helper=False)).files("cpython", self.DETECTION_READER, self._found)
        self._processes: dict[int, PythonProcess] = {}
        # Frames named in this report, by (tgid, code, instruction): stacks share most of theirs.
        self._named: dict[tuple[int, int, int], Frame] = {}
        self.stats = dict.fromkeys(("processes", "unknown_layout", "unreadable", "frames_named", "frames_unnamed"), 0)
        self._budget = UNBUDGETED  # the report's (new_report), for the processes found meanwhile too

    # -- processes --------------------------------------------------------------------------------

    def register(self, info: ProcessInfo) -> None:
        """Look for a CPython among ``info``'s mappings (again after its maps changed)."""
        if info.kernel_thread or info.exited:
            return
        with self._registering:
            self._register(info)

    def _register(self, info: ProcessInfo) -> None:
        with self._lock:
            before = self._processes.get(info.pid)
        if before is not None and before.info.program == info.program and any(mapping.path == before.cpython.path for mapping in info.mappings):
            before.info = info  # the same program mapped more (an extension module): nothing changed here
            return
        found = self._find(info)
        with self._lock:
            before = self._processes.pop(info.pid, None)
            if found is not None:
                self._processes[info.pid] = found
            self.stats["processes"] = len(self._processes)
        if before is not None:  # another program now (exec): its code objects are new
            self.code.forget_process(info.pid)  # (its memory reader closes when the last user lets go)
        key = self._table.Key(info.pid)
        if found is None:
            if before is not None:
                self._delete(key)
            return
        self._table[key] = self._leaf(found)

    def forget(self, tgid: int) -> None:
        with self._registering:
            with self._lock:
                process = self._processes.pop(tgid, None)
                self.stats["processes"] = len(self._processes)
            if process is None:
                return
            self.code.forget_process(tgid)
            self._delete(self._table.Key(tgid))

    def _delete(self, key) -> None:
        self._table.pop(key, None)

    def _find(self, info: ProcessInfo) -> PythonProcess | None:
        for mapping in info.mappings:
            if not mapping.file_backed or not may_be_cpython(mapping.path):
                continue
            cpython = self.files.get(info, mapping)
            if cpython is None or cpython is PENDING:  # (pending: it is registered again when the file is read)
                continue
            bias = cpython.bias(mapping.start, mapping.offset)
            if bias is None:
                continue
            return self._attach(info, cpython, bias)
        return None

    def _found(self, info: ProcessInfo, mapping: Mapping, cpython: CPython) -> None:
        """(Once per file: DetectedFiles.)"""
        self.log.info("found CPython", version="%d.%d" % cpython.version, path=mapping.path, pid=info.pid)

    def _attach(self, info: ProcessInfo, cpython: CPython, bias: int) -> PythonProcess | None:
        try:
            memory = ProcessMemory(info.pid)
        except MemoryReadError as error:
            self.stats["unreadable"] += 1
            log_once(self.log, ("python-memory", info.pid), "warning", "cannot read a Python process's memory; its Python frames are not named", pid=info.pid, error=str(error))
            return None
        try:
            offsets = self._offsets(cpython, memory, bias)
        except (UnknownLayout, MemoryReadError) as error:
            self.stats["unknown_layout"] += 1
            log_once(self.log, ("python-layout", cpython.path, cpython.version), "warning",
                     "this CPython's frame layout is not known; its processes get native stacks only",
                     path=cpython.path, version="%d.%d" % cpython.version, reason=str(error))
            return None
        named_from = BudgetedMemory(memory, self.code.stats)
        named_from.budget = self._budget
        return PythonProcess(info, cpython, bias, offsets, memory, eval_loop_test(cpython.version[0]), named_from)

    @staticmethod
    def _offsets(cpython: CPython, memory: ProcessMemory, bias: int) -> Offsets:
        """The version's offsets: from the process's own _Py_DebugOffsets where it has them (a
        build with other options would differ from the file's copy only there, which is the same
        initializer), else the table."""
        if RUNTIME in cpython.symbols and cpython.debug_offsets_data is not None:
            offsets = cpython.debug_offsets(memory, cpython.symbols[RUNTIME] + bias)
        else:
            offsets = cpython.offsets()
        if offsets.frame_code_tag_mask or offsets.frame_owner_interpreter is not None:
            raise UnknownLayout(f"CPython {offsets.version[0]}.{offsets.version[1]}: tagged frame references are not walked yet")
        return offsets

    def _leaf(self, process: PythonProcess):
        offsets = process.offsets
        leaf = self._table.Leaf()
        leaf.interpreters = process.cpython.interpreters_head(offsets) + process.bias
        leaf.interp_threads = offsets.interpreter_threads_head
        leaf.thread_next = offsets.thread_next
        leaf.thread_id = offsets.thread_id
        leaf.thread_frame = offsets.thread_frame
        leaf.cframe_frame = _or_none(offsets.cframe_current_frame)
        leaf.frame_code = offsets.frame_code
        leaf.frame_previous = offsets.frame_previous
        leaf.frame_instruction = offsets.frame_instruction
        leaf.frame_owner = _or_none(offsets.frame_owner)
        leaf.code_instructions = _or_none(offsets.code_instructions)
        leaf.code_first_line = offsets.code_firstlineno
        leaf.layout = INTERPRETER_FRAMES if offsets.instruction_kind is InstructionKind.POINTER else FRAME_OBJECTS
        leaf.owner_kind = {None: OWNER_NONE, EntryKind.IS_ENTRY: OWNER_IS_ENTRY, EntryKind.OWNER: OWNER_BYTE}[offsets.entry_kind]
        leaf.owner_c_stack = offsets.frame_owner_c_stack or 0
        return leaf

    # -- reports ----------------------------------------------------------------------------------

    def knows(self, tgid: int, started: int | None = None) -> bool:
        """Whether this runtime names the frames of ``tgid``'s process started at ``started``
        (reads its memory in reports)."""
        return self._attached(tgid, started) is not None

    def _attached(self, tgid: int, started: int | None) -> PythonProcess | None:
        with self._lock:
            process = self._processes.get(tgid)
        return process if process is not None and same_incarnation(process.info, started) else None

    def new_report(self, budget: ReportBudget) -> None:
        """Called once per report: cached code objects are checked again before they are used,
        and every read is within the report's ``budget`` (all processes' and runtimes' together)."""
        self.code.new_epoch()
        self._named = {}
        with self._lock:
            self._budget = budget
            processes = list(self._processes.values())
        for process in processes:
            process.named_from.budget = budget

    def has_next(self, kind: int) -> bool:
        return False

    def name(self, tgid: int, stack: runtime_stacks.Stack, started: int | None = None) -> runtime_stacks.Stack:
        """``stack`` with each eval loop frame replaced by the run of Python frames that call of
        the loop ran, from those the kernel appended (runtime_stacks.Runtime)."""
        recorded, rest = [], []
        for item in stack:
            mine = isinstance(item, runtime_stacks.Recorded) and item.kind in self.kinds
            (recorded if mine else rest).append(item.value if mine else item)
        if not recorded:
            return stack
        _, python = split(recorded)
        process = self._attached(tgid, started)  # (another process's state, of a pid reused since, names nothing)
        is_eval_loop = process.is_eval_loop if process is not None else _never
        runs = [[self.frame(tgid, frame, process) for frame in run] for run in calls(python)]
        return interleave(rest, runs, lambda item: isinstance(item, Frame) and item.kind == "native" and is_eval_loop(item.name))

    def frame(self, tgid: int, frame: PythonFrame, process: PythonProcess | None) -> Frame:
        """The frame named from the code object of ``process`` (the state of tgid's incarnation
        that took the sample; None: none known), or a nameless one (counted) when it cannot be
        read: the process exited or freed the code object since the sample."""
        key = (tgid, process.info.program if process is not None else 0, frame.code, frame.instruction, frame.first_line_bits)
        named = self._named.get(key)
        if named is None:
            named, final = self._name(tgid, frame, process)
            if final:  # (a read the report's budget refused may be made later in the report)
                self._named[key] = named
        return named

    def _name(self, tgid: int, frame: PythonFrame, process: PythonProcess | None) -> tuple[Frame, bool]:
        """The frame, and whether it is all this report can make of it."""
        reason, final = "the process is no longer known", True
        if process is not None:
            try:
                where = self.code.locate(tgid, process.named_from, process.offsets, frame.code, frame.instruction,
                                         frame.first_line_bits)
            except (CodeReadError, MemoryReadError) as error:
                reason, final = str(error), not isinstance(error, BudgetSpent)
            else:
                self.stats["frames_named"] += 1
                return Frame(address=0, kind=FRAME_KIND, name=where.function, source_file=where.file,
                             line=where.line or 0, first_line=where.first_line), True
        self.stats["frames_unnamed"] += 1
        log_once(self.log, ("python-unnamed", tgid), "debug", "a Python frame could not be named (the process exited, or "
                 "freed the code object, since the sample); counted in pycollector_profiling_python{stat=\"frames_unnamed\"}",
                 pid=tgid, reason=reason)
        return Frame(address=frame.code, kind=FRAME_KIND), final


def _never(_name) -> bool:
    return False


def _or_none(offset: int | None) -> int:
    return NO_OFFSET if offset is None else offset

