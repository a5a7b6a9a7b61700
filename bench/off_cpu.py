"""Off-CPU profiling's cost on a workload that does little but switch context, against BCC's
offcputime (issue 16), and what lock and I/O waits add to it (issue 44).

The workload: ping_pong (bench/ping_pong.c), two processes bouncing a byte over two pipes,
timing their round trips; then the same bouncing a turn through a futex word (every wait a lock
wait). Each round runs both, in an order of modes rotated round by round:

none                    the workload alone: the round's baseline
pycollector             the agent with off_cpu_threshold: 1.0 (every switch off a CPU recorded), CPU
                        samples at HZ as elsewhere, exporting OTLP/gRPC to the bench's sink
pycollector +lock +io   the same with lock_profiling and io_profiling on, every wait recorded
                        (wait_events_per_second at its highest): against off-CPU alone, the
                        cost of telling the waits apart; the goal is at most 1.3 times
offcputime-bpfcc        `offcputime-bpfcc -f`: every thread's off-CPU time by stack (peers.OffCpuTimeBpfcc)

(BCC's offwaketime, which also records wakers, needs kprobes on try_to_wake_up and
finish_task_switch: on a kernel without kprobes, as the bench host's, it cannot start, and no
row compares with it; offcputime, ported to the sched_switch tracepoint, stands for it.)

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

import sys
import time
from pathlib import Path

from opentelemetry.proto.profiles.v1development import profiles_pb2

from bench import alone, bpf_stats, peers, ping_pong, procfs, rounds, unwinding
from bench.figures import Row, per_round
from bench.peers import OffCpuTimeBpfcc, Profiler, PycollectorAgent, PycollectorWaitsAgent
from bench.rounds import NONE, Run
from bench.settings import Settings
from bench.sink import ProfilesSink
from pycollector.pdata import OFF_CPU_TIME, iter_samples, sample_type

MODES = (NONE, PycollectorAgent.name, PycollectorWaitsAgent.name, OffCpuTimeBpfcc.name)
SECTION = "Off-CPU"
OFF_CPU_THRESHOLD = 1.0  # every switch: the most the program can cost
WAITS_GOAL = 1.3  # lock and I/O waits: at most this many times off-CPU alone's cost per switch
FUTEX = "futex_"  # the futex ping-pong's figures: the pipe's names with this before them


def run_rounds(settings: Settings, binary: Path, workdir: Path, sink: ProfilesSink) -> list[Run]:
    return rounds.rotated(settings.rounds, MODES, workdir, "off-CPU", lambda mode, index, rundir: _run(mode, index, settings, binary, rundir, sink))


def _run(mode: str, index: int, settings: Settings, binary: Path, rundir: Path, sink: ProfilesSink) -> Run:
    if mode == NONE:
        load = procfs.load_average()
        return Run(mode, index, load, {"round_trips_per_second": ping_pong.run(binary, settings.workload_seconds).rate,
                                       FUTEX + "round_trips_per_second": ping_pong.run(binary, settings.workload_seconds, futex=True).rate})
    if mode in (PycollectorAgent.name, PycollectorWaitsAgent.name):
        agent = PycollectorWaitsAgent if mode == PycollectorWaitsAgent.name else PycollectorAgent
        profiler = agent(rundir, settings.hz, sink.endpoint, settings.reporter_interval_s, rounds.unwind_cache_dir(rundir),
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
        futex_figures, futex_measured = _measure(profiler, binary, settings.workload_seconds, futex=True)
        figures.update({FUTEX + name: value for name, value in futex_figures.items()})
    finally:
        peers.stop(profiler)  # pycollector reports its last partial interval; offcputime prints
    recorded_s = _pycollector_recorded(sink.take(), binary.name) if mode != OffCpuTimeBpfcc.name else _offcputime_recorded(profiler.log_path, binary.name)
    figures["off_cpu_recorded_per_second"] = recorded_s / (settle.seconds + measured.seconds + futex_measured.seconds)
    return Run(mode, index, load, figures)


def _switch_program(profiler: Profiler) -> int:
    """The profiler's program on the context switch, a kprobe or raw tracepoint (pycollector's
    off-CPU walks are tail calls, counted in its time)."""
    program = profiler.sampling_program_id(OffCpuTimeBpfcc.program_types)
    if program is None:
        raise RuntimeError(f"process {profiler.pid} holds no kprobe or raw tracepoint program")
    return program


def _measure(profiler: Profiler, binary: Path, seconds: float, futex: bool = False) -> tuple[dict[str, float], ping_pong.PingPongResult]:
    program = _switch_program(profiler)
    bpf_before = bpf_stats.program_stats(program)
    cpu_before = procfs.tree_run_seconds(profiler.pid)
    began = time.monotonic()
    result = ping_pong.run(binary, seconds, futex)
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


def _overhead(runs: list[Run], mode: str, figure: str = "round_trips_per_second") -> list[float]:
    return [1 - profiled / alone for profiled, alone in zip(per_round(runs, mode, figure), per_round(runs, NONE, figure))]


def _within_goal(_ours, _theirs, ratio) -> str:
    """The waits' cost per switch against off-CPU alone's, by the median of the rounds' ratios."""
    if ratio.median != ratio.median:  # (nan: no rounds)
        return ""
    return f"goal ≤ {WAITS_GOAL:g}×: {'met' if ratio.median <= WAITS_GOAL else 'missed'}"


