"""The debug exporter: what flows through a pipeline, printed for a person to read.

basic     one line per export: how many resources and items.
normal    a line per resource with its attributes, a line per profile with its sample type and
          count, and the profile's top functions by self value (CPU samples; for off-CPU time,
          the function each thread waited in: see _waited_in; for memory, the top allocation
          sites: the code that called the allocator, see allocation_sites.py; for lock_wake, the
          code that woke the waiters: see _woken_by).
detailed  every sample with its attributes (and the trace and span it ran in, when it has one), then
          its stack, one frame per line, leaf first.

Each profile is shown under its own sample type, and its values in that type's unit (off-CPU
time as ms and s, memory as KiB and MiB): values of different types are never added together.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from typing import Any, TextIO

from google.protobuf import text_format

from pycollector import logs
from pycollector.component import Component, StartError
from pycollector.pdata import (GOROUTINES, LOCK_WAKE, MARKER_FRAME_TYPE, OFF_CPU_TIME, THREADS, display_order, is_memory, is_snapshot, item_count, iter_samples,
                               resource_entries, sample_count, sample_type, signal_of)
from pycollector.pdata.attributes import to_dict
from pycollector.text import printable

from exporters.allocation_sites import allocator_depth
from exporters.debug.config import DebugConfig
from exporters.debug.values import describe_total, format_value
from exporters.profiles import sample_value, with_source_line


class _LogSampler:
    """Per one-second tick: let the first ``initial`` through, then every ``thereafter``-th."""

    def __init__(self, initial: int, thereafter: int):
        self.initial, self.thereafter = initial, thereafter
        self._tick, self._count = -1, 0
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            tick = int(time.monotonic())
            if tick != self._tick:
                self._tick, self._count = tick, 0
            self._count += 1
            if self._count <= self.initial:
                return True
            return self.thereafter > 0 and (self._count - self.initial) % self.thereafter == 0


class DebugExporter(Component):
    def __init__(self, settings, config: DebugConfig, output: TextIO | None = None):
        self.log = settings.logger
        self.config = config
        self.output = output
        self._sampler = _LogSampler(config.sampling_initial, config.sampling_thereafter)
        self._lock = threading.Lock()
        self._own_streams: list[TextIO] = []  # use_internal_logger false: where the text goes
        self._opened: list[TextIO] = []

    def start(self, host) -> None:
        if self.config.use_internal_logger:
            return
        for path in self.config.output_paths or ["stdout"]:
            if path in ("stdout", "stderr"):
                self._own_streams.append(self.output or getattr(sys, path))
                continue
            try:
                stream = open(path, "a", encoding="utf-8")
            except OSError as error:
                raise StartError(f"cannot open output path {path}: {error.strerror}") from error
            self._opened.append(stream)
            self._own_streams.append(stream)

    def shutdown(self) -> None:
        with self._lock:
            for stream in self._opened:
                stream.close()
            self._opened, self._own_streams = [], []

    def consume(self, data: Any) -> None:
        if not self._sampler.allow():
            return
        signal = signal_of(data)
        summary = _summary(signal, data)
        # Names in the data are whatever a sampled process chose: no escape sequence reaches the console.
        body = "" if self.config.verbosity == "basic" else printable(_render(signal, data, self.config))
        with self._lock:
            if self._own_streams:
                # Plain text, as Go's console logger writes it: the summary, then the body.
                text = signal.capitalize() + " " + " ".join(f"{key}={value}" for key, value in summary.items()) + "\n" + body
                for stream in self._own_streams:
                    stream.write(text if text.endswith("\n") else text + "\n")
                    stream.flush()
            elif logs.current_format() == "json" or not body:
                self.log.info(signal.capitalize(), **summary, **({"text": body} if body else {}))
            else:
                self.log.info(signal.capitalize(), **summary)
                stream = self.output or sys.stderr
                stream.write(body if body.endswith("\n") else body + "\n")
                stream.flush()


def _summary(signal: str, data: Any) -> dict[str, int]:
    resources = len(resource_entries(data))
    if signal == "profiles":
        profiles = sum(len(scope.profiles) for rp in data.resource_profiles for scope in rp.scope_profiles)
        return {"resource_profiles": resources, "profiles": profiles, "samples": sample_count(data)}
    return {"resources": resources, "items": item_count(data)}


def _render(signal: str, data: Any, config: DebugConfig) -> str:
    if signal == "profiles":
        return _render_profiles(data, config)
    if config.verbosity == "detailed":
        return text_format.MessageToString(data, as_utf8=True)
    return _render_resources(signal, data)


def _attributes_line(attributes: dict) -> str:
    return " ".join(f"{key}={_show(value)}" for key, value in attributes.items())


def _show(value: Any) -> str:
    text = str(value)
    return f'"{text}"' if isinstance(value, str) and (" " in text or not text) else text


def _render_resources(signal: str, data: Any) -> str:
    lines = []
    for index, resource_data in enumerate(resource_entries(data)):
        lines.append(f"Resource #{index} {_attributes_line(to_dict(resource_data.resource.attributes))}")
    return "\n".join(lines)


def _render_profiles(data: Any, config: DebugConfig) -> str:
    """Group samples back under their resource and profile, as the message nests them.

    ``normal`` lists the busiest resources first, so the top of each block answers "what is using
    the CPU"; ``detailed`` keeps the message's order. ``#N`` is always the position in the message.
    """
    detailed = config.verbosity == "detailed"
    lines: list[str] = []
    by_profile: dict[int, list] = collections.defaultdict(list)
    for view in iter_samples(data):
        by_profile[id(view.profile)].append(view)

    resources = list(enumerate(data.resource_profiles))
    if not detailed:
        weights = _weights(data, by_profile)
        resources.sort(key=lambda entry: weights[entry[0]], reverse=True)
    for r_index, resource_profiles in resources:
        resource = to_dict(resource_profiles.resource.attributes)
        lines.append(f"ResourceProfiles #{r_index}  {_attributes_line(resource)}")
        for scope_profiles in resource_profiles.scope_profiles:
            for p_index, profile in enumerate(scope_profiles.profiles):
                views = by_profile.get(id(profile), [])
                lines.append(_profile_line(data, profile, p_index, views))
                if detailed:
                    lines.extend(_sample_lines(views))
                else:
                    lines.extend(_top_functions(views, config.top_functions, sample_type(data, profile)))
                    lines.extend(_top_language_functions(views, config.top_functions, sample_type(data, profile)))
    return "\n".join(lines)


def _weights(data: Any, by_profile: dict[int, list]) -> list[tuple[int, ...]]:
    """Per resource, its total of each sample type, in the order types are shown (CPU samples
    first, then off-CPU time, in-use bytes...: display_order). Compared as tuples, resources are
    ordered by CPU samples and only a tie looks at the next type, so no count is ever weighed
    against nanoseconds or bytes."""
    totals: list[collections.Counter] = []
    types: dict[tuple[str, str], None] = {}  # ordered, without repeats
    for resource_profiles in data.resource_profiles:
        total: collections.Counter = collections.Counter()
        for scope in resource_profiles.scope_profiles:
            for profile in scope.profiles:
                value_type = sample_type(data, profile)
                types.setdefault(value_type)
                total[value_type] += sum(sample_value(view) for view in by_profile.get(id(profile), ()))
        totals.append(total)
    ranked = sorted(types, key=display_order)
    return [tuple(total[value_type] for value_type in ranked) for total in totals]


def _profile_line(data: Any, profile: Any, index: int, views: list) -> str:
    kind, unit = sample_type(data, profile)
    total = describe_total(sum(sample_value(view) for view in views), (kind, unit))
    strings = data.dictionary.string_table
    period = ""
    if profile.period:
        period_kind, period_unit = (strings[index] if index < len(strings) else "" for index in (profile.period_type.type_strindex, profile.period_type.unit_strindex))
        period = f"  period={profile.period} {period_kind}/{period_unit}"
    # The live heap's values are a reading at the report, not a count over the interval.
    duration = f"  duration={profile.duration_nano / 1e9:.1f}s" if profile.duration_nano and not is_snapshot((kind, unit)) else ""
    if is_memory((kind, unit)):  # a sample is a stack here, not one sampled allocation
        return f"  Profile #{index}  {kind}/{unit}  stacks={len(views)}  total={total}{period}{duration}"
    return f"  Profile #{index}  {kind}/{unit}  samples={len(views)}  total={total}{period}{duration}"


def _top_functions(views: list, limit: int, value_type: tuple[str, str]) -> list[str]:
    """The functions the samples were in (leaf frame; for off-CPU time ``_waited_in``; for memory
    the allocation site, and for lock_wake the waker's code (``_woken_by``), under a heading saying
    so), heaviest first, with their share, values in the type's unit.

    Addresses with no symbol (a stripped binary) are summed per binary: one line saying where
    the time went, rather than one line per address.
    """
    frame_of = (_waited_in if value_type in (OFF_CPU_TIME, THREADS) else _woken_by if value_type == LOCK_WAKE else _goroutine_site if value_type == GOROUTINES
                else _allocation_site if is_memory(value_type) else _leaf)
    unit = value_type[1]
    self_values: collections.Counter = collections.Counter()
    for view in views:
        self_values[_leaf_label(frame_of(view.frames))] += sample_value(view)
    total = sum(self_values.values()) or 1
    lines = []
    if is_memory(value_type) and self_values:
        held = " of the memory in use" if is_snapshot(value_type) else ""
        lines.append(f"    Top allocation sites{held} (the code that called the allocator):")
    if value_type == LOCK_WAKE and self_values:
        lines.append("    Top wakers (the code that woke the waiters: who held the lock):")
    for name, value in self_values.most_common(limit):
        lines.append(f"    {format_value(value, unit):>8}  {100 * value / total:5.1f}%  {name}")
    if len(self_values) > limit:
        rest = total - sum(value for _, value in self_values.most_common(limit))
        lines.append(f"    {format_value(rest, unit):>8}  {100 * rest / total:5.1f}%  ({len(self_values) - limit} more functions)")
    return lines


# Frame types of code an interpreter or a JIT runs, and how its developers call the language.
LANGUAGES = {"cpython": "Python", "jvm": "Java", "v8js": "JavaScript"}
NATIVE_KINDS = frozenset({"", "native", "kernel", MARKER_FRAME_TYPE})


def _top_language_functions(views: list, limit: int, value_type: tuple[str, str]) -> list[str]:
    """For a process that runs interpreted or JIT code: its functions as its developer reads
    them, the innermost frame of that language in each sample (Python ``function file:line``),
    heaviest first, with their share of the profile's total: where the native leaf says
    ``_PyEval_EvalFrameDefault``, this says ``spin_heavy (known_split.py:16)``. A function is one
    row whatever line it was on, named with the line most of its samples were at. For lock_wake,
    the innermost of the waker's frames: the code that woke the waiter."""
    frames_of = _waker_frames if value_type == LOCK_WAKE else lambda frames: frames
    kinds = sorted({frame.frame_type for view in views for frame in frames_of(view.frames)} - NATIVE_KINDS)
    unit = value_type[1]
    total = sum(sample_value(view) for view in views) or 1
    lines = []
    for kind in kinds:
        values: collections.Counter = collections.Counter()
        at_line: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
        for view in views:
            frame = next((frame for frame in frames_of(view.frames) if frame.frame_type == kind), None)
            if frame is not None:
                function = (frame.function or f"0x{frame.address:x}", frame.filename)
                values[function] += sample_value(view)
                at_line[function][frame.line] += sample_value(view)
        language = LANGUAGES.get(kind, kind)
        if is_memory(value_type):
            lines.append(f"    {language} allocation sites (the innermost {language} frame of each allocation):")
        elif value_type == LOCK_WAKE:
            lines.append(f"    {language} wakers (the innermost {language} frame of each waker):")
        else:
            lines.append(f"    {language} functions (the innermost {language} frame of each sample):")
        for (function, filename), value in values.most_common(limit):
            name = with_source_line(function, filename, at_line[(function, filename)].most_common(1)[0][0])
            lines.append(f"    {format_value(value, unit):>8}  {100 * value / total:5.1f}%  {name}")
        outside = total - sum(values.values())
        if outside > 0:
            lines.append(f"    {format_value(outside, unit):>8}  {100 * outside / total:5.1f}%  (no {language} frame)")
    return lines


