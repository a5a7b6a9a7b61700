"""Function names, files and lines of Go programs from their own function table, the pclntab.

`go build -ldflags="-s -w"` drops .symtab and DWARF, but the Go runtime needs its function table
for tracebacks, so every Go binary keeps it: sorted function entries, each function's name, and
per-function tables mapping pc to file and line.  GoFunctions reads it once per file and keeps the
entries in an array that lookup() bisects; a function's name and its pc tables are decoded only
when an address in it is looked up: a profile touches a few hundred functions, and decoding all
of them up front costs 0.45 s for terraform's 102k functions against 20 ms for reading the table.
It keeps the table's bytes, about a third of a Go binary (19.5 MB of kubectl's 60 MB).

Where the table is: the section .gopclntab (internal linking, and external linking without RELRO),
else .data.rel.ro.gopclntab (-buildmode=pie, internal linking), else inside .data.rel.ro, found by
its header, where the host linker merged it (external linking with RELRO, e.g. an externally
linked PIE, or Docker's CLI); that search runs only in a Go program (.go.buildinfo or
.note.go.buildid), so other large files pay nothing.

Layouts, told apart by the header's magic (Go's src/debug/gosym/pclntab.go and runtime/symtab.go):
  0xfffffffb  Go 1.2-1.15   the function table is pairs of pointer-sized (entry pc, offset of the
                            function record); names, files and pc tables are offsets from the table
                            start; a function's file number indexes one global file table.
  0xfffffffa  Go 1.16-1.17  the header gives the offsets of the name, compilation-unit, file, pc
                            and function tables; a file number goes through the function's
                            compilation unit (cutab) to an offset in the file name table.
  0xfffffff0  Go 1.18-1.19  as 1.16, with 32-bit entries relative to the header's text start.
  0xfffffff1  Go 1.20+      as 1.18 for what is read here (1.20 added fields after them).
The header's pointer size and pc quantum are used, not assumed; tables must be little-endian.

Tested against the Go toolchain here (tests/test_gopclntab.py): 1.18-1.19 (Debian's go1.19, and
what it builds: internally and externally linked, executable and PIE) and 1.20+ (binaries of
go1.21 to go1.25 found on this machine, Docker's CLI among them).  Not tested: 1.2-1.15 and
1.16-1.17, as no binary or toolchain of those versions is here; that code follows debug/gosym.

Not handled: big-endian tables; more than one text section (only ppc64/arm64 binaries large
enough for the linker to split their text have them); a table found neither by section name nor
in .data.rel.ro.  Inlined calls are not expanded: an address in inlined code gets the outer
function's name with the inlined code's own file and line, as the pc tables (and go tool
addr2line) give it.  Naming the inlined function too needs the inline tree (a funcdata and a
pcdata table whose indexes and record layout changed across versions): not cheap, so skipped.
"""

from __future__ import annotations

import bisect
import operator
import struct
import sys
import threading
import weakref
from array import array
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from itertools import islice

from pycollector.varint import VarintError, read_uvarint as uleb128  # Go's varints are unsigned LEB128, as DWARF's are

from ..elf.bounded import SHT_NOBITS, BoundedElf, section_data, sections_named

# Layout versions by magic: what changed is named in the module docstring.
_GO12, _GO116, _GO118 = 12, 116, 118
_MAGICS = {0xFFFFFFFB: _GO12, 0xFFFFFFFA: _GO116, 0xFFFFFFF0: _GO118, 0xFFFFFFF1: _GO118}
# A function record (_func) after its entry field, the same in every layout: nameoff, args,
# deferreturn, pcsp, pcfile, pcln, npcdata, then cuOffset (1.16+) or nfuncdata (1.2).
_FUNC_FIELDS = struct.Struct("<i12xII")  # nameoff, pcfile, pcln
_PCSP_AT = 12  # pcsp: the record's fourth field (after nameoff, args, deferreturn)
_CU_OFFSET_AT = 28
_RECORD_SIZE = 32  # what is read of a record, past its entry field
_NO_FILE = 0xFFFFFFFF  # a cutab slot for a file the compilation unit does not use


class GoTableError(ValueError):
    """The bytes are not a pclntab this module reads."""


@dataclass(frozen=True, slots=True)
class GoFunction:
    name: str
    entry: int  # ELF virtual address of the function's first instruction
    file: str | None  # source file of the looked-up address; None when the table has none
    line: int  # its line; 0 when unknown


# The tables read, by file, while anyone holds them: the symbolizer (names) and the goroutine
# reader (frame sizes) both want a Go program's, and each copy is a third of the binary.
_shared: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_shared_lock = threading.Lock()


