"""Merging one ``ProfilesData`` into another: its dictionary, and every index that refers into it.

Two ways, for two kinds of callers:

- ``append(dst, src)``, the batch processor's: src's tables go after dst's, without src's zero
  entries, and each index src holds moves by its table's offset; index 0 ("none") stays 0. No entry
  is looked up or compared, so a batch holds an entry once per message that had it, which the
  format allows. ``check(src)`` raises the ValueError ``append`` would, for the message a batch
  starts with and may pass on as it is.
- ``merge_into(builder, src)``, behind ``ProfilesBuilder.merge``: ``Reinterner`` re-interns what
  src's profiles use, so that each entry is held once (``split_at`` cuts profiles with it too).

How ``append`` stays fast in Python. Touching a field of a repeated message element is a round trip
into upb of a few hundred nanoseconds, and a message of a few thousand samples has a hundred
thousand index fields, so ``append`` touches no element. It serializes src once and reads the bytes
back through shadow message types (``_T``) that see each dictionary table as a list of serialized
entries. A table's entries, joined behind markers, are parsed as one message whose repeated fields
collect one field of every entry each ("columns"); serialized and split at the markers, each column
gives every entry's bytes of that field ("pieces"), all in C. Dicts from a piece to its moved bytes,
built in bulk from encoded varints, move the indices; entries are joined again from their pieces
and go into dst with one ``MergeFromString``. The location indices of stacks, half of all indices,
move as lanes of one big integer instead. Costs are in bench/merge_speed.py.
"""

from __future__ import annotations

import itertools
import os
import struct
import threading
from collections.abc import Callable, Iterable, Sequence
from operator import methodcaller, sub
from typing import TYPE_CHECKING, Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.pdata.validate import validate_indices
from pycollector.pdata.zero_entries import TABLES

if TYPE_CHECKING:
    from pycollector.pdata.builder import ProfilesBuilder

# -- shadow message types: the profiles messages as append reads them -----------------------------

_F = descriptor_pb2.FieldDescriptorProto
_U64, _I32, _BYTES = _F.TYPE_UINT64, _F.TYPE_INT32, _F.TYPE_BYTES
_UNPACKED = "unpacked"


def _message_types(package: str, messages: dict[str, list[tuple]]) -> dict[str, Any]:
    """Message classes from rows (name, number, type or message name, repeated[, "unpacked"])."""
    file = descriptor_pb2.FileDescriptorProto(name=f"{package}.proto", package=package, syntax="proto3")
    for message_name, fields in messages.items():
        message = file.message_type.add(name=message_name)
        for name, number, kind, repeated, *options in fields:
            field = message.field.add(name=name, number=number)
            field.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
            if isinstance(kind, str):
                field.type, field.type_name = _F.TYPE_MESSAGE, f".{package}.{kind}"
            else:
                field.type = kind
            if _UNPACKED in options:
                field.options.packed = False
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
        for name in messages
    }


def _columns(*fields: tuple) -> list[tuple]:
    return [(name, number, kind, True, *options) for name, number, kind, *options in fields]


_TABLE_NUMBERS = {
    field.name: field.number
    for field in profiles_pb2.ProfilesDictionary.DESCRIPTOR.fields
    if field.name in TABLES
}

