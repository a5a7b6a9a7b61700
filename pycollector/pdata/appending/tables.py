"""The tables: each table's entries, cut into pieces, their indices moved, joined again."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable
from operator import methodcaller, sub

from google.protobuf.message import DecodeError

from pycollector.pdata.appending.columns import Columns
from pycollector.pdata.appending.moves import FUNCTION_KEY, LINE_KEY, Move, Outside
from pycollector.pdata.appending.shadow import TYPES
from pycollector.pdata.appending.varints import LENGTH, OUT_OF_INT32, varint

# A line whose function index no int32 holds marks where each location's lines start.
_LINE_MARK_BODY = FUNCTION_KEY + OUT_OF_INT32
_LINE_MARK = LINE_KEY + LENGTH[len(_LINE_MARK_BODY)] + _LINE_MARK_BODY

_ATTRIBUTES = Columns(TYPES["AttributeColumns"], {1: "varint", 2: "bytes", 3: "varint"})
_FUNCTIONS = Columns(TYPES["FunctionColumns"], {1: "varint", 2: "varint", 3: "varint", 4: "varint"})
_MAPPINGS = Columns(TYPES["MappingColumns"], {1: "unpacked", 2: "unpacked", 3: "unpacked", 4: "varint", 5: "list"})
_LOCATIONS = Columns(TYPES["LocationColumns"], {1: "varint", 2: "unpacked", 3: "bytes", 4: "list"}, {3: _LINE_MARK_BODY})
_LINES = Columns(TYPES["LineColumns"], {1: "varint", 2: "unpacked", 3: "unpacked"})
_SAMPLES = Columns(TYPES["SampleColumns"], {1: "varint", 2: "list", 3: "varint", 4: "bytes", 5: "bytes"})

# An entry whose index fields are all singular keeps its bytes, and each moved index is written
# after them: of a field written twice, the last counts. Other entries are joined from their pieces.
# A moved 0 is written as an explicit 0, which reads as a missing field does.


def _rebuilt(*fields: Iterable[bytes]) -> list[bytes]:
    """Entries joined from their pieces (or whole entries), field after field."""
    return list(map(b"".join, zip(*fields)))


def _moved(table: dict, pieces: list[bytes]) -> Iterable[bytes]:
    return map(table.__getitem__, pieces)


def _field(key: bytes, varints: Iterable[bytes]) -> tuple[Iterable[bytes], Iterable[bytes]]:
    """Pieces to join for a varint field: its key, then each entry's varint."""
    return itertools.repeat(key), varints


def moved_attributes(entries: list[bytes], strings: Move) -> list[bytes]:
    pieces, index = _ATTRIBUTES.pieces(entries), strings.index()
    return _rebuilt(entries, *_field(b"\x08", _moved(index, pieces[1])), *_field(b"\x18", _moved(index, pieces[3])))


def moved_functions(entries: list[bytes], strings: Move) -> list[bytes]:
    pieces, index = _FUNCTIONS.pieces(entries), strings.index()
    return _rebuilt(
        entries,
        *_field(b"\x08", _moved(index, pieces[1])),
        *_field(b"\x10", _moved(index, pieces[2])),
        *_field(b"\x18", _moved(index, pieces[3])),
    )


def moved_mappings(entries: list[bytes], strings: Move, attributes: Move) -> list[bytes]:
    pieces = _MAPPINGS.pieces(entries)
    return _rebuilt(
        pieces[1],
        pieces[2],
        pieces[3],
        *_field(b"\x20", _moved(strings.index(), pieces[4])),
        _moved(attributes.indices(b"\x2a"), pieces[5]),
    )


def moved_locations(entries: list[bytes], mappings: Move, functions: Move, attributes: Move) -> list[bytes]:
    pieces = _LOCATIONS.pieces(entries)
    return _rebuilt(
        _moved(mappings.index(b"\x08"), pieces[1]),
        pieces[2],
        _moved_lines(pieces[3], functions),
        _moved(attributes.indices(b"\x22"), pieces[4]),
    )


