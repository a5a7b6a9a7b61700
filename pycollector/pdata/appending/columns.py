"""Columns: one field of many entries at once."""

from __future__ import annotations

import os
from typing import Any

from google.protobuf.message import DecodeError

from pycollector.pdata.appending.varints import LENGTH, OUT_OF_INT32, read_varint, varint

_MARK = os.urandom(8)  # marks where an entry starts in a column of serialized values


class Columns:
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
                mark = varint(number << 3 | 2) + LENGTH[len(content)] + content
            else:
                mark = varint(number << 3) + (OUT_OF_INT32 if kind == "list" else b"\x00")
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
                _, start = read_varint(packed, at_packed)
                length, start = read_varint(packed, start)
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

