"""The agent's memory over a long run: pycollector profiling a busy host (every known workload,
as bench.agent_reports makes it) for ``agent_memory_seconds`` (10 minutes in full mode), its RSS
read every ``agent_memory_interval``. What it holds after a minute (caches filled, first reports
sent) against what it holds at the end: it must not grow."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from bench import agent_reports, children, procfs
from bench.figures import Row, Summary
from bench.peers import PycollectorAgent
from bench.rounds import unwind_cache_dir
from bench.settings import Settings
from bench.sink import ProfilesSink

SETTLED_S = 60.0  # what the agent holds once its caches are filled: the baseline (full mode)
GROWTH_TARGET = 1.05  # at the end, at most 5% above the baseline


@dataclasses.dataclass
class MemoryRun:
    baseline_mib: float  # RSS once settled
    end_mib: float  # RSS at the end
    peak_mib: float  # VmHWM at the end
    readings: list[tuple[float, float]]  # (seconds since the first sample, RSS MiB)


def run(settings: Settings, workdir: Path, sink: ProfilesSink) -> MemoryRun:
    seconds, interval = settings.agent_memory_seconds, settings.agent_memory_interval
    settled = min(SETTLED_S, seconds / 2)
    workdir.mkdir()
    workloads = agent_reports.busy_host(workdir, seconds + 60, settings.agent_memory_every_runtime)
    agent = PycollectorAgent(workdir, settings.hz, sink.endpoint, settings.reporter_interval_s, unwind_cache_dir(workdir))
    try:
        agent.launch()
        agent.wait_until_sampling()
        began, readings, baseline = time.monotonic(), [], None
        while (elapsed := time.monotonic() - began) < seconds:
            time.sleep(interval)
            elapsed = time.monotonic() - began
            rss = procfs.memory_kib(agent.pid, "VmRSS") / procfs.KIB_PER_MIB
            readings.append((elapsed, rss))
            if baseline is None and elapsed >= settled:
                baseline = rss
                print(f"bench: agent memory: {rss:.0f} MiB after {elapsed:.0f} s", file=sys.stderr)
        peak = procfs.memory_kib(agent.pid, "VmHWM") / procfs.KIB_PER_MIB
    finally:
        children.stop(agent.process, *workloads)
    end = readings[-1][1]
    print(f"bench: agent memory: {end:.0f} MiB after {readings[-1][0]:.0f} s (peak {peak:.0f})", file=sys.stderr)
    return MemoryRun(baseline if baseline is not None else readings[0][1], end, peak, readings)


def _no_growth(_ours: Summary, _peer: Summary, ratio: Summary) -> str:
    verdict = "met" if ratio.median <= GROWTH_TARGET else f"missed: grew {100 * (ratio.median - 1):.0f}%"
    return f"no growth (≤ {100 * (GROWTH_TARGET - 1):.0f}% above): {verdict}"


def rows(run: MemoryRun, settings: Settings) -> list[Row]:
    minutes = settings.agent_memory_seconds / 60
    settled = min(SETTLED_S, settings.agent_memory_seconds / 2)
    return [
        Row("Agent memory", f"RSS after {minutes:g} min on a busy host, MiB", [run.end_mib], f"itself after {settled:g} s", [run.baseline_mib], "{:.0f}", _no_growth),
        Row("Agent memory", f"Peak RSS (VmHWM) over {minutes:g} min, MiB", [run.peak_mib], "", [], "{:.0f}"),
    ]
