"""The agent's own cost, against the peers in the same rounds: CPU seconds per second and peak
RSS in steady state, kernel time per sample of the sampling BPF program, and start-up (time and
CPU from launch to the first sample, and CPU from there to the steady-state window)."""

from __future__ import annotations

from bench.figures import Row, Summary, per_round
from bench.peers import PerfRecord, ProfileBpfcc, PycollectorAgent

# Targets: under 1% of one core at 97 Hz on a busy host; no more memory than profile-bpfcc.
CPU_TARGET = 0.01


def cpu_target(ours: Summary, _peer: Summary, _ratio: Summary) -> str:
    verdict = "met" if ours.median < CPU_TARGET else f"missed by {100 * (ours.median - CPU_TARGET):.2f}% of a core"
    return f"< {100 * CPU_TARGET:g}% of a core: {verdict}"


def _rss_target(_ours: Summary, _peer: Summary, ratio: Summary) -> str:
    verdict = "met" if ratio.median <= 1 else f"missed by {100 * (ratio.median - 1):.0f}%"
    return f"≤ profile-bpfcc's: {verdict}"


def _startup_target(most: float):
    def target(_ours: Summary, _peer: Summary, ratio: Summary) -> str:
        verdict = "met" if ratio.median <= most else f"missed: {ratio.median / most:.2f}x over"
        return f"≤ {most:g}x profile-bpfcc's: {verdict}"

    return target


# Start-up targets against profile-bpfcc: launch to first sample, CPU from launch to first sample.
STARTUP_TARGETS = {"startup_seconds": _startup_target(1.2), "startup_cpu_seconds": _startup_target(1.0)}


def rows(runs: list, first_starts: list) -> list[Row]:
    ours = PycollectorAgent.name
    both = (PerfRecord.name, ProfileBpfcc.name)
    out = []
    for peer in both:
        out.append(Row("Agent cost", "CPU seconds per second, steady state", per_round(runs, ours, "agent_cpu_per_second"), peer, per_round(runs, peer, "agent_cpu_per_second"), "{:.4f}", cpu_target if peer == PerfRecord.name else None))
    for peer in both:
        out.append(Row("Agent cost", "Peak RSS (VmHWM), MiB", per_round(runs, ours, "peak_rss_mib"), peer, per_round(runs, peer, "peak_rss_mib"), "{:.0f}", _rss_target if peer == ProfileBpfcc.name else None))
    out.append(Row("Agent cost", "BPF run time per sample, ns (bpf_stats)", per_round(runs, ours, "bpf_ns_per_sample"), ProfileBpfcc.name, per_round(runs, ProfileBpfcc.name, "bpf_ns_per_sample"), "{:.0f}"))
    # A restart (the compiled program in the cache) is what a deploy, a crash or a reboot of the
    # agent pays; the first start on a host (or after a kernel or config change) compiles, in a
    # child process (rounds.first_starts). Each against profile-bpfcc in the same rounds.
    for figure, title in (("startup_seconds", "Launch to first sample, s"), ("startup_cpu_seconds", "CPU from launch to first sample, s"), ("settle_cpu_seconds", "CPU from first sample to the steady-state window (pycollector: its first report), s")):
        for peer in both:
            target = STARTUP_TARGETS.get(figure) if peer == ProfileBpfcc.name else None
            out.append(Row("Start-up", f"{title} (a restart: program from the cache)", per_round(runs, ours, figure), peer, per_round(runs, peer, figure), "{:.2f}", target))
    for figure, title in (("startup_seconds", "Launch to first sample, s"), ("startup_cpu_seconds", "CPU from launch to first sample, s")):
        out.append(Row("Start-up", f"{title} (first start: compiles in a child process)", per_round(first_starts, ours, figure), ProfileBpfcc.name, per_round(first_starts, ProfileBpfcc.name, figure), "{:.2f}"))
    return out
