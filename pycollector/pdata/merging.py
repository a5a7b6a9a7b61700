"""Re-interning one ``ProfilesData``'s dictionary into another's, and every index that refers
into it.

``Reinterner`` re-interns what src's profiles use, so that each entry is held once; behind
``ProfilesBuilder.merge``, and ``split_at`` cuts profiles with it too. It needs of the builder only
its interning (``Interning``), so this module does not import the builder, which imports it. The
batch processor appends instead (``pycollector.pdata.appending``): faster, and an entry is held
once per message that had it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.pdata.zero_entries import TABLES


class Interning(Protocol):
    """What re-interning asks of a dictionary builder (``ProfilesBuilder``): each call returns the
    index of an entry equal to the one described, adding it when there is none."""

    def string(self, value: str) -> int: ...
    def _attribute(self, key: int, value: Any, unit: int) -> int: ...
    def _mapping(self, *fields: Any) -> int: ...
    def _function(self, *fields: Any) -> int: ...
    def _location(self, *fields: Any) -> int: ...
    def stack(self, location_indices: Sequence[int]) -> int: ...
    def link(self, trace_id: bytes, span_id: bytes) -> int: ...

# -- re-interning ---------------------------------------------------------------------------------


class Reinterner:
    """Source dictionary index -> index in ``builder``'s dictionary, each source entry interned
    once and only when something asks for it, so that entries nothing uses stay behind.

    Raises IndexError for an index outside its source table."""

    def __init__(self, source: profiles_pb2.ProfilesDictionary, builder: Interning) -> None:
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