def _moved_lines(pieces: list[bytes], functions: Move) -> Iterable[bytes]:
    """Each location's lines (as a piece), function indices moved. The lines of other shapes than
    one bare function index (line numbers, inlined calls) are cut into pieces in turn, between
    marker lines that keep each location's lines together."""
    known = functions.bare_lines()
    others = list(set(pieces).difference(known.keys()))
    if others:
        lines = TYPES["Lines"].FromString(_LINE_MARK + _LINE_MARK.join(others)).lines
        parts = _LINES.pieces(list(lines))
        moved = _rebuilt(*_field(FUNCTION_KEY, _moved(functions.index(), parts[1])), parts[2], parts[3])
        grouped = TYPES["Lines"](lines=moved).SerializeToString().split(_LINE_MARK)
        if len(grouped) != len(others) + 1:
            raise DecodeError("lines do not split into locations")
        known.update(zip(others, grouped[1:]))
    return _moved(known, pieces)


def moved_samples(entries: list[bytes], stacks: Move, attributes: Move, links: Move) -> list[bytes]:
    pieces = _SAMPLES.pieces(entries)
    return _rebuilt(
        _moved(stacks.index(b"\x08"), pieces[1]),
        _moved(attributes.indices(b"\x12"), pieces[2]),
        _moved(links.index(b"\x18"), pieces[3]),
        pieces[4],
        pieces[5],
    )


_HIGH_BYTES = bytes(range(0x80, 0x100))  # all bytes of a varint but its last


def moved_stacks(entries: list[bytes], locations: Move) -> list[bytes]:
    """Stacks hold half of a message's indices: they move all at once, as lanes of one big
    integer, and are written back as varints of one width (a longer encoding than needed reads the
    same)."""
    if not entries:
        return []
    values = TYPES["Varints"].FromString(b"".join(entries)).values[:]
    # Each stack's varints: its bytes that end one, less its field's key and length.
    ends = map(len, map(methodcaller("translate", None, _HIGH_BYTES), entries))
    counts = list(map(max, map(sub, ends, itertools.repeat(2)), itertools.repeat(0)))
    if sum(counts) != len(values):  # stacks that hold fields this module does not know
        raise DecodeError("stack entries hold more than location indices")
    width = max(1, ((locations.size - 1 + locations.by).bit_length() + 6) // 7)
    lane = 4 if width <= 4 else 8
    try:
        lanes = int.from_bytes(struct.pack(f"<{len(values)}{'I' if lane == 4 else 'Q'}", *values), "little")
    except struct.error:  # a negative index (read as uint64) or one past 2**32
        raise Outside(locations.table) from None
    ones = int.from_bytes((b"\x01" + bytes(lane - 1)) * len(values), "little")
    # Every index below 2**31 first; then index + 2**31 - size has bit 31 set iff index >= size.
    if lanes & (ones * ((1 << 8 * lane) - (1 << 31))) or (lanes + ones * ((1 << 31) - locations.size)) & (ones << 31):
        raise Outside(locations.table)
    if locations.drop_zero:  # add ``by`` in each lane that is not 0
        lanes += (((lanes + ones * ((1 << 31) - 1)) >> 31) & ones) * locations.by
    else:
        lanes += ones * locations.by
    # Varint bytes: the bits from 7 * g up move up g bits, which adds (2**g - 1) times them; every
    # byte but the last gets its high bit.
    encoded = lanes
    for group in range(1, width):
        encoded += ((1 << group) - 1) * (lanes & (ones * (0x7F << 7 * group)))
    encoded |= ones * sum(0x80 << 8 * group for group in range(width - 1))
    raw = encoded.to_bytes(lane * len(values), "little")
    if width != lane:
        narrowed = bytearray(width * len(values))
        for group in range(width):
            narrowed[group::width] = raw[group::lane]
        raw = bytes(narrowed)
    stops = list(itertools.accumulate(count * width for count in counts))
    headers = {count: b"\x0a" + varint(count * width) if count else b"" for count in set(counts)}
    payloads = map(raw.__getitem__, map(slice, [0, *stops], stops))
    return list(map(bytes.__add__, map(headers.__getitem__, counts), payloads))