class GoFunctions:
    """The function table of one Go binary: lookup(address) -> GoFunction | None.

    data: the pclntab from its header on (more bytes after it do no harm); text_address: where
    the text starts, used only when a Go 1.18+ header does not say.  Raises GoTableError on
    anything it cannot read; from_elf() returns None instead."""

    def __init__(self, data: bytes, text_address: int = 0) -> None:
        try:
            self._parse(bytes(data), text_address)
        except (IndexError, struct.error, OverflowError, VarintError) as e:
            raise GoTableError(f"damaged pclntab: {e}") from None

    @classmethod
    def from_elf(cls, elf: BoundedElf) -> GoFunctions | None:
        """The table of a Go ELF file, or None when it has none or it is damaged (the caller
        counts it).  Found by section name or inside .data.rel.ro; the module docstring says
        what is not handled."""
        try:
            sections = {section.name: section for section in sections_named(elf, _SECTIONS)}  # (the last of a name, as pyelftools took it)
            text = sections.get(".text")
            text_address = text.addr if text is not None else 0
            for data in _candidates(elf, sections):
                try:
                    return cls(data, text_address)
                except GoTableError:
                    continue
        except Exception:  # noqa: BLE001 - a damaged file: pyelftools raises many kinds
            pass
        return None

    @classmethod
    def held(cls, key: Hashable) -> GoFunctions | None:
        """The table of the file ``key`` (a mapping's identity) that a reader of it still holds."""
        with _shared_lock:
            return _shared.get(key)

    @classmethod
    def of_file(cls, key: Hashable, elf: BoundedElf) -> GoFunctions | None:
        """from_elf(elf) for the file ``key``, read once while any reader holds the table."""
        table = cls.held(key)
        if table is None and (table := cls.from_elf(elf)) is not None:
            with _shared_lock:
                table = _shared.setdefault(key, table)  # (another thread's, when both read it at once)
        return table

    def __len__(self) -> int:
        return len(self._funcoffs)

    def __iter__(self) -> Iterator[tuple[int, str]]:
        """(entry, name) of every function, in address order; a damaged record is left out."""
        for i in range(len(self._funcoffs)):
            try:
                nameoff = _FUNC_FIELDS.unpack_from(self._data, self._record(i))[0]
                yield self._base + self._entries[i], self._name(nameoff)
            except (struct.error, ValueError, OverflowError):
                continue

    def lookup(self, vaddr: int) -> GoFunction | None:
        """The function holding ELF virtual address vaddr, with the file and line of vaddr
        itself (give a return address minus one to name its call).  None outside the table, or
        when the function's record is damaged."""
        offset = vaddr - self._base
        i = bisect.bisect_right(self._entries, offset) - 1
        if i < 0 or i >= len(self._funcoffs):  # before the first function, past the last's end
            return None
        entry = self._base + self._entries[i]
        try:
            record = self._record(i)
            nameoff, pcfile, pcln = _FUNC_FIELDS.unpack_from(self._data, record)
            return GoFunction(self._name(nameoff), entry,
                              self._file(record, pcfile, entry, vaddr),
                              max(self._pcvalue(pcln, entry, vaddr), 0))
        except (IndexError, struct.error, ValueError, OverflowError):  # (a varint's value past any offset)
            return None

    def frame(self, vaddr: int) -> tuple[int, str, int] | None:
        """(entry, name, frame size) of the function holding vaddr: the frame size is how far
        the stack pointer there is below the one at its entry (its pcsp table), what a Go
        traceback steps by (the return address is just above: sp + size). None outside the
        table, for a function without the table, or a damaged record."""
        offset = vaddr - self._base
        i = bisect.bisect_right(self._entries, offset) - 1
        if i < 0 or i >= len(self._funcoffs):
            return None
        entry = self._base + self._entries[i]
        try:
            record = self._record(i)
            nameoff = _FUNC_FIELDS.unpack_from(self._data, record)[0]
            pcsp = struct.unpack_from("<I", self._data, record + _PCSP_AT)[0]
            size = self._pcvalue(pcsp, entry, vaddr)
            return None if size < 0 else (entry, self._name(nameoff), size)
        except (IndexError, struct.error, ValueError, OverflowError):
            return None

    # -- parsing

    def _parse(self, data: bytes, text_address: int) -> None:
        magic, pad, quantum, ptrsize = struct.unpack_from("<IHBB", data)
        version = _MAGICS.get(magic)
        if version is None or pad or quantum not in (1, 2, 4) or ptrsize not in (4, 8):
            raise GoTableError("no pclntab header")
        word = "<Q" if ptrsize == 8 else "<I"

        def header(i: int) -> int:
            return struct.unpack_from(word, data, 8 + i * ptrsize)[0]

        nfunc = header(0)
        self._base = 0  # what the function table's entries are relative to
        self._cutab = 0
        if version == _GO118:
            # Word 2 is runtime.text, relocated in the file by the linker (also in a PIE, where it
            # holds the relocation's addend).  Zero only if a toolchain stops writing it.
            self._base = header(2) or text_address
            self._names, self._cutab, self._filetab, self._pctab, self._funcdata = (
                header(i) for i in range(3, 8))
            ftab, field = self._funcdata, "I"
        elif version == _GO116:
            self._names, self._cutab, self._filetab, self._pctab, self._funcdata = (
                header(i) for i in range(2, 7))
            ftab, field = self._funcdata, word[1]
        else:
            self._names = self._pctab = self._funcdata = 0
            ftab, field = 8 + ptrsize, word[1]
        size = struct.calcsize(field)
        ftab_end = ftab + (2 * nfunc + 1) * size
        if nfunc == 0 or ftab_end > len(data):
            raise GoTableError(f"{nfunc} functions do not fit in {len(data)} bytes")
        if version == _GO12:
            self._filetab = struct.unpack_from("<I", data, ftab_end)[0]
            self._nfiles = struct.unpack_from("<I", data, self._filetab)[0]
        if max(self._names, self._cutab, self._filetab, self._pctab) >= len(data):
            raise GoTableError("a table offset is past the end")
        table = array(field)
        table.frombytes(data[ftab:ftab_end])
        if sys.byteorder == "big":
            table.byteswap()
        self._entries = table[0::2]  # nfunc + 1: the last is the end of the last function
        self._funcoffs = table[1::2]
        if not all(map(operator.le, self._entries, islice(self._entries, 1, None))):
            raise GoTableError("function entries are not sorted")
        self._entry_size = 4 if version == _GO118 else ptrsize  # _func's first field
        if self._funcdata + max(self._funcoffs) + self._entry_size + _RECORD_SIZE > len(data):
            raise GoTableError("a function record is past the end")
        self._data = data
        self._version = version
        self._quantum = quantum

    # -- one function

    def _record(self, i: int) -> int:
        """Offset of function i's record past its entry field (the fields all layouts share)."""
        return self._funcdata + self._funcoffs[i] + self._entry_size

    def _string(self, at: int) -> str:
        if at < 0:  # a damaged offset; bytes.index would count it from the end
            raise ValueError(f"string at {at}")
        data = self._data
        return data[at:data.index(b"\0", at)].decode("utf-8", "replace")

    def _name(self, nameoff: int) -> str:
        return self._string(self._names + nameoff)

    def _file(self, record: int, pcfile: int, entry: int, pc: int) -> str | None:
        number = self._pcvalue(pcfile, entry, pc)
        if self._version == _GO12:  # one global table; number 0 is its length, not a file
            if not 0 < number < self._nfiles:
                return None
            return self._string(struct.unpack_from("<I", self._data, self._filetab + 4 * number)[0])
        if number < 0:
            return None
        cu = struct.unpack_from("<I", self._data, record + _CU_OFFSET_AT)[0]
        at = struct.unpack_from("<I", self._data, self._cutab + 4 * (cu + number))[0]
        return None if at == _NO_FILE else self._string(self._filetab + at)

    def _pcvalue(self, table: int, entry: int, pc: int) -> int:
        """The value a pc-value table (pcfile, pcln) gives pc, or -1.  The table is a run of
        (value delta, pc delta) pairs from the function's entry, as zig-zag and plain varints;
        a zero value delta after the first pair ends it.  Most varints are one byte, so that
        case is read inline."""
        if table == 0:  # no table (C code linked in by cgo, linker markers), as the runtime says
            return -1
        data, quantum = self._data, self._quantum
        at = self._pctab + table
        value, at_pc, first = -1, entry, True
        while True:
            delta = data[at]
            at += 1
            if delta & 0x80:
                delta, at = uleb128(data, at - 1)
            if delta == 0 and not first:
                return -1
            first = False
            value += -(delta >> 1) - 1 if delta & 1 else delta >> 1
            step = data[at]
            at += 1
            if step & 0x80:
                step, at = uleb128(data, at - 1)
            at_pc += step * quantum
            if pc < at_pc:
                return value


_SECTIONS = (".text", ".gopclntab", ".data.rel.ro.gopclntab", ".go.buildinfo", ".note.go.buildid", ".data.rel.ro")


def _candidates(elf: BoundedElf, sections):
    """The bytes where a pclntab may start, most likely first; ``sections``: the headers of
    _SECTIONS, by name."""
    for name in (".gopclntab", ".data.rel.ro.gopclntab"):
        section = sections.get(name)
        if section is not None and section.type != SHT_NOBITS:
            yield section_data(elf, section)
            return
    if ".go.buildinfo" not in sections and ".note.go.buildid" not in sections:
        return  # not a Go program: do not read a C++ library's large .data.rel.ro
    section = sections.get(".data.rel.ro")
    if section is None or section.type == SHT_NOBITS:
        return
    data = section_data(elf, section)
    for magic in _MAGICS:
        pattern = struct.pack("<IH", magic, 0)
        at = data.find(pattern)
        while at >= 0:
            yield data[at:]
            at = data.find(pattern, at + 1)
