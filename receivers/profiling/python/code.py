"""Code objects of another process: (code object address, instruction) -> function, file, line.

The kernel walker records each Python frame as its code object's address and instruction; this
reads the code object through /proc/PID/mem (name, co_qualname where it exists, file, first line,
line table) and caches it per (process, address). An address can be freed and reused for
another code object (a function defined in a loop, a module reloaded), so a cached entry is
checked once per epoch (the caller starts one per report) by reading again the fields that tell
code objects apart: its type, argument counts, flags, first line, and the name, file and line
table pointers, in one read of a few words.

Everything read is the sampled process's to choose, so each read has a bound: a line table of at
most MAX_LINE_TABLE bytes, names cut at MAX_NAME_CHARS (with a marker), the cache held to
``max_bytes`` of what its code objects keep, and the bytes read from processes' memory to
``max_read_bytes_per_epoch`` a report, ``max_read_bytes_per_process`` of them for one process (so
that one process cannot spend the others' share); a code object past a budget is not read
(counted in ``stats``), and its frame stays unnamed this report. The memory a report gives is
read within the report's budget too, all runtimes' together (processes/report_budget.py): a
read it refuses is BudgetSpent, a cached code object's check among them.
"""

from __future__ import annotations

import functools
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass

from .frames import FIRST_LINE_MASK
from .linetable import LineTable
from ..processes.memory import MemoryReadError, ProcessMemory
from ..processes.report_budget import REFUSED_STAT, NamingBudgetSpent
from .offsets import Offsets, StringKind

# A name's length past this is no name but garbage where a code object was expected. (Only the
# first MAX_NAME_CHARS characters of a name are read, whatever its length: a hostile program's
# name of a megabyte is cut, its frame still named.)
MAX_STRING = 1 << 31
MAX_NAME_CHARS = 1024  # characters of a name or file name kept; a longer one is cut and marked
TRUNCATED = "…[truncated]"
# A line table's bytes: CPython 3.11 writes about 2 a line, so this is a function of ~30,000 lines.
MAX_LINE_TABLE = 1 << 16
DEFAULT_MAX_BYTES = 32 << 20  # what the cached code objects hold, all processes together
# Memory read for code objects in one report: in all, and for one process. Decoding a line table
# costs about 0.5 us a byte, so a process busy in thousands of fat code objects costs each report
# at most about 0.1 s, and all of them together 1 s; the rest waits for the next reports (frames
# of code objects already read stay named: checking one costs no budget).
DEFAULT_MAX_READ_BYTES_PER_EPOCH = 2 << 20
DEFAULT_MAX_READ_BYTES_PER_PROCESS = 256 << 10
_ENTRY_OVERHEAD = 400  # bytes a cached code object costs beyond its strings and table


class CodeReadError(Exception):
    """A code object could not be read (the memory is gone) or does not look like one."""


class TableTooLarge(CodeReadError):
    """A bytes object over its limit (a line table): the code object is named without lines."""


class BudgetSpent(CodeReadError):
    """This epoch's budget of memory reads is spent: the code object is read in a later one."""


class NotTheSampledCode(CodeReadError):
    """The address holds a code object, but not the one the sample saw there: the kernel's note
    of its first line disagrees, or the instruction lies past its end. Code objects freed after a
    module's import leave their addresses to new ones, within the interval before a report."""


@dataclass(frozen=True, slots=True)
class PythonLocation:
    function: str  # co_qualname where it exists (3.11+), else co_name
    file: str  # co_filename
    line: int | None  # the instruction's line, None when the line table has none for it
    first_line: int  # co_firstlineno


@dataclass(frozen=True, slots=True, eq=False)
class CodeObject:
    address: int
    name: str  # co_name
    qualname: str | None  # co_qualname (3.11+)
    file: str
    first_line: int
    identity: tuple[int, ...]  # see CodeReader.identity
    lines: LineTable
    read_bytes: int = 0  # what reading it took from the process's memory

    @property
    def size(self) -> int:
        """Bytes it holds, about (what the cache counts)."""
        return _ENTRY_OVERHEAD + len(self.name) + len(self.qualname or "") + len(self.file) + self.lines.size

    @property
    def function(self) -> str:
        return self.qualname or self.name

    def locate(self, instruction: int) -> PythonLocation:
        return PythonLocation(self.function, self.file, self.lines.line(instruction), self.first_line)

    def check_sampled(self, instruction: int, first_line_bits: int, first_line_mask: int) -> None:
        """Raise NotTheSampledCode unless this can be the code object a sample recorded."""
        if self.first_line & first_line_mask != first_line_bits:
            raise NotTheSampledCode(f"0x{self.address:x} holds {self.function} (first line {self.first_line}) now, "
                                    f"not the code object sampled there")
        if self.lines.end is not None and instruction >= self.lines.end:
            raise NotTheSampledCode(f"0x{self.address:x} holds {self.function} now, whose {self.lines.end} "
                                    f"instructions end before the sampled {instruction}")


