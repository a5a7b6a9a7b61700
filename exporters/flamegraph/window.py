"""The last N minutes of CPU samples, as stack counts per process.

Samples are added to the bucket of the current time slice; a slice is a sixtieth of the window
(at least a second), so the window slides in small steps and memory is bounded by the number of
distinct stacks per slice, however often exports arrive.

Only ``samples/count`` profiles are kept (what CPU profilers send): adding counts of another
sample type (bytes allocated, wall time) into the same graph would mix units.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, NamedTuple

from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.pdata import Frame, iter_samples, sample_type

from exporters.profiles import FrameNames, sample_value

SAMPLES = ("samples", "count")
SLICES_PER_WINDOW = 60
MIN_SLICE_SECONDS = 1.0

# A stack, root first: (frame name, frame type) per frame.
Stack = tuple[tuple[str, str], ...]


class ProcessKey(NamedTuple):
    pid: int | None
    name: str
    container: str


class ProfileWindow:
    def __init__(self, window_seconds: float, clock: Callable[[], float] = time.monotonic):
        self.window_seconds = window_seconds
        self._slice_seconds = max(MIN_SLICE_SECONDS, window_seconds / SLICES_PER_WINDOW)
        self._clock = clock
        self._slices: collections.deque[tuple[int, dict[ProcessKey, collections.Counter]]] = collections.deque()
        self._lock = threading.Lock()

    def add(self, data: profiles_pb2.ProfilesData) -> int:
        """Count ``data``'s CPU samples into the current slice; returns how many were taken."""
        counts: dict[ProcessKey, collections.Counter] = collections.defaultdict(collections.Counter)
        names = FrameNames(data.dictionary)
        taken, current_profile, wanted = 0, None, False
        for view in iter_samples(data):
            if view.profile is not current_profile:  # samples come profile by profile
                current_profile = view.profile
                wanted = sample_type(data, view.profile) == SAMPLES
            if not wanted:
                continue
            count = sample_value(view)
            counts[process_key(view.resource)][stack_of(view.frames, names.of_stack(view.sample.stack_index))] += count
            taken += count
        with self._lock:
            now_slice = int(self._clock() // self._slice_seconds)
            if not self._slices or self._slices[-1][0] != now_slice:
                self._slices.append((now_slice, collections.defaultdict(collections.Counter)))
            current = self._slices[-1][1]
            for key, stacks in counts.items():
                current[key].update(stacks)
            self._expire(now_slice)
        return taken

    def totals(self) -> dict[ProcessKey, collections.Counter]:
        """Stack counts per process over the window, summed over its slices."""
        with self._lock:
            self._expire(int(self._clock() // self._slice_seconds))
            totals: dict[ProcessKey, collections.Counter] = collections.defaultdict(collections.Counter)
            for _, processes in self._slices:
                for key, stacks in processes.items():
                    totals[key].update(stacks)
        return dict(totals)

    def _expire(self, now_slice: int) -> None:
        oldest_kept = now_slice - int(self.window_seconds // self._slice_seconds) + 1
        while self._slices and self._slices[0][0] < oldest_kept:
            self._slices.popleft()


def process_key(resource: dict) -> ProcessKey:
    pid = resource.get("process.pid")
    name = resource.get("process.executable.name") or resource.get("service.name") or "unknown"
    return ProcessKey(pid if isinstance(pid, int) else None, str(name), str(resource.get("container.id", "")))


def stack_of(frames: list[Frame], names: tuple[str, ...]) -> Stack:
    """Frames are stored leaf first; a flame graph grows from the root. ``names`` are the frames'
    (``FrameNames``), so a frame with no symbol is named by its file and address."""
    return tuple((name, frame.frame_type) for name, frame in zip(reversed(names), reversed(frames)))