def _leaf(frames: list):
    return frames[0] if frames else None


def _allocation_site(frames: list):
    """Where an allocation was asked for: the first frame past the allocator's (the sampler's
    frames and malloc, operator new...: allocation_sites.py)."""
    return frames[allocator_depth([frame.function for frame in frames])] if frames else None


def _waited_in(frames: list):
    """Where a thread waited off the CPU: the innermost frame outside the kernel (the program's
    call that blocked). Every off-CPU stack starts in the scheduler, so its leaf would say the
    same for all of them; for a thread with only kernel frames (a kernel thread), the innermost
    frame that is not the scheduler's (worker_thread, rcu_gp_kthread, ...)."""
    user = next((frame for frame in frames if frame.frame_type != "kernel"), None)
    if user is not None:
        return user
    return next((frame for frame in frames if "schedule" not in frame.function), _leaf(frames))


def _woken_by(frames: list):
    """Who held the lock a lock_wake sample waited for: of the waker's frames (before the marker,
    root first: receivers/profiling/waits/wakers.py), the innermost outside the file that woke the
    waiter (pthread_mutex_unlock's caller rather than libc; a Python function rather than
    libpython's drop_gil); the marker itself when the waker has no user frames (an interrupt, a
    waker not seen)."""
    at = next((index for index, frame in enumerate(frames) if frame.frame_type == MARKER_FRAME_TYPE), None)
    if at is None:
        return _leaf(frames)
    waker = [frame for frame in _waker_frames(frames) if frame.frame_type != "kernel"]
    if not waker:
        return frames[at]
    return next((frame for frame in waker if frame.mapping_filename != waker[0].mapping_filename), waker[0])


