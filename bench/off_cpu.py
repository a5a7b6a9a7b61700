"""Off-CPU profiling's cost on a workload that does little but switch context, against BCC's
offcputime (issue 16).

The workload: ping_pong (bench/ping_pong.c), two processes bouncing a byte over two pipes,
timing their round trips. Each round runs it, in an order rotated round by round:

none                the workload alone: the round's baseline
pycollector         the agent with off_cpu_threshold: 1.0 (every switch off a CPU recorded), CPU
                    samples at HZ as elsewhere, exporting OTLP/gRPC to the bench's sink
offcputime-bpfcc    `offcputime-bpfcc -f`: every thread's off-CPU time by stack (peers.OffCpuTimeBpfcc)

A profiler is started, waited for until its program runs, and settles over a ping_pong run of
its own (pycollector's first report meets the workload there); then the window. Figures: round
trips per second, overhead = 1 - that / the round's baseline, the CPU of the profiler's process
tree, and its context-switch program's run time (bpf_stats), which the kernel charges to the
threads switching. Once the profiler has stopped, the off-CPU time it recorded for ping_pong's two
processes over both runs, a check that both measured the same thing: pycollector's from the
off_cpu/nanoseconds profiles it exported, offcputime's from its folded output.

Alone: `python -m bench.off_cpu [--quick]` runs this section and prints its rows (RESULTS.md is
left as it is).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from opentelemetry.proto.profiles.v1development import profiles_pb2

from bench import bpf_stats, children, peers, ping_pong, procfs, report, rounds, unwinding
from bench.figures import Row, per_round
from bench.peers import OffCpuTimeBpfcc, Profiler, PycollectorAgent
from bench.rounds import NONE, Run
from bench.settings import FULL, QUICK, Settings
from bench.sink import ProfilesSink
from pycollector.pdata import OFF_CPU_TIME, iter_samples, sample_type

MODES = (NONE, PycollectorAgent.name, OffCpuTimeBpfcc.name)
SECTION = "Off-CPU"
OFF_CPU_THRESHOLD = 1.0  # every switch: the most the program can cost


def run_rounds(settings: Settings, binary: Path, workdir: Path, sink: ProfilesSink) -> list[Run]:
    return rounds.rotated(settings.rounds, MODES, workdir, "off-CPU", lambda mode, index, rundir: _run(mode, index, settings, binary, rundir, sink))


def _run(mode: str, index: int, settings: Settings, binary: Path, rundir: Path, sink: ProfilesSink) -> Run:
    if mode == NONE:
        load = procfs.load_average()
        return Run(mode, index, load, {"round_trips_per_second": ping_pong.run(binary, settings.workload_seconds).rate})
    if mode == PycollectorAgent.name:
        profiler = PycollectorAgent(rundir, settings.hz, sink.endpoint, settings.reporter_interval_s, rounds.unwind_cache_dir(rundir),
                                    off_cpu_threshold=OFF_CPU_THRESHOLD)
    else:
        profiler = OffCpuTimeBpfcc(rundir, settings.hz)
    sink.take()  # only this run's reports are read after it
    profiler.launch()
    try:
        profiler.wait_until_sampling()
        settle = ping_pong.run(binary, settings.settle_seconds)
        load = procfs.load_average()
        figures, measured = _measure(profiler, binary, settings.workload_seconds)
    finally:
        peers.stop(profiler)  # pycollector reports its last partial interval; offcputime prints
    recorded_s = _pycollector_recorded(sink.take(), binary.name) if mode == PycollectorAgent.name else _offcputime_recorded(profiler.log_path, binary.name)
    figures["off_cpu_recorded_per_second"] = recorded_s / (settle.seconds + measured.seconds)
    return Run(mode, index, load, figures)


def _switch_program(profiler: Profiler) -> int:
    """The profiler's program on the context switch, a kprobe or raw tracepoint (pycollector's
    off-CPU walks are tail calls, counted in its time)."""
    program = profiler.sampling_program_id(OffCpuTimeBpfcc.program_types)
    if program is None:
        raise RuntimeError(f"process {profiler.pid} holds no kprobe or raw tracepoint program")
    return program


def _measure(profiler: Profiler, binary: Path, seconds: float) -> tuple[dict[str, float], ping_pong.PingPongResult]:
    program = _switch_program(profiler)
    bpf_before = bpf_stats.program_stats(program)
    cpu_before = procfs.tree_run_seconds(profiler.pid)
    began = time.monotonic()
    result = ping_pong.run(binary, seconds)
    elapsed = time.monotonic() - began
    run_time_ns, run_count = (after - before for after, before in zip(bpf_stats.program_stats(program), bpf_before))
    figures = {
        "round_trips_per_second": result.rate,
        "agent_cpu_per_second": (procfs.tree_run_seconds(profiler.pid) - cpu_before) / elapsed,
        "bpf_ns_per_switch": run_time_ns / run_count if run_count else float("nan"),
        "bpf_cpu_per_second": run_time_ns / 1e9 / elapsed,
    }
    return figures, result


def _pycollector_recorded(requests: list[bytes], executable: str) -> float:
    """Seconds off the CPU in the off-CPU profiles of ``executable``'s processes."""
    total_ns = 0
    for request in requests:
        data = profiles_pb2.ProfilesData.FromString(request)
        for view in iter_samples(data):
            if view.resource.get("process.executable.name") == executable and sample_type(data, view.profile) == OFF_CPU_TIME:
                total_ns += sum(view.values)
    return total_ns / 1e9


