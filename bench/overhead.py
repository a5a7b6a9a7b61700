"""Overhead on the workload: known_split's iterations under each profiler, relative to the run
with no profiler in the same round; and per CPU second the workload got, which leaves out CPU
time the profiler took from it and keeps what a sample costs the workload (the interrupt, the BPF
program, caches)."""

from __future__ import annotations

from bench.figures import Row, Summary, per_round
from bench.peers import PerfRecord, ProfileBpfcc, PycollectorAgent
from bench.rounds import NONE

SECTION = "Overhead"
# The target: pycollector slows the workload by no more than perf does plus this many points.
SLOWDOWN_MARGIN_POINTS = 0.5


def _relative(runs: list, mode: str, figure: str) -> list[float]:
    return [profiled / alone for profiled, alone in zip(per_round(runs, mode, figure), per_round(runs, NONE, figure))]


def _within_perf(ours: Summary, perf: Summary, ratio: Summary) -> str:
    ours_points, perf_points = 100 * (1 - ours.median), 100 * (1 - perf.median)
    excess = ours_points - perf_points
    verdict = "met" if excess <= SLOWDOWN_MARGIN_POINTS else f"missed by {excess - SLOWDOWN_MARGIN_POINTS:.2f} pt"
    # On a shared host the rounds scatter; a gap smaller than their spread is not a finding.
    spread_points = 100 * (ratio.high - ratio.low)
    return f"slowdown ≤ perf's + {SLOWDOWN_MARGIN_POINTS} pt: {verdict} ({ours_points:.2f} pt vs {perf_points:.2f} pt; rounds spread over {spread_points:.1f} pt)"


def rows(runs: list) -> list[Row]:
    out = []
    for figure, title in (("iterations", "Workload iterations, profiled / no profiler"), ("iterations_per_cpu_second", "Workload iterations per CPU second, profiled / no profiler")):
        ours = _relative(runs, PycollectorAgent.name, figure)
        for peer in (PerfRecord.name, ProfileBpfcc.name):
            target = _within_perf if figure == "iterations" and peer == PerfRecord.name else None
            out.append(Row(SECTION, title, ours, peer, _relative(runs, peer, figure), "{:.4f}", target))
    return out
