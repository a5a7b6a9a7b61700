"""Is a mapped file a Go program whose goroutines can be read, and where from: its Go version, the
symbols the reader starts from (``runtime.allgs``), and the layout of the runtime's ``g``.

Read per file, in symbols/detection.py's helper (killed past its deadline): the file is the
process's to write. Only a Go program's main executable is looked at (its .gopclntab or Go build
notes say so), and only one with a symbol table (``go build``'s default): ``runtime.allgs`` is data,
which the function table (.gopclntab, kept by ``-ldflags=-s``) does not name. A stripped Go program
gives no goroutines profile (counted: ``go_stripped``); its threads are in the threads profile.

The layout of ``g`` (where its stack bounds, saved registers, status and id are) changed across Go
releases; LAYOUTS holds it per release (x86-64), from the runtime's own source (runtime2.go),
1.17-1.22 checked against the DWARF of what Debian's go1.19 builds (tests/test_thread_profiles.py).
The reader checks the layout against the process before it trusts it (``GoLayout.plausible``): a
release past the table's last is tried with the last layout, and refused if it does not fit.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

from ..elf.bounded import BoundedElf, sections_named
from ..elf.symbols import defined_symbols, load_bias, load_segments, read_at
from ..processes.files import open_host_file

ALLGS = "runtime.allgs"  # []*g: every goroutine the runtime made (dead ones are reused)
BUILD_VERSION = "runtime.buildVersion"  # string: "go1.19.8"
_GO_SECTIONS = (".gopclntab", ".data.rel.ro.gopclntab", ".go.buildinfo", ".note.go.buildid")
_VERSION = re.compile(rb"go(\d+)\.(\d+)")
_STRING = struct.Struct("<QQ")  # a Go string header: data, length


@dataclass(frozen=True)
class GoLayout:
    """Offsets in ``g`` (bytes) of what the reader uses; ``size`` what it reads of one."""

    stack_lo: int
    stack_hi: int
    sched_sp: int
    sched_pc: int
    syscall_sp: int
    syscall_pc: int
    status: int  # atomicstatus, a uint32
    goid: int  # a uint64 (int64 before 1.20)

    @property
    def size(self) -> int:
        return max(self.status + 4, self.goid + 8)


# g's fields: stack (lo, hi), stackguard0, stackguard1, _panic, _defer, m, then sched, a gobuf
# (sp, pc, g, ctxt, ret, lr, bp: 56 bytes; 1.24 dropped ret), syscallsp, syscallpc, (1.23:
# syscallbp), stktopsp, param, atomicstatus, stackLock, goid.
_GO117 = GoLayout(stack_lo=0, stack_hi=8, sched_sp=56, sched_pc=64, syscall_sp=112, syscall_pc=120, status=144, goid=152)
_GO123 = GoLayout(stack_lo=0, stack_hi=8, sched_sp=56, sched_pc=64, syscall_sp=112, syscall_pc=120, status=152, goid=160)
_GO124 = GoLayout(stack_lo=0, stack_hi=8, sched_sp=56, sched_pc=64, syscall_sp=104, syscall_pc=112, status=144, goid=152)
LAYOUTS = {**{(1, minor): _GO117 for minor in range(17, 23)}, (1, 23): _GO123, (1, 24): _GO124, (1, 25): _GO124}
FIRST, LAST = min(LAYOUTS), max(LAYOUTS)


def layout_for(version: tuple[int, int]) -> GoLayout | None:
    """The layout of ``g`` in Go ``version``: the table's; past its last release the last's (to
    be checked against the process); None before its first (not read)."""
    if version in LAYOUTS:
        return LAYOUTS[version]
    return LAYOUTS[LAST] if version > LAST else None


@dataclass(frozen=True)
class GoProgram:
    """What detection read of a Go executable (ELF virtual addresses: add the load bias)."""

    path: str
    version: tuple[int, int]
    allgs: int | None  # None: stripped (no symbol table)
    segments: tuple[tuple[int, int, int, int], ...]

    def bias(self, mapping_start: int, mapping_offset: int) -> int | None:
        return load_bias(self.segments, mapping_start, mapping_offset, True)


def detect_file(path: str, fd: int, open_debug: Callable[[str], int | None]) -> GoProgram | None:
    """The Go program in the file (symbols/detection.py's helper calls this), or None when it is
    not one, or unreadable."""
    own = os.dup(fd) if fd is not None else open_host_file(path)
    if own is None:
        return None
    with os.fdopen(own, "rb", buffering=1 << 16) as stream:
        try:
            return _read(path, BoundedElf(stream))
        except Exception:  # noqa: BLE001 - the file is the process's to write; pyelftools raises many kinds
            return None


def _read(path: str, elf: BoundedElf) -> GoProgram | None:
    if elf.elfclass != 64 or not elf.little_endian or not sections_named(elf, _GO_SECTIONS):
        return None
    segments = load_segments(elf)
    symbols = defined_symbols(elf, (ALLGS, BUILD_VERSION), tables=(".symtab",))
    version = None
    if BUILD_VERSION in symbols:
        header = read_at(elf, segments, symbols[BUILD_VERSION], _STRING.size)
        if header is not None:
            data, length = _STRING.unpack(header)
            text = read_at(elf, segments, data, min(length, 64)) if 0 < length else None
            match = _VERSION.match(text or b"")
            if match:
                version = (int(match.group(1)), int(match.group(2)))
    if version is None:
        version = (0, 0)  # (stripped: no symbol says it; nothing is read of such a program)
    return GoProgram(path=path, version=version, allgs=symbols.get(ALLGS), segments=segments)
