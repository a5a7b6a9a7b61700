"""Build ``ProfilesData`` whose dictionary holds every entry once.

OTLP profiles keep strings, functions, locations, stacks, ... in one ``ProfilesDictionary`` shared
by all profiles of a message, and samples refer to them by index. ``ProfilesBuilder`` owns that
dictionary: each ``string()``, ``function()``, ``location()``, ... call returns the index of an
equal entry if there is one, else appends it. Index 0 of every table is the zero value, which the
proto defines as "none", so it is created up front and asking for an all-default entry returns 0.

Each method that takes names or Python values has an index-level twin (``_function``,
``_location``, ...) taking already-interned indices; ``merging`` uses those to re-intern another
message's dictionary without decoding it back to Python values.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.pdata.merging import Reinterner
from pycollector.pdata.attributes import key_values, to_any_value

# Attribute values that can key a cache directly, skipping AnyValue encoding on a repeat.
_HASHABLE_SCALARS = (str, bool, int, float, bytes)


def _sorted_tuple(indices: Sequence[int]) -> tuple[int, ...]:
    """Attribute indices as a dedupe key: the same set of attributes in any order is one entry."""
    return tuple(sorted(indices))


def _attribute_key(entry: profiles_pb2.KeyValueAndUnit) -> Hashable:
    # Deterministic serialization gives equal AnyValues (including nested ones) equal bytes.
    return (
        entry.key_strindex,
        entry.value.SerializeToString(deterministic=True),
        entry.unit_strindex,
    )


def _mapping_key(entry: profiles_pb2.Mapping) -> Hashable:
    return (
        entry.memory_start,
        entry.memory_limit,
        entry.file_offset,
        entry.filename_strindex,
        _sorted_tuple(entry.attribute_indices),
    )


def _function_key(entry: profiles_pb2.Function) -> Hashable:
    return (
        entry.name_strindex,
        entry.system_name_strindex,
        entry.filename_strindex,
        entry.start_line,
    )


def _location_key(entry: profiles_pb2.Location) -> Hashable:
    return (
        entry.mapping_index,
        entry.address,
        tuple((line.function_index, line.line, line.column) for line in entry.lines),
        _sorted_tuple(entry.attribute_indices),
    )


def _stack_key(entry: profiles_pb2.Stack) -> Hashable:
    return tuple(entry.location_indices)


def _link_key(entry: profiles_pb2.Link) -> Hashable:
    return (entry.trace_id, entry.span_id)


class _InternedTable:
    """One message table of the dictionary plus the index of each distinct entry's first copy.

    The ``*_key`` functions above and the keys the builder computes from arguments must agree:
    both list the entry's fields in declaration order.
    """

    def __init__(self, table: Any, key_of: Callable[[Any], Hashable]) -> None:
        if not table:
            table.add()  # the zero entry that index 0 ("none") points at
        self._table = table
        self._index: dict[Hashable, int] = {}
        for index, entry in enumerate(table):
            self._index.setdefault(key_of(entry), index)

    def get(self, key: Hashable) -> int | None:
        return self._index.get(key)

    def add(self, key: Hashable, **fields: Any) -> int:
        index = self._index[key] = len(self._table)
        self._table.add(**fields)
        return index


class ProfilesBuilder:
    """Interns dictionary entries into a new or existing ``ProfilesData`` and builds its profiles.

    Wrapping an existing message rebuilds the intern maps from its tables, so entries added later,
    or merged in, are shared with the ones already there.
    """

    def __init__(self, data: profiles_pb2.ProfilesData | None = None) -> None:
        self._data = profiles_pb2.ProfilesData() if data is None else data
        dictionary = self._data.dictionary
        self._string_table = dictionary.string_table
        if not self._string_table:
            self._string_table.append("")
        self._strings: dict[str, int] = {}
        for index, string in enumerate(self._string_table):
            self._strings.setdefault(string, index)
        self._attributes = _InternedTable(dictionary.attribute_table, _attribute_key)
        self._mappings = _InternedTable(dictionary.mapping_table, _mapping_key)
        self._functions = _InternedTable(dictionary.function_table, _function_key)
        self._locations = _InternedTable(dictionary.location_table, _location_key)
        self._stacks = _InternedTable(dictionary.stack_table, _stack_key)
        self._links = _InternedTable(dictionary.link_table, _link_key)
        # (key, unit, type, value) -> attribute index: samples repeat the same few attributes
        # (thread.id, thread.name), and this skips building and encoding an AnyValue each time.
        self._scalar_attributes: dict[tuple[str, str, type, Any], int] = {}

    @property
    def data(self) -> profiles_pb2.ProfilesData:
        return self._data

    # -- dictionary entries from names and Python values -------------------------------------

    def string(self, s: str) -> int:
        index = self._strings.get(s)
        if index is None:
            index = self._strings[s] = len(self._string_table)
            self._string_table.append(s)
        return index

    def attribute(self, key: str, value: Any, unit: str = "") -> int:
        cache_key = (
            (key, unit, type(value), value) if isinstance(value, _HASHABLE_SCALARS) else None
        )
        if cache_key is not None:
            index = self._scalar_attributes.get(cache_key)
            if index is not None:
                return index
        index = self._attribute(self.string(key), to_any_value(value), self.string(unit))
        if cache_key is not None:
            self._scalar_attributes[cache_key] = index
        return index

    def function(
        self, name: str, system_name: str = "", filename: str = "", start_line: int = 0
    ) -> int:
        return self._function(
            self.string(name), self.string(system_name), self.string(filename), start_line
        )

    def mapping(
        self,
        memory_start: int = 0,
        memory_limit: int = 0,
        file_offset: int = 0,
        filename: str = "",
        attributes: Mapping[str, Any] | None = None,
    ) -> int:
        return self._mapping(
            memory_start,
            memory_limit,
            file_offset,
            self.string(filename),
            self._attribute_indices(attributes),
        )

    def location(
        self,
        mapping_index: int = 0,
        address: int = 0,
        lines: Sequence[tuple[int, int, int]] = (),
        attributes: Mapping[str, Any] | None = None,
    ) -> int:
        """``lines`` are (function_index, line, column), innermost first when inlined."""
        return self._location(
            mapping_index,
            address,
            tuple((function_index, line, column) for function_index, line, column in lines),
            self._attribute_indices(attributes),
        )

    def stack(self, location_indices: Sequence[int]) -> int:
        """``location_indices`` leaf first, as OTLP stores them."""
        key = tuple(location_indices)
        index = self._stacks.get(key)
        if index is None:
            index = self._stacks.add(key, location_indices=key)
        return index

    def link(self, trace_id: bytes, span_id: bytes) -> int:
        key = (bytes(trace_id), bytes(span_id))
        index = self._links.get(key)
        if index is None:
            index = self._links.add(key, trace_id=key[0], span_id=key[1])
        return index

    # -- dictionary entries from already-interned indices ------------------------------------

    def _attribute(self, key_strindex: int, value: common_pb2.AnyValue, unit_strindex: int) -> int:
        key = (key_strindex, value.SerializeToString(deterministic=True), unit_strindex)
        index = self._attributes.get(key)
        if index is None:
            index = self._attributes.add(
                key, key_strindex=key_strindex, value=value, unit_strindex=unit_strindex
            )
        return index

    def _attribute_indices(self, attributes: Mapping[str, Any] | None) -> list[int]:
        """Sorted by key so that equal dicts give equal index lists whatever their order."""
        if not attributes:
            return []
        return [self.attribute(key, attributes[key]) for key in sorted(attributes)]

    def _function(
        self,
        name_strindex: int,
        system_name_strindex: int,
        filename_strindex: int,
        start_line: int,
    ) -> int:
        key = (name_strindex, system_name_strindex, filename_strindex, start_line)
        index = self._functions.get(key)
        if index is None:
            index = self._functions.add(
                key,
                name_strindex=name_strindex,
                system_name_strindex=system_name_strindex,
                filename_strindex=filename_strindex,
                start_line=start_line,
            )
        return index

    def _mapping(
        self,
        memory_start: int,
        memory_limit: int,
        file_offset: int,
        filename_strindex: int,
        attribute_indices: Sequence[int],
    ) -> int:
        key = (
            memory_start,
            memory_limit,
            file_offset,
            filename_strindex,
            _sorted_tuple(attribute_indices),
        )
        index = self._mappings.get(key)
        if index is None:
            index = self._mappings.add(
                key,
                memory_start=memory_start,
                memory_limit=memory_limit,
                file_offset=file_offset,
                filename_strindex=filename_strindex,
                attribute_indices=attribute_indices,
            )
        return index

    def _location(
        self,
        mapping_index: int,
        address: int,
        lines: tuple[tuple[int, int, int], ...],
        attribute_indices: Sequence[int],
    ) -> int:
        key = (mapping_index, address, lines, _sorted_tuple(attribute_indices))
        index = self._locations.get(key)
        if index is None:
            index = self._locations.add(
                key,
                mapping_index=mapping_index,
                address=address,
                lines=[profiles_pb2.Line(function_index=f, line=n, column=c) for f, n, c in lines],
                attribute_indices=attribute_indices,
            )
        return index

    # -- the message tree ---------------------------------------------------------------------

    def resource_profiles(
        self, attributes: Mapping[str, Any], schema_url: str = ""
    ) -> profiles_pb2.ResourceProfiles:
        """A new ``ResourceProfiles`` appended to ``data``, never a reused one."""
        resource_profiles = self._data.resource_profiles.add(schema_url=schema_url)
        resource_profiles.resource.attributes.extend(key_values(attributes))
        return resource_profiles

    def scope_profiles(
        self, resource_profiles: profiles_pb2.ResourceProfiles, name: str = "", version: str = "", schema_url: str = ""
    ) -> profiles_pb2.ScopeProfiles:
        return resource_profiles.scope_profiles.add(
            scope=common_pb2.InstrumentationScope(name=name, version=version), schema_url=schema_url
        )

    def profile(
        self,
        scope_profiles: profiles_pb2.ScopeProfiles,
        sample_type: tuple[str, str] = ("samples", "count"),
        period_type: tuple[str, str] = ("cpu", "nanoseconds"),
        period: int = 0,
        time_unix_nano: int = 0,
        duration_nano: int = 0,
        attributes: Mapping[str, Any] | None = None,
        profile_id: bytes | None = None,
    ) -> profiles_pb2.Profile:
        """``profile_id`` defaults to 16 random bytes: OTLP requires it unique and non-zero."""
        return scope_profiles.profiles.add(
            sample_type=self._value_type(sample_type),
            period_type=self._value_type(period_type),
            period=period,
            time_unix_nano=time_unix_nano,
            duration_nano=duration_nano,
            attribute_indices=self._attribute_indices(attributes),
            profile_id=os.urandom(16) if profile_id is None else profile_id,
        )

    def sample(
        self,
        profile: profiles_pb2.Profile,
        stack_index: int,
        values: Sequence[int],
        attributes: Mapping[str, Any] | None = None,
        timestamps_unix_nano: Sequence[int] = (),
        link_index: int = 0,
    ) -> profiles_pb2.Sample:
        return profile.samples.add(
            stack_index=stack_index,
            values=values,
            attribute_indices=self._attribute_indices(attributes),
            timestamps_unix_nano=timestamps_unix_nano,
            link_index=link_index,
        )

    def _value_type(self, type_and_unit: tuple[str, str]) -> profiles_pb2.ValueType:
        type_, unit = type_and_unit
        return profiles_pb2.ValueType(
            type_strindex=self.string(type_), unit_strindex=self.string(unit)
        )

    # -- merging --------------------------------------------------------------------------------

    def merge(self, src: profiles_pb2.ProfilesData) -> None:
        """Append ``src``'s resource profiles to ``data``, re-indexed into this dictionary: what
        they use is interned, so each entry stays once. (``appending.append`` instead appends src's
        tables as they are, several times faster, as the batch processor does.)

        Raises ValueError if ``src`` refers outside its own dictionary; ``data`` then gets no
        resource profiles from ``src`` (its dictionary may keep a few harmless unreferenced
        entries)."""
        if src is self.data:
            # Appending to the list being read would never end: merge a snapshot instead.
            snapshot = type(src)()
            snapshot.CopyFrom(src)
            src = snapshot
        dst = self.data.resource_profiles
        start = len(dst)
        reintern = Reinterner(src.dictionary, self)
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


def merge(
    dst: profiles_pb2.ProfilesData, src: profiles_pb2.ProfilesData
) -> profiles_pb2.ProfilesData:
    """One-off merge of ``src`` into ``dst``; returns ``dst``.

    For many merges into one message keep a ``ProfilesBuilder`` instead: this rebuilds the intern
    maps from ``dst``'s tables on every call.
    """
    ProfilesBuilder(dst).merge(src)
    return dst
