"""The workload under each profiler, alternated and repeated: every round runs known_split once
with no profiler and once under each profiler, in an order rotated round by round, so that a
change in the host's load falls on all of them alike.

Per run: start the profiler and time it to its first sample (start-up), let it settle (its CPU
meanwhile is reported apart), then run the workload for the window and read, over the window,
the profiler's CPU time, its BPF program's run time and count, and its peak RSS.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench import bpf_stats, peers, procfs, workload
from bench.peers import PerfDwarf, PerfRecord, Profiler, ProfileBpfcc, PycollectorAgent
from bench.settings import Settings
from bench.sink import ProfilesSink

NONE = "none"
MODES = (NONE, PycollectorAgent.name, PerfRecord.name, ProfileBpfcc.name)


@dataclasses.dataclass
class Run:
    mode: str
    round: int
    load: str  # /proc/loadavg as the window began
    figures: dict[str, float]  # what was measured, by name


def run_rounds(settings: Settings, binary: Path, workdir: Path, sink: ProfilesSink, modes: tuple[str, ...] = MODES, label: str = "round") -> list[Run]:
    """Every mode once a round, in an order rotated round by round."""
    return rotated(settings.rounds, modes, workdir, label, lambda mode, index, rundir: _run(mode, index, settings, binary, rundir, sink))


def rotated(count: int, modes: tuple[str, ...], workdir: Path, label: str, run: Callable[[str, int, Path], Run]) -> list[Run]:
    """``count`` rounds of ``run(mode, round, rundir)`` for every mode, in an order rotated by one
    each round (so no mode always follows the same one), each in its own new folder."""
    runs = []
    for index in range(count):
        rotation = index % len(modes)
        for mode in modes[rotation:] + modes[:rotation]:
            rundir = workdir / f"{label.replace(' ', '-')}{index}-{mode.replace(' ', '-')}"
            rundir.mkdir()
            runs.append(run(mode, index, rundir))
            print(f"bench: {label} {index + 1}/{count} {mode}: {progress(runs[-1])}", file=sys.stderr)
    return runs


def progress(run: Run) -> str:
    return ", ".join(f"{name}={value:.4g}" for name, value in run.figures.items())


def unwind_cache_dir(rundir: Path) -> Path:
    """pycollector's row cache, one for the whole bench: the first run builds the rows (in its
    settling time), the others start warm, as a restarted agent does."""
    return rundir.parent / "unwind-cache"


def _profiler(mode: str, settings: Settings, rundir: Path, sink: ProfilesSink) -> Profiler | None:
    if mode == PycollectorAgent.name:
        return PycollectorAgent(rundir, settings.hz, sink.endpoint, settings.reporter_interval_s, unwind_cache_dir(rundir))
    if mode == PerfRecord.name:
        return PerfRecord(rundir, settings.hz)
    if mode == PerfDwarf.name:
        return PerfDwarf(rundir, settings.hz)
    if mode == ProfileBpfcc.name:
        return ProfileBpfcc(rundir, settings.hz)
    return None


def _run(mode: str, index: int, settings: Settings, binary: Path, rundir: Path, sink: ProfilesSink) -> Run:
    profiler = _profiler(mode, settings, rundir, sink)
    copies = procfs.online_cpus()
    if profiler is None:
        load = procfs.load_average()
        result = workload.run(binary, settings.workload_seconds, copies)
        return Run(mode, index, load, _workload_figures(result))
    profiler.launch()
    try:
        startup_seconds, startup_cpu = profiler.wait_until_sampling()
        # Settle under the window's load, so pycollector's first report has already met (and
        # symbolized) the processes the window will sample.
        workload.run(binary, settings.settle_seconds, copies)
        settle_cpu = procfs.tree_cpu_seconds(profiler.pid) - startup_cpu
        load = procfs.load_average()
        figures = _measure(profiler, binary, settings.workload_seconds, copies)
    finally:
        peers.stop(profiler)
    sink.take()  # pycollector's reports: sent, and not needed here
    figures.update(startup_seconds=startup_seconds, startup_cpu_seconds=startup_cpu, settle_cpu_seconds=settle_cpu)
    return Run(mode, index, load, figures)


def first_starts(settings: Settings, workdir: Path, sink: ProfilesSink) -> list[Run]:
    """Start-up as on a host pycollector never ran on (its compiled program cache empty: it
    compiles, in a child process), against profile-bpfcc's in the same round. The rounds' agents
    share one cache, which the bench's warm-up filled: their start-up is a restart's."""
    def start(mode: str, index: int, rundir: Path) -> Run:
        if mode == PycollectorAgent.name:  # (a cache folder of its own, empty)
            profiler = PycollectorAgent(rundir, settings.hz, sink.endpoint, settings.reporter_interval_s, unwind_cache_dir(rundir),
                                        bpf_cache_dir=rundir / "empty-bpf-cache")
        else:
            profiler = _profiler(mode, settings, rundir, sink)
        load = procfs.load_average()
        profiler.launch()
        try:
            startup_seconds, startup_cpu = profiler.wait_until_sampling()
        finally:
            peers.stop(profiler)
        sink.take()
        return Run(mode, index, load, {"startup_seconds": startup_seconds, "startup_cpu_seconds": startup_cpu})

    return rotated(settings.rounds, (PycollectorAgent.name, ProfileBpfcc.name), workdir, "first start", start)


def _workload_figures(result: workload.WorkloadResult) -> dict[str, float]:
    return {"iterations": result.iterations, "iterations_per_cpu_second": result.iterations / result.cpu_seconds}


def _measure(profiler: Profiler, binary: Path, seconds: float, copies: int) -> dict[str, float]:
    program = profiler.sampling_program_id()
    bpf_before = bpf_stats.program_stats(program) if program else None
    threads_before = procfs.threads(profiler.pid)
    cpu_before = procfs.tree_run_seconds(profiler.pid)
    began = time.monotonic()
    result = workload.run(binary, seconds, copies)
    window = time.monotonic() - began
    figures = _workload_figures(result)
    figures["agent_cpu_per_second"] = (procfs.tree_run_seconds(profiler.pid) - cpu_before) / window
    ended = threads_before - procfs.threads(profiler.pid)
    if ended:  # its CPU time left with it (see tree_run_seconds)
        print(f"bench: warning: {len(ended)} threads of {profiler.name} ended in the window; their CPU time is not counted", file=sys.stderr)
    figures["peak_rss_mib"] = procfs.memory_kib(profiler.pid, "VmHWM") / procfs.KIB_PER_MIB
    if bpf_before is not None:
        run_time_ns, run_count = (after - before for after, before in zip(bpf_stats.program_stats(program), bpf_before))
        figures["bpf_ns_per_sample"] = run_time_ns / run_count
    return figures

