"""The last N minutes of samples, as stack counts per sample type and process.

Samples are added to the bucket of the current time slice; a slice is a sixtieth of the window
(at least a second), so the window slides in small steps and memory is bounded by the number of
distinct stacks per slice, however often exports arrive.

Each sample type (``samples/count`` from CPU profilers, ``off_cpu/nanoseconds`` from off-CPU
profiling, bytes allocated...) is kept apart, keyed by (type, unit): the page shows one type at a
time, as adding values of different units into one graph would mean nothing. A memory sample's
stack ends at its allocation site: the allocator's frames (the sampler's, malloc...) are left out
(allocation_sites.py), as pprof leaves them out of a heap profile. The live heap's types
(``inuse_space``...) are readings, not counts: a process's latest reading replaces its earlier ones
(in a slice, over the window, in a segment), never adds to them (sample_types.is_snapshot).

Within a process, stacks are kept per span (`SpanKey`: the trace and span a sample is linked to,
and its span attributes such as ``http.route``), so the page can show one span, one trace or one
route. A slice keeps at most MAX_SPANS_PER_SLICE spans; the samples of spans past that keep their
attributes but not their ids (counted in ``spans_cut``, which the page shows).

For the page's timeline, and its comparisons of two times, the window also gives its samples in
time segments (``segments``: one per slice, spans merged: what the timeline draws and a range
selects) and each process's resource attributes (``resources``: service.version, container,
pod..., so two versions can be compared).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, NamedTuple

from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.pdata import Frame, is_memory, is_snapshot, iter_samples, sample_type

from exporters.allocation_sites import allocator_depth
from exporters.profiles import FrameNames, sample_value

SLICES_PER_WINDOW = 60
MIN_SLICE_SECONDS = 1.0
MAX_SPANS_PER_SLICE = 2000  # a busy service ends thousands of spans a second; their stacks add up
MAX_RESOURCE_VALUE = 200  # characters of a resource attribute's value kept for comparisons
# Resource attributes that name one process, not a kind of process: comparing by them means nothing.
PER_PROCESS_ATTRIBUTES = frozenset({"process.pid", "process.parent_pid", "process.command_line", "process.command_args"})

# A profile's (type, unit), e.g. ("samples", "count") or ("off_cpu", "nanoseconds").
SampleType = tuple[str, str]
# A stack, root first: (frame name, frame type) per frame.
Stack = tuple[tuple[str, str], ...]


class ProcessKey(NamedTuple):
    pid: int | None
    name: str
    container: str


class SpanKey(NamedTuple):
    """The span a sample ran in: ids in hex ("" when it carries no link), and its span attributes
    (the sample's, but thread.*: those say which thread, not which request)."""

    trace_id: str
    span_id: str
    attributes: tuple[tuple[str, str], ...]


NO_SPAN = SpanKey("", "", ())

# A process's stack values per span it ran in (NO_SPAN for samples in none).
ProcessStacks = dict[SpanKey, collections.Counter]
# What one slice, or the whole window, holds: per sample type and process.
Totals = dict[SampleType, dict[ProcessKey, ProcessStacks]]


def merged(stacks_by_span: ProcessStacks) -> collections.Counter:
    """A process's stack values, whatever span they ran in."""
    total: collections.Counter = collections.Counter()
    for stacks in stacks_by_span.values():
        total.update(stacks)
    return total


class Segment(NamedTuple):
    """A stretch of the window: wall-clock seconds it covers, and its stack values per sample
    type and process (spans merged)."""

    start_unix: float
    end_unix: float
    totals: dict[SampleType, dict[ProcessKey, collections.Counter]]


class ProfileWindow:
    def __init__(self, window_seconds: float, clock: Callable[[], float] = time.monotonic):
        self.window_seconds = window_seconds
        self._slice_seconds = max(MIN_SLICE_SECONDS, window_seconds / SLICES_PER_WINDOW)
        self._clock = clock
        # Wall-clock seconds of the clock's zero, taken once: a segment's start is the same number
        # at every call, so a range the page selected by it is found again after a refresh.
        self._wall_offset = time.time() - clock()
        self._slices: collections.deque[_Slice] = collections.deque()
        self._lock = threading.Lock()

    def add(self, data: profiles_pb2.ProfilesData) -> collections.Counter:
        """Count ``data``'s samples into the slice of the time each profile covers (the one it
        arrives in, for a profile that says no time); returns the value taken per sample type
        (values of different types are never summed)."""
        now_slice = int(self._clock() // self._slice_seconds)
        counts: dict[int, Totals] = collections.defaultdict(_empty)  # by slice number
        names = FrameNames(data.dictionary)
        taken: collections.Counter = collections.Counter()
        current_profile, of_type, memory, outdated = None, None, False, False
        spans: dict[tuple, SpanKey] = {}
        resources: dict[ProcessKey, dict[str, str]] = {}
        # The time of the reading kept, per slice, snapshot type and process.
        readings: dict[int, dict[tuple[SampleType, ProcessKey], int]] = collections.defaultdict(dict)
        last_resource = None
        for view in iter_samples(data):
            if view.profile is not current_profile:  # samples come profile by profile
                current_profile = view.profile
                value_type, number = sample_type(data, view.profile), self._slice_number(view.profile, now_slice)
                of_type, memory, outdated = counts[number][value_type], is_memory(value_type), False
                if is_snapshot(value_type):  # (an export may hold a process's readings of several reports)
                    outdated = _keep_latest(readings[number], of_type, value_type, process_key(view.resource), view.profile)
            if outdated:
                continue
            value = sample_value(view)
            span = _span_key(view, spans)
            if view.resource is not last_resource:
                last_resource = view.resource
                resources[process_key(view.resource)] = comparable_attributes(view.resource)
            stack = stack_of(view.frames, names.of_stack(view.sample.stack_index))
            if memory:
                stack = stack[:len(stack) - allocator_depth(names.of_stack(view.sample.stack_index))]
            of_type[process_key(view.resource)][span][stack] += value
            taken[value_type] += value
        with self._lock:
            self._expire(int(self._clock() // self._slice_seconds))
            newest = None
            for number in sorted(counts):
                newest = self._slice(number)
                self._add_capped(newest, counts[number])
            if newest is not None:
                newest.resources.update(resources)
        return taken

    def _slice_number(self, profile: profiles_pb2.Profile, now_slice: int) -> int:
        """The slice of the middle of the time the profile covers (wall clock), not of its
        arrival: reports a second apart that arrive with jitter would put two in one slice and
        none in the next, a spike and a hole in the page's timeline. A time outside the window (a
        clock set otherwise than ours, a profile held up longer than the window on its way) is not
        believed: the profile is counted where it arrives, as one that says no time."""
        if profile.time_unix_nano:
            middle = (profile.time_unix_nano + profile.duration_nano / 2) / 1e9
            number = int((middle - self._wall_offset) // self._slice_seconds)
            if self._oldest_kept(now_slice) <= number <= now_slice:
                return number
        return now_slice

    def _slice(self, number: int) -> "_Slice":
        """The slice numbered ``number``, made in its place if there is none."""
        for index in range(len(self._slices) - 1, -1, -1):  # (from the newest: nearly always that one)
            found = self._slices[index]
            if found.number == number:
                return found
            if found.number < number:
                self._slices.insert(index + 1, made := _Slice(number))
                return made
        self._slices.appendleft(made := _Slice(number))
        return made

    @staticmethod
    def _add_capped(slice_: "_Slice", counts: Totals) -> None:
        """Into the slice, a span past its MAX_SPANS_PER_SLICE kept under its attributes alone; a
        snapshot type's reading replacing the process's earlier one."""
        for value_type, processes in counts.items():
            for key, by_span in processes.items():
                if is_snapshot(value_type):
                    slice_.totals[value_type].pop(key, None)
                for span, stacks in by_span.items():
                    if span.span_id and (span.trace_id, span.span_id) not in slice_.span_ids:
                        if len(slice_.span_ids) >= MAX_SPANS_PER_SLICE:
                            slice_.spans_cut += 1
                            span = SpanKey("", "", span.attributes)
                        else:
                            slice_.span_ids.add((span.trace_id, span.span_id))
                    slice_.totals[value_type][key][span].update(stacks)

    @property
    def spans_cut(self) -> int:
        """Spans kept without their ids in the window's slices (a span cut in two slices, or for
        two sample types, counts twice)."""
        with self._lock:
            return sum(slice_.spans_cut for slice_ in self._slices)

    def totals(self) -> Totals:
        """Stack values per sample type, process and span over the window, summed over its slices
        (a snapshot type's: each process's latest reading)."""
        with self._lock:
            self._expire(int(self._clock() // self._slice_seconds))
            totals = _empty()
            for slice_ in self._slices:
                _add_into(totals, slice_.totals)
        return {value_type: {key: dict(by_span) for key, by_span in processes.items()} for value_type, processes in totals.items()}

    def segments(self) -> list[Segment]:
        """The window's slices with samples, oldest first, each with its wall-clock seconds: the
        steps of the page's timeline and of the time ranges it selects and compares."""
        with self._lock:
            self._expire(int(self._clock() // self._slice_seconds))
            slices = list(self._slices)
            merged_totals = [{value_type: {key: merged(by_span) for key, by_span in processes.items()}
                              for value_type, processes in slice_.totals.items()} for slice_ in slices]
        seconds, offset = self._slice_seconds, self._wall_offset
        return [Segment(round(offset + slice_.number * seconds, 3), round(offset + (slice_.number + 1) * seconds, 3), totals)
                for slice_, totals in zip(slices, merged_totals)]

    def resources(self) -> dict[ProcessKey, dict[str, str]]:
        """Each process's resource attributes as it last reported them in the window."""
        with self._lock:
            latest: dict[ProcessKey, dict[str, str]] = {}
            for slice_ in self._slices:
                latest.update(slice_.resources)
        return latest

    def _oldest_kept(self, now_slice: int) -> int:
        return now_slice - int(self.window_seconds // self._slice_seconds) + 1

    def _expire(self, now_slice: int) -> None:
        oldest_kept = self._oldest_kept(now_slice)
        while self._slices and self._slices[0].number < oldest_kept:
            self._slices.popleft()


class _Slice:
    __slots__ = ("number", "totals", "span_ids", "spans_cut", "resources")

    def __init__(self, number: int) -> None:
        self.number = number
        self.totals: Totals = _empty()
        self.span_ids: set[tuple[str, str]] = set()  # (trace id, span id) of the spans it keeps
        self.spans_cut = 0  # spans past its cap, kept without their ids
        self.resources: dict[ProcessKey, dict[str, str]] = {}  # as each process last reported them


def _empty() -> Totals:
    return collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(collections.Counter)))


def _add_into(target: Totals, counts: Totals) -> None:
    """``counts`` into ``target``, a snapshot type's replacing a process's reading there."""
    for value_type, processes in counts.items():
        for key, by_span in processes.items():
            if is_snapshot(value_type):
                target[value_type].pop(key, None)
            for span, stacks in by_span.items():
                target[value_type][key][span].update(stacks)


def _keep_latest(readings: dict, of_type: dict, value_type: SampleType, key: ProcessKey, profile: profiles_pb2.Profile) -> bool:
    """For a profile of a snapshot type: whether it is an older reading of its process than one
    already counted (to be skipped); a newer one drops what was counted of the older."""
    at = profile.time_unix_nano + profile.duration_nano
    kept = readings.get((value_type, key))
    if kept is not None and at < kept:
        return True
    if kept is not None and at > kept:
        of_type.pop(key, None)
    readings[(value_type, key)] = at
    return False


def _span_key(view, known: dict[tuple, SpanKey]) -> SpanKey:
    """The sample's SpanKey, one object per distinct link and attributes (views share them)."""
    attributes = tuple(sorted((key, str(value)) for key, value in view.attributes.items() if not key.startswith("thread.")))
    if view.link is None and not attributes:
        return NO_SPAN
    cache_key = (view.link, attributes)
    span = known.get(cache_key)
    if span is None:
        trace_id, span_id = (view.link[0].hex(), view.link[1].hex()) if view.link is not None else ("", "")
        span = known[cache_key] = SpanKey(trace_id, span_id, attributes)
    return span


def process_key(resource: dict) -> ProcessKey:
    """A process by its pid, named by its executable, and by the service it says it is when that
    differs ("python3.11 (checkout)": an SDK's service.name)."""
    pid = resource.get("process.pid")
    executable, service = resource.get("process.executable.name"), resource.get("service.name")
    name = executable or service or "unknown"
    if executable and service and service != executable:
        name = f"{executable} ({service})"
    return ProcessKey(pid if isinstance(pid, int) else None, str(name), str(resource.get("container.id", "")))


def comparable_attributes(resource: dict) -> dict[str, str]:
    """The resource attributes two sets of processes can be compared by (service.version,
    container.id, k8s.pod.name...): scalar values, as text of bounded length, but those that
    name one process (its pid, its command line)."""
    return {key: str(value)[:MAX_RESOURCE_VALUE] for key, value in resource.items()
            if key not in PER_PROCESS_ATTRIBUTES and isinstance(value, (str, int, float, bool))}


def stack_of(frames: list[Frame], names: tuple[str, ...]) -> Stack:
    """Frames are stored leaf first; a flame graph grows from the root. ``names`` are the frames'
    (``FrameNames``), so a frame with no symbol is named by its file and address."""
    return tuple((name, frame.frame_type) for name, frame in zip(reversed(names), reversed(frames)))