def _offcputime_recorded(log_path: Path, comm: str) -> float:
    """Seconds off the CPU in offcputime's folded lines of ``comm`` ("comm;frame;... microseconds")."""
    total_us = 0
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith(comm + ";"):
            total_us += int(line.rsplit(" ", 1)[1])
    return total_us / 1e6


def _overhead(runs: list[Run], mode: str) -> list[float]:
    return [1 - profiled / alone for profiled, alone in zip(per_round(runs, mode, "round_trips_per_second"), per_round(runs, NONE, "round_trips_per_second"))]


def rows(runs: list[Run]) -> list[Row]:
    ours, peer = PycollectorAgent.name, OffCpuTimeBpfcc.name

    def both(title: str, figure: str, style: str) -> Row:
        return Row(SECTION, title, per_round(runs, ours, figure), peer, per_round(runs, peer, figure), style)

    return [
        Row(SECTION, "Ping-pong round trips per second, no profiler (the baseline)", per_round(runs, NONE, "round_trips_per_second"), "", [], "{:.0f}"),
        both("Ping-pong round trips per second, every switch off a CPU recorded", "round_trips_per_second", "{:.0f}"),
        Row(SECTION, "Overhead: 1 − round trips per second profiled / the baseline", _overhead(runs, ours), peer, _overhead(runs, peer), "{:.3f}"),
        both("BPF run time per context switch, ns (bpf_stats)", "bpf_ns_per_switch", "{:.0f}"),
        both("BPF CPU seconds per second, charged to the switching threads", "bpf_cpu_per_second", "{:.3f}"),
        both("CPU seconds per second, the profiler's processes", "agent_cpu_per_second", "{:.4f}"),
        both("Off-CPU seconds recorded for ping_pong's two processes, per second of its runs", "off_cpu_recorded_per_second", "{:.3f}"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.off_cpu", description="The off-CPU section of the bench alone; prints its rows.")
    parser.add_argument("--quick", action="store_true", help="one round on tiny durations")
    settings = QUICK if parser.parse_args(argv).quick else FULL
    if os.geteuid() != 0:
        print("bench: needs root (BPF, the bpf_stats sysctl)", file=sys.stderr)
        return 2
    handlers = children.stop_on_signals()
    began = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="pycollector-bench-") as scratch, bpf_stats.enabled(), ProfilesSink(keep_requests=True) as sink:
            workdir = Path(scratch)
            binary = ping_pong.build(workdir)
            # The row cache warm, as the whole bench leaves it for its sections (see unwinding.warm_up).
            unwinding.warm_up(settings, [binary], workdir, sink)
            runs = run_rounds(settings, binary, workdir, sink)
    finally:
        children.kill_all()
        children.restore_signals(handlers)
    print("\n".join(report.table(report.HEADER, [row.cells() for row in rows(runs)])))
    print(f"bench: off-CPU section in {time.monotonic() - began:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
