"""OTLP ``ProfilesData`` -> pprof ``Profile`` messages, one per process or one for everything.

OTLP and pprof share their model (pprof is where OTLP profiles came from): samples point at stacks
of locations, leaf first; a location has an address, a mapping and lines (innermost first when
inlined); a line names a function with its file. So locations, mappings and functions are copied
entry by entry, keeping inline frames and addresses, rather than rebuilt from names. Each pprof
profile gets only the entries its own samples reach, with dense ids from 1.

Sample types follow Go's profiles. An OTLP ``samples/count`` profile whose period is
``cpu/nanoseconds`` becomes pprof ``[samples/count, cpu/nanoseconds]``, so ``go tool pprof`` shows
CPU time. A process's memory profiles (one OTLP profile per type: ``alloc_objects``,
``alloc_space``, ``inuse_objects``, ``inuse_space``) become one heap profile, as Go writes one:
each sample a stack with its labels and its value of each type (0 where a type has none there),
the types in Go's order, ``inuse_space`` shown by default (``alloc_space`` when the live heap is
off), period type ``space/bytes``, and ``drop_frames`` naming the allocator's entry points, so that
pprof shows each allocation under the code that asked for it (allocation_sites.py). Any other type
is copied as it is, a profile of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.pdata import CPU_SAMPLES, CPU_TIME, HEAP_TYPES, display_order, is_memory, iter_samples, sample_type
from pycollector.pdata.resolve import BUILD_ID_KEY

from exporters.allocation_sites import ALLOCATOR_FRAMES
from exporters.pprof.profile_proto import Profile
from exporters.profiles import location_name, sample_value

PID_KEY = "process.pid"
EXECUTABLE_NAME_KEY = "process.executable.name"
EXECUTABLE_PATH_KEY = "process.executable.path"
CONTAINER_KEY = "container.id"
SERVICE_NAME_KEY = "service.name"
# Resource attributes that tell samples of different processes apart in a merged profile.
PROCESS_LABEL_KEYS = (PID_KEY, EXECUTABLE_NAME_KEY, CONTAINER_KEY)
# What a heap profile is called where a type would be (its file name's suffix), and its period's
# type, as Go's heap profiles have it.
HEAP = "heap"
HEAP_PERIOD_TYPE = ("space", "bytes")


@dataclasses.dataclass
class PprofProfile:
    """One file's worth: the message and what its name is made of."""

    profile: Any  # profile_proto.Profile
    time_unix_nano: int
    process_name: str  # "" for a merged profile
    pid: int | None
    sample_type: str  # the OTLP sample type, e.g. "samples", or HEAP for a heap profile


def to_pprof(data: profiles_pb2.ProfilesData, merged: bool) -> list[PprofProfile]:
    """The pprof profiles of ``data``: one per process and sample type, or one per sample type;
    a process's memory types (all processes' when merged) together in one heap profile."""
    groups: dict[tuple, _Group] = {}
    current_profile, group = None, None
    for view in iter_samples(data):
        if view.profile is not current_profile:  # samples come profile by profile
            current_profile = view.profile
            value_type = sample_type(data, view.profile)
            process = None if merged else (view.resource.get(PID_KEY), view.resource.get(EXECUTABLE_NAME_KEY))
            kind = HEAP if is_memory(value_type) else value_type
            group = groups.get((process, kind))
            if group is None:
                group_class = _HeapGroup if kind == HEAP else _Group
                group = groups[(process, kind)] = group_class(data, view.resource, view.profile, value_type, merged)
            group.cover(view.profile, value_type)
        labels = dict(view.attributes)
        if view.link is not None:  # as Pyroscope's span profiles read them: lower-case hex
            labels["trace_id"], labels["span_id"] = view.link[0].hex(), view.link[1].hex()
        if merged:
            labels.update((key, view.resource[key]) for key in PROCESS_LABEL_KEYS if key in view.resource)
        group.add(view.sample.stack_index, sample_value(view), labels)
    return [group.finish() for group in groups.values()]


