"""Memory profiles as the profiling receiver builds them, without BPF, with known figures.

A real process (tests/testdata/memory/heap_sites.c: alloc_hot, alloc_warm and alloc_leaky call
malloc) runs under the native heap sampler (sdk/native), so its executable and
libpycollector_heap.so are mapped as in production. The counts the kernel would have sent are
made up here as StackCounts, each stack the one the probe fires on: the sampler's ``sample``
(where otel_memory:alloc is), ``malloc_sampled``, ``malloc``, then the allocating function and
``main``, leaf first. The receiver's own ReportBuilder, ProcessTable and Symbolizer turn them into
OTLP: one Profile per sample type, the frames named from the files.

The figures (``ALLOCATED``, ``HELD_BEFORE``, ``HELD_AFTER``) are as a sampler at its default
512 KiB interval reports them: every sampled block stands for 512 KiB. Allocated bytes split
60/30/10 between the three functions; the leaker holds 80% of the in-use bytes at the first
report and 90% at the second, a minute later (4 then 9 MiB, while alloc_warm holds 1 MiB).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from elftools.elf.elffile import ELFFile
from opentelemetry.proto.profiles.v1development import profiles_pb2

from receivers.profiling.kernel.samples import (ORIGIN_ALLOC_OBJECTS, ORIGIN_ALLOC_SPACE, ORIGIN_CPU, ORIGIN_INUSE_OBJECTS, ORIGIN_INUSE_SPACE,
                                                 Interval, StackCount)
from receivers.profiling.processes.table import ProcessTable
from receivers.profiling.report import ReportBuilder
from receivers.profiling.symbols.symbolizer import Symbolizer

REPO = Path(__file__).resolve().parent.parent
WORKLOAD = REPO / "tests" / "testdata" / "memory" / "heap_sites.c"
NATIVE = REPO / "sdk" / "native"
SITES = ("alloc_hot", "alloc_warm", "alloc_leaky")
# The sampler's frames above the allocating function, leaf first: the probe is in `sample`.
SAMPLER_FRAMES = ("sample", "malloc_sampled", "malloc")
KIB, MIB = 1 << 10, 1 << 20
SAMPLE_BYTES = 512 * KIB  # the sampler's default interval
START_NS = 1_700_000_000_123_000_000  # 2023-11-14T22:13:20.123Z
MINUTE_NS = 60_000_000_000
CPU_SAMPLES_IN_HOT = 5  # the process's CPU samples, all in alloc_hot


def blocks(count: int) -> dict[int, int]:
    """A site's sampled blocks as the two counts the receiver reports for them: objects, bytes."""
    return {0: count, 1: count * SAMPLE_BYTES}


# Per site, sampled blocks allocated (60/30/10 by bytes) and held at each report.
ALLOCATED = {"alloc_hot": 120, "alloc_warm": 60, "alloc_leaky": 20}
HELD_BEFORE = {"alloc_warm": 2, "alloc_leaky": 8}
HELD_AFTER = {"alloc_warm": 2, "alloc_leaky": 18}


class HeapSites:
    """The running workload and the receiver's pieces that name its frames."""

    def __init__(self, process: subprocess.Popen, executable: Path, library: Path):
        self.process = process
        self.pid = process.pid
        self.table = ProcessTable()
        self.table.on_new_process(self.pid, self.pid, "heap_sites")
        self.symbolizer = Symbolizer(self.table)
        self.addresses = {**_symbols_in_memory(self.pid, executable, ("main", *SITES)), **_symbols_in_memory(self.pid, library, SAMPLER_FRAMES)}

    def stack(self, site: str) -> list[int]:
        """The user stack of an allocation in ``site``, leaf first: the probe's address in
        ``sample``, then return addresses (a few bytes into each caller)."""
        return [self.addresses[name] + 4 for name in (*SAMPLER_FRAMES, site, "main")]

    def report(self, allocated: dict[str, int] | None = ALLOCATED, held: dict[str, int] | None = HELD_AFTER,
               cpu: int = CPU_SAMPLES_IN_HOT, start_ns: int = START_NS) -> profiles_pb2.ProfilesData:
        """One report of the receiver: ``allocated`` and ``held`` sampled blocks per site (None:
        allocation or live-heap profiling off), ``cpu`` samples in alloc_hot."""
        stacks = []
        for counts, origins in ((allocated, (ORIGIN_ALLOC_OBJECTS, ORIGIN_ALLOC_SPACE)), (held, (ORIGIN_INUSE_OBJECTS, ORIGIN_INUSE_SPACE))):
            for site, count in (counts or {}).items():
                for which, origin in enumerate(origins):
                    stacks.append(StackCount(self.pid, self.pid, "heap_sites", [], self.stack(site), blocks(count)[which], origin=origin))
        if cpu:
            stacks.append(StackCount(self.pid, self.pid, "heap_sites", [], [self.addresses["alloc_hot"] + 4, self.addresses["main"] + 4], cpu,
                                     origin=ORIGIN_CPU))
        interval = Interval(stacks, 0, MINUTE_NS, start_ns, start_ns + MINUTE_NS, frequency_hz=20)
        return ReportBuilder(self.table, self.symbolizer, host_name="testhost").build(interval, final=True)


@contextlib.contextmanager
def heap_sites(directory: Path) -> Iterator[HeapSites]:
    """The workload built in ``directory`` and running under the sampler until the block ends."""
    subprocess.run(["make", "-s", "-C", str(NATIVE), f"OUT={directory}"], check=True, capture_output=True)
    library = directory / "libpycollector_heap.so"
    executable = directory / "heap_sites"
    subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls", "-o", str(executable), str(WORKLOAD)], check=True)
    process = subprocess.Popen([str(executable)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, "LD_PRELOAD": str(library)})
    try:
        assert process.stdout.readline() == b"ready\n"
        yield HeapSites(process, executable, library)
    finally:
        process.stdin.close()
        process.wait(10)


def _symbols_in_memory(pid: int, path: Path, names: tuple[str, ...]) -> dict[str, int]:
    """Where ``names`` (symbols of ``path``, local ones too) are in process ``pid``: the file's
    first mapping (offset 0) is its load address, as for any PIE or shared library."""
    base = None
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == str(path) and int(fields[2], 16) == 0:
                base = int(fields[0].split("-")[0], 16)
                break
    assert base is not None, f"{path} is not mapped in {pid}"
    with open(path, "rb") as file:
        symbols = {symbol.name: symbol["st_value"] for symbol in ELFFile(file).get_section_by_name(".symtab").iter_symbols()
                   if symbol.name in names and symbol["st_info"]["type"] == "STT_FUNC"}
    assert set(symbols) == set(names), f"{path} lacks {set(names) - set(symbols)}"
    return {name: base + value for name, value in symbols.items()}
