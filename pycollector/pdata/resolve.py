"""Read samples back as frames and Python values.

Exporters that show stacks (debug, pprof, flame graphs) want names, not dictionary indices. Samples
share stacks and locations heavily, so one ``iter_samples`` pass resolves each stack and each
location once and reuses the result. It assumes valid indices: check untrusted data with
``validate_indices`` first.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.pdata.zero_entries import with_zero_entries

from pycollector.pdata.attributes import from_any_value, to_dict

# Semantic-convention attribute keys the frames expose.
FRAME_TYPE_KEY = "profile.frame.type"  # on a Location: "native", "python", "kernel", ...
BUILD_ID_KEY = "process.executable.build_id.gnu"  # on a Mapping


@dataclass(frozen=True)
class Frame:
    """One (possibly inlined) function of a location, with what its location and mapping add."""

    function: str
    system_name: str
    filename: str
    line: int
    column: int
    address: int
    frame_type: str
    mapping_filename: str
    build_id: str


@dataclass
class SampleView:
    """A sample with its context resolved. ``frames`` are leaf first, as stored.

    Views from one ``iter_samples`` pass share the ``resource`` dict and attribute values: read,
    don't mutate.
    """

    resource: dict[str, Any]
    scope_name: str
    profile: profiles_pb2.Profile
    sample: profiles_pb2.Sample
    frames: list[Frame]
    attributes: dict[str, Any]
    values: list[int]
    link: tuple[bytes, bytes] | None = None  # (trace id, span id) of the span the sample ran in


def _as_str(value: Any) -> str:
    return "" if value is None else str(value)


class _Resolver:
    """Decodes entries of one dictionary, each attribute, location and stack at most once."""

    def __init__(self, dictionary: profiles_pb2.ProfilesDictionary) -> None:
        self._dictionary = dictionary
        self._strings = dictionary.string_table
        self._attributes: dict[int, tuple[str, Any]] = {}
        self._locations: dict[int, tuple[Frame, ...]] = {}
        self._stacks: dict[int, tuple[Frame, ...]] = {}

    def attributes(self, indices: Sequence[int]) -> dict[str, Any]:
        result = {}
        for index in indices:
            pair = self._attributes.get(index)
            if pair is None:
                entry = self._dictionary.attribute_table[index]
                pair = self._attributes[index] = (
                    self._strings[entry.key_strindex],
                    from_any_value(entry.value),
                )
            result[pair[0]] = pair[1]
        return result

    def link(self, index: int) -> tuple[bytes, bytes] | None:
        """The link at ``index`` as (trace id, span id); None for the zero entry (no span)."""
        if not index or index >= len(self._dictionary.link_table):
            return None
        entry = self._dictionary.link_table[index]
        return (entry.trace_id, entry.span_id) if entry.trace_id or entry.span_id else None

    def frames(self, stack_index: int) -> list[Frame]:
        frames = self._stacks.get(stack_index)
        if frames is None:
            stack = self._dictionary.stack_table[stack_index]
            frames = self._stacks[stack_index] = tuple(
                frame
                for location_index in stack.location_indices
                for frame in self._location_frames(location_index)
            )
        return list(frames)

    def _location_frames(self, index: int) -> tuple[Frame, ...]:
        frames = self._locations.get(index)
        if frames is not None:
            return frames
        location = self._dictionary.location_table[index]
        mapping = self._dictionary.mapping_table[location.mapping_index]
        common = {
            "address": location.address,
            "frame_type": _as_str(self.attributes(location.attribute_indices).get(FRAME_TYPE_KEY)),
            "mapping_filename": self._strings[mapping.filename_strindex],
            "build_id": _as_str(self.attributes(mapping.attribute_indices).get(BUILD_ID_KEY)),
        }
        if not location.lines:
            # Unsymbolized (e.g. a native address): still one frame, known by address and mapping.
            frames = (Frame(function="", system_name="", filename="", line=0, column=0, **common),)
        else:
            frames = tuple(self._line_frame(line, common) for line in location.lines)
        self._locations[index] = frames
        return frames

    def _line_frame(self, line: profiles_pb2.Line, common: dict[str, Any]) -> Frame:
        function = self._dictionary.function_table[line.function_index]
        return Frame(
            function=self._strings[function.name_strindex],
            system_name=self._strings[function.system_name_strindex],
            filename=self._strings[function.filename_strindex],
            line=line.line,
            column=line.column,
            **common,
        )


def iter_samples(data: profiles_pb2.ProfilesData) -> Iterator[SampleView]:
    """Every sample of ``data`` in message order, resolved."""
    resolver = _Resolver(with_zero_entries(data.dictionary))
    for resource_profiles in data.resource_profiles:
        resource = to_dict(resource_profiles.resource.attributes)
        for scope_profiles in resource_profiles.scope_profiles:
            scope_name = scope_profiles.scope.name
            for profile in scope_profiles.profiles:
                for sample in profile.samples:
                    yield SampleView(
                        resource=resource,
                        scope_name=scope_name,
                        profile=profile,
                        sample=sample,
                        frames=resolver.frames(sample.stack_index),
                        attributes=resolver.attributes(sample.attribute_indices),
                        values=list(sample.values),
                        link=resolver.link(sample.link_index),
                    )


def sample_type(data: profiles_pb2.ProfilesData, profile: profiles_pb2.Profile) -> tuple[str, str]:
    """The profile's (type, unit), e.g. ("samples", "count"). Index 0 is the empty string in a
    message that leaves the string table out, as everywhere (``with_zero_entries``)."""
    strings = data.dictionary.string_table
    type_index, unit_index = profile.sample_type.type_strindex, profile.sample_type.unit_strindex
    return (strings[type_index] if type_index or strings else "", strings[unit_index] if unit_index or strings else "")


def frames_of(data: profiles_pb2.ProfilesData, stack_index: int) -> list[Frame]:
    """The frames of one stack, leaf first. For many samples use ``iter_samples``, which caches."""
    return _Resolver(with_zero_entries(data.dictionary)).frames(stack_index)
