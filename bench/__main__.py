"""`make bench`: python -m bench [--quick] [--output PATH].

Runs every scenario (the workload under each profiler, round after round; then the pipeline),
writes the table, and stops every process it started, even when interrupted. Needs root: BPF,
perf on every CPU, and the bpf_stats sysctl.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from bench import agent_cost, agent_memory, bpf_stats, children, crowded_host, gateway_workers, memory, off_cpu, overhead, peers, persistent_queue, ping_pong, pipeline, procfs, python_frames, report, rounds, runtime_frames, side_by_side, sizes, span_context, truth, unwinding, workload
from bench.settings import FULL, QUICK
from bench.sink import ProfilesSink
from receivers.profiling.config import DEFAULT_BPF_CACHE_DIR

RESULTS = Path(__file__).resolve().with_name("RESULTS.md")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round on tiny durations: a smoke test of every step, not figures to read")
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"where to write the table (default {RESULTS})")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    settings = QUICK if args.quick else FULL
    peers.HOST_BPF_CACHE = Path(DEFAULT_BPF_CACHE_DIR) if args.quick else None
    if os.geteuid() != 0:
        print("bench: needs root (BPF, perf -a, the bpf_stats sysctl)", file=sys.stderr)
        return 2
    handlers = children.stop_on_signals()
    began = time.monotonic()
    loads = [procfs.load_average()]
    try:
        with tempfile.TemporaryDirectory(prefix="pycollector-bench-") as scratch, bpf_stats.enabled():
            workdir = Path(scratch)
            binary = workload.build_known_split(workdir)
            binary_without_frame_pointers = workload.build_known_split(workdir, frame_pointers=False)
            ping_pong_binary = ping_pong.build(workdir)
            span_binary = span_context.build(workdir)
            with ProfilesSink(keep_requests=True) as sink:
                warm_up_seconds = unwinding.warm_up(settings, [binary, binary_without_frame_pointers], workdir, sink)
                print(f"bench: unwind rows of the host built in {warm_up_seconds:.0f} s", file=sys.stderr)
                runs = rounds.run_rounds(settings, binary, workdir, sink)
                first_start_runs = rounds.first_starts(settings, workdir, sink)
                side_by_side_runs = side_by_side.run_rounds(settings, binary, workdir, sink)
                unwinding_runs, startup_runs = unwinding.run_rounds(settings, binary_without_frame_pointers, workdir, sink)
                python_runs = python_frames.run_rounds(settings, workdir, sink)
                runtime_runs = runtime_frames.run_rounds(settings, binary, workdir, sink)
                off_cpu_runs = off_cpu.run_rounds(settings, ping_pong_binary, workdir, sink)
                span_runs = span_context.run_bpf_rounds(settings, span_binary, workdir, sink)
                heap_loop_runs, heap_json_runs = memory.run_rounds(settings, workdir, sink)
                memory_run = agent_memory.run(settings, workdir / "agent_memory", sink)
            crowded_runs = crowded_host.run_rounds(workdir / "crowded_host", settings.rounds, settings.crowded_window, settings.crowded_processes)
            writer_runs = span_context.run_writer_rounds(settings, workdir)
            pipeline_dir = workdir / "pipeline"
            pipeline_dir.mkdir()
            pipeline_results, pipeline_shape = pipeline.run_rounds(pipeline_dir, settings.rounds, settings.distinct_payloads, settings.pipeline_seconds)
            workers_results = gateway_workers.run_rounds(workdir / "gateway_workers", settings.rounds, settings.pipeline_seconds)
            queue_dir = workdir / "persistent_queue"
            queue_dir.mkdir()
            queue_results = persistent_queue.run_rounds(queue_dir, settings.rounds, settings.distinct_payloads, settings.payloads_per_burst)
    finally:
        children.kill_all()
        children.restore_signals(handlers)
    loads += [run.load for run in runs + first_start_runs + side_by_side_runs + unwinding_runs + startup_runs + python_runs + runtime_runs + off_cpu_runs + span_runs + heap_loop_runs + heap_json_runs]
    loads += [procfs.load_average()]
    rows = (overhead.rows(runs) + agent_cost.rows(runs, first_start_runs) + truth.rows(side_by_side_runs) + unwinding.rows(unwinding_runs, startup_runs)
            + python_frames.rows(python_runs) + runtime_frames.rows(runtime_runs) + off_cpu.rows(off_cpu_runs) + span_context.rows(span_runs, writer_runs)
            + memory.rows(heap_loop_runs, heap_json_runs) + pipeline.rows(pipeline_results) + gateway_workers.rows(workers_results) + persistent_queue.rows(queue_results)
            + sizes.rows(side_by_side_runs) + agent_memory.rows(memory_run, settings) + crowded_host.rows(crowded_runs, settings.crowded_window))
    report.write(args.output, rows, settings, loads, time.monotonic() - began, pipeline_shape, warm_up_seconds)
    print(f"bench: wrote {args.output} in {time.monotonic() - began:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
