"""The sampled processes that run a HotSpot JVM: told to the kernel's walker, and their Java frames
named in reports.

When a process maps libjvm.so (its symbols read once per file, off this thread, by
symbols/detection.py: the process is registered once they are), the JVM's own tables
(vmstructs.py) say where its code cache is and how its CodeBlobs and Methods are laid out
(jvm.py); the kernel gets the code cache
(``hotspot_processes``, bpf/profile.h ``struct hotspot_process``) and the unwind registry its range
(``code_ranges``). A JVM still starting has no tables yet: it is looked at again when its maps
are read again. The report names each Method the kernel recorded, ``Class.method``, with the
class's source file, from the process's memory; a name read earlier is checked again each report
(a class unloaded frees its Methods).

Threading: as python/interpreters.py and v8/runtimes.py."""

from __future__ import annotations

import array
import bisect
import dataclasses
import os
import struct
import threading
from collections.abc import Callable, Iterable
from typing import Any

from pycollector.logs import log_once

from ..elf.bounded import BoundedElf
from ..elf.symbols import defined_symbols, load_bias, load_segments
from ..processes.memory import MemoryReadError, ProcessExited, ProcessMemory
from ..processes.proc import ProcessInfo
from ..processes.runtime_processes import RuntimeProcesses
from ..processes.report_budget import REFUSED_STAT, UNBUDGETED, BudgetedMemory, ReportBudget
from ..symbols import runtime_stacks
from ..symbols.detection import PENDING, FileDetector
from ..symbols.frame import Frame
from .jvm import CodeCacheLayout, MethodLayout, code_cache_layout, method_layout
from .scopes import ScopeReader, ScopeReadError, _unsigned5, scope_layout
from .vmstructs import SYMBOLS, VMStructsError, read_vmstructs

FRAME_KIND = "jvm"  # profile.frame.type, as the OpenTelemetry eBPF profiler names these frames
MAPPING_HOTSPOT_CODE = 3  # profile.h: struct unwind_mapping.kind
INTERPRETED, COMPILED, NO_NEXT = 4, 5, 6  # profile.h HOTSPOT_FRAME_*: the first two followed by a bcp or pc
POINTER_MASK = (1 << 47) - 1
MAX_SYMBOL = 1024
# What one JVM's names, scopes and line tables may read a report. 256 KiB left 9 to 29% of a
# busy new JVM's frames unnamed for its first seconds (a compiled method's scopes alone can
# take tens of KiB); 2 MiB named all but 2.3%, its budget never spent.
READ_BUDGET_PER_PROCESS = 2 * 1024 * 1024
MAX_METHODS_PER_PROCESS = 65536
STARTING_ATTEMPTS = 60  # reports a starting JVM is looked at again
# Starting JVMs looked at again in one report, in turn: each look reads its tables whole (up to
# vmstructs.MAX_ENTRIES entries: 30 ms), and six forged JVMs kept starting cost 0.3 s each, every report.
STARTING_RETRIES_PER_REPORT = 2
MAX_BYTECODES = 1 << 16  # a method's bytecodes (the JVM's limit): a bcp beyond is not this method's
MAX_LINE_TABLE = 16 * 1024  # bytes of a line number table read
MAX_LINE_ENTRIES = 1 << 14
# What the Methods' names and line tables read from JVMs may hold, in bytes (estimated): each JVM
# its own share, and all of them together. A forged JVM can show a new Method with a full line
# table every millisecond: kept by count, its 65,536 entries took the agent past 2.5 GB.
MAX_NAMES_BYTES_PER_PROCESS = 8 << 20
MAX_NAMES_BYTES = 32 << 20
_NAME_ENTRY_BYTES = 320  # what a cached Method costs besides its strings and line table (dict slot, tuple, arrays)



class NameReadError(Exception):
    pass


