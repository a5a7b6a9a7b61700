"""Naming a SharedFunctionInfo the kernel recorded, from the live process's heap: its function's
name, its script's name, and the lines of its script (where each line ends), by which a frame's
script offset becomes its line.

Everything here is the process's to write, and V8's collector moves objects: an address names
an object only until the next compaction. So every object is checked to be of the type expected
before it is used (its map's instance type), strings are read to a bound, cons strings to a
depth, and every read is counted against the caller's budget (``ReadBudget``) and, through its
memory (processes/report_budget.py BudgetedMemory), the report's."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from ..processes.memory import MemoryReadError, ProcessExited, ProcessMemory
from ..processes.report_budget import NamingBudgetSpent
from .layout import V8Layout
from .positions import MAX_POSITION_TABLE, decode_positions

MAX_NAME_CHARS = 1024  # a longer name is cut (as the other namers cut theirs)
MAX_STRING_DEPTH = 16  # cons and sliced strings followed this deep
MAX_LINES = 1 << 15  # a script's line ends read (a longer script's later lines are not told)
MAX_SOURCE_CHARS = 64 * 1024  # a script without line ends has its own counted in this much source
LINE_TERMINATORS = "\n\r\u2028\u2029"  # as V8 counts lines (a \r\n is one)
SCOPE_INFO_NAME_SLOTS = 8  # ScopeInfo slots searched for the function's name after the locals


class HeapReadError(Exception):
    """An object was not what it should be, could not be read, or the budget is spent."""


class BudgetSpent(HeapReadError):
    pass


class ReadBudget:
    """Bytes a report may read from one process's heap (a name costs a few hundred)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.spent = limit, 0

    def spend(self, size: int) -> None:
        if self.spent + size > self.limit:
            raise BudgetSpent(f"this report's {self.limit} bytes of V8 heap reads are spent")
        self.spent += size


@dataclass(frozen=True)
class FunctionInfo:
    name: str
    script: str  # the script's name: a path, a file:// URL, node:internal/..., or ""
    script_address: int  # the Script (tagged), for its lines; 0 when none
    bytecode: int  # the BytecodeArray (tagged) of an interpreted function; 0 when none
    identity: bytes  # the SharedFunctionInfo's fields read: another object there reads differently