def pprof_sample_types(value_type: tuple[str, str], period_type: tuple[str, str], period: int) -> list[tuple[str, str]]:
    """The pprof sample types of an OTLP profile's one: Go's CPU profile convention for CPU
    samples at a period of CPU time (a count and the CPU time it stands for), else its own."""
    return [value_type, CPU_TIME] if (value_type == CPU_SAMPLES and period_type == CPU_TIME and period > 0) else [value_type]


class _Group:
    """The samples of one output profile and the time span they cover."""

    def __init__(self, data: profiles_pb2.ProfilesData, resource: dict, profile: profiles_pb2.Profile, value_type: tuple[str, str], merged: bool):
        strings = data.dictionary.string_table
        period_type = (strings[profile.period_type.type_strindex], strings[profile.period_type.unit_strindex])
        sample_types = pprof_sample_types(value_type, period_type, profile.period)
        self._period = profile.period if len(sample_types) == 2 else 0
        self.builder = PprofBuilder(data.dictionary, sample_types, period_type, profile.period)
        self.sample_type = value_type[0]
        self.resource = {} if merged else resource
        self.start, self.end = None, None

    def cover(self, profile: profiles_pb2.Profile, value_type: tuple[str, str]) -> None:
        if not profile.time_unix_nano:
            return
        end = profile.time_unix_nano + profile.duration_nano
        self.start = profile.time_unix_nano if self.start is None else min(self.start, profile.time_unix_nano)
        self.end = end if self.end is None else max(self.end, end)

    def add(self, stack_index: int, value: int, labels: dict[str, Any]) -> None:
        self.builder.add_sample(stack_index, [value, value * self._period] if self._period else [value], labels)

    def finish(self) -> PprofProfile:
        comments = [f"{key}={value}" for key, value in self.resource.items()]
        profile = self.builder.finish(
            time_nanos=self.start or 0,
            duration_nanos=(self.end - self.start) if self.start is not None else 0,
            comments=comments,
            main_executable=str(self.resource.get(EXECUTABLE_PATH_KEY, "")),
        )
        pid = self.resource.get(PID_KEY)
        # Data from an SDK rather than a profiler names a service, not an executable.
        name = self.resource.get(EXECUTABLE_NAME_KEY) or self.resource.get(SERVICE_NAME_KEY) or ""
        return PprofProfile(profile, self.start or 0, str(name), pid if isinstance(pid, int) else None, self.sample_type)


class _HeapGroup(_Group):
    """The memory profiles of one process (or of all, merged) as one heap profile. Its sample
    types are those present, so the samples are kept until the last has come: by stack and
    labels, one value per heap type."""

    def __init__(self, data: profiles_pb2.ProfilesData, resource: dict, profile: profiles_pb2.Profile, value_type: tuple[str, str], merged: bool):
        self._dictionary = data.dictionary
        self._types: set[tuple[str, str]] = set()
        self._type_index = 0
        self._period = 0
        self._samples: dict[tuple, list[int]] = {}  # (locations, labels) -> a value per HEAP_TYPES
        self._labels: dict[tuple, tuple[int, dict[str, Any]]] = {}  # its stack and labels as given
        self.sample_type = HEAP
        self.resource = {} if merged else resource
        self.start, self.end = None, None

    def cover(self, profile: profiles_pb2.Profile, value_type: tuple[str, str]) -> None:
        super().cover(profile, value_type)
        self._types.add(value_type)
        self._type_index = HEAP_TYPES.index(value_type)
        self._period = self._period or profile.period

    def add(self, stack_index: int, value: int, labels: dict[str, Any]) -> None:
        # Keyed by locations, not the stack's index: a batch that appended two messages' tables
        # holds the same stack twice.
        key = (tuple(self._dictionary.stack_table[stack_index].location_indices), tuple(labels.items()))
        values = self._samples.get(key)
        if values is None:
            values = self._samples[key] = [0] * len(HEAP_TYPES)
            self._labels[key] = (stack_index, labels)
        values[self._type_index] += value

    def finish(self) -> PprofProfile:
        present = [index for index, value_type in enumerate(HEAP_TYPES) if value_type in self._types]
        sample_types = [HEAP_TYPES[index] for index in present]
        self.builder = PprofBuilder(self._dictionary, sample_types, HEAP_PERIOD_TYPE, self._period)
        self.builder.set_default_sample_type(min(sample_types, key=display_order))
        self.builder.set_drop_frames(ALLOCATOR_FRAMES)
        for key, values in self._samples.items():
            stack_index, labels = self._labels[key]
            self.builder.add_sample(stack_index, [values[index] for index in present], labels)
        return super().finish()


