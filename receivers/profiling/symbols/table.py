"""Function symbols sorted by address, held compactly.

A busy host maps hundreds of files, some with hundreds of thousands of symbols (a JIT's LLVM, a
browser), and the kernel has a hundred thousand more. Kept as Python lists of ints and str, each
symbol costs about 150 bytes, and /proc/kallsyms alone held 28 MiB of the collector. Here each
costs 24 bytes in arrays (start, end, where its name starts) and its name's bytes in one string
table, decoded (and demangled) when a lookup names that symbol; the last NAME_CACHE names decoded
are kept, so a hot symbol is decoded once (the symbolizer also caches ELF lookups per address).
Tables are built through SymbolTableBuilder, which holds no object per symbol but its name.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable

Demangler = Callable[[str], str]


NAME_CACHE = 4096
_ADDRESS_END = (1 << 64) - 1


class SymbolTable:
    __slots__ = ("_starts", "_ends", "_name_at", "_strings", "_demangle", "_decoded")

    def __init__(self, starts: array, ends: array, name_at: array, strings: bytes, demangle: Demangler | None = None):
        """Symbol i covers [starts[i], ends[i]); its name is NUL-terminated at strings[name_at[i]]."""
        self._starts, self._ends, self._name_at = starts, ends, name_at
        self._strings = strings
        self._demangle = demangle
        self._decoded: dict[int, str] = {}

    @classmethod
    def empty(cls) -> SymbolTable:
        return cls(array("Q"), array("Q"), array("Q"), b"")

    def __len__(self) -> int:
        return len(self._starts)

    def index(self, address: int) -> int:
        """The index of the last symbol starting at or below ``address``; -1 if none does."""
        return bisect.bisect_right(self._starts, address) - 1

    def start(self, i: int) -> int:
        return self._starts[i]

    def name(self, i: int) -> str:
        name = self._decoded.get(i)
        if name is None:
            at = self._name_at[i]
            end = self._strings.find(b"\0", at)
            name = self._strings[at:end if end >= 0 else None].decode("utf-8", "replace")
            if self._demangle:
                name = self._demangle(name)
            if len(self._decoded) >= NAME_CACHE:
                self._decoded.clear()
            self._decoded[i] = name
        return name

    def lookup(self, address: int) -> tuple[str, int] | None:
        """(name, start) of the symbol whose range holds ``address``."""
        i = self.index(address)
        if i >= 0 and address < self._ends[i]:
            return self.name(i), self._starts[i]
        return None


class SymbolTableBuilder:
    """Symbols added in order of their start, one per start (the caller picks among aliases)."""

    def __init__(self) -> None:
        self._starts, self._ends, self._name_at = array("Q"), array("Q"), array("Q")
        self._strings = bytearray()  # the names, each NUL-terminated (not a bytes object each: 33 bytes apiece more)

    def __len__(self) -> int:
        return len(self._starts)

    def last_start(self) -> int | None:
        return self._starts[-1] if self._starts else None

    def add(self, start: int, size: int, name: bytes) -> None:
        """A size of 0 (hand-written assembly says none) reaches the next symbol's start."""
        self._starts.append(start)
        self._ends.append(min(start + size, _ADDRESS_END) if size else 0)  # a malformed size ends at the top
        self._name_at.append(len(self._strings))
        self._strings += name
        self._strings.append(0)

    def build(self, demangle: Demangler | None = None) -> SymbolTable:
        starts, ends = self._starts, self._ends
        for i, end in enumerate(ends):
            if end == 0:
                ends[i] = starts[i + 1] if i + 1 < len(starts) else starts[i] + 1
        strings = bytes(self._strings or b"\0")
        self._strings = bytearray()
        return SymbolTable(starts, ends, self._name_at, strings, demangle)
