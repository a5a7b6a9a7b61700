"""Function symbols of an ELF file (.symtab, .dynsym or a debug file's), and demangling."""

from __future__ import annotations

import struct

import pydemumble
from elftools.elf.elffile import ELFFile

from ..elf.headers import ElfHeaders
from .gopclntab import GoFunctions
from .table import SymbolTable, SymbolTableBuilder

_STT_FUNC, _STT_GNU_IFUNC = 2, 10


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
        self._symbols = SymbolTable.empty()

    @property
    def symbol_count(self) -> int:
        return len(self._symbols)

    def lookup(self, vaddr: int) -> tuple[str, int] | None:
        return self._symbols.lookup(vaddr)

    def read_symbols(self, elf: ELFFile, which: str, demangler) -> bool:
        sec = elf.get_section_by_name(which)
        if sec is None or sec["sh_type"] == "SHT_NOBITS":
            return False
        strtab = elf.get_section(sec["sh_link"]).data()
        data = sec.data()
        if elf.elfclass == 64:
            fmt, size, order = "IBBHQQ", 24, (0, 1, 3, 4, 5)
        else:
            fmt, size, order = "IIIBBH", 16, (0, 3, 5, 1, 2)
        fmt = ("<" if elf.little_endian else ">") + fmt
        thumb = elf["e_machine"] == "EM_ARM"
        syms: list[tuple[int, int, int, int]] = []  # (start, rank, size, name offset)
        for entry in struct.iter_unpack(fmt, data[: len(data) // size * size]):
            name_off, info, shndx, value, sym_size = (entry[j] for j in order)
            if (info & 0xF) not in (_STT_FUNC, _STT_GNU_IFUNC) or shndx == 0 or value == 0:
                continue
            if thumb:
                value &= ~1
            bind = info >> 4
            rank = 0 if bind == 1 else 1 if bind == 2 else 2  # global, weak, local
            if strtab.startswith(b"__GI_", name_off):
                rank = 3  # glibc's internal alias of a function (__GI___clone3): the plain name reads as perf shows it
            syms.append((value, rank, sym_size, name_off))
        if not syms:
            return False
        syms.sort()
        table = SymbolTableBuilder()
        for value, _rank, sym_size, name_off in syms:
            if value == table.last_start():
                continue  # alias at the same address; the global one came first
            end = strtab.find(b"\0", name_off)
            table.add(value, sym_size, strtab[name_off:end if end >= 0 else None])
        self._symbols = table.build(demangler)  # names demangled when a lookup needs one
        self.symbol_source = which
        return True