@dataclasses.dataclass
class JvmProcess:
    info: ProcessInfo
    code: CodeCacheLayout
    methods: MethodLayout
    memory: BudgetedMemory  # (its reads within the report's budget)
    scopes: ScopeReader | None  # the methods inlined at a compiled pc (None: not known for this JDK)
    # Method -> (check, name, file, code base, line table, its cost in bytes), oldest first
    names: dict[int, tuple] = dataclasses.field(default_factory=dict)
    names_bytes: int = 0  # what names holds (estimated)
    checked: set[int] = dataclasses.field(default_factory=set)
    budget: int = READ_BUDGET_PER_PROCESS


class HotSpotRuntimes:
    """HotSpot as a runtime_stacks.Runtime."""

    DETECTION_READER = f"{__name__}:libjvm_symbols"  # (what symbols/detection.py's helper runs)
    kinds = frozenset({INTERPRETED, COMPILED, NO_NEXT})
    appended = False

    def __init__(self, table: Any, logger: Any, detector: FileDetector | None = None):
        """``table``: the sampler's hotspot_processes map. ``detector``: where libjvm is read (by
        default inline, on the registering thread)."""
        self._table = table
        self.log = logger
        self._lock = threading.Lock()  # (the stats and the JVMs starting)
        self.files = (detector or FileDetector(in_helper=False)).files("hotspot", self.DETECTION_READER)
        self._processes = RuntimeProcesses(table, self._find, self._leaf, self._close)
        self._names_bytes = 0  # what every JVM's names hold together (under _lock)
        self._budget = UNBUDGETED  # the report's (new_report), for the JVMs found meanwhile too
        # JVMs whose tables were not there yet: looked at again in reports, a few a report in
        # turn, 60 looks at most (their maps may not change again), with the process table's
        # current snapshot (current(pid)); on_found(info) tells the unwind registry.
        self._starting: dict[int, int] = {}  # pid -> attempts, the next to look at first
        self.current: Callable[[int], ProcessInfo | None] = lambda pid: None
        self.on_found: Callable[[ProcessInfo], None] = lambda info: None
        self.stats = dict.fromkeys(("processes", "starting", "unknown_layout", "frames_named", "frames_unnamed",
                                    "methods_read", "read_budget_spent", "inlining_unknown", "names_evicted",
                                    "names_bytes", "starting_deferred", REFUSED_STAT), 0)

    # -- processes --------------------------------------------------------------------------------

    def register(self, info: ProcessInfo) -> None:
        self._processes.register(info)
        self.stats["processes"] = len(self._processes)

    def forget(self, tgid: int) -> None:
        with self._lock:
            self._starting.pop(tgid, None)
        self._processes.forget(tgid)
        self.stats["processes"] = len(self._processes)

    def _close(self, process: JvmProcess) -> None:
        process.memory.close()
        with self._lock:
            self._names_bytes -= process.names_bytes
            process.names.clear()
            process.names_bytes = 0
            self.stats["names_bytes"] = self._names_bytes

    def code_ranges(self, info: ProcessInfo) -> list[tuple[int, int, int]]:
        process = self._processes.get(info.pid)
        return [(process.code.low, process.code.high, MAPPING_HOTSPOT_CODE)] if process is not None else []

    def _find(self, info: ProcessInfo) -> JvmProcess | None:
        for mapping in info.mappings:
            if not (mapping.file_backed and os.path.basename(mapping.path) == "libjvm.so"):
                continue
            found = self.files.get(info, mapping)
            if found is None or found is PENDING:  # (pending: it is registered again when libjvm is read)
                return None
            symbols, segments = found
            bias = load_bias(segments, mapping.start, mapping.offset)
            if bias is None:
                return None
            try:
                memory = ProcessMemory(info.pid)
            except MemoryReadError:
                return None
            try:
                tables = read_vmstructs(memory.read, symbols, bias)
                major = struct.unpack("<i", memory.read(tables.statics[("Abstract_VM_Version", "_vm_major_version")], 4))[0] \
                    if ("Abstract_VM_Version", "_vm_major_version") in tables.statics else 0
                code, methods = code_cache_layout(tables, memory.read), method_layout(tables, major)
                scopes = scope_layout(tables, major)
            except (VMStructsError, MemoryReadError, struct.error) as error:
                memory.close()
                starting = isinstance(error, VMStructsError) and "starting" in str(error)
                with self._lock:
                    self.stats["starting" if starting else "unknown_layout"] += 1
                    if starting:
                        self._starting.setdefault(info.pid, 0)
                if not starting:
                    log_once(self.log, ("hotspot-layout", mapping.identity), "warning", "this JVM's layout could not be read; "
                             "its Java frames are named only from perf maps", path=mapping.path, pid=info.pid, reason=str(error))
                return None
            with self._lock:
                self._starting.pop(info.pid, None)
            self.log.info("found a JVM", path=mapping.path, pid=info.pid, code_cache=f"{code.low:#x}-{code.high:#x}", heaps=len(code.heaps))
            process = JvmProcess(info, code, methods, BudgetedMemory(memory, self.stats), None)
            process.memory.budget = self._budget
            if scopes is not None:  # (its reads count against the process's budget, as the names')
                process.scopes = ScopeReader(lambda address, size: self._read(process, address, size), code, scopes)
            return process
        return None

    def _leaf(self, process: JvmProcess):
        code = process.code
        leaf = self._table.Leaf()
        leaf.code_low, leaf.code_high = code.low, code.high
        for index, heap in enumerate(code.heaps):
            leaf.heaps[index].low, leaf.heaps[index].high, leaf.heaps[index].segmap = heap.low, heap.high, heap.segmap
        leaf.blob_name, leaf.blob_frame_size = code.blob_name, code.blob_frame_size
        leaf.blob_frame_complete, leaf.blob_code_begin = code.blob_frame_complete, code.blob_code_begin
        leaf.nmethod_method, leaf.segment_shift, leaf.heap_block_size = code.nmethod_method, code.segment_shift, code.heap_block_size
        leaf.code_begin_is_offset, leaf.frame_complete_is_short = code.code_begin_is_offset, code.frame_complete_is_short
        return leaf

    # -- reports ----------------------------------------------------------------------------------

    def knows(self, tgid: int, started: int | None = None) -> bool:
        """Whether this runtime names the frames of ``tgid``'s process started at ``started``
        (reads its memory in reports)."""
        return self._processes.get(tgid, started) is not None

    def new_report(self, budget: ReportBudget) -> None:
        """Called once per report: a few starting JVMs are looked at again, names read before are
        checked again before they are used, and every read is within the report's ``budget``."""
        self._budget = budget
        self._retry_starting()
        for process in self._processes.new_report():
            process.memory.budget = budget
            process.checked.clear()
            process.budget = READ_BUDGET_PER_PROCESS
            if process.scopes is not None:
                process.scopes.new_report()

    def _retry_starting(self) -> None:
        """Look again at STARTING_RETRIES_PER_REPORT starting JVMs, those looked at longest ago
        first (each looked at goes last); the others wait (counted in starting_deferred)."""
        with self._lock:
            starting = dict(self._starting)
        retried = 0
        for pid, attempts in starting.items():
            info = self.current(pid)
            with self._lock:
                if info is None or attempts >= STARTING_ATTEMPTS or self._processes.get(pid) is not None:
                    self._starting.pop(pid, None)
                    continue
                if retried >= STARTING_RETRIES_PER_REPORT:
                    self.stats["starting_deferred"] += 1
                    continue
                retried += 1
                self._starting.pop(pid, None)
                self._starting[pid] = attempts + 1  # (last in turn)
            try:
                self.register(info)
                if self._processes.get(pid) is not None:
                    self.on_found(info)
            except Exception as error:  # noqa: BLE001 - one JVM's retry must not cost the report
                log_once(self.log, ("hotspot-retry", pid), "warning", "a JVM could not be registered", pid=pid, error=str(error))

    def has_next(self, kind: int) -> bool:
        return kind in (INTERPRETED, COMPILED)

    def name(self, tgid: int, stack: runtime_stacks.Stack, started: int | None = None) -> runtime_stacks.Stack:
        """``stack`` with each Java frame the kernel recorded named, and each unnamed native frame
        in the code cache named by its CodeBlob (runtime_stacks.Runtime)."""
        process = self._processes.get(tgid, started)  # (another process's, of a pid reused since, names nothing)
        if process is None:
            return stack

        def java(recorded: runtime_stacks.Recorded) -> list[Frame]:
            method, kind, next_slot = recorded.value & POINTER_MASK, recorded.kind, recorded.next_slot
            inlined = self._inlined(process, next_slot, method, recorded.index > 0) if kind == COMPILED else []
            if inlined:
                return [self.frame(process, scope_method, bci) for scope_method, bci in inlined]
            return [self.frame(process, method, bcp=next_slot if kind == INTERPRETED else 0)]

        def native(frame: Frame) -> Frame:
            in_code_cache = frame.name is None and frame.kind == "native" and process.code.low <= frame.address < process.code.high
            return self._stub_frame(process, frame) if in_code_cache else frame

        return runtime_stacks.name_recorded(stack, self.kinds, java, native)

    def _stub_frame(self, process: JvmProcess, frame: Frame) -> Frame:
        """A pc of the code cache outside Java code (a stub, an adapter, the interpreter where
        its frame was not whole): named by its CodeBlob, as the JVM names it ("StubRoutines (1)",
        "I2C/C2I adapters")."""
        if process.scopes is None:
            return frame
        try:
            name = process.scopes.blob_name(frame.address)
        except (ScopeReadError, NameReadError, MemoryReadError, struct.error, UnicodeDecodeError):
            return frame
        return dataclasses.replace(frame, name=name, kind=FRAME_KIND) if name else frame

    def _inlined(self, process: JvmProcess, pc: int, method: int, return_address: bool) -> list[tuple[int, int]]:
        """The scopes at a compiled frame's pc, innermost first, its own method last; empty when
        they cannot be read (the frame is then its method alone)."""
        if process.scopes is None or not pc:
            return []
        try:
            return process.scopes.inlined(pc, method, return_address)
        except (ScopeReadError, NameReadError, MemoryReadError, struct.error) as error:
            with self._lock:
                self.stats["inlining_unknown"] += 1
            log_once(self.log, ("hotspot-scopes", process.info.pid), "debug", "the methods inlined at a pc of compiled Java code "
                     "could not be read; counted in pycollector_profiling_hotspot{stat=\"inlining_unknown\"}",
                     pid=process.info.pid, reason=str(error))
            return []

    def frame(self, process: JvmProcess, method: int, bci: int | None = None, bcp: int = 0) -> Frame:
        """The frame of ``method`` at bytecode index ``bci``, or at the bytecode pointer ``bcp``
        (an interpreted frame's), for its line; neither: no line."""
        try:
            name, file, code_base, lines = self._name(process, method)
        except (NameReadError, MemoryReadError, struct.error, UnicodeDecodeError) as error:
            with self._lock:
                self.stats["frames_unnamed"] += 1
            log_once(self.log, ("hotspot-unnamed", process.info.pid), "debug", "a Java frame could not be named; counted in "
                     "pycollector_profiling_hotspot{stat=\"frames_unnamed\"}", pid=process.info.pid, reason=str(error))
            return Frame(address=method, kind=FRAME_KIND)
        with self._lock:
            self.stats["frames_named"] += 1
        if bcp and code_base <= bcp < code_base + MAX_BYTECODES:
            bci = bcp - code_base
        return Frame(address=method, kind=FRAME_KIND, name=name, source_file=file or None,
                     line=lines.line_at(bci) if bci is not None and bci >= 0 else 0)

    def _read(self, process: JvmProcess, address: int, size: int) -> bytes:
        """Within the JVM's budget and, through its memory, the report's (NamingBudgetSpent, a
        MemoryReadError)."""
        if process.memory.exited:  # (spends nothing: nothing can be read)
            raise ProcessExited(process.info.pid, address, size)
        if size > process.budget:
            with self._lock:
                self.stats["read_budget_spent"] += 1
            raise NameReadError(f"this report's {READ_BUDGET_PER_PROCESS} bytes of JVM memory reads are spent")
        process.budget -= size
        return process.memory.read(address, size)

    def _name(self, process: JvmProcess, method: int) -> tuple[str, str, int, tuple]:
        """(Class.method, source file, where its bytecodes start, its line table)."""
        layout = process.methods
        known = process.names.get(method)
        check = None
        if method not in process.checked:
            try:
                check = self._read(process, method + layout.const_method, 8)
            except ProcessExited:
                # Nothing can be read once the JVM has exited: a name read while it ran is kept
                # (its last samples were of that Method, unless the JVM freed it since).
                if known is None:
                    raise
        if known is not None and (check is None or check == known[0]):
            process.checked.add(method)
            return known[1:5]
        check = check or self._read(process, method + layout.const_method, 8)
        const_method = struct.unpack("<Q", check)[0]
        constants = self._u64(process, const_method + layout.constants)
        name_index = struct.unpack("<H", self._read(process, const_method + layout.name_index, 2))[0]
        holder = self._u64(process, constants + layout.pool_holder)
        class_name = self._symbol(process, self._u64(process, holder + layout.klass_name)).replace("/", ".")
        method_name = self._symbol(process, self._u64(process, constants + layout.pool_size + 8 * name_index))
        file = ""
        if layout.source_file_index is not None:
            index = struct.unpack("<H", self._read(process, constants + layout.source_file_index, 2))[0]
            if index:
                file = self._symbol(process, self._u64(process, constants + layout.pool_size + 8 * index))
        name = f"{_without_hidden_suffix(class_name)}.{method_name}"
        code_base = const_method + layout.const_method_size
        lines = self._line_table(process, const_method, code_base)
        self._keep(process, method, (check, name, file, code_base, lines))
        process.checked.add(method)
        return name, file, code_base, lines

    def _keep(self, process: JvmProcess, method: int, entry: tuple) -> None:
        """Cache a Method's name and lines, within the bytes its JVM and all JVMs may hold: the
        oldest of this JVM's go first, then, while all of them hold too much, the oldest of the
        JVM holding most."""
        cost = _NAME_ENTRY_BYTES + len(entry[1]) + len(entry[2]) + entry[4].nbytes
        with self._lock:
            self.stats["methods_read"] += 1
            if (old := process.names.pop(method, None)) is not None:
                self._forget_name(process, old)
            while process.names and (len(process.names) >= MAX_METHODS_PER_PROCESS
                                     or process.names_bytes + cost > MAX_NAMES_BYTES_PER_PROCESS):
                self._evict_oldest(process)
            while self._names_bytes + cost > MAX_NAMES_BYTES:
                largest = max(self._processes.known(), key=lambda other: other.names_bytes, default=None)
                if largest is None or not largest.names:
                    return  # (named now, not kept: read again when it is sampled again)
                self._evict_oldest(largest)
            process.names[method] = (*entry, cost)
            process.names_bytes += cost
            self._names_bytes += cost
            self.stats["names_bytes"] = self._names_bytes

    def _evict_oldest(self, process: JvmProcess) -> None:
        self._forget_name(process, process.names.pop(next(iter(process.names))))
        self.stats["names_evicted"] += 1

    def _forget_name(self, process: JvmProcess, entry: tuple) -> None:
        process.names_bytes -= entry[5]
        self._names_bytes -= entry[5]

    def _line_table(self, process: JvmProcess, const_method: int, code_base: int) -> LineTable:
        """The method's (bci, line) pairs: its compressed line number table, which follows its
        bytecodes where its flags say it has one."""
        layout = process.methods
        if not layout.has_line_table:
            return LineTable()
        flags = int.from_bytes(self._read(process, const_method + layout.flags, layout.flags_size), "little")
        if not flags & layout.has_line_table:
            return LineTable()
        code_size = struct.unpack("<H", self._read(process, const_method + layout.code_size, 2))[0]
        start = code_base + code_size
        data = self._read(process, start, min(MAX_LINE_TABLE, 4096 - start % 4096))  # (to its page's end first)
        if 0 not in data and len(data) < MAX_LINE_TABLE:
            data += self._read(process, start + len(data), min(MAX_LINE_TABLE - len(data), 4096))
        return decode_line_table(data, layout.excludes_zero)

    def _u64(self, process: JvmProcess, address: int) -> int:
        value = struct.unpack("<Q", self._read(process, address, 8))[0]
        if not 4096 <= value < 1 << 47:
            raise NameReadError(f"{value:#x} at {address:#x} is not a pointer")
        return value

    def _symbol(self, process: JvmProcess, symbol: int) -> str:
        layout = process.methods
        length = struct.unpack("<H", self._read(process, symbol + layout.symbol_length, 2))[0]
        return self._read(process, symbol + layout.symbol_body, min(length, MAX_SYMBOL)).decode("utf-8", "replace")