_T = _message_types(
    "pycollector.pdata.merging",
    {
        # ProfilesData down to each profile's samples, which stay serialized. What else a message
        # holds is kept as unknown fields and written back as it was.
        "Data": [("resource_profiles", 1, "Resource", True), ("dictionary", 2, _BYTES, False)],
        "Resource": [("scope_profiles", 2, "Scope", True)],
        "Scope": [("profiles", 2, "Profile", True)],
        "Profile": [
            ("sample_type", 1, "ValueType", False),
            ("samples", 2, _BYTES, True),
            ("period_type", 5, "ValueType", False),
            ("attribute_indices", 11, _I32, True),
        ],
        "ValueType": [("type_strindex", 1, _I32, False), ("unit_strindex", 2, _I32, False)],
        # The dictionary as one list of serialized entries per table.
        "Tables": [(name, number, _BYTES, True) for name, number in _TABLE_NUMBERS.items()],
        "Varints": [("values", 1, _U64, True)],
        "Lines": [("lines", 3, _BYTES, True)],
        # Columns (see _Columns): each field repeated; varint fields as uint64, which keeps a
        # negative int32 as the 10 bytes it was written in.
        "MappingColumns": _columns(
            ("memory_start", 1, _U64, _UNPACKED),
            ("memory_limit", 2, _U64, _UNPACKED),
            ("file_offset", 3, _U64, _UNPACKED),
            ("filename_strindex", 4, _U64),
            ("attribute_indices", 5, _U64),
        ),
        "LocationColumns": _columns(
            ("mapping_index", 1, _U64),
            ("address", 2, _U64, _UNPACKED),
            ("lines", 3, _BYTES),
            ("attribute_indices", 4, _U64),
        ),
        "LineColumns": _columns(
            ("function_index", 1, _U64), ("line", 2, _U64, _UNPACKED), ("column", 3, _U64, _UNPACKED)
        ),
        "FunctionColumns": _columns(
            ("name_strindex", 1, _U64),
            ("system_name_strindex", 2, _U64),
            ("filename_strindex", 3, _U64),
            ("start_line", 4, _U64),
        ),
        "AttributeColumns": _columns(
            ("key_strindex", 1, _U64), ("value", 2, _BYTES), ("unit_strindex", 3, _U64)
        ),
        "SampleColumns": _columns(
            ("stack_index", 1, _U64),
            ("attribute_indices", 2, _U64),
            ("link_index", 3, _U64),
            ("values", 4, _BYTES),
            ("timestamps_unix_nano", 5, _BYTES),
        ),
        # For check(): all of a table's entries, or all of a profile's samples, parsed into one
        # message (occurrences of a singular message field merge), so each index field is one list.
        "CheckData": [
            ("resource_profiles", 1, "CheckResource", True),
            ("dictionary", 2, "CheckTables", False),
        ],
        "CheckResource": [("scope_profiles", 2, "CheckScope", True)],
        "CheckScope": [("profiles", 2, "CheckProfile", True)],
        "CheckProfile": [
            ("sample_type", 1, "ValueType", False),
            ("samples", 2, "SampleColumns", False),
            ("period_type", 5, "ValueType", False),
            ("attribute_indices", 11, _I32, True),
        ],
        "CheckTables": [
            ("mapping_table", 1, "MappingColumns", False),
            ("location_table", 2, "CheckLocations", False),
            ("function_table", 3, "FunctionColumns", False),
            ("attribute_table", 6, "AttributeColumns", False),
            ("stack_table", 7, "Varints", False),
        ],
        "CheckLocations": [
            ("mapping_index", 1, _U64, True),
            ("lines", 3, "CheckLines", False),
            ("attribute_indices", 4, _U64, True),
        ],
        "CheckLines": [("function_index", 1, _U64, True)],
    },
)

# -- varints ------------------------------------------------------------------------------------

_CACHE_LIMIT = 1 << 20  # encodings kept, far more than a batch's tables hold: 45 MiB at most
_encoded: list[bytes] = [b"\x00"]
_encoded_lock = threading.Lock()
_LENGTH = [bytes([n]) for n in range(128)]  # one-byte lengths


