"""A symbolized frame: what the symbolizer, the JIT maps and the Python walker name, and the report
turns into a location."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Frame:
    """One symbolized frame.  `name` is None when no symbol covers the address; the mapping
    fields are still filled whenever the address fell into a known mapping."""

    address: int  # as sampled; a Python frame: 0, or its code object's address when unnamed
    kind: str  # "kernel" | "native" | "cpython"
    name: str | None = None
    offset: int = 0  # address - start of the symbol (0 without a symbol)
    file: str | None = None  # mapped path as the process sees it, "[kernel.kallsyms]", "[mod]"
    build_id: str | None = None  # GNU build id, hex
    go_build_id: str | None = None  # a Go program's own build id (.note.go.buildid)
    htlhash: str | None = None  # the OTel profiling file id: see file_htlhash
    mapping_start: int = 0
    mapping_limit: int = 0
    mapping_offset: int = 0  # file offset of mapping_start
    file_address: int | None = None  # ELF virtual address (the address normalized to the file)
    # Interpreted code (a Python frame): its source file, line (0: none) and function's first line.
    source_file: str | None = None
    line: int = 0
    first_line: int = 0
