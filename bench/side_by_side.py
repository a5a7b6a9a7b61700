"""pycollector and perf profiling the same rounds at the same time, for the figures that compare
what they produced: truth (bench.truth) and sizes (bench.sizes).

Each round starts pycollector, then perf, runs the workload while both sample, interrupts both
together (so neither samples much longer than the other), then reads pycollector's exported OTLP
and `perf script` of perf.data.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench import peers, perf_script, procfs, rounds, sizes, truth, workload
from bench.peers import PerfRecord, PycollectorAgent
from bench.rounds import Run
from bench.settings import Settings
from bench.sink import ProfilesSink


def run_rounds(settings: Settings, binary: Path, workdir: Path, sink: ProfilesSink) -> list[Run]:
    runs = []
    for index in range(settings.rounds):
        rundir = workdir / f"side-by-side{index}"
        rundir.mkdir()
        runs += _round(index, settings, binary, rundir, sink)
        print(f"bench: side by side {index + 1}/{settings.rounds}: " + "; ".join(f"{run.mode} {run.figures}" for run in runs[-2:]), file=sys.stderr)
    return runs


def _round(index: int, settings: Settings, binary: Path, rundir: Path, sink: ProfilesSink) -> list[Run]:
    agent = PycollectorAgent(rundir, settings.hz, sink.endpoint, settings.reporter_interval_s, rounds.unwind_cache_dir(rundir))
    perf = PerfRecord(rundir, settings.hz)
    sink.take()
    started = []
    try:
        for profiler in (agent, perf):
            profiler.launch()
            started.append(profiler)
            profiler.wait_until_sampling()
        load = procfs.load_average()
        result = workload.run(binary, settings.side_by_side_seconds, procfs.online_cpus())
    finally:
        peers.stop(*started)
    requests, samples = sink.take(), perf_script.read_samples(perf.data_path)
    profilers = [agent.pid, perf.pid]
    exported_raw, exported_gzip = sizes.exported_bytes_per_sample(requests)
    perf_raw, perf_gzip = sizes.perf_data_bytes_per_sample(perf.data_path, len(samples))
    return [
        Run(agent.name, index, load, {"heavy_share": truth.heavy_share_exported(requests, result.pids), "named_share": truth.named_share_exported(requests, profilers), "bytes_per_sample": exported_raw, "gzip_bytes_per_sample": exported_gzip}),
        Run(perf.name, index, load, {"heavy_share": truth.heavy_share_perf(samples, result.pids), "named_share": truth.named_share_perf(samples, profilers), "bytes_per_sample": perf_raw, "gzip_bytes_per_sample": perf_gzip}),
    ]