# The fields of a code object's identity: (offset field, struct format); absent ones are skipped.
_IDENTITY = (("object_type", "Q"), ("code_argcount", "i"), ("code_kwonlyargcount", "i"), ("code_flags", "i"),
             ("code_firstlineno", "i"), ("code_name", "Q"), ("code_qualname", "Q"), ("code_filename", "Q"),
             ("code_linetable", "Q"))


class CodeReader:
    """Reads code objects laid out as ``offsets`` say."""

    def __init__(self, offsets: Offsets):
        self.offsets = offsets
        fields = [(getattr(offsets, name), fmt, name) for name, fmt in _IDENTITY if getattr(offsets, name) is not None]
        self._start = min(offset for offset, _, _ in fields)
        self._size = max(offset + struct.calcsize(fmt) for offset, fmt, _ in fields) - self._start
        self._fields = [(offset - self._start, struct.Struct("<" + fmt), name) for offset, fmt, name in fields]
        self._names = [name for _, _, name in self._fields]

    def identity(self, memory: ProcessMemory, address: int) -> tuple[int, ...]:
        """The identity fields' values, in one read."""
        data = _read(memory, address + self._start, self._size)
        return tuple(fmt.unpack_from(data, offset)[0] for offset, fmt, _ in self._fields)

    def read(self, memory: ProcessMemory, address: int) -> CodeObject:
        o = self.offsets
        identity = self.identity(memory, address)
        value = dict(zip(self._names, identity))
        if value["code_firstlineno"] < 0 or value["code_argcount"] < 0:
            raise CodeReadError(f"0x{address:x} is not a code object (first line {value['code_firstlineno']}, "
                                f"{value['code_argcount']} arguments)")
        name = self.read_string(memory, value["code_name"])
        qualname = self.read_string(memory, value["code_qualname"]) if o.code_qualname is not None else None
        file = self.read_string(memory, value["code_filename"])
        try:
            table = self.read_bytes(memory, value["code_linetable"], MAX_LINE_TABLE)
        except TableTooLarge:
            table = b""  # named all the same, with no line (an empty table tells none)
        first_line = value["code_firstlineno"]
        read = self._size + len(table) + 4 * (len(name) + len(qualname or "") + len(file))  # (at most 4 bytes a character)
        return CodeObject(address, name, qualname, file, first_line, identity, LineTable(o.linetable_kind, table, first_line), read)

    def read_bytes(self, memory: ProcessMemory, address: int, limit: int) -> bytes:
        """A bytes object's contents (2.7: a str)."""
        size = self._bytes_size(memory, address)
        if size > limit:
            raise TableTooLarge(f"a bytes object of {size} bytes at 0x{address:x}, over {limit}")
        return _read(memory, address + self.offsets.bytes_data, size) if size else b""

    def _bytes_size(self, memory: ProcessMemory, address: int) -> int:
        size = struct.unpack("<q", _read(memory, address + self.offsets.bytes_size, 8))[0]
        if size < 0:
            raise CodeReadError(f"a bytes object of {size} bytes at 0x{address:x}")
        return size

    def read_string(self, memory: ProcessMemory, address: int) -> str:
        """A str: 2.7's bytes (decoded as UTF-8), 3.x's compact or legacy unicode."""
        o = self.offsets
        if o.string_kind is StringKind.BYTES:
            size = self._bytes_size(memory, address)
            if size > MAX_STRING:
                raise CodeReadError(f"no string at 0x{address:x} (length {size})")
            kept = min(size, MAX_NAME_CHARS)
            data = _read(memory, address + o.bytes_data, kept) if kept else b""
            return data.decode("utf-8", "replace") + (TRUNCATED if kept < size else "")
        header = _read(memory, address, o.unicode_compact_data)
        length = struct.unpack_from("<q", header, o.unicode_length)[0]
        state = struct.unpack_from("<I", header, o.unicode_state)[0]
        kind = state >> o.unicode_kind_shift & 7
        if not 0 <= length <= MAX_STRING or kind not in (1, 2, 4):
            raise CodeReadError(f"no string at 0x{address:x} (length {length}, kind {kind})")
        kept = min(length, MAX_NAME_CHARS)
        if state >> o.unicode_compact_bit & 1:
            is_ascii = state >> o.unicode_ascii_bit & 1
            data_at = address + (o.unicode_ascii_data if is_ascii else o.unicode_compact_data)
        else:  # a legacy string: its characters are elsewhere
            data_at = struct.unpack("<Q", _read(memory, address + o.unicode_legacy_data, 8))[0]
        data = _read(memory, data_at, kept * kind) if kept else b""
        return data.decode(_ENCODINGS[kind], "replace") + (TRUNCATED if kept < length else "")


_ENCODINGS = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}