def _waker_frames(frames: list) -> list:
    """A lock_wake sample's waker's frames, leaf first (they stand before the marker, root first)."""
    at = next((index for index, frame in enumerate(frames) if frame.frame_type == MARKER_FRAME_TYPE), 0)
    return list(reversed(frames[:at]))


def _goroutine_site(frames: list):
    """Where a goroutine sits: the innermost frame outside Go's runtime (the program's call that
    blocked: every parked goroutine's leaf is runtime.gopark), else its leaf."""
    return next((frame for frame in frames if frame.function and not frame.function.startswith("runtime.")), _leaf(frames))


def _leaf_label(leaf) -> str:
    if leaf is None:
        return "(no frames)"
    binary = leaf.mapping_filename.rsplit("/", 1)[-1]
    if not leaf.function:
        return f"(no symbol)  [{binary}]" if binary else f"0x{leaf.address:x}"
    function = with_source_line(leaf.function, leaf.filename, leaf.line)
    return f"{function}  [{binary}]" if binary else function


def _sample_lines(views: list) -> list[str]:
    lines = []
    for s_index, view in enumerate(views):
        timestamps = f"  timestamps={len(view.sample.timestamps_unix_nano)}" if view.sample.timestamps_unix_nano else ""
        link = f"  trace_id={view.link[0].hex()} span_id={view.link[1].hex()}" if view.link is not None else ""
        lines.append(f"    Sample #{s_index}  values={list(view.values)}{timestamps}{link}  {_attributes_line(view.attributes)}")
        for frame in view.frames:
            parts = [f"Instrumentation: {frame.frame_type or 'unknown'}", f"Function: {frame.function or f'0x{frame.address:x}'}"]
            if frame.filename:
                parts.append(f"File: {frame.filename}")
            if frame.line:
                parts.append(f"Line: {frame.line}")
            if frame.mapping_filename and not frame.filename:
                parts.append(f"Mapping: {frame.mapping_filename}")
            lines.append("      " + ", ".join(parts))
    return lines