class V8Heap:
    def __init__(self, memory: ProcessMemory, layout: V8Layout, budget: ReadBudget) -> None:
        self.memory, self.layout, self.budget = memory, layout, budget
        self.reads = 0  # made

    # -- primitives --------------------------------------------------------------------------------

    def read(self, address: int, size: int) -> bytes:
        if self.memory.exited:  # (spends nothing: nothing can be read)
            raise HeapReadError(str(ProcessExited(self.memory.pid, address, size)))
        self.budget.spend(size)
        try:
            data = self.memory.read(address, size)
        except NamingBudgetSpent as error:  # (the report's, all processes'; read in a later report)
            raise BudgetSpent(str(error)) from error
        except MemoryReadError as error:
            raise HeapReadError(str(error)) from error
        self.reads += 1
        return data

    def word(self, address: int) -> int:
        return struct.unpack("<Q", self.read(address, 8))[0]

    def field(self, obj: int, offset: int) -> int:
        """The tagged field at ``offset`` of the heap object ``obj`` (a tagged pointer)."""
        return self.word(obj - 1 + offset)

    def type_of(self, obj: int) -> int:
        if not is_heap_object(obj):
            raise HeapReadError(f"{obj:#x} is not a heap object")
        return self.instance_type_of_map(self.field(obj, self.layout.object_map))

    def instance_type_of_map(self, map_: int) -> int:
        """The instance type a map gives the objects it describes."""
        if not is_heap_object(map_):
            raise HeapReadError(f"{map_:#x} is not a map")
        return struct.unpack("<H", self.read(map_ - 1 + self.layout.map_instance_type, 2))[0]

    def expect(self, obj: int, instance_type: int, what: str) -> None:
        found = self.type_of(obj)
        if found != instance_type:
            raise HeapReadError(f"{obj:#x} is not a {what} (instance type {found}, not {instance_type})")

    def is_string(self, obj: int) -> bool:
        return is_heap_object(obj) and self.type_of(obj) < self.layout.first_nonstring_type

    def string(self, obj: int, limit: int = MAX_NAME_CHARS) -> str:
        """The string ``obj``, at most ``limit`` characters."""
        out: list[str] = []
        self._string(obj, 0, limit, out, 0)
        return "".join(out)[:limit]

    def _string(self, obj: int, start: int, limit: int, out: list[str], depth: int) -> int:
        """Appends the characters of ``obj`` from ``start``, at most ``limit`` of them, to ``out``;
        returns how many it appended."""
        layout = self.layout
        if limit <= 0:
            return 0
        if depth > MAX_STRING_DEPTH:
            raise HeapReadError("a string nested too deep")
        instance_type = self.type_of(obj)
        if instance_type >= layout.first_nonstring_type:
            raise HeapReadError(f"{obj:#x} is not a string (instance type {instance_type})")
        length = struct.unpack("<i", self.read(obj - 1 + layout.string_length, 4))[0]
        if length < 0:
            raise HeapReadError(f"string {obj:#x} of length {length}")
        representation = instance_type & layout.string_representation_mask
        one_byte = instance_type & layout.string_encoding_mask == layout.one_byte_string_tag
        count = max(0, min(length - start, limit))
        if count == 0:
            return 0
        if representation == layout.seq_string_tag:
            if one_byte:
                out.append(self.read(obj - 1 + layout.seq_one_byte_chars + start, count).decode("latin-1"))
            else:
                out.append(self.read(obj - 1 + layout.seq_two_byte_chars + 2 * start, 2 * count).decode("utf-16-le", "replace"))
            return count
        if representation == layout.cons_string_tag:
            first = self.field(obj, layout.cons_first)
            first_length = struct.unpack("<i", self.read(first - 1 + layout.string_length, 4))[0]
            taken = self._string(first, start, count, out, depth + 1) if start < first_length else 0
            return taken + self._string(self.field(obj, layout.cons_second), max(0, start - first_length), count - taken, out, depth + 1)
        if representation == layout.thin_string_tag:
            return self._string(self.field(obj, layout.thin_actual), start, count, out, depth + 1)
        if representation == layout.sliced_string_tag:
            offset = self.field(obj, layout.sliced_offset) >> 32
            return self._string(self.field(obj, layout.sliced_parent), start + offset, count, out, depth + 1)
        else:
            raise HeapReadError(f"string {obj:#x}: an external string (its characters are outside the heap)")

    def byte_array(self, array: int, limit: int) -> bytes:
        """The bytes of the ByteArray ``array`` (b"" for no heap object: a table not made)."""
        if not is_heap_object(array):
            return b""
        length = self.field(array, self.layout.fixed_array_length) >> 32
        if not 0 <= length <= limit:
            raise HeapReadError(f"a table of {length} bytes (at most {limit} are read)")
        return self.read(array - 1 + self.layout.fixed_array_data, length)

    # -- lines -------------------------------------------------------------------------------------

    def line_ends(self, script: int) -> tuple[int, ...]:
        """The script offsets at which the lines of the Script ``script`` end: each newline's,
        then the source's end, as V8's own table has them. V8's table where V8 made one, else
        counted in the source; either up to a bound (then without the end: the later lines are
        not known)."""
        layout = self.layout
        ends = self.field(script, layout.script_line_ends)
        if is_heap_object(ends) and self.type_of(ends) == layout.fixed_array_type:
            count = self.field(ends, layout.fixed_array_length) >> 32
            if 0 < count:
                data = self.read(ends - 1 + layout.fixed_array_data, 8 * min(count, MAX_LINES))
                return tuple(value >> 32 for (value,) in struct.iter_unpack("<Q", data))
        source = self.field(script, layout.script_source)
        if not self.is_string(source):
            return ()
        text = self.string(source, MAX_SOURCE_CHARS)
        ends, offset = [], 0  # (offsets count UTF-16 code units, as V8's do)
        for index, char in enumerate(text):
            if char in LINE_TERMINATORS and not (char == "\r" and text[index + 1: index + 2] == "\n"):
                ends.append(offset)
            offset += 2 if char > "\uffff" else 1
        whole = len(text) == struct.unpack("<i", self.read(source - 1 + layout.string_length, 4))[0]
        return tuple(ends) + (offset,) if whole else tuple(ends)

    def bytecode_positions(self, bytecode: int) -> tuple[tuple[int, int], ...]:
        """(bytecode offset, source position) of the BytecodeArray ``bytecode``: empty while V8
        has not made the table (it makes them lazily, when a profiler or a stack trace asks)."""
        table = self.field(bytecode, self.layout.bytecode_array_source_positions)
        if not is_heap_object(table) or self.type_of(table) not in self.layout.byte_array_types:
            return ()
        return tuple(decode_positions(self.byte_array(table, MAX_POSITION_TABLE)))

    # -- functions ---------------------------------------------------------------------------------

    def function(self, shared: int) -> FunctionInfo:
        """What names the SharedFunctionInfo ``shared``."""
        layout = self.layout
        self.expect(shared, layout.shared_type, "SharedFunctionInfo")
        fields = self.identity(shared)

        def at(offset: int) -> int:
            return struct.unpack_from("<Q", fields, offset)[0]

        name = self._function_name(at(layout.shared_name_or_scope_info))
        script_address, script = at(layout.shared_script_or_debug_info), ""
        if is_heap_object(script_address) and self.type_of(script_address) == layout.script_type:
            script_name = self.field(script_address, layout.script_name)
            script = self.string(script_name) if self.is_string(script_name) else ""
        else:
            script_address = 0
        data = at(layout.shared_function_data)
        bytecode = data if is_heap_object(data) and self.type_of(data) == layout.bytecode_array_type else 0
        return FunctionInfo(name, script, script_address, bytecode, fields)

    def identity(self, shared: int) -> bytes:
        """The SharedFunctionInfo's fields a name is read from: another object there reads
        differently."""
        layout = self.layout
        return self.read(shared - 1, max(layout.shared_name_or_scope_info, layout.shared_script_or_debug_info,
                                         layout.shared_function_data) + 8)

    def _function_name(self, name_or_scope_info: int) -> str:
        layout = self.layout
        if not is_heap_object(name_or_scope_info):
            return ""
        instance_type = self.type_of(name_or_scope_info)
        if instance_type < layout.first_nonstring_type:
            return self.string(name_or_scope_info)
        if instance_type != layout.scope_info_type:
            return ""
        # After the scope's flags, counts and context locals (a name and an info slot each), the
        # first string is the function's name (its own variable's, or the one V8 inferred).
        locals_ = self.field(name_or_scope_info, 8 + 8 * layout.scope_info_context_locals) >> 32
        first = layout.scope_info_first_vars + 2 * min(locals_, 1 << 16)
        for slot in range(first, first + SCOPE_INFO_NAME_SLOTS):
            value = self.field(name_or_scope_info, 8 + 8 * slot)
            if is_heap_object(value) and self.is_string(value):
                return self.string(value)
        return ""


def still_there(heap: V8Heap, same: Callable[[], bool]) -> bool:
    """Whether an object read before is still the one there, by ``same()``. Once the process has
    exited nothing can be read, and what was read while it ran is kept: its last report's samples
    were of those objects, unless one moved between that read and the exit (a rare wrong name,
    where otherwise every last sample of every process would be nameless)."""
    try:
        return same()
    except HeapReadError:
        if heap.memory.exited:
            return True
        raise


def is_heap_object(value: int) -> bool:
    return value & 3 == 1 and 4096 <= value < 1 << 47
