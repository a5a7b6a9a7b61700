"""Addresses to names: the symbolizer (symbolizer.py) over ELF symbols (elf_symbols.py), Go's
.gopclntab (gopclntab.py), kernel symbols (kernel.py), held in compact tables (table.py); a named
frame is a `Frame` (frame.py).
"""
