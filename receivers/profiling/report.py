"""One interval of counted stacks -> one OTLP ``ProfilesData``.

The shape follows what opentelemetry-ebpf-profiler sends, so backends treat our data the same:
one ResourceProfiles per process (``process.pid``, ``process.executable.name``,
``process.executable.path``, ``container.id``, ``host.name``, and the resource an OpenTelemetry
SDK in the process publishes: ``service.name``...), one Profile with sample type
``samples/count`` and period ``cpu/nanoseconds`` and, with off-CPU profiling, a second with sample
type ``off_cpu/nanoseconds`` (no period: each value is the time a thread spent away from the CPU
there), and with memory profiling ``alloc_objects/count`` and ``alloc_space/bytes`` (and
``inuse_objects/count``, ``inuse_space/bytes`` for the live heap): SAMPLE_KINDS, samples carrying ``thread.id`` and
``thread.name``, locations carrying ``profile.frame.type`` and mappings carrying the file's ids
(``process.executable.build_id.gnu``, ``.go`` and ``.htlhash``, which every file has); the
resource and scope name the semantic conventions release these names are from. Stacks are leaf first: kernel frames (when the sample was
taken in the kernel) above the user frames that called into it; an off-CPU stack starts at the
scheduler (``__schedule``), where the thread left the CPU.
"""

from __future__ import annotations

import collections
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.pdata import (ALLOC_OBJECTS, ALLOC_SPACE, CPU_SAMPLES, CPU_TIME, GOROUTINES, INUSE_OBJECTS, INUSE_SPACE, IO_WAIT, LOCK_WAIT,
                               LOCK_WAKE, OFF_CPU_TIME, THREADS, ProfilesBuilder, is_snapshot)

from receivers.profiling.kernel.samples import (ORIGIN_ALLOC_OBJECTS, ORIGIN_ALLOC_SPACE, ORIGIN_CPU, ORIGIN_GOROUTINES, ORIGIN_INUSE_OBJECTS,
                                                 ORIGIN_INUSE_SPACE, ORIGIN_IO_WAIT, ORIGIN_LOCK_WAIT, ORIGIN_LOCK_WAKE, ORIGIN_OFF_CPU, ORIGIN_THREADS,
                                                 Interval, StackCount)
from receivers.profiling.otel_context.contexts import ProcessContexts
from receivers.profiling.processes.proc import ProcessInfo
from receivers.profiling.processes.table import IncarnationGone, ProcessTable
from receivers.profiling.python.interpreters import FRAME_KIND as PYTHON_FRAME_KIND
from receivers.profiling.processes.report_budget import DEFAULT_READ_BYTES, DEFAULT_READ_SECONDS, ReportBudget
from receivers.profiling.stall_watch import Progress
from receivers.profiling.symbols import runtime_stacks
from receivers.profiling.symbols.runtime_stacks import TAG as RUNTIME_TAG
from receivers.profiling.symbols.frame import Frame
from receivers.profiling.symbols.symbolizer import Symbolizer
from receivers.profiling.waits.devices import DeviceNames
from receivers.profiling.waits.lock_kinds import lock_kind
from receivers.profiling.waits.wakers import waiter_frames, waker_attributes, woken_by

SCOPE_NAME = "pycollector/receivers/profiling"
SCOPE_VERSION = "0.1.0"
# The semantic conventions release whose attribute names the profiles carry (htlhash and
# profile.frame.type are in it).
SCHEMA_URL = "https://opentelemetry.io/schemas/1.34.0"

# The scheduler's core, where every switch off a CPU happens: an off-CPU kernel stack starts
# here; the frames above it are the tracepoint's and the BPF program's own.
SCHEDULER_ENTRY = "__schedule"
# An I/O wait's device (waits/devices.py: why this name).
DEVICE_ATTRIBUTE = "system.device"
# Native frames kept from one report to the next (ReportBuilder._lasting_frames), all processes':
# about 20 MB at most (400 bytes a frame with its key), dropped all at once past it.
MAX_LASTING_FRAMES = 50_000


