"""Where each table's indices go."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

from pycollector.pdata.appending.varints import LENGTH, OUT_OF_INT32, read_varints, varint, varints


class Outside(ValueError):
    """An index outside its own table: ``append`` turns it into a ValueError that names it."""


class _Pieces(dict):
    """Piece -> moved piece, seeded in bulk; ``compute`` works out a piece of another shape."""

    def __init__(self, compute: Callable[[bytes], bytes], keys: Iterable[bytes], values: Iterable[bytes]) -> None:
        super().__init__(zip(keys, values))
        self._compute = compute

    def __missing__(self, piece: bytes) -> bytes:
        moved = self[piece] = self._compute(piece)
        return moved


LINE_KEY, FUNCTION_KEY = b"\x1a", b"\x08"


class Move:
    """Source index -> destination index for one table: ``index + by``, except that index 0 stays
    0 when the source's zero entry is dropped. Valid indices are 0 to ``size - 1``, and 0 always
    is: a message that leaves a table out still means "none" by it.

    Its dicts take a piece (see ``columns.Columns``) to what is written in its place: every valid index is
    in them; a piece they do not hold is out of range, or of a shape worked out when first met."""

    def __init__(self, table: str, size: int, by: int, drop_zero: bool) -> None:
        self.table, self.size, self.by, self.drop_zero = table, max(size, 1), by, drop_zero
        self._index: dict[bytes, _Pieces] = {}
        self._lists: dict[bytes, _Pieces] = {}
        self._lines: dict[bytes, bytes] | None = None

    def __call__(self, index: int) -> int:
        if not 0 <= index < self.size:
            raise Outside(self.table)
        return 0 if index == 0 and self.drop_zero else index + self.by

    def _targets(self, start: int) -> list[bytes]:
        """The moved indices start .. size-1, encoded."""
        if start == 0 and self.drop_zero:
            return [b"\x00", *self._targets(1)]
        return varints(start + self.by, self.size + self.by)

    def index(self, key: bytes = b"") -> _Pieces:
        """A singular index field's varint (b"" for 0) -> the moved varint (b"\\x00" for 0), after
        ``key``: with the field's key for a small table, without it for one that many fields share."""
        pieces = self._index.get(key)
        if pieces is None:

            def compute(piece: bytes) -> bytes:
                return key + varint(self(read_varints(piece)[0] if piece else 0))

            targets = self._targets(1)
            moved = map(key.__add__, targets) if key else targets
            keys = itertools.chain((b"",), varints(1, self.size))
            pieces = self._index[key] = _Pieces(compute, keys, itertools.chain((compute(b""),), moved))
            pieces[OUT_OF_INT32] = key + OUT_OF_INT32  # a marker line's (see tables._moved_lines)
        return pieces

    def indices(self, key: bytes) -> _Pieces:
        """A packed index field's varints -> the moved field, written with ``key``."""
        pieces = self._lists.get(key)
        if pieces is None:

            def compute(piece: bytes) -> bytes:
                values = b"".join(map(varint, map(self, read_varints(piece))))
                return key + varint(len(values)) + values if values else b""

            targets = self._targets(0)
            lengths = map(LENGTH.__getitem__, map(len, targets))
            ones = map(b"".join, zip(itertools.repeat(key), lengths, targets))
            keys = itertools.chain((b"",), varints(0, self.size))
            pieces = self._lists[key] = _Pieces(compute, keys, itertools.chain((b"",), ones))
        return pieces

    def bare_lines(self) -> dict[bytes, bytes]:
        """For the function table: a location's lines when it has one line holding only a function
        index (or no line) -> the moved lines."""
        if self._lines is None:
            self._lines = dict(zip(_bare_lines(varints(1, self.size)), _bare_lines(self._targets(1))))
            self._lines[b""] = b""
        return self._lines


# A line holding only a function index: these bytes, then the index.
_BARE_LINE = [LINE_KEY + LENGTH[length + 1] + FUNCTION_KEY for length in range(11)]


def _bare_lines(functions: list[bytes]) -> Iterable[bytes]:
    """A line holding only a function index, for each of ``functions`` (encoded), as a whole field."""
    return map(bytes.__add__, map(_BARE_LINE.__getitem__, map(len, functions)), functions)