def _read(memory: ProcessMemory, address: int, size: int) -> bytes:
    try:
        return memory.read(address, size)
    except NamingBudgetSpent as e:  # (the report's, all processes'; read in a later report)
        raise BudgetSpent(str(e)) from e
    except MemoryReadError as e:
        raise CodeReadError(str(e)) from e


@functools.lru_cache(maxsize=64)
def reader_for(offsets: Offsets) -> CodeReader:
    return CodeReader(offsets)


class CodeCache:
    """Code objects per (pid, address), at most ``max_entries`` (least recently used go first).

    locate() reads a code object the first time it is asked for and rechecks a cached one's
    identity the first time it is asked for in each epoch; a changed identity means the address
    now holds another code object, which is read instead. Errors are raised (CodeReadError), and
    counted in ``stats``, for the caller to count and go on."""

    def __init__(self, max_entries: int = 65536, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_read_bytes_per_epoch: int = DEFAULT_MAX_READ_BYTES_PER_EPOCH,
                 max_read_bytes_per_process: int = DEFAULT_MAX_READ_BYTES_PER_PROCESS):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_read_bytes_per_epoch = max_read_bytes_per_epoch
        self.max_read_bytes_per_process = max_read_bytes_per_process
        self._entries: OrderedDict[tuple[int, int], list] = OrderedDict()  # -> [CodeObject, epoch checked]
        self._held = 0  # the cached code objects' sizes, summed
        self._read_left = max_read_bytes_per_epoch
        self._read_by: dict[int, int] = {}  # pid -> bytes read for it this epoch
        self._epoch = 0
        self._lock = threading.Lock()
        self.stats = {"hits": 0, "reads": 0, "replaced": 0, "errors": 0, "evicted": 0, "read_budget_spent": 0, REFUSED_STAT: 0}

    def new_epoch(self) -> None:
        """From now on, each cached code object is checked again on its next use; the epoch's
        budget of memory reads starts again."""
        with self._lock:
            self._epoch += 1
            self._read_left = self.max_read_bytes_per_epoch
            self._read_by.clear()

    def locate(self, pid: int, memory: ProcessMemory, offsets: Offsets, address: int, instruction: int,
               first_line_bits: int | None = None, first_line_mask: int = FIRST_LINE_MASK) -> PythonLocation:
        """The location of ``instruction`` in the code object at ``address``. With
        ``first_line_bits`` (a kernel sample's), raises NotTheSampledCode when the code object
        there now is not the one sampled."""
        code = self.code(pid, memory, offsets, address)
        if first_line_bits is not None:
            code.check_sampled(instruction, first_line_bits, first_line_mask)
        return code.locate(instruction)

    def code(self, pid: int, memory: ProcessMemory, offsets: Offsets, address: int) -> CodeObject:
        key = (pid, address)
        reader = reader_for(offsets)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            epoch = self._epoch
        try:
            if entry is not None:
                if entry[1] == epoch:
                    self.stats["hits"] += 1
                    return entry[0]
                try:
                    same = reader.identity(memory, address) == entry[0].identity
                except BudgetSpent:
                    raise  # (not checked: not named, rather than named after what may be gone)
                except CodeReadError:
                    # Nothing is there now (the process exited since the sample, or freed the
                    # object): another code object would be readable, so the one the sample
                    # saw was the one cached.
                    self.stats["hits"] += 1
                    return entry[0]
                if same:
                    entry[1] = epoch
                    self.stats["hits"] += 1
                    return entry[0]
                self.stats["replaced"] += 1
            if self._read_left <= 0 or self._read_by.get(pid, 0) >= self.max_read_bytes_per_process:
                self.stats["read_budget_spent"] += 1
                raise BudgetSpent(f"this report's {self.max_read_bytes_per_epoch} bytes of code object reads, or "
                                  f"{self.max_read_bytes_per_process} for this process, are spent")
            code = reader.read(memory, address)
        except BudgetSpent:
            raise
        except CodeReadError:
            self.stats["errors"] += 1
            with self._lock:  # a failed read costs the budget too (the identity read, at least)
                self._spend(pid, reader._size)
            raise
        self.stats["reads"] += 1
        with self._lock:
            self._spend(pid, code.read_bytes)
            replaced = self._entries.pop(key, None)
            if replaced is not None:
                self._held -= replaced[0].size
            self._entries[key] = [code, epoch]
            self._held += code.size
            while len(self._entries) > self.max_entries or (self._held > self.max_bytes and len(self._entries) > 1):
                _, (evicted, _) = self._entries.popitem(last=False)
                self._held -= evicted.size
                self.stats["evicted"] += 1
        return code

    def _spend(self, pid: int, count: int) -> None:
        self._read_left -= count
        self._read_by[pid] = self._read_by.get(pid, 0) + count

    def forget_process(self, pid: int) -> None:
        with self._lock:
            for key in [k for k in self._entries if k[0] == pid]:
                self._held -= self._entries.pop(key)[0].size

    @property
    def held_bytes(self) -> int:
        return self._held

    def __len__(self) -> int:
        return len(self._entries)
