"""The functions inlined at a pc of V8's optimized code: the Code object the pc lies in, found
from the pc alone (V8 runs on-stack-replaced code that no JSFunction points to), then its source
position table and deoptimization data, as V8's own profiler reads them.

Finding the Code: an InstructionStream (V8 11.1+) is a heap object whose instructions follow its
header, and the header's second word points back to its Code object, which says where those
instructions start and how long they are. Before V8 11.1 the Code object itself holds the
instructions after its header. Scanning back from the pc, at every code-aligned address, for a
header whose map is the InstructionStream's (or the Code's) and whose Code says its instructions
start there and hold the pc, finds it; instruction bytes that happen to look like a header fail
that check. What was found is kept by its range and checked again each report (the collector may
move or free code). A scan reads up to 256 KiB, so it has a budget of its own (the names' is not
spent on it) and a pc whose scan found nothing is not scanned again in the same report."""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass

from .heap import BudgetSpent, HeapReadError, ReadBudget, V8Heap, is_heap_object, still_there
from .positions import MAX_POSITION_TABLE, baseline_pc_ends, bytecode_offsets, decode_positions, inlining_id, position_at, script_offset
from .layout import CodeLayout

CODE_ALIGNMENT = 32  # instruction starts are aligned to at least this (64 on x64 since V8 10)
MAX_SCAN_BYTES = 256 * 1024  # how far back from a pc a Code's start is looked for
SCAN_CHUNK = 4096
MAX_INLINED = 64  # inlined functions followed at one pc
MAX_CODES = 4096  # Code objects kept per process
MAX_HELD_ENTRIES = 1 << 17  # their tables' entries, in all (about 16 MB)
MAX_MISSES = 4096  # pcs in no Code known, per report
MAX_BYTECODES = 64 * 1024  # bytes of a baseline function's bytecodes read
MAX_CODE_BYTES = 64 << 20  # a Code's instructions: a larger size is not a Code's


@dataclass(frozen=True)
class CodeObject:
    code: int  # the Code (tagged)
    start: int  # its instructions
    end: int
    kind: int
    positions: tuple[tuple[int, int], ...]  # (code offset, source position), by code offset
    inlining: tuple[tuple[int, int], ...]  # InliningPositions: (source position, inlined function id)
    inlined: tuple[int, ...]  # the SharedFunctionInfos the ids name (tagged)
    # Baseline code: (code offset where a bytecode's machine code ends, its script offset), in order
    baseline: tuple[tuple[int, int], ...] = ()
    incomplete: bool = False  # baseline code read before V8 made its function's source positions

    @property
    def entries(self) -> int:
        """What it holds, in table entries (a pair of numbers each: about 120 bytes)."""
        return 1 + len(self.positions) + len(self.inlining) + len(self.inlined) + len(self.baseline)

    def scopes_at(self, pc: int, return_address: bool) -> tuple[list[tuple[int, int]], int]:
        """What ran at ``pc``: the functions optimized code inlined there, innermost first, each
        with the script offset it was at (its SharedFunctionInfo, offset), and the script offset
        the code's own function was at (offsets -1 where not known)."""
        if self.baseline:  # (a return address ends its call's code; another pc is in the code that ends past it)
            offset = pc - self.start
            at = bisect.bisect_left(self.baseline, (offset, -2) if return_address else (offset + 1, -2))
            return [], self.baseline[at][1] if at < len(self.baseline) else -1
        position = position_at(self.positions, pc - self.start - (1 if return_address else 0))
        if position < 0:
            return [], -1
        out: list[tuple[int, int]] = []
        inlining = inlining_id(position)
        while inlining >= 0 and len(out) < MAX_INLINED and inlining < len(self.inlining):
            caller_position, function_id = self.inlining[inlining]
            if not 0 <= function_id < len(self.inlined):
                break
            out.append((self.inlined[function_id], script_offset(position)))
            position = caller_position
            parent = inlining_id(position)
            if parent >= inlining:  # ids of callers are smaller: anything else is not V8's table
                return out, -1
            inlining = parent
        return out, script_offset(position)