def _read_varint(serialized: bytes, position: int) -> tuple[int, int]:
    """The varint at ``position``, and the position after it."""
    value = shift = 0
    while True:
        byte = serialized[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7


def _encode(start: int, stop: int) -> list[bytes]:
    """The varints of start..stop-1, encoded in C: packed with a 0 before each, split at the zero
    bytes (no other varint holds one)."""
    if start >= stop:
        return []
    if start == 0:
        return [b"\x00", *_encode(1, stop)]
    values = [0] * (2 * (stop - start))
    values[1::2] = range(start, stop)
    packed = _T["Varints"](values=values).SerializeToString()
    _, payload = _read_varint(packed, 1)
    return packed[payload:].split(b"\x00")[1:]


def _varints(start: int, stop: int) -> list[bytes]:
    """The varints of start..stop-1."""
    if len(_encoded) < stop <= _CACHE_LIMIT:
        with _encoded_lock:
            have = len(_encoded)
            if stop > have:
                _encoded.extend(_encode(have, min(_CACHE_LIMIT, max(stop, 2 * have))))
    if stop <= len(_encoded):
        return _encoded[start:stop]
    return _encode(start, stop)


def _varint(value: int) -> bytes:
    if value < len(_encoded):
        return _encoded[value]
    return _varints(value, value + 1)[0]


def _read_varints(data: bytes) -> list[int]:
    values, position = [], 0
    while position < len(data):
        value, position = _read_varint(data, position)
        values.append(value)
    return values


# -- columns: one field of many entries at once ---------------------------------------------------

_MARK = os.urandom(8)  # marks where an entry starts in a column of serialized values
_OUT_OF_INT32 = _varint(1 << 31)  # no int32, so no index, is written this way


class _Columns:
    """Cuts each entry of a table into pieces, one a field, with one parse of them all.

    ``kinds`` says for each field of ``columns_type`` what its piece is: "varint" (a singular
    varint field: its varint, b"" when it is 0), "list" (a packed varint field: its varints),
    "unpacked" (a singular varint field: the whole field) or "bytes" (a length-delimited field:
    the whole fields). Each entry is preceded by a marker a field, a value that column cannot hold
    otherwise (for "bytes", random, unless ``marks`` gives one), and the columns split at them.
    The "unpacked" and "bytes" fields come in one run, "unpacked" first: each is found by the marker
    it starts with, where the packed ones are found by their lengths.
    """

    def __init__(self, columns_type: Any, kinds: dict[int, str], marks: dict[int, bytes] | None = None) -> None:
        self._type = columns_type
        fields = [(field.number, field.name, kinds[field.number]) for field in columns_type.DESCRIPTOR.fields]
        self._run = [name for _, name, kind in fields if kind in ("unpacked", "bytes")]
        self._plan: list[list[Any]] = []  # [number, kind, separator, the next field's mark in the run]
        all_marks = []
        for number, _, kind in fields:
            if kind == "bytes":
                content = (marks or {}).get(number, _MARK)
                mark = _varint(number << 3 | 2) + _LENGTH[len(content)] + content
            else:
                mark = _varint(number << 3) + (_OUT_OF_INT32 if kind == "list" else b"\x00")
            all_marks.append(mark)
            self._plan.append([number, kind, mark if kind in ("unpacked", "bytes") else mark[1:], None])
        for this, following, mark in zip(self._plan, self._plan[1:], all_marks[1:]):
            if this[1] in ("unpacked", "bytes") and following[1] in ("unpacked", "bytes"):
                this[3] = mark
        self._marks = b"".join(all_marks)

    def pieces(self, entries: list[bytes]) -> dict[int, list[bytes]]:
        """Field number -> each entry's piece."""
        columns = self._type.FromString(self._marks + self._marks.join(entries))
        columns.DiscardUnknownFields()
        whole = columns.SerializeToString()
        for name in self._run:
            columns.ClearField(name)
        packed = columns.SerializeToString()
        pieces: dict[int, list[bytes]] = {}
        at_whole = at_packed = at_run = 0
        run = b""
        for number, kind, separator, next_mark in self._plan:
            if kind in ("varint", "list"):
                _, start = _read_varint(packed, at_packed)
                length, start = _read_varint(packed, start)
                block = packed[start : start + length]
                at_whole += start + length - at_packed
                at_packed = start + length
            else:
                if not run:  # the run is as long as the two serializations differ
                    run = whole[at_whole : at_whole + len(whole) - len(packed)]
                    at_whole += len(run)
                end = run.find(next_mark, at_run) if next_mark else len(run)
                block, at_run = run[at_run:end], end
            parts = block.split(separator)
            if len(parts) != len(entries) + 1:
                raise DecodeError("entries do not split into fields")
            del parts[0]
            pieces[number] = parts
        return pieces


# -- where each table's indices go ----------------------------------------------------------------


class _Outside(ValueError):
    """An index outside its own table: ``append`` turns it into a ValueError that names it."""


class _Pieces(dict):
    """Piece -> moved piece, seeded in bulk; ``compute`` works out a piece of another shape."""

    def __init__(self, compute: Callable[[bytes], bytes], keys: Iterable[bytes], values: Iterable[bytes]) -> None:
        super().__init__(zip(keys, values))
        self._compute = compute

    def __missing__(self, piece: bytes) -> bytes:
        moved = self[piece] = self._compute(piece)
        return moved


_LINE_KEY, _FUNCTION_KEY = b"\x1a", b"\x08"


class _Move:
    """Source index -> destination index for one table: ``index + by``, except that index 0 stays
    0 when the source's zero entry is dropped. Valid indices are 0 to ``size - 1``, and 0 always
    is: a message that leaves a table out still means "none" by it.

    Its dicts take a piece (see ``_Columns``) to what is written in its place: every valid index is
    in them; a piece they do not hold is out of range, or of a shape worked out when first met."""

    def __init__(self, table: str, size: int, by: int, drop_zero: bool) -> None:
        self.table, self.size, self.by, self.drop_zero = table, max(size, 1), by, drop_zero
        self._index: dict[bytes, _Pieces] = {}
        self._lists: dict[bytes, _Pieces] = {}
        self._lines: dict[bytes, bytes] | None = None

    def __call__(self, index: int) -> int:
        if not 0 <= index < self.size:
            raise _Outside(self.table)
        return 0 if index == 0 and self.drop_zero else index + self.by

    def _targets(self, start: int) -> list[bytes]:
        """The moved indices start .. size-1, encoded."""
        if start == 0 and self.drop_zero:
            return [b"\x00", *self._targets(1)]
        return _varints(start + self.by, self.size + self.by)

    def index(self, key: bytes = b"") -> _Pieces:
        """A singular index field's varint (b"" for 0) -> the moved varint (b"\\x00" for 0), after
        ``key``: with the field's key for a small table, without it for one that many fields share."""
        pieces = self._index.get(key)
        if pieces is None:

            def compute(piece: bytes) -> bytes:
                return key + _varint(self(_read_varints(piece)[0] if piece else 0))

            targets = self._targets(1)
            moved = map(key.__add__, targets) if key else targets
            keys = itertools.chain((b"",), _varints(1, self.size))
            pieces = self._index[key] = _Pieces(compute, keys, itertools.chain((compute(b""),), moved))
            pieces[_OUT_OF_INT32] = key + _OUT_OF_INT32  # a marker line's (see _moved_lines)
        return pieces

    def indices(self, key: bytes) -> _Pieces:
        """A packed index field's varints -> the moved field, written with ``key``."""
        pieces = self._lists.get(key)
        if pieces is None:

            def compute(piece: bytes) -> bytes:
                values = b"".join(map(_varint, map(self, _read_varints(piece))))
                return key + _varint(len(values)) + values if values else b""

            targets = self._targets(0)
            lengths = map(_LENGTH.__getitem__, map(len, targets))
            ones = map(b"".join, zip(itertools.repeat(key), lengths, targets))
            keys = itertools.chain((b"",), _varints(0, self.size))
            pieces = self._lists[key] = _Pieces(compute, keys, itertools.chain((b"",), ones))
        return pieces

    def bare_lines(self) -> dict[bytes, bytes]:
        """For the function table: a location's lines when it has one line holding only a function
        index (or no line) -> the moved lines."""
        if self._lines is None:
            self._lines = dict(zip(_bare_lines(_varints(1, self.size)), _bare_lines(self._targets(1))))
            self._lines[b""] = b""
        return self._lines


# A line holding only a function index: these bytes, then the index.
_BARE_LINE = [_LINE_KEY + _LENGTH[length + 1] + _FUNCTION_KEY for length in range(11)]


def _bare_lines(functions: list[bytes]) -> Iterable[bytes]:
    """A line holding only a function index, for each of ``functions`` (encoded), as a whole field."""
    return map(bytes.__add__, map(_BARE_LINE.__getitem__, map(len, functions)), functions)


# -- the tables ---------------------------------------------------------------------------------

# A line whose function index no int32 holds marks where each location's lines start.
_LINE_MARK_BODY = _FUNCTION_KEY + _OUT_OF_INT32
_LINE_MARK = _LINE_KEY + _LENGTH[len(_LINE_MARK_BODY)] + _LINE_MARK_BODY

_ATTRIBUTES = _Columns(_T["AttributeColumns"], {1: "varint", 2: "bytes", 3: "varint"})
_FUNCTIONS = _Columns(_T["FunctionColumns"], {1: "varint", 2: "varint", 3: "varint", 4: "varint"})
_MAPPINGS = _Columns(_T["MappingColumns"], {1: "unpacked", 2: "unpacked", 3: "unpacked", 4: "varint", 5: "list"})
_LOCATIONS = _Columns(_T["LocationColumns"], {1: "varint", 2: "unpacked", 3: "bytes", 4: "list"}, {3: _LINE_MARK_BODY})
_LINES = _Columns(_T["LineColumns"], {1: "varint", 2: "unpacked", 3: "unpacked"})
_SAMPLES = _Columns(_T["SampleColumns"], {1: "varint", 2: "list", 3: "varint", 4: "bytes", 5: "bytes"})

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


def _moved_attributes(entries: list[bytes], strings: _Move) -> list[bytes]:
    pieces, index = _ATTRIBUTES.pieces(entries), strings.index()
    return _rebuilt(entries, *_field(b"\x08", _moved(index, pieces[1])), *_field(b"\x18", _moved(index, pieces[3])))


def _moved_functions(entries: list[bytes], strings: _Move) -> list[bytes]:
    pieces, index = _FUNCTIONS.pieces(entries), strings.index()
    return _rebuilt(
        entries,
        *_field(b"\x08", _moved(index, pieces[1])),
        *_field(b"\x10", _moved(index, pieces[2])),
        *_field(b"\x18", _moved(index, pieces[3])),
    )


def _moved_mappings(entries: list[bytes], strings: _Move, attributes: _Move) -> list[bytes]:
    pieces = _MAPPINGS.pieces(entries)
    return _rebuilt(
        pieces[1],
        pieces[2],
        pieces[3],
        *_field(b"\x20", _moved(strings.index(), pieces[4])),
        _moved(attributes.indices(b"\x2a"), pieces[5]),
    )


def _moved_locations(entries: list[bytes], mappings: _Move, functions: _Move, attributes: _Move) -> list[bytes]:
    pieces = _LOCATIONS.pieces(entries)
    return _rebuilt(
        _moved(mappings.index(b"\x08"), pieces[1]),
        pieces[2],
        _moved_lines(pieces[3], functions),
        _moved(attributes.indices(b"\x22"), pieces[4]),
    )


def _moved_lines(pieces: list[bytes], functions: _Move) -> Iterable[bytes]:
    """Each location's lines (as a piece), function indices moved. The lines of other shapes than
    one bare function index (line numbers, inlined calls) are cut into pieces in turn, between
    marker lines that keep each location's lines together."""
    known = functions.bare_lines()
    others = list(set(pieces).difference(known.keys()))
    if others:
        lines = _T["Lines"].FromString(_LINE_MARK + _LINE_MARK.join(others)).lines
        parts = _LINES.pieces(list(lines))
        moved = _rebuilt(*_field(_FUNCTION_KEY, _moved(functions.index(), parts[1])), parts[2], parts[3])
        grouped = _T["Lines"](lines=moved).SerializeToString().split(_LINE_MARK)
        if len(grouped) != len(others) + 1:
            raise DecodeError("lines do not split into locations")
        known.update(zip(others, grouped[1:]))
    return _moved(known, pieces)


def _moved_samples(entries: list[bytes], stacks: _Move, attributes: _Move, links: _Move) -> list[bytes]:
    pieces = _SAMPLES.pieces(entries)
    return _rebuilt(
        _moved(stacks.index(b"\x08"), pieces[1]),
        _moved(attributes.indices(b"\x12"), pieces[2]),
        _moved(links.index(b"\x18"), pieces[3]),
        pieces[4],
        pieces[5],
    )


_HIGH_BYTES = bytes(range(0x80, 0x100))  # all bytes of a varint but its last


def _moved_stacks(entries: list[bytes], locations: _Move) -> list[bytes]:
    """Stacks hold half of a message's indices: they move all at once, as lanes of one big
    integer, and are written back as varints of one width (a longer encoding than needed reads the
    same)."""
    if not entries:
        return []
    values = _T["Varints"].FromString(b"".join(entries)).values[:]
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
        raise _Outside(locations.table) from None
    ones = int.from_bytes((b"\x01" + bytes(lane - 1)) * len(values), "little")
    # Every index below 2**31 first; then index + 2**31 - size has bit 31 set iff index >= size.
    if lanes & (ones * ((1 << 8 * lane) - (1 << 31))) or (lanes + ones * ((1 << 31) - locations.size)) & (ones << 31):
        raise _Outside(locations.table)
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
    headers = {count: b"\x0a" + _varint(count * width) if count else b"" for count in set(counts)}
    payloads = map(raw.__getitem__, map(slice, [0, *stops], stops))
    return list(map(bytes.__add__, map(headers.__getitem__, counts), payloads))


# -- append ---------------------------------------------------------------------------------------


def _moves(dst: profiles_pb2.ProfilesDictionary, tables: Any, out: Any) -> tuple[dict[str, _Move], dict[str, list[bytes]]]:
    """Per table, where src's indices go, and src's entries to append to dst's.

    src's zero entry is dropped when both tables start with the zero value (a table left out
    counts as one); else every src entry is kept, and every index moves, 0 too. A dst table left
    out gets its zero entry first, in ``out``."""
    moves, entries = {}, {}
    for name in TABLES:
        mine, theirs = getattr(dst, name), list(getattr(tables, name))
        size = len(mine)
        if not size:
            getattr(out, name).append(b"")
            size = 1
        mine_zero = not mine or (mine[0] == "" if name == "string_table" else mine[0].ByteSize() == 0)
        drop = mine_zero and (not theirs or theirs[0] == b"")
        moves[name] = _Move(name, len(theirs), size - 1 if drop else size, drop)
        entries[name] = theirs[1:] if drop else theirs
    return moves, entries


def _move_profile(profile: Any, strings: _Move, attributes: _Move) -> None:
    for value_type in (profile.sample_type, profile.period_type):
        for field in ("type_strindex", "unit_strindex"):
            index = getattr(value_type, field)
            if strings(index) != index:
                setattr(value_type, field, strings(index))
    if profile.attribute_indices:
        profile.attribute_indices[:] = [attributes(index) for index in profile.attribute_indices]


def _outside(src: Message) -> ValueError:
    problems = validate_indices(src)
    first = problems[0] if problems else "an index is outside its table"
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return ValueError(f"profiles refer outside their dictionary: {first}{more}; validate_indices() lists them all")


def append(dst: profiles_pb2.ProfilesData, src: Message) -> None:
    """Append src's resource profiles to dst's, and src's dictionary entries after dst's.

    src, a ProfilesData or ExportProfilesServiceRequest, is only read. Raises ValueError, and dst
    stays as it was, when src refers outside its own dictionary."""
    data = _T["Data"].FromString(src.SerializeToString())
    out = _T["Tables"]()
    try:
        move, entries = _moves(dst.dictionary, _T["Tables"].FromString(data.dictionary), out)
        strings, attributes = move["string_table"], move["attribute_table"]
        profiles, samples = [], []
        for resource in data.resource_profiles:
            for scope in resource.scope_profiles:
                for profile in scope.profiles:
                    _move_profile(profile, strings, attributes)
                    profiles.append((profile, len(profile.samples)))
                    samples.extend(profile.samples)
        if samples:
            moved = iter(_moved_samples(samples, move["stack_table"], attributes, move["link_table"]))
            for profile, count in profiles:
                if count:
                    del profile.samples[:]
                    profile.samples.extend(itertools.islice(moved, count))
        tables = {"string_table": entries["string_table"], "link_table": entries["link_table"]}
        if entries["attribute_table"]:
            tables["attribute_table"] = _moved_attributes(entries["attribute_table"], strings)
        if entries["function_table"]:
            tables["function_table"] = _moved_functions(entries["function_table"], strings)
        if entries["mapping_table"]:
            tables["mapping_table"] = _moved_mappings(entries["mapping_table"], strings, attributes)
        if entries["location_table"]:
            tables["location_table"] = _moved_locations(
                entries["location_table"], move["mapping_table"], move["function_table"], attributes
            )
        tables["stack_table"] = _moved_stacks(entries["stack_table"], move["location_table"])
    except _Outside:
        raise _outside(src) from None
    except (DecodeError, IndexError) as error:
        raise ValueError(f"profiles could not be read: {error!r}") from error
    for name, table in tables.items():
        getattr(out, name).extend(table)
    data.dictionary = out.SerializeToString()
    dst.MergeFromString(data.SerializeToString())


# -- check ----------------------------------------------------------------------------------------


def check(src: Message, serialized: bytes | None = None) -> None:
    """Raise the ValueError ``append(dst, src)`` would, merging nothing. ``serialized``:
    ``src.SerializeToString()``, when the caller has it already."""
    sizes = {name: max(len(getattr(src.dictionary, name)), 1) for name in TABLES}
    data = _T["CheckData"].FromString(src.SerializeToString() if serialized is None else serialized)
    d = data.dictionary
    # Lists of uint64, which read a negative index as a huge one, and of int32.
    unsigned: list[tuple[Sequence[int], str]] = [
        (d.mapping_table.filename_strindex, "string_table"),
        (d.mapping_table.attribute_indices, "attribute_table"),
        (d.location_table.mapping_index, "mapping_table"),
        (d.location_table.lines.function_index, "function_table"),
        (d.location_table.attribute_indices, "attribute_table"),
        (d.function_table.name_strindex, "string_table"),
        (d.function_table.system_name_strindex, "string_table"),
        (d.function_table.filename_strindex, "string_table"),
        (d.attribute_table.key_strindex, "string_table"),
        (d.attribute_table.unit_strindex, "string_table"),
        (d.stack_table.values, "location_table"),
    ]
    signed: list[tuple[Sequence[int], str]] = []
    for resource in data.resource_profiles:
        for scope in resource.scope_profiles:
            for profile in scope.profiles:
                samples, types = profile.samples, (profile.sample_type, profile.period_type)
                unsigned += [
                    (samples.stack_index, "stack_table"),
                    (samples.attribute_indices, "attribute_table"),
                    (samples.link_index, "link_table"),
                ]
                signed += [
                    ([index for t in types for index in (t.type_strindex, t.unit_strindex)], "string_table"),
                    (profile.attribute_indices, "attribute_table"),
                ]
    if any(max(values[:], default=0) >= sizes[table] for values, table in unsigned) or any(
        values and (max(values) >= sizes[table] or min(values) < 0) for values, table in signed
    ):
        raise _outside(src)


# -- re-interning ---------------------------------------------------------------------------------


class Reinterner:
    """Source dictionary index -> index in ``builder``'s dictionary, each source entry interned
    once and only when something asks for it, so that entries nothing uses stay behind.

    Raises IndexError for an index outside its source table."""

    def __init__(self, source: profiles_pb2.ProfilesDictionary, builder: ProfilesBuilder) -> None:
        self._source = source
        self._builder = builder
        self._done: dict[str, dict[int, int]] = {name: {} for name in TABLES}

    def _interned(self, table_name: str, index: int, intern: Callable[[Any], int]) -> int:
        """The destination index of a source entry, interned by ``intern`` the first time."""
        done = self._done[table_name]
        found = done.get(index)
        if found is None:
            if index < 0:
                raise IndexError(f"{table_name} index {index} is negative")
            table = getattr(self._source, table_name)
            # A message without a dictionary still means "none" by index 0.
            found = done[index] = intern(table[index]) if index or table else 0
        return found

    def string(self, index: int) -> int:
        return self._interned("string_table", index, self._builder.string)

    def attribute(self, index: int) -> int:
        return self._interned("attribute_table", index, self._attribute)

    def _attribute(self, entry: Any) -> int:
        return self._builder._attribute(self.string(entry.key_strindex), entry.value, self.string(entry.unit_strindex))

    def attributes(self, indices: Sequence[int]) -> list[int]:
        return [self.attribute(index) for index in indices]

    def mapping(self, index: int) -> int:
        return self._interned("mapping_table", index, self._mapping)

    def _mapping(self, entry: Any) -> int:
        return self._builder._mapping(
            entry.memory_start,
            entry.memory_limit,
            entry.file_offset,
            self.string(entry.filename_strindex),
            self.attributes(entry.attribute_indices),
        )

    def function(self, index: int) -> int:
        return self._interned("function_table", index, self._function)

    def _function(self, entry: Any) -> int:
        return self._builder._function(
            self.string(entry.name_strindex),
            self.string(entry.system_name_strindex),
            self.string(entry.filename_strindex),
            entry.start_line,
        )

    def location(self, index: int) -> int:
        return self._interned("location_table", index, self._location)

    def _location(self, entry: Any) -> int:
        return self._builder._location(
            self.mapping(entry.mapping_index),
            entry.address,
            tuple((self.function(ln.function_index), ln.line, ln.column) for ln in entry.lines),
            self.attributes(entry.attribute_indices),
        )

    def stack(self, index: int) -> int:
        return self._interned("stack_table", index, self._stack)

    def _stack(self, entry: Any) -> int:
        indices = entry.location_indices[:]
        moved = list(map(self._done["location_table"].get, indices))
        if None in moved:  # locations met for the first time
            moved = [self.location(i) if m is None else m for m, i in zip(moved, indices)]
        return self._builder.stack(moved)

    def link(self, index: int) -> int:
        return self._interned("link_table", index, self._link)

    def _link(self, entry: Any) -> int:
        return self._builder.link(entry.trace_id, entry.span_id)

    def profile(self, profile: profiles_pb2.Profile) -> None:
        """Re-index ``profile``, a copy of a source profile, samples and all."""
        for value_type in (profile.sample_type, profile.period_type):
            value_type.type_strindex = self.string(value_type.type_strindex)
            value_type.unit_strindex = self.string(value_type.unit_strindex)
        profile.attribute_indices[:] = self.attributes(profile.attribute_indices)
        for sample in profile.samples:
            sample.stack_index = self.stack(sample.stack_index)
            if sample.attribute_indices:
                sample.attribute_indices[:] = self.attributes(sample.attribute_indices)
            sample.link_index = self.link(sample.link_index)


def merge_into(builder: ProfilesBuilder, src: Message) -> None:
    """Append ``src``'s resource profiles to ``builder.data``, re-indexed through its interning.

    Raises ValueError if ``src`` refers outside its own dictionary; ``builder.data`` then gets no
    resource profiles from ``src`` (its dictionary may keep a few harmless unreferenced entries).
    """
    if src is builder.data:
        # Appending to the list being read would never end: merge a snapshot instead.
        snapshot = type(src)()
        snapshot.CopyFrom(src)
        src = snapshot
    dst = builder.data.resource_profiles
    start = len(dst)
    reintern = Reinterner(src.dictionary, builder)
    try:
        for resource_profiles in src.resource_profiles:
            copy = dst.add()
            copy.CopyFrom(resource_profiles)
            for scope_profiles in copy.scope_profiles:
                for profile in scope_profiles.profiles:
                    reintern.profile(profile)
    except IndexError as e:
        del dst[start:]
        raise ValueError(
            f"profiles refer to an index outside their dictionary ({e}); "
            "validate_indices() lists every such index"
        ) from e