def rows(runs: list[Run]) -> list[Row]:
    ours, peer, waits = PycollectorAgent.name, OffCpuTimeBpfcc.name, PycollectorWaitsAgent.name
    alone = f"{ours} (off-CPU alone)"

    def both(title: str, figure: str, style: str) -> Row:
        return Row(SECTION, title, per_round(runs, ours, figure), peer, per_round(runs, peer, figure), style)

    def against_off_cpu(title: str, figure: str, style: str, target=None) -> Row:
        return Row(SECTION, title, per_round(runs, waits, figure), alone, per_round(runs, ours, figure), style, target)

    return [
        Row(SECTION, "Ping-pong round trips per second, no profiler (the baseline)", per_round(runs, NONE, "round_trips_per_second"), "", [], "{:.0f}"),
        both("Ping-pong round trips per second, every switch off a CPU recorded", "round_trips_per_second", "{:.0f}"),
        Row(SECTION, "Overhead: 1 − round trips per second profiled / the baseline", _overhead(runs, ours), peer, _overhead(runs, peer), "{:.3f}"),
        both("BPF run time per context switch, ns (bpf_stats)", "bpf_ns_per_switch", "{:.0f}"),
        both("BPF CPU seconds per second, charged to the switching threads", "bpf_cpu_per_second", "{:.3f}"),
        both("CPU seconds per second, the profiler's processes", "agent_cpu_per_second", "{:.4f}"),
        both("Off-CPU seconds recorded for ping_pong's two processes, per second of its runs", "off_cpu_recorded_per_second", "{:.3f}"),
        Row(SECTION, "Futex ping-pong round trips per second, no profiler (the baseline)", per_round(runs, NONE, FUTEX + "round_trips_per_second"),
            "", [], "{:.0f}"),
        both("Futex ping-pong: BPF run time per context switch, ns", FUTEX + "bpf_ns_per_switch", "{:.0f}"),
        against_off_cpu("Pipes: BPF run time per context switch, ns, + lock_profiling + io_profiling (a pipe wait is neither)",
                        "bpf_ns_per_switch", "{:.0f}", _within_goal),
        against_off_cpu("Futex: BPF run time per context switch, ns, + lock_profiling + io_profiling (every wait a lock wait)",
                        FUTEX + "bpf_ns_per_switch", "{:.0f}", _within_goal),
        Row(SECTION, "Futex ping-pong overhead: 1 − round trips per second profiled / the baseline, + lock + io", _overhead(runs, waits, FUTEX + "round_trips_per_second"),
            alone, _overhead(runs, ours, FUTEX + "round_trips_per_second"), "{:.3f}"),
        against_off_cpu("CPU seconds per second, the agent's processes, futex ping-pong", FUTEX + "agent_cpu_per_second", "{:.4f}"),
    ]


def main(argv: list[str] | None = None) -> int:
    def measure(settings: Settings, workdir: Path, sink: ProfilesSink) -> list[Row]:
        binary = ping_pong.build(workdir)
        # The row cache warm, as the whole bench leaves it for its sections (see unwinding.warm_up).
        unwinding.warm_up(settings, [binary], workdir, sink)
        return rows(run_rounds(settings, binary, workdir, sink))

    return alone.run_section(argv, "bench.off_cpu", "off-CPU", measure)


if __name__ == "__main__":
    sys.exit(main())