class LineTable:
    """A method's (bci, line) pairs in the table's order, as two arrays: 16 bytes a pair, where a
    tuple of tuples took about 100."""

    __slots__ = ("bcis", "lines")

    def __init__(self, pairs: Iterable[tuple[int, int]] = ()) -> None:
        self.bcis, self.lines = array.array("q"), array.array("q")
        for bci, line in pairs:
            self.bcis.append(bci)
            self.lines.append(line)

    @property
    def nbytes(self) -> int:
        return 2 * 8 * len(self.bcis)

    def line_at(self, bci: int) -> int:
        """The line of ``bci``: that of the last entry at or before it (0: none)."""
        at = bisect.bisect_right(self.bcis, bci) - 1
        return self.lines[at] if at >= 0 else 0

    def pairs(self) -> list[tuple[int, int]]:
        return list(zip(self.bcis, self.lines))


def decode_line_table(data: bytes, excludes_zero: bool) -> LineTable:
    """The JVM's compressed line number table: a byte (bci delta << 3 | line delta) for small
    steps, 0xFF then two signed UNSIGNED5 numbers (bci delta, line delta) for others, 0 at its
    end. A table without its end (the read cut it) keeps what was decoded."""
    out: list[tuple[int, int]] = []
    bci = line = at = 0
    try:
        while at < len(data) and len(out) < MAX_LINE_ENTRIES:
            byte = data[at]
            at += 1
            if byte == 0:
                break
            if byte == 0xFF:
                bci_delta, at = _unsigned5(data, at, excludes_zero)
                line_delta, at = _unsigned5(data, at, excludes_zero)
                bci += (bci_delta >> 1) ^ -(bci_delta & 1)
                line += (line_delta >> 1) ^ -(line_delta & 1)
            else:
                bci += byte >> 3
                line += byte & 7
            out.append((bci, line))
    except ScopeReadError:
        pass
    return LineTable(out)


def _without_hidden_suffix(name: str) -> str:
    """A hidden class (a lambda's) carries its address after a '+' (or '/' in older JDKs): one name
    for all of them."""
    at = name.find("+0x")
    return name[:at] if at >= 0 else name


def libjvm_symbols(_path: str, fd: int, _open_debug) -> tuple[dict[str, int], tuple] | None:
    """libjvm's VMStructs symbols and its PT_LOAD segments (once per file, in
    symbols/detection.py's helper process)."""
    try:
        with os.fdopen(os.dup(fd), "rb", buffering=1 << 16) as stream:
            elf = BoundedElf(stream)
            # (.dynsym first: the JVM exports them all for debuggers, and its .symtab is 120 times larger)
            return defined_symbols(elf, SYMBOLS, tables=(".dynsym", ".symtab")), load_segments(elf)
    except Exception:  # noqa: BLE001 - the file is the process's to write; pyelftools raises many kinds
        return None