@dataclass(frozen=True)
class SampleKind:
    """The profile one origin of counts (StackCount.origin) makes: its sample type and, for one
    taken at the sampling period, the period's type (the period is the interval's)."""

    sample_type: tuple[str, str]
    period_type: tuple[str, str] = ("", "")
    periodic: bool = False
    # Attributes each sample of the kind carries that its frames tell (a lock wait's lock.kind).
    frame_attributes: Callable[[list[Frame]], dict] | None = None
    # Whether a sample is a thread's (thread.id, thread.name): not a goroutine's, which moves among threads.
    per_thread: bool = True


# A process's profiles, one per kind of count it has, in this order. Memory's are named as
# OpenTelemetry's memory profiling design names them (and pprof's heap profiles): the sampled
# allocations by count and by the bytes their weights stand for, and the live heap's alike.
SAMPLE_KINDS = {
    ORIGIN_CPU: SampleKind(CPU_SAMPLES, CPU_TIME, periodic=True),
    ORIGIN_OFF_CPU: SampleKind(OFF_CPU_TIME),  # (no period: each value is the time a thread spent away)
    ORIGIN_LOCK_WAIT: SampleKind(LOCK_WAIT, frame_attributes=lambda frames: {"lock.kind": lock_kind(frames)}),
    # (its frames: the waker's, a marker, then the waiter's, whose lock.kind it is: waits/wakers.py)
    ORIGIN_LOCK_WAKE: SampleKind(LOCK_WAKE, frame_attributes=lambda frames: {"lock.kind": lock_kind(waiter_frames(frames))}),
    ORIGIN_IO_WAIT: SampleKind(IO_WAIT),
    ORIGIN_ALLOC_OBJECTS: SampleKind(ALLOC_OBJECTS),
    ORIGIN_ALLOC_SPACE: SampleKind(ALLOC_SPACE),
    ORIGIN_INUSE_OBJECTS: SampleKind(INUSE_OBJECTS),
    ORIGIN_INUSE_SPACE: SampleKind(INUSE_SPACE),
    # Readings at the report (receivers/profiling/threads/): one sample a thread, or a goroutine.
    ORIGIN_THREADS: SampleKind(THREADS),
    ORIGIN_GOROUTINES: SampleKind(GOROUTINES, per_thread=False),
}
# Stacks taken as a thread left a CPU (waits, and where threads sit): their kernel part starts at the scheduler.
_SWITCH_ORIGINS = frozenset((ORIGIN_OFF_CPU, ORIGIN_LOCK_WAIT, ORIGIN_IO_WAIT, ORIGIN_LOCK_WAKE, ORIGIN_THREADS))


