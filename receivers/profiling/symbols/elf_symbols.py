"""Function symbols of an ELF file (.symtab, .dynsym or a debug file's), and demangling."""

from __future__ import annotations

import struct
import time
from array import array
from collections.abc import Sequence

import pydemumble
from ..elf.bounded import SHT_NOBITS, BoundedElf, section_at, section_data, section_named
from ..elf.headers import ElfHeaders
from ..elf.symbols import MAX_STRING_TABLE_BYTES, MAX_SYMBOL_ENTRIES
from .gopclntab import GoFunctions
from .table import SymbolTable, SymbolTableBuilder

_STT_FUNC, _STT_GNU_IFUNC = 2, 10

# A symbol table larger than elf/symbols.py's bounds is not read (the file's .dynsym, or no
# names, instead): see there.
_CHECK_CLOCK_EVERY = 1 << 14  # entries between two looks at the deadline


class SymbolsTooLarge(ValueError):
    """A symbol table past MAX_SYMBOL_ENTRIES or MAX_STRING_TABLE_BYTES."""


class ParseOverTime(ValueError):
    """Reading a symbol table took longer than its deadline."""


# --------------------------------------------------------------------------------------------
# Demangling: C++ (Itanium), Rust legacy and Rust v0


def demangle(name: str) -> str:
    """``name`` as people read it: ``known_split::spin_heavy`` for Rust's legacy
    ``_ZN11known_split10spin_heavy17h929ba14e6bb210d5E`` (the hash dropped, as perf and rustfilt
    show it) and its v0 ``_RNv...``; C++ with its parameter types. Others are returned as given."""
    if not name.startswith(("_Z", "_R")):  # neither scheme: most C symbols, without a call
        return name
    return pydemumble.demangle(name) or name


# --------------------------------------------------------------------------------------------
# ELF symbols


class ElfSymbols(ElfHeaders):
    """What symbolization needs from one ELF file: its headers and function symbols."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.go: GoFunctions | None = None  # a Go program's function table (.gopclntab)
        self.symbol_source = ""  # ".symtab", ".dynsym", or the debug file used
        # Its debug file may yet come from a debuginfod server (symbolizer.py asks again), and
        # which reading of the file's names this is (the symbolizer's cache of lookups is by it).
        self.awaiting_debuginfod = False
        self.next_fetch_check = 0.0  # (monotonic)
        self.names_version = 0
        self._symbols = SymbolTable.empty()

    @property
    def symbol_count(self) -> int:
        return len(self._symbols)

    def lookup(self, vaddr: int) -> tuple[str, int] | None:
        return self._symbols.lookup(vaddr)

    def read_symbols(self, elf: BoundedElf, which: str, demangler, deadline: float | None = None,
                     also: Sequence[tuple[BoundedElf, str]] = ()) -> bool:
        """Read the function symbols of section ``which`` (and of the tables ``also`` names, as one
        table: a MiniDebugInfo's .symtab holds only what .dynsym does not); whether there were
        any. Raises SymbolsTooLarge for a table past the caps, ParseOverTime past ``deadline``
        (monotonic)."""
        starts, ranks, sizes, name_offsets = array("Q"), bytearray(), array("Q"), array("Q")
        strtabs: list[bytes] = []
        base = 0
        for table_elf, table_name in ((elf, which), *also):
            strtab = _function_symbols(table_elf, table_name, deadline, starts, ranks, sizes, name_offsets, base)
            if strtab:
                strtabs.append(strtab)
                base += len(strtab)
        if not starts:
            return False
        strtab = b"".join(strtabs)
        del strtabs
        # By address, and at one address the preferred rank first: one int a symbol, which holds
        # its index too (a list of ints sorts in C, and costs half what indexes plus keys would).
        shift = max(1, len(starts) - 1).bit_length()
        by_address = [(starts[i] << 2 | ranks[i]) << shift | i for i in range(len(starts))]
        by_address.sort()
        del ranks
        table = SymbolTableBuilder()
        mask = (1 << shift) - 1
        for key in by_address:
            i = key & mask
            value = starts[i]
            if value == table.last_start():
                continue  # alias at the same address; the global one came first
            name_off = name_offsets[i]
            end = strtab.find(b"\0", name_off)
            table.add(value, sizes[i], strtab[name_off:end if end >= 0 else None])
        self._symbols = table.build(demangler)  # names demangled when a lookup needs one
        self.symbol_source = "+".join(name for _, name in ((elf, which), *also))
        return True


def _function_symbols(elf: BoundedElf, which: str, deadline: float | None, starts: array, ranks: bytearray, sizes: array,
                      name_offsets: array, base: int) -> bytes:
    """Append the function symbols of section ``which`` to the arrays (their names' offsets from
    ``base``, where its string table will be in the tables joined); that string table, or b""."""
    sec = section_named(elf, which)
    if sec is None or sec.type == SHT_NOBITS:
        return b""
    if elf.elfclass == 64:
        fmt, size, order = "IBBHQQ", 24, (0, 1, 3, 4, 5)
    else:
        fmt, size, order = "IIIBBH", 16, (0, 3, 5, 1, 2)
    strtab_section = section_at(elf, sec.link)
    if strtab_section is None:
        return b""  # (no table of names: pyelftools raised)
    if sec.size // size > MAX_SYMBOL_ENTRIES or strtab_section.size > MAX_STRING_TABLE_BYTES:
        raise SymbolsTooLarge(f"{which} of {sec.size // size} entries and {strtab_section.size} bytes of "
                              f"names, over {MAX_SYMBOL_ENTRIES} entries or {MAX_STRING_TABLE_BYTES} bytes")
    strtab = section_data(elf, strtab_section, MAX_STRING_TABLE_BYTES)
    data = section_data(elf, sec, MAX_SYMBOL_ENTRIES * size)
    fmt = ("<" if elf.little_endian else ">") + fmt
    thumb = elf["e_machine"] == "EM_ARM"
    found = len(starts)
    # Parallel arrays, not a tuple a symbol (21 bytes a symbol, not 180).
    for i, entry in enumerate(struct.iter_unpack(fmt, data[: len(data) // size * size])):
        if deadline is not None and not i % _CHECK_CLOCK_EVERY and time.monotonic() > deadline:
            raise ParseOverTime(f"{which} took longer than its time to read")
        name_off, info, shndx, value, sym_size = (entry[j] for j in order)
        if (info & 0xF) not in (_STT_FUNC, _STT_GNU_IFUNC) or shndx == 0 or value == 0:
            continue
        if thumb:
            value &= ~1
        bind = info >> 4
        rank = 0 if bind == 1 else 1 if bind == 2 else 2  # global, weak, local
        if strtab.startswith(b"__GI_", name_off):
            rank = 3  # glibc's internal alias of a function (__GI___clone3): the plain name reads as perf shows it
        starts.append(value)
        ranks.append(rank)
        sizes.append(sym_size)
        name_offsets.append(base + name_off)
    if len(starts) > MAX_SYMBOL_ENTRIES:
        raise SymbolsTooLarge(f"{len(starts)} function symbols in the tables together, over {MAX_SYMBOL_ENTRIES}")
    return strtab if len(starts) > found else b""
