"""A code object's line table: which source line an instruction belongs to, in every format
CPython has used since 2.7.

The instruction is what the kernel walker records: f_lasti (a byte offset) up to 3.9, f_lasti in
2-byte code units in 3.10, the code unit's index from 3.11. A table is decoded once into sorted
(start, line) pairs (a run of instructions on one line is one pair), held in two arrays (8 bytes a number: the table comes from the sampled
process, and lists of ints cost five times that), and looked up by bisection, since one code
object serves many samples.

- co_lnotab (2.7, 3.6-3.9): pairs (byte increment, line increment); the line of an offset is the
  first line plus every line increment whose address is at or below it (PyCode_Addr2Line). 2.7's
  line increments are unsigned, 3.6's signed.
- 3.10's co_linetable: pairs (length in bytes, signed line delta); a delta of -128 means "no
  line" and is not added; entries of length 0 only carry their delta.
- 3.11+'s location table (Objects/locations.md): entries of one first byte (bit 7 set; bits 3-6
  the form, bits 0-2 the length in code units less one) and form-specific bytes after it. The
  line delta is 0 for the short forms 0-9, form - 10 for the one-line forms 10-12, a signed
  varint after the first byte for 13 (no columns) and 14 (long); 15 has no location.
"""

from __future__ import annotations

import bisect
from array import array

from .offsets import LineTableKind

_NONE = -(1 << 62)  # "no line" in the lines array

_NO_LINE_310 = -128
_LOCATION_NONE = 15
_LOCATION_NO_COLUMNS = 13
_LOCATION_LONG = 14
_LOCATION_ONE_LINE = 10  # 10, 11, 12: the line delta is form - 10


class LineTable:
    __slots__ = ("_starts", "_lines", "end")

    def __init__(self, kind: LineTableKind, table: bytes, first_line: int):
        if kind is LineTableKind.LOCATIONS:
            pairs = _locations(table, first_line)
        elif kind is LineTableKind.LINETABLE_310:
            pairs = _linetable_310(table, first_line)
        else:
            pairs = _lnotab(table, first_line, signed=kind is LineTableKind.LNOTAB)
        self._starts = array("q", (start for start, _ in pairs))
        self._lines = array("q", (_NONE if line is None else max(_NONE + 1, min(line, 1 << 62)) for _, line in pairs))
        # The first instruction past the code, where the table tells (3.10+'s cover every
        # instruction); None for co_lnotab, and for an empty table (code made by hand).
        self.end = None if kind in (LineTableKind.LNOTAB, LineTableKind.LNOTAB_UNSIGNED) or not self._starts[-1] else self._starts[-1]

    def line(self, instruction: int) -> int | None:
        """The source line of ``instruction`` (as the walker records it), None when the table
        gives it none."""
        i = bisect.bisect_right(self._starts, instruction) - 1
        return self._lines[i] if i >= 0 and self._lines[i] != _NONE else None

    @property
    def size(self) -> int:
        """Bytes it holds (what a cache of code objects counts)."""
        return 8 * (len(self._starts) + len(self._lines))


def _lnotab(table: bytes, first_line: int, signed: bool) -> list[tuple[int, int | None]]:
    # Before the first increment's address (and for f_lasti -1, not yet started): the first line.
    pairs: list[tuple[int, int | None]] = [(-1 << 31, first_line)]
    address, line = 0, first_line
    for i in range(0, len(table) - 1, 2):
        address += table[i]
        increment = table[i + 1]
        line += increment - 256 if signed and increment >= 128 else increment
        if pairs[-1][0] == address:
            pairs[-1] = (address, line)  # an increment split over entries (> 255 bytes or lines)
        else:
            pairs.append((address, line))
    return pairs


def _linetable_310(table: bytes, first_line: int) -> list[tuple[int, int | None]]:
    pairs: list[tuple[int, int | None]] = [(-1 << 31, first_line)]
    start, line = 0, first_line
    for i in range(0, len(table) - 1, 2):
        length, delta = table[i], table[i + 1]
        delta = delta - 256 if delta >= 128 else delta
        if delta != _NO_LINE_310:
            line += delta
        if length:
            # Lengths are in bytes, the walker's 3.10 instruction in code units.
            pairs.append((start // 2, line if delta != _NO_LINE_310 else None))
            start += length
    pairs.append((start // 2, None))  # past the end
    return pairs


def _locations(table: bytes, first_line: int) -> list[tuple[int, int | None]]:
    pairs: list[tuple[int, int | None]] = []
    start, line, i, n = 0, first_line, 0, len(table)
    while i < n:
        first = table[i]
        form, length = first >> 3 & 15, (first & 7) + 1
        i += 1
        if form == _LOCATION_NONE:
            if not pairs or pairs[-1][1] is not None:
                pairs.append((start, None))
        else:
            if form in (_LOCATION_NO_COLUMNS, _LOCATION_LONG):
                delta, i = _signed_varint(table, i)
            elif form >= _LOCATION_ONE_LINE:
                delta = form - _LOCATION_ONE_LINE
            else:
                delta = 0
            line += delta
            if not pairs or pairs[-1][1] != line:  # (a run on one line is one pair)
                pairs.append((start, line))
        start += length
        while i < n and not table[i] & 0x80:  # the rest of the entry: columns
            i += 1
    pairs.append((start, None))  # past the end
    return pairs


def _signed_varint(table: bytes, i: int) -> tuple[int, int]:
    # 6 bits a byte, least significant first, bit 6 set while more follow; the sign in bit 0.
    # At most 11 bytes (66 bits): the table is the sampled process's, and a run of continuation
    # bytes would otherwise build an ever longer integer.
    value, shift = 0, 0
    while i < len(table) and shift < 66:
        byte = table[i]
        i += 1
        value |= (byte & 63) << shift
        shift += 6
        if not byte & 64:
            break
    return (-(value >> 1) if value & 1 else value >> 1), i