class ReportBuilder:
    def __init__(self, processes: ProcessTable, symbolizer: Symbolizer, host_name: str | None = None, progress: Progress | None = None):
        self.processes = processes
        self.progress = progress or Progress("report", float("inf"))  # says which process it builds
        self.symbolizer = symbolizer
        self.host_name = host_name or socket.gethostname()
        # The runtimes whose frames the kernel records by what they run (runtime_stacks.Runtime:
        # PythonInterpreters, V8Runtimes, HotSpotRuntimes): each names the frames of its kinds.
        self.runtimes: list[runtime_stacks.Runtime] = []
        # What they may read of the processes' memory to name one report's frames, all together
        # (processes/report_budget.py): bytes (READ_COST a read more) and seconds.
        self.naming_read_bytes, self.naming_read_seconds = DEFAULT_READ_BYTES, DEFAULT_READ_SECONDS
        self.budget: ReportBudget | None = None  # this report's (the last one's, between reports)
        self._refused: set[tuple[int, int | None]] = set()  # processes the last report's budget refused a read
        self.contexts: ProcessContexts | None = None  # the resources OpenTelemetry SDKs publish
        # {(tgid, span): attrs-data} for the spans asked (the sampler's thread_ctx_attributes)
        self.span_attributes: Callable[[Iterable[tuple[int, bytes]]], dict[tuple[int, bytes], bytes]] | None = None
        self._span_attributes: dict[tuple[int, bytes], dict[str, str]] = {}
        # Stacks of processes held back one report because a file of theirs was still being read
        # (symbols/loads.py): sent with the next report's, named, rather than unnamed now.
        self._carried: list[StackCount] = []
        self.stats = {"samples_carried": 0, "samples_of_gone_processes": 0, "samples_carried_for_names": 0}
        self._native_frames: dict[tuple[int, int | None], dict] = {}
        # Per process: the snapshot, its JIT names' state, and the frames that stay true while
        # both do (Symbolizer.symbolize_process's lasting), kept from one report to the next.
        self._lasting_frames: dict[tuple[int, int | None], tuple[ProcessInfo, tuple | None, dict]] = {}
        self._names_asked: set[tuple[int, int | None]] = set()  # (this report's: see _lasting)
        self.devices = DeviceNames()  # (the names of the devices I/O waits were on)

    def build(self, interval: Interval, on_error: Callable[[int, int, int, Exception], None] | None = None,
              *, final: bool = False, on_dropped: Callable[[int, int, int, str], None] | None = None) -> profiles_pb2.ProfilesData:
        """One ResourceProfiles per process. A process whose stacks cannot be symbolized is left
        out and reported to ``on_error(tgid, samples, off_cpu_ns, error)`` (its CPU samples and its
        off-CPU nanoseconds); the others are still built. A process with frames in a file still
        being read is held back to the next report, once (never in the ``final`` one). A process
        is its pid and its start (a pid reused within the interval is two processes): one gone
        whose pid another process holds, or held when last seen, is left out and reported to
        ``on_dropped(tgid, samples, off_cpu_ns, "pid_reused")``, never named as that other.
        The runtimes' reads to name frames are within one budget for the report
        (processes/report_budget.py): a process a read was refused for is held back to the next
        report, once, as one waiting for a file is, and named after the others there."""
        builder = ProfilesBuilder()
        self.symbolizer.new_report()
        budget = self.budget = ReportBudget(self.naming_read_bytes, self.naming_read_seconds)
        for runtime in self.runtimes:
            runtime.new_report(budget)
        self._native_frames = collections.defaultdict(dict)  # per process, for this report: see symbolize_user
        locations: dict[Frame, int] = {}  # the same frame recurs across stacks and threads
        by_process: dict[tuple[int, int | None], list[StackCount]] = collections.defaultdict(list)
        carried = {(stack.tgid, stack.start_ticks) for stack in self._carried}
        for stack in self._carried + interval.stacks:
            by_process[(stack.tgid, stack.start_ticks)].append(stack)
        self._carried = []
        self._forget_lasting_frames()
        self._names_asked = set()
        # (shared among the processes with frames of a runtime that knows them, CPython's, V8's or
        # HotSpot's, which the kernel tags alike: the others read nothing)
        budget.share_among([key for key, stacks in by_process.items() if any(address & RUNTIME_TAG for stack in stacks for address in stack.user_addrs)
                            and any(runtime.knows(*key) for runtime in self.runtimes)])
        if self.contexts is not None:
            self.progress.stage("reading the processes' OpenTelemetry contexts")
            self.contexts.refresh({tgid for tgid, _ in by_process})
            self._span_attributes = self._name_span_attributes([stack for stacks in by_process.values() for stack in stacks])
        # Newest processes first (the highest pids, but for a wrap): the likeliest to exit before
        # the report reaches them, when what is read from a process's memory (the names of its
        # JIT code, its interpreters' frames) can no longer be read. Those the last report's
        # budget refused go last: a process that overspends does not go before the others twice.
        order = sorted(by_process.items(), key=lambda item: (item[0][0], item[0][1] or 0), reverse=True)
        order.sort(key=lambda item: item[0] in self._refused)
        refused = self._refused = set()
        # A process the budget refused within its share is named again after all the others, with
        # what they left (named from what it read: its names cost it only their checks again).
        work = [(key, stacks, False) for key, stacks in order]
        for (tgid, started), stacks, again in work:  # (work grows as it is gone through)
            built = len(builder.data.resource_profiles)
            self.progress.stage(f"building the profile of pid {tgid}")
            budget.begin((tgid, started))
            try:
                try:
                    info = self.processes.incarnation(tgid, started)
                except IncarnationGone:
                    samples = sum(stack.count for stack in stacks if stack.cpu)
                    self.stats["samples_of_gone_processes"] += samples
                    if on_dropped is not None:
                        on_dropped(tgid, samples, sum(stack.count for stack in stacks if stack.off_cpu), "pid_reused")
                    continue
                deferred = self.symbolizer.deferred
                attached = [runtime for runtime in self.runtimes if runtime.knows(tgid, started)]  # (once a process, not a stack)
                symbolized = [(stack, self._frames(tgid, stack, info, attached)) for stack in stacks]
                if tgid in budget.refused and not again and self.symbolizer.deferred == deferred:
                    budget.refused.discard(tgid)
                    work.append(((tgid, started), stacks, True))
                    continue
                if tgid in budget.refused:
                    refused.add((tgid, started))
                waiting_for = ("samples_carried" if self.symbolizer.deferred > deferred
                               else "samples_carried_for_names" if tgid in budget.refused else None)
                if waiting_for is not None and not final and (tgid, started) not in carried:
                    # (not the live heap's readings: the next report reads it again)
                    self._carried.extend(stack for stack in stacks if not is_snapshot(SAMPLE_KINDS[stack.origin].sample_type))
                    self.stats[waiting_for] += sum(stack.count for stack in stacks if stack.cpu)
                    continue
                self._add_process(builder, interval, tgid, info, symbolized, locations)
            except Exception as error:  # one bad file or process must not cost the whole interval
                if on_error is None:
                    raise
                # What it added is taken back (its dictionary entries stay, unreferenced).
                del builder.data.resource_profiles[built:]
                on_error(tgid, sum(stack.count for stack in stacks if stack.cpu),
                         sum(stack.count for stack in stacks if stack.off_cpu), error)
        return builder.data

    def _name_span_attributes(self, stacks: list[StackCount]) -> dict[tuple[int, bytes], dict[str, str]]:
        """The attributes of the spans the interval's samples ran in, as each process's own
        record held them, named by the key map of that process's context."""
        spans = {(stack.tgid, stack.span) for stack in stacks if stack.span}
        if not spans or self.span_attributes is None:
            return {}
        named = {}
        for (tgid, span), data in self.span_attributes(spans).items():
            attributes = self.contexts.span_attributes(tgid, data)
            if attributes:
                named[(tgid, span)] = attributes
        return named

    def _frames(self, tgid: int, stack: StackCount, info: ProcessInfo | None, attached: list[runtime_stacks.Runtime]) -> list[Frame]:
        """The stack's frames; its native ones named from ``info``, the snapshot of the process
        that took it (None: gone unknown, left unnamed), its runtimes' by ``attached``."""
        frames = self.symbolizer.symbolize_kernel(stack.kernel_addrs) if stack.kernel_addrs else []
        if stack.origin in _SWITCH_ORIGINS:
            frames = _from_scheduler(frames)
        if stack.user_addrs:
            memo = self._native_frames[(tgid, stack.start_ticks)]
            lasting = self._lasting(tgid, stack.start_ticks, info)

            def native(addresses: list[int]) -> list[Frame]:
                if info is None:
                    return [Frame(address, "native") for address in addresses]
                return self.symbolizer.symbolize_user(tgid, addresses, memo, info=info, lasting=lasting)

            if any(address & RUNTIME_TAG for address in stack.user_addrs):  # (each runtime names the frames of its kinds)
                frames += runtime_stacks.name_stack(tgid, stack.user_addrs, attached, native, stack.start_ticks)
            else:
                frames += native(stack.user_addrs)
        if stack.waker is not None:  # (a lock wait by who woke it)
            frames = self._waker_frames(tgid, stack, info, attached) + frames
        if stack.note:  # (outermost: what the stack below it is, or why there is none)
            frames.append(Frame(0, "native", name=stack.note))
        return frames

    def _forget_lasting_frames(self) -> None:
        """Those of processes whose snapshot the table no longer holds (exited, exec'd, maps
        read again); all of them past MAX_LASTING_FRAMES in all."""
        kept = {key: entry for key, entry in self._lasting_frames.items() if self.processes.newest(entry[0]) is entry[0]}
        self._lasting_frames = kept if sum(len(entry[2]) for entry in kept.values()) <= MAX_LASTING_FRAMES else {}

    def _lasting(self, tgid: int, started: int | None, info: ProcessInfo | None) -> dict | None:
        """The process's lasting frames (``_lasting_frames``), while ``info`` is its snapshot,
        the table's, and its JIT names are as they were (Symbolizer.names_state: asked once a
        process a report)."""
        if info is None or self.processes.newest(info) is not info:
            return None
        key = (tgid, started)
        kept = self._lasting_frames.get(key)
        if kept is None or kept[0] is not info or key not in self._names_asked:
            self._names_asked.add(key)
            names = self.symbolizer.names_state(info)
            if kept is None or kept[0] is not info or kept[1] != names:
                kept = self._lasting_frames[key] = (info, names, {})
        return kept[2]

    def _waker_frames(self, tgid: int, stack: StackCount, info: ProcessInfo | None, attached: list[runtime_stacks.Runtime]) -> list[Frame]:
        """What a lock_wake sample's frames begin with (waits/wakers.py): its waker's frames, root
        first, and the marker that joins them to the waiter's."""
        waker = stack.waker
        kernel = self.symbolizer.symbolize_kernel(waker.kernel_addrs) if waker.kernel_addrs else []
        user = []
        if waker.user_addrs and waker.tgid == tgid:  # (named as the waiter's, from the same process)
            user = self._frames(tgid, StackCount(tgid, waker.tid, waker.comm, [], waker.user_addrs, 0, start_ticks=stack.start_ticks), info, attached)
        return woken_by(waker, tgid, kernel, user)

    def _add_process(self, builder: ProfilesBuilder, interval: Interval, tgid: int, info: ProcessInfo | None, symbolized: list,
                     locations: dict) -> None:
        stacks = [stack for stack, _ in symbolized]
        resource = builder.resource_profiles(self._resource_attributes(tgid, info, stacks), schema_url=SCHEMA_URL)
        scope = builder.scope_profiles(resource, name=SCOPE_NAME, version=SCOPE_VERSION, schema_url=SCHEMA_URL)
        by_origin = collections.defaultdict(list)
        for stack, frames in symbolized:
            by_origin[stack.origin].append((stack, frames))
        for origin, kind in SAMPLE_KINDS.items():
            of_kind = by_origin.get(origin)
            if not of_kind:
                continue
            profile = builder.profile(
                scope,
                sample_type=kind.sample_type,
                period_type=kind.period_type,
                period=interval.period_ns if kind.periodic else 0,
                time_unix_nano=interval.start_wall_ns,
                duration_nano=max(0, interval.end_wall_ns - interval.start_wall_ns),
            )
            for stack, frames in of_kind:
                builder.sample(
                    profile,
                    builder.stack([self._location(builder, frame, locations) for frame in frames]),
                    [stack.count],
                    # The comm in the sample is the thread's name when it was sampled.
                    attributes={**self._span_attributes.get((stack.tgid, stack.span), {}),
                                **({"thread.id": stack.tid, "thread.name": stack.comm} if kind.per_thread else {}),
                                **(kind.frame_attributes(frames) if kind.frame_attributes else {}),
                                **(waker_attributes(stack.waker, tgid, frames) if stack.waker is not None else {}),
                                **({DEVICE_ATTRIBUTE: self.devices.name(stack.device)} if stack.device else {})},
                    # The span it ran in, as the SDK's thread context said: a trace's slow span links to its samples.
                    link_index=builder.link(stack.span[:16], stack.span[16:]) if stack.span else 0,
                    timestamps_unix_nano=(stack.timestamp_ns,) if stack.timestamp_ns else (),
                )

    def _resource_attributes(self, tgid: int, info: ProcessInfo | None, stacks: list[StackCount]) -> dict:
        attributes: dict = {"host.name": self.host_name, "process.pid": tgid}
        if info is None:
            # Gone before we could read /proc: the thread's comm from the sample is all we have.
            attributes["process.executable.name"] = stacks[0].comm
            return attributes
        attributes["process.executable.name"] = info.executable_name
        if info.exe_path:
            attributes["process.executable.path"] = info.exe_path
        if info.container_id:
            attributes["container.id"] = info.container_id
        for name, value in sorted(info.env.items()):
            attributes[f"process.environment_variable.{name}"] = value
        # (The contexts are the pid's process's now: none for one whose pid was reused since.)
        current = self.processes.newest(info) is not None
        context = self.contexts.context(tgid) if self.contexts is not None and current else None
        if context is not None:
            # The SDK's resource (service.name above all), except what the kernel told the agent:
            # a process may name its service as it likes, not pass for another process or container.
            attributes = {**context.attributes, **attributes}
        return attributes

    @staticmethod
    def _location(builder: ProfilesBuilder, frame: Frame, memo: dict[Frame, int]) -> int:
        known = memo.get(frame)
        if known is not None:
            return known
        if frame.kind == PYTHON_FRAME_KIND:  # no mapping: the code object is named, not an address
            lines = [(builder.function(frame.name, system_name=frame.name, filename=frame.source_file or "", start_line=frame.first_line),
                      frame.line, 0)] if frame.name else ()
            memo[frame] = builder.location(0, frame.address, lines, attributes={"profile.frame.type": frame.kind})
            return memo[frame]
        mapping = 0
        if frame.file:
            mapping = builder.mapping(
                memory_start=frame.mapping_start,
                memory_limit=frame.mapping_limit,
                file_offset=frame.mapping_offset,
                filename=frame.file,
                attributes=_file_ids(frame),
            )
        # A Go function's file and line come from its .gopclntab; other native code has neither.
        lines = [(builder.function(frame.name, system_name=frame.name, filename=frame.source_file or "", start_line=frame.first_line),
                  frame.line, 0)] if frame.name else ()
        memo[frame] = builder.location(mapping, frame.address, lines, attributes={"profile.frame.type": frame.kind})
        return memo[frame]


# A mapping's file ids, under the names OpenTelemetry's profiling conventions give them.
_FILE_ID_KEYS = (("build_id", "process.executable.build_id.gnu"), ("go_build_id", "process.executable.build_id.go"),
                 ("htlhash", "process.executable.build_id.htlhash"))


def _file_ids(frame: Frame) -> dict[str, str] | None:
    ids = {key: getattr(frame, field) for field, key in _FILE_ID_KEYS if getattr(frame, field)}
    return ids or None


def _from_scheduler(frames: list[Frame]) -> list[Frame]:
    """An off-CPU kernel stack without the frames above the scheduler (the tracepoint's)."""
    for index, frame in enumerate(frames):
        if frame.name == SCHEDULER_ENTRY:
            return frames[index:]
    return frames
