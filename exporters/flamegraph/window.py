"""The last N minutes of samples, as stack counts per sample type and process.

Samples are added to the bucket of the current time slice; a slice is a sixtieth of the window
(at least a second), so the window slides in small steps and memory is bounded by the number of
distinct stacks per slice, however often exports arrive.

Each sample type (``samples/count`` from CPU profilers, ``off_cpu/nanoseconds`` from off-CPU
profiling, bytes allocated...) is kept apart, keyed by (type, unit): the page shows one type at a
time, as adding values of different units into one graph would mean nothing.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, NamedTuple

from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.pdata import Frame, iter_samples, sample_type

from exporters.profiles import FrameNames, sample_value

SLICES_PER_WINDOW = 60
MIN_SLICE_SECONDS = 1.0

# A profile's (type, unit), e.g. ("samples", "count") or ("off_cpu", "nanoseconds").
SampleType = tuple[str, str]
# A stack, root first: (frame name, frame type) per frame.
Stack = tuple[tuple[str, str], ...]


class ProcessKey(NamedTuple):
    pid: int | None
    name: str
    container: str


# What one slice, or the whole window, holds: stack values per sample type and process.
Totals = dict[SampleType, dict[ProcessKey, collections.Counter]]


class ProfileWindow:
    def __init__(self, window_seconds: float, clock: Callable[[], float] = time.monotonic):
        self.window_seconds = window_seconds
        self._slice_seconds = max(MIN_SLICE_SECONDS, window_seconds / SLICES_PER_WINDOW)
        self._clock = clock
        self._slices: collections.deque[tuple[int, Totals]] = collections.deque()
        self._lock = threading.Lock()

    def add(self, data: profiles_pb2.ProfilesData) -> collections.Counter:
        """Count ``data``'s samples into the current slice; returns the value taken per sample
        type (values of different types are never summed)."""
        counts: Totals = _empty()
        names = FrameNames(data.dictionary)
        taken: collections.Counter = collections.Counter()
        current_profile, of_type = None, None
        for view in iter_samples(data):
            if view.profile is not current_profile:  # samples come profile by profile
                current_profile = view.profile
                value_type = sample_type(data, view.profile)
                of_type = counts[value_type]
            value = sample_value(view)
            of_type[process_key(view.resource)][stack_of(view.frames, names.of_stack(view.sample.stack_index))] += value
            taken[value_type] += value
        with self._lock:
            now_slice = int(self._clock() // self._slice_seconds)
            if not self._slices or self._slices[-1][0] != now_slice:
                self._slices.append((now_slice, _empty()))
            _add_into(self._slices[-1][1], counts)
            self._expire(now_slice)
        return taken

    def totals(self) -> Totals:
        """Stack values per sample type and process over the window, summed over its slices."""
        with self._lock:
            self._expire(int(self._clock() // self._slice_seconds))
            totals = _empty()
            for _, counts in self._slices:
                _add_into(totals, counts)
        return {value_type: dict(processes) for value_type, processes in totals.items()}

    def _expire(self, now_slice: int) -> None:
        oldest_kept = now_slice - int(self.window_seconds // self._slice_seconds) + 1
        while self._slices and self._slices[0][0] < oldest_kept:
            self._slices.popleft()


def _empty() -> Totals:
    return collections.defaultdict(lambda: collections.defaultdict(collections.Counter))


def _add_into(target: Totals, counts: Totals) -> None:
    for value_type, processes in counts.items():
        for key, stacks in processes.items():
            target[value_type][key].update(stacks)


def process_key(resource: dict) -> ProcessKey:
    pid = resource.get("process.pid")
    name = resource.get("process.executable.name") or resource.get("service.name") or "unknown"
    return ProcessKey(pid if isinstance(pid, int) else None, str(name), str(resource.get("container.id", "")))


def stack_of(frames: list[Frame], names: tuple[str, ...]) -> Stack:
    """Frames are stored leaf first; a flame graph grows from the root. ``names`` are the frames'
    (``FrameNames``), so a frame with no symbol is named by its file and address."""
    return tuple((name, frame.frame_type) for name, frame in zip(reversed(names), reversed(frames)))
