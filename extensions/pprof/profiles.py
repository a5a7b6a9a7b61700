"""What the pprof extension answers with: pprof files and text stack dumps of this process.

Samples become an OTLP ``ProfilesData`` built with ``pycollector.pdata.ProfilesBuilder`` (Python
frames typed ``profile.frame.type: cpython``, functions with their file and first line, locations
with the line, as the profiling receiver writes CPython frames), and that becomes pprof through
the pprof exporter's converter: one path writes pprof files in this project. The CPU profile is an
OTLP ``samples/count`` profile with period ``cpu/nanoseconds``, which the converter turns into
Go's CPU profile types ``[samples/count, cpu/nanoseconds]``.
"""

from __future__ import annotations

import collections
import gzip
import os
import sys
import traceback
from pathlib import Path
from types import CodeType

from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.pdata import ProfilesBuilder, sample_type, to_dict

from exporters.pprof.convert import PprofBuilder, pprof_sample_types, to_pprof
from extensions.pprof.sampler import Recording, ThreadStack, stack_of

FRAME_TYPE = "cpython"  # profile.frame.type, as the profiling receiver and the eBPF profiler name them
SCOPE_NAME = "pycollector.extensions.pprof"
CPU_PROFILE = (("samples", "count"), ("cpu", "nanoseconds"))
# Go's goroutine profile counts goroutines by stack; this one counts Python threads.
THREADS_PROFILE = (("threads", "count"), ("threads", "count"))


def process_resource() -> dict:
    try:
        executable = os.readlink("/proc/self/exe")
    except OSError:
        executable = sys.executable
    return {"process.pid": os.getpid(), "process.executable.name": Path(executable).name, "process.executable.path": executable}


def cpu_profile(recording: Recording, period_ns: int) -> bytes:
    """A gzipped pprof CPU profile of ``recording``, each sample ``period_ns`` of CPU."""
    builder, profile = _new_profile(CPU_PROFILE, period_ns, recording.start_unix_nano,
                                    max(recording.end_unix_nano - recording.start_unix_nano, 0))
    locations = _Locations(builder)
    for ((native_id, name), stack), count in recording.counts.items():
        builder.sample(profile, locations.stack(stack), [count], {"thread.id": native_id, "thread.name": name})
    return gzipped_pprof(builder.data)


def threads_profile(threads: list[ThreadStack], now_unix_nano: int) -> bytes:
    """A gzipped pprof profile with one sample per thread at its current stack (Go's goroutine
    profile, ``/debug/pprof/goroutine``)."""
    builder, profile = _new_profile(THREADS_PROFILE, 1, now_unix_nano, 0)
    locations = _Locations(builder)
    for thread in threads:
        attributes = {"thread.name": thread.name} | ({"thread.id": thread.native_id} if thread.native_id is not None else {})
        builder.sample(profile, locations.stack(stack_of(thread.frame)), [1], attributes)
    return gzipped_pprof(builder.data)


def gzipped_pprof(data: profiles_pb2.ProfilesData) -> bytes:
    """``data`` (one profile) as a gzipped pprof file, through the pprof exporter's converter."""
    converted = to_pprof(data, merged=False)
    if converted:
        message = converted[0].profile
    else:  # no samples, which the converter makes no file of: an empty profile of the same types
        profile = data.resource_profiles[0].scope_profiles[0].profiles[0]
        strings = data.dictionary.string_table
        period_type = (strings[profile.period_type.type_strindex], strings[profile.period_type.unit_strindex])
        resource = to_dict(data.resource_profiles[0].resource.attributes)
        message = PprofBuilder(data.dictionary, pprof_sample_types(sample_type(data, profile), period_type, profile.period), period_type,
                               profile.period).finish(
            time_nanos=profile.time_unix_nano,
            duration_nanos=profile.duration_nano,
            comments=[f"{key}={value}" for key, value in resource.items()],
            main_executable="",
        )
    return gzip.compress(message.SerializeToString(), mtime=0)


def stack_dump(threads: list[ThreadStack], grouped: bool) -> str:
    """Every thread's stack as text, Python's traceback format (most recent call last): Go's
    ``goroutine?debug=2`` (one entry per thread) or, ``grouped``, ``?debug=1`` (threads with the
    same stack together, most common first)."""
    if not grouped:
        return "\n".join(f"{_thread_title(thread)}:\n{''.join(traceback.format_stack(thread.frame))}" for thread in threads)
    by_stack: dict[str, list[ThreadStack]] = collections.defaultdict(list)
    for thread in threads:
        by_stack["".join(traceback.format_stack(thread.frame))].append(thread)
    groups = sorted(by_stack.items(), key=lambda item: -len(item[1]))
    return f"threads: total {len(threads)}\n\n" + "\n".join(
        f"{len(members)} @ {', '.join(_thread_title(thread) for thread in members)}\n{stack}" for stack, members in groups
    )


def _thread_title(thread: ThreadStack) -> str:
    number = "?" if thread.native_id is None else str(thread.native_id)
    return f'thread {number} "{thread.name}"' + (" daemon" if thread.daemon else "")


def _new_profile(types: tuple, period: int, time_unix_nano: int, duration_nano: int) -> tuple[ProfilesBuilder, profiles_pb2.Profile]:
    builder = ProfilesBuilder()
    scope = builder.scope_profiles(builder.resource_profiles(process_resource()), name=SCOPE_NAME)
    value_type, period_type = types
    profile = builder.profile(scope, sample_type=value_type, period_type=period_type, period=period,
                              time_unix_nano=time_unix_nano, duration_nano=duration_nano)
    return builder, profile


class _Locations:
    """A location per (code object, line), interned once per profile."""

    def __init__(self, builder: ProfilesBuilder):
        self._builder = builder
        self._memo: dict[tuple[CodeType, int], int] = {}

    def stack(self, stack) -> int:
        return self._builder.stack([self._location(code, line) for code, line in stack])

    def _location(self, code: CodeType, line: int) -> int:
        index = self._memo.get((code, line))
        if index is None:
            name = getattr(code, "co_qualname", code.co_name)  # Class.method, 3.11+
            function = self._builder.function(name, system_name=name, filename=code.co_filename, start_line=code.co_firstlineno)
            index = self._memo[(code, line)] = self._builder.location(0, 0, [(function, line, 0)], attributes={"profile.frame.type": FRAME_TYPE})
        return index
