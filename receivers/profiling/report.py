"""One interval of counted stacks -> one OTLP ``ProfilesData``.

The shape follows what opentelemetry-ebpf-profiler sends, so backends treat our data the same:
one ResourceProfiles per process (``process.pid``, ``process.executable.name``,
``process.executable.path``, ``container.id``, ``host.name``), one Profile with sample type
``samples/count`` and period ``cpu/nanoseconds``, samples carrying ``thread.id`` and
``thread.name``, locations carrying ``profile.frame.type`` and mappings carrying
``process.executable.build_id.gnu``. Stacks are leaf first: kernel frames (when the sample was
taken in the kernel) above the user frames that called into it.
"""

from __future__ import annotations

import collections
import socket

from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.pdata import ProfilesBuilder

from receivers.profiling.processes import ProcessInfo, ProcessTable
from receivers.profiling.sampler import Interval, StackCount
from receivers.profiling.symbolizer import Frame, Symbolizer

SCOPE_NAME = "pycollector/receivers/profiling"
SCOPE_VERSION = "0.1.0"


class ReportBuilder:
    def __init__(self, processes: ProcessTable, symbolizer: Symbolizer, host_name: str | None = None):
        self.processes = processes
        self.symbolizer = symbolizer
        self.host_name = host_name or socket.gethostname()

    def build(self, interval: Interval) -> profiles_pb2.ProfilesData:
        builder = ProfilesBuilder()
        by_process: dict[int, list[StackCount]] = collections.defaultdict(list)
        for stack in interval.stacks:
            by_process[stack.tgid].append(stack)
        for tgid, stacks in sorted(by_process.items()):
            info = self.processes.lookup(tgid)
            for stack in stacks:
                self.processes.observe_thread(tgid, stack.tid, stack.comm)
            self._add_process(builder, interval, tgid, info, stacks)
        return builder.data

    def _add_process(self, builder: ProfilesBuilder, interval: Interval, tgid: int, info: ProcessInfo | None, stacks: list[StackCount]) -> None:
        resource = builder.resource_profiles(self._resource_attributes(tgid, info, stacks))
        profile = builder.profile(
            builder.scope_profiles(resource, name=SCOPE_NAME, version=SCOPE_VERSION),
            sample_type=("samples", "count"),
            period_type=("cpu", "nanoseconds"),
            period=interval.period_ns,
            time_unix_nano=interval.start_wall_ns,
            duration_nano=max(0, interval.end_wall_ns - interval.start_wall_ns),
        )
        for stack in stacks:
            frames = self.symbolizer.symbolize_kernel(stack.kernel_addrs) if stack.kernel_addrs else []
            if stack.user_addrs:
                frames += self.symbolizer.symbolize_user(tgid, stack.user_addrs)
            thread_name = self.processes.thread_name(tgid, stack.tid) or stack.comm
            builder.sample(
                profile,
                builder.stack([self._location(builder, frame) for frame in frames]),
                [stack.count],
                attributes={"thread.id": stack.tid, "thread.name": thread_name},
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
        return attributes

    @staticmethod
    def _location(builder: ProfilesBuilder, frame: Frame) -> int:
        mapping = 0
        if frame.file:
            mapping = builder.mapping(
                memory_start=frame.mapping_start,
                memory_limit=frame.mapping_limit,
                file_offset=frame.mapping_offset,
                filename=frame.file,
                attributes={"process.executable.build_id.gnu": frame.build_id} if frame.build_id else None,
            )
        lines = [(builder.function(frame.name, system_name=frame.name), 0, 0)] if frame.name else ()
        return builder.location(mapping, frame.address, lines, attributes={"profile.frame.type": frame.kind})
