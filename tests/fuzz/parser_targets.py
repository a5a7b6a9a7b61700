"""Fuzz targets for the profiling receiver's parsers: each reads bytes a sampled process chose.

A target returns when the parser gave a result or refused the input the documented way (the
exception named below), and raises anything else; an input slower than its timeout is a hang.

- ``elf_file``: a file mapped by a process, as the receiver reads it: its symbols and ids
  (``Symbolizer``: never raises, a damaged file is an ElfSymbols whose symbol_source says
  ``error: ...``), its unwind rows (``build_rows``: bytes or ``NoRows``) and CPython detection
  (``detect_cpython``: a CPython or None).
- ``eh_frame``: a ``.eh_frame`` section's bytes (``.debug_frame`` when the first byte is odd):
  its records (``records``: refusals are ``CfiError``, ``IndexError``, ``struct.error`` or a
  ``ValueError``, what ``build_rows`` turns into ``NoRows``), then its rows (``rows_of``: never
  raises, an instruction it cannot read is a row that says so); rows come out sorted.
- ``gopclntab``: a Go function table (``GoFunctions``: ``GoTableError``), then every function
  and a lookup of addresses across it (never raise).
- ``perf_map``: a perf map file in a process's /tmp, read as ``PerfMaps`` reads it, in two
  checks (the second after it grew): lookups never raise; ranges held stay sorted and disjoint,
  names within ``max_name_chars`` and their marker, nothing held past ``max_entries``.
- ``cpython_linetable``: a code object's line table of each kind (``LineTable``: ``ValueError``
  for one it cannot read), then the line of instructions across it.
- ``cpython_debug_offsets``: the bytes at the start of ``_PyRuntime`` (``read_debug_offsets``:
  ``UnknownLayout``).
"""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

from receivers.profiling.jit.perfmap import TRUNCATED, PerfMaps
from receivers.profiling.python.detect import detect_cpython
from receivers.profiling.python.linetable import LineTable
from receivers.profiling.python.offsets import LineTableKind, UnknownLayout, read_debug_offsets
from receivers.profiling.symbols.gopclntab import GoFunctions, GoTableError
from receivers.profiling.symbols.symbolizer import Symbolizer
from receivers.profiling.unwind.cfi import CfiError, records
from receivers.profiling.unwind.rows import NoRows, build_rows, rows_of

# The first byte chooses among kinds where a target reads more than one (so the corpus and the
# mutations can reach each).
_FIRST_LINE = 7


def _temporary_file(data: bytes) -> tuple[int, str]:
    fd, path = tempfile.mkstemp(prefix="fuzz-elf-")
    os.write(fd, data)
    return fd, path


def elf_file(data: bytes) -> None:
    fd, path = _temporary_file(data)
    try:
        symbols = Symbolizer(debug_dirs=())._load(fd, path, None)
        for address in (0, 0x400, 0x1000, 0x401000):
            vaddr = symbols.vaddr(address)
            symbols.lookup(address if vaddr is None else vaddr)
            if symbols.go is not None:
                symbols.go.lookup(address)
        with open(path, "rb") as stream:
            try:
                rows = build_rows(stream)
            except NoRows:
                rows = b""
        assert len(rows) % 12 == 0, len(rows)
        detect_cpython("libpython3.11.so.1.0", fd=fd, debug_dirs=())
    finally:
        os.close(fd)
        os.unlink(path)


def eh_frame(data: bytes) -> None:
    if not data:
        return
    is_eh_frame = not data[0] & 1
    try:
        fdes = list(records(data[1:], 0x1000, is_eh_frame))
    except (CfiError, IndexError, struct.error, ValueError):
        return
    rows = rows_of(fdes)
    assert [row[0] for row in rows] == sorted(row[0] for row in rows)


def gopclntab(data: bytes) -> None:
    try:
        functions = GoFunctions(data, text_address=0x401000)
    except GoTableError:
        return
    entries = [entry for entry, _name in functions]
    for address in [*entries[:64], 0, 0x401000, 0x402000, 1 << 40]:
        functions.lookup(address)


def perf_map(data: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="fuzz-perfmap-") as root:
        (Path(root) / "tmp").mkdir()
        path = Path(root) / "tmp" / "perf-1.map"
        cut = len(data) // 2
        path.write_bytes(data[:cut])
        maps = PerfMaps(max_entries=64, max_read_bytes=4096, max_line_bytes=256, max_name_chars=32, max_total_bytes=16384)
        for chunk in (data[:cut], data[cut:]):
            if chunk is not data[:cut]:
                with open(path, "ab") as file:
                    file.write(chunk)
            for address in (0, 0x1000, 0x7F0000001000, 1 << 63):
                maps.lookup(os.getpid(), address, root=root, nspid=1, started_ns=None)
            held = maps._maps[os.getpid()]
            assert len(held.starts) <= maps.max_entries
            assert all(start < end for start, end in zip(held.starts, held.ends))
            assert all(end <= start for end, start in zip(held.ends, held.starts[1:])), "ranges overlap"
            assert all(len(name) <= maps.max_name_chars + len(TRUNCATED) for name in held.names)


def cpython_linetable(data: bytes) -> None:
    if not data:
        return
    kinds = list(LineTableKind)
    kind = kinds[data[0] % len(kinds)]
    try:
        table = LineTable(kind, data[1:], _FIRST_LINE)
    except ValueError:
        return
    for instruction in range(0, 2 * len(data) + 2, max(1, len(data) // 16)):
        line = table.line(instruction)
        assert line is None or isinstance(line, int)


def cpython_debug_offsets(data: bytes) -> None:
    try:
        read_debug_offsets(data)
    except UnknownLayout:
        return
