"""Re-index one ``ProfilesData`` into a ``ProfilesBuilder``'s dictionary.

Batching merges many small messages into one, so this is on the hot path. Each table entry of the
source dictionary is re-interned exactly once, in dependency order (strings, then attributes, then
what refers to them, ...), giving one list per table mapping source index -> destination index.
Every reference in the copied resource profiles is then a list lookup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry.proto.profiles.v1development import profiles_pb2

if TYPE_CHECKING:
    from pycollector.pdata.builder import ProfilesBuilder


# Source index -> destination index. A dict rather than a list so that a negative (malformed)
# source index is a KeyError instead of silently meaning "counted from the end".
_IndexMap = dict[int, int]


def _index_map(indices: list[int]) -> _IndexMap:
    # A source without a dictionary still means "none" by index 0; map it to our zero entry.
    return dict(enumerate(indices or [0]))


@dataclass(frozen=True)
class _Translation:
    strings: _IndexMap
    attributes: _IndexMap
    stacks: _IndexMap
    links: _IndexMap


def _translate_dictionary(
    builder: ProfilesBuilder, src: profiles_pb2.ProfilesDictionary
) -> _Translation:
    strings = _index_map([builder.string(s) for s in src.string_table])
    attributes = _index_map(
        [
            builder._attribute(strings[a.key_strindex], a.value, strings[a.unit_strindex])
            for a in src.attribute_table
        ]
    )
    functions = _index_map(
        [
            builder._function(
                strings[f.name_strindex],
                strings[f.system_name_strindex],
                strings[f.filename_strindex],
                f.start_line,
            )
            for f in src.function_table
        ]
    )
    mappings = _index_map(
        [
            builder._mapping(
                m.memory_start,
                m.memory_limit,
                m.file_offset,
                strings[m.filename_strindex],
                [attributes[i] for i in m.attribute_indices],
            )
            for m in src.mapping_table
        ]
    )
    locations = _index_map(
        [
            builder._location(
                mappings[loc.mapping_index],
                loc.address,
                tuple(
                    (functions[line.function_index], line.line, line.column) for line in loc.lines
                ),
                [attributes[i] for i in loc.attribute_indices],
            )
            for loc in src.location_table
        ]
    )
    stacks = _index_map(
        [builder.stack([locations[i] for i in s.location_indices]) for s in src.stack_table]
    )
    links = _index_map([builder.link(link.trace_id, link.span_id) for link in src.link_table])
    return _Translation(strings, attributes, stacks, links)


def _reindex_value_type(value_type: profiles_pb2.ValueType, strings: _IndexMap) -> None:
    value_type.type_strindex = strings[value_type.type_strindex]
    value_type.unit_strindex = strings[value_type.unit_strindex]


def _reindex_profile(profile: profiles_pb2.Profile, t: _Translation) -> None:
    _reindex_value_type(profile.sample_type, t.strings)
    _reindex_value_type(profile.period_type, t.strings)
    profile.attribute_indices[:] = [t.attributes[i] for i in profile.attribute_indices]
    for sample in profile.samples:
        sample.stack_index = t.stacks[sample.stack_index]
        if sample.attribute_indices:
            sample.attribute_indices[:] = [t.attributes[i] for i in sample.attribute_indices]
        sample.link_index = t.links[sample.link_index]


def merge_into(builder: ProfilesBuilder, src: profiles_pb2.ProfilesData) -> None:
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
    try:
        translation = _translate_dictionary(builder, src.dictionary)
        for resource_profiles in src.resource_profiles:
            copy = dst.add()
            copy.CopyFrom(resource_profiles)
            for scope_profiles in copy.scope_profiles:
                for profile in scope_profiles.profiles:
                    _reindex_profile(profile, translation)
    except KeyError as e:
        del dst[start:]
        raise ValueError(
            f"profiles refer to index {e}, outside their dictionary; "
            "validate_indices() lists every such index"
        ) from e