class CodeIndex:
    """One process's Code objects found so far. ``heap``: its reads are this index's alone (its
    budget is spent on scans and tables, and given again each report)."""

    def __init__(self, heap: V8Heap, layout: CodeLayout) -> None:
        self.heap, self.layout = heap, layout
        self._starts: list[int] = []
        self._codes: dict[int, CodeObject] = {}
        self._checked: set[int] = set()
        self._misses: dict[int, str] = {}  # pc -> why no Code was found for it, this report
        self._held = 0  # table entries the codes kept hold (CodeObject.entries)
        self._stream_map = 0  # the InstructionStream map, once seen

    def new_report(self) -> None:
        self._checked.clear()
        self._misses.clear()
        self.heap.budget = ReadBudget(self.heap.budget.limit)

    def find(self, pc: int) -> CodeObject:
        at = bisect.bisect_right(self._starts, pc) - 1
        if at >= 0:
            code = self._codes[self._starts[at]]
            first_look = code.start not in self._checked
            if code.start <= pc < code.end and self._still_there(code):
                if code.incomplete and first_look:  # (once a report: V8 may have made its positions since)
                    try:
                        again = self._code_at(code.start, code.code)
                    except HeapReadError:
                        again = None
                    if again is not None and not again.incomplete:
                        self._keep(again)
                        return again
                return code
        if pc in self._misses:
            raise HeapReadError(self._misses[pc])
        try:
            code = self._scan(pc)
        except HeapReadError as error:
            if len(self._misses) < MAX_MISSES and not isinstance(error, BudgetSpent):
                self._misses[pc] = str(error)
            raise
        self._keep(code)
        return code

    def _still_there(self, code: CodeObject) -> bool:
        if code.start in self._checked:
            return True
        if still_there(self.heap, lambda: self._same_code(code)):
            self._checked.add(code.start)
            return True
        self._forget(code)
        return False

    def _same_code(self, code: CodeObject) -> bool:
        """Whether the object before ``code``'s instructions still says they are its."""
        layout = self.layout
        header = self.heap.read(code.start - layout.stream_header, layout.stream_header)
        if layout.code_holds_instructions:  # (the Code is where it was: its map and size tell)
            return (struct.unpack_from("<Q", header, 0)[0] == self._stream_map
                    and struct.unpack_from("<I", header, layout.instruction_size)[0] == code.end - code.start)
        return struct.unpack_from("<Q", header, 8)[0] == code.code  # (the InstructionStream's Code)

    def _keep(self, code: CodeObject) -> None:
        for start in [start for start in self._starts if code.start <= start < code.end]:
            self._forget(self._codes[start])
        # (the oldest kept first: a dict keeps its order)
        while self._codes and (len(self._codes) >= MAX_CODES or self._held + code.entries > MAX_HELD_ENTRIES):
            self._forget(next(iter(self._codes.values())))
        bisect.insort(self._starts, code.start)
        self._codes[code.start] = code
        self._held += code.entries
        self._checked.add(code.start)

    def _forget(self, code: CodeObject) -> None:
        self._starts.remove(code.start)
        del self._codes[code.start]
        self._held -= code.entries
        self._checked.discard(code.start)

    def _scan(self, pc: int) -> CodeObject:
        header = self.layout.stream_header
        low = max(pc - MAX_SCAN_BYTES, 4096)
        high = pc + 1  # (the instructions may start at the pc itself)
        while high > low:
            chunk = max(low, high - SCAN_CHUNK)
            data = self.heap.read(chunk - header, high - chunk + header)  # (with the header of a start at `chunk`)
            start = (high - 1) - (high - 1) % CODE_ALIGNMENT
            while start >= chunk:
                at = start - header - (chunk - header)
                if self._is_stream_map(struct.unpack_from("<Q", data, at)[0]):
                    owner = start - header + 1 if self.layout.code_holds_instructions else struct.unpack_from("<Q", data, at + 8)[0]
                    code = self._code_at(start, owner)
                    if code is not None:
                        if pc < code.end:
                            return code
                        raise HeapReadError(f"pc {pc:#x} lies after the code at {code.start:#x}: in no code V8 knows")
                start -= CODE_ALIGNMENT
            high = chunk
        raise HeapReadError(f"no Code within {MAX_SCAN_BYTES} bytes below pc {pc:#x}")

    def _is_stream_map(self, word: int) -> bool:
        if word & 3 != 1:
            return False
        if self._stream_map:
            return word == self._stream_map
        try:
            if self.heap.instance_type_of_map(word) != self.layout.stream_type:
                return False
        except HeapReadError:
            return False
        self._stream_map = word
        return True

    def _code_at(self, start: int, code: int) -> CodeObject | None:
        """The CodeObject whose instructions start at ``start``, if ``code`` is its Code."""
        layout, heap = self.layout, self.heap
        if not is_heap_object(code):
            return None
        try:
            if heap.type_of(code) != layout.code_type:
                return None
            fields = heap.read(code - 1, max(layout.instruction_size, layout.flags, layout.instruction_start + 4,
                                             layout.source_positions + 4, layout.deoptimization_data + 4) + 4)
        except HeapReadError:
            return None
        # (a Code that holds its instructions was found from where they start: only the other says it)
        if not layout.code_holds_instructions and struct.unpack_from("<Q", fields, layout.instruction_start)[0] != start:
            return None
        size = struct.unpack_from("<I", fields, layout.instruction_size)[0]
        if not 0 < size <= MAX_CODE_BYTES:  # (before V8 11.1 only the Code map vouches for a header found)
            return None
        kind = (struct.unpack_from("<I", fields, layout.flags)[0] >> layout.kind_shift) & layout.kind_mask
        positions, inlining, inlined, baseline = (), (), (), ()
        if kind in layout.optimized_kinds:
            positions = self._positions(struct.unpack_from("<Q", fields, layout.source_positions)[0])
            inlining, inlined = self._inlining(struct.unpack_from("<Q", fields, layout.deoptimization_data)[0])
        elif kind == layout.baseline_kind and layout.bytecode_sizes is not None:
            try:
                baseline = self._baseline(struct.unpack_from("<Q", fields, layout.deoptimization_data)[0],
                                          struct.unpack_from("<Q", fields, layout.source_positions)[0])
            except BudgetSpent:
                raise  # (not kept: read again when there is budget)
            except HeapReadError:
                baseline = ()  # (its frames then have no line)
            return CodeObject(code, start, start + size, kind, (), (), (), baseline,
                              incomplete=not any(offset >= 0 for _, offset in baseline))
        return CodeObject(code, start, start + size, kind, positions, inlining, inlined)

    def _baseline(self, bytecode: int, offset_table: int) -> tuple[tuple[int, int], ...]:
        """Where each bytecode's machine code ends in baseline code, with its script offset: the
        code keeps its BytecodeArray where optimized code keeps its deoptimization data, and its
        bytecode offset table where optimized code keeps its source positions."""
        heap, v8 = self.heap, self.heap.layout
        if not is_heap_object(bytecode) or heap.type_of(bytecode) != v8.bytecode_array_type:
            return ()
        length = heap.field(bytecode, v8.fixed_array_length) >> 32
        if not 0 < length <= MAX_BYTECODES:
            return ()
        offsets = bytecode_offsets(heap.read(bytecode - 1 + v8.bytecode_array_data, length), self.layout.bytecode_sizes)
        ends = baseline_pc_ends(heap.byte_array(offset_table, MAX_POSITION_TABLE))
        positions = heap.bytecode_positions(bytecode)
        # The first end is the prologue's (no bytecode yet); the k-th after it, the k-th bytecode's.
        return tuple((end, script_offset(position_at(positions, offsets[index - 1])) if 0 < index <= len(offsets) else -1)
                     for index, end in enumerate(ends))

    def _positions(self, table: int) -> tuple[tuple[int, int], ...]:
        return tuple(decode_positions(self.heap.byte_array(table, MAX_POSITION_TABLE)))

    def _inlining(self, deoptimization_data: int) -> tuple[tuple, tuple]:
        layout, heap = self.layout, self.heap
        if not is_heap_object(deoptimization_data):
            return (), ()

        def entry(index: int) -> int:
            return heap.field(deoptimization_data, layout.array_data + 8 * index)

        count = entry(layout.deopt_inlined_count) >> 32
        if not 0 <= count <= MAX_INLINED * 16:
            raise HeapReadError(f"deoptimization data naming {count} inlined functions")
        literals = entry(layout.deopt_literals)
        inlined = tuple(heap.field(literals, layout.array_data + 8 * i) & ~2 for i in range(count))  # (weak references)
        table = self.heap.byte_array(entry(layout.deopt_inlining_positions), 16 * MAX_INLINED * 16)
        inlining = tuple(struct.iter_unpack("<Qi4x", table[: len(table) // 16 * 16]))
        return inlining, inlined