class PprofBuilder:
    """One pprof Profile filled from samples of one OTLP dictionary.

    OTLP index 0 of each table is "none": a location with mapping index 0 gets no mapping (pprof's
    mapping id 0 means the same).
    """

    def __init__(self, dictionary: profiles_pb2.ProfilesDictionary, sample_types: Sequence[tuple[str, str]], period_type: tuple[str, str], period: int):
        self._dictionary = dictionary
        self._otlp_strings = dictionary.string_table
        self.profile = Profile(string_table=[""])
        self._strings: dict[str, int] = {"": 0}
        self._mapping_ids: dict[int, int] = {}
        self._function_ids: dict[int, int] = {}
        self._unsymbolized_ids: dict[str, int] = {}  # by name, which is made up, not a symbol
        self._location_ids: dict[int, int] = {}
        self._stacks: dict[int, list[int]] = {}
        for type_, unit in sample_types:
            self.profile.sample_type.add(type=self.string(type_), unit=self.string(unit))
        if period_type != ("", ""):
            self.profile.period_type.type = self.string(period_type[0])
            self.profile.period_type.unit = self.string(period_type[1])
            self.profile.period = period

    def string(self, text: str) -> int:
        index = self._strings.get(text)
        if index is None:
            index = self._strings[text] = len(self.profile.string_table)
            self.profile.string_table.append(text)
        return index

    def set_default_sample_type(self, value_type: tuple[str, str]) -> None:
        self.profile.default_sample_type = self.string(value_type[0])

    def set_drop_frames(self, pattern: str) -> None:
        self.profile.drop_frames = self.string(pattern)

    def add_sample(self, stack_index: int, values: Sequence[int], labels: dict[str, Any]) -> None:
        """``values``: one per sample type, in their order."""
        sample = self.profile.sample.add(location_id=self._stack(stack_index), value=values)
        for key, value in labels.items():
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                value = str(value)
            if isinstance(value, int):
                sample.label.add(key=self.string(key), num=value)
            else:
                sample.label.add(key=self.string(key), str=self.string(value))

    def finish(self, time_nanos: int, duration_nanos: int, comments: list[str], main_executable: str) -> Any:
        profile = self.profile
        profile.time_nanos, profile.duration_nanos = time_nanos, duration_nanos
        profile.comment.extend(self.string(comment) for comment in comments)
        self._main_mapping_first(main_executable)
        return profile

    # -- entries, copied on first use --------------------------------------------------------------

    def _stack(self, stack_index: int) -> list[int]:
        ids = self._stacks.get(stack_index)
        if ids is None:
            stack = self._dictionary.stack_table[stack_index]
            ids = self._stacks[stack_index] = [self._location(index) for index in stack.location_indices]
        return ids

    def _location(self, index: int) -> int:
        location_id = self._location_ids.get(index)
        if location_id is not None:
            return location_id
        source = self._dictionary.location_table[index]
        location_id = self._location_ids[index] = len(self.profile.location) + 1
        location = self.profile.location.add(id=location_id, address=source.address)
        if source.mapping_index:
            location.mapping_id = self._mapping(source.mapping_index)
        for line in source.lines:
            named = self._otlp_strings[self._dictionary.function_table[line.function_index].name_strindex]
            function_id = self._function(line.function_index) if named else self._unsymbolized_function(source)
            location.line.add(function_id=function_id, line=line.line, column=line.column)
        if not source.lines:
            location.line.add(function_id=self._unsymbolized_function(source))
        if location.mapping_id:
            self._note_symbols(location)
        return location_id

    def _function(self, index: int) -> int:
        function_id = self._function_ids.get(index)
        if function_id is None:
            source = self._dictionary.function_table[index]
            function_id = self._function_ids[index] = len(self.profile.function) + 1
            self.profile.function.add(
                id=function_id,
                name=self.string(self._otlp_strings[source.name_strindex]),
                system_name=self.string(self._otlp_strings[source.system_name_strindex]),
                filename=self.string(self._otlp_strings[source.filename_strindex]),
                start_line=source.start_line,
            )
        return function_id

    def _unsymbolized_function(self, location: profiles_pb2.Location) -> int:
        """A function named by the frame's file and address (``[libfoo.so]+0x56cd``) for a frame
        with no symbol: speedscope leaves out a location without lines (a stripped binary's samples
        would vanish from its graphs) and calls every nameless function "(unknown)"."""
        name = location_name(self._dictionary, location)
        function_id = self._unsymbolized_ids.get(name)
        if function_id is None:
            function_id = self._unsymbolized_ids[name] = len(self.profile.function) + 1
            self.profile.function.add(id=function_id, name=self.string(name), system_name=self.string(name))
        return function_id

    def _mapping(self, index: int) -> int:
        mapping_id = self._mapping_ids.get(index)
        if mapping_id is None:
            source = self._dictionary.mapping_table[index]
            mapping_id = self._mapping_ids[index] = len(self.profile.mapping) + 1
            self.profile.mapping.add(
                id=mapping_id,
                memory_start=source.memory_start,
                memory_limit=source.memory_limit,
                file_offset=source.file_offset,
                filename=self.string(self._otlp_strings[source.filename_strindex]),
                build_id=self.string(self._build_id(source)),
            )
        return mapping_id

    def _build_id(self, mapping: profiles_pb2.Mapping) -> str:
        for index in mapping.attribute_indices:
            attribute = self._dictionary.attribute_table[index]
            if self._otlp_strings[attribute.key_strindex] == BUILD_ID_KEY:
                return attribute.value.string_value
        return ""

    def _note_symbols(self, location: Any) -> None:
        """Set the mapping's has_* flags, which tell pprof not to symbolize what already is. A name
        made from an address is no symbol: pprof may still find the function in the file."""
        mapping = self.profile.mapping[location.mapping_id - 1]
        functions = [self.profile.function[line.function_id - 1] for line in location.line]
        names = [self.profile.string_table[function.name] for function in functions]
        mapping.has_functions |= any(name and name not in self._unsymbolized_ids for name in names)
        mapping.has_filenames |= any(function.filename for function in functions)
        mapping.has_line_numbers |= any(line.line for line in location.line)
        mapping.has_inline_frames |= len(location.line) > 1

    def _main_mapping_first(self, main_executable: str) -> None:
        """pprof takes mapping[0] as the main binary (its "File:" line); ids stay as they are."""
        mappings = list(self.profile.mapping)
        main = next((m for m in mappings if main_executable and self.profile.string_table[m.filename] == main_executable), None)
        if main is None or main is mappings[0]:
            return
        ordered = [main] + [m for m in mappings if m is not main]
        copies = [type(main)() for _ in ordered]
        for copy, mapping in zip(copies, ordered):
            copy.CopyFrom(mapping)
        del self.profile.mapping[:]
        self.profile.mapping.extend(copies)
