"""Native unwinding's cost and start-up, on the workload built without frame pointers (as
distributions and release builds ship code), where pycollector walks stacks with unwind rows.

Steady state: rounds like bench.rounds (no profiler, pycollector, `perf record --call-graph
dwarf` and profile-bpfcc, rotated), on the -fomit-frame-pointer build. perf's DWARF mode is what
users run to get these stacks without eBPF unwinding; profile-bpfcc walks frame pointers, which
is what the BPF time per sample is held against.

Start-up: with the workload already running, pycollector is started with an empty row cache
(cold), then again with the cache the first start filled (warm, a restart). It reports every
REPORT_INTERVAL_S; the unwinder is ready at the end of the first report in which the workload's
samples reach their entry (see ENTRY) at least READY_SHARE of the time, counted from the first
sample. The files and rows it loaded come from its own metrics.
"""

from __future__ import annotations

import re
import socket
import sys
import time
import urllib.request
from pathlib import Path

from opentelemetry.proto.profiles.v1development import profiles_pb2

from bench import children, peers, procfs, rounds, workload
from bench.agent_cost import cpu_target
from bench.figures import Row, Summary, per_round
from bench.peers import PerfDwarf, ProfileBpfcc, PycollectorAgent
from bench.rounds import NONE, Run
from bench.settings import Settings
from bench.sink import ProfilesSink
from pycollector.pdata import iter_samples

MODES = (NONE, PycollectorAgent.name, PerfDwarf.name, ProfileBpfcc.name)
ENTRY = re.compile(r"^(__libc_start_main|__libc_start_call_main|_start)\b")
READY_SHARE = 0.95
REPORT_INTERVAL_S = 0.2
ROW_BYTES = 12  # one unwind row in the kernel's map
BPF_TARGET = 3.0  # times the frame-pointer walk
READY_TARGET_S = 2.0
COLD, WARM = "cold", "warm"


def warm_up(settings: Settings, binaries: list[Path], workdir: Path, sink: ProfilesSink) -> float:
    """Fill the rounds' row cache (bench.rounds.unwind_cache_dir) with the rows of every file the
    workloads and the host map, so the rounds measure a restarted agent's steady state, not the
    first build of a host's rows (the start-up rows measure that). Returns the seconds it took."""
    began = time.monotonic()
    rundir = workdir / "warm-up"
    rundir.mkdir()
    copies = [copy for binary in binaries for copy in workload.start(binary, settings.warm_up_limit_s, 1)]
    agent = PycollectorAgent(rundir, settings.hz, sink.endpoint, settings.reporter_interval_s, rounds.unwind_cache_dir(rundir), metrics_port=_free_port())
    try:
        agent.launch()
        agent.wait_until_sampling()
        while time.monotonic() - began < settings.warm_up_limit_s:
            time.sleep(1.0)
            tables = _unwind_tables(agent.metrics_port)
            if tables.get("files_loaded") and not tables.get("files_waiting"):
                break
        else:
            print(f"bench: warning: pycollector was still building unwind rows after {settings.warm_up_limit_s:g} s", file=sys.stderr)
    finally:
        peers.stop(agent)
        children.stop(*copies)
    sink.take()
    return time.monotonic() - began


def run_rounds(settings: Settings, binary: Path, workdir: Path, sink: ProfilesSink) -> tuple[list[Run], list[Run]]:
    """(steady-state runs, start-up runs) on ``binary``, the build without frame pointers."""
    steady = rounds.run_rounds(settings, binary, workdir, sink, modes=MODES, label="unwinding")
    startups = []
    for index in range(settings.rounds):
        cache = workdir / f"unwind-cache-startup{index}"
        for state in (COLD, WARM):
            rundir = workdir / f"startup{index}-{state}"
            rundir.mkdir()
            startups.append(_startup(state, index, settings, binary, rundir, cache, sink))
            print(f"bench: unwinding start-up {index + 1}/{settings.rounds} {state}: {rounds.progress(startups[-1])}", file=sys.stderr)
    return steady, startups


def _startup(state: str, index: int, settings: Settings, binary: Path, rundir: Path, cache: Path, sink: ProfilesSink) -> Run:
    # The copies outlive the agent's start (seconds of compiling) and are stopped with it.
    copies = workload.start(binary, peers.STARTUP_TIMEOUT_S + settings.startup_seconds, procfs.online_cpus())
    agent = PycollectorAgent(rundir, settings.hz, sink.endpoint, REPORT_INTERVAL_S, cache, metrics_port=_free_port())
    sink.take()
    try:
        time.sleep(0.5)  # the copies are running (and their files mapped) before the agent starts
        load = procfs.load_average()
        agent.launch()
        agent.wait_until_sampling()
        first_sample_ns = time.time_ns()
        time.sleep(settings.startup_seconds)
        tables = _unwind_tables(agent.metrics_port)
        peak_rss = procfs.memory_kib(agent.pid, "VmHWM") / procfs.KIB_PER_MIB
    finally:
        peers.stop(agent)
        children.stop(*copies)
    ready = _ready_after(sink.take(), [copy.pid for copy in copies], first_sample_ns)
    figures = {"ready_seconds": ready, "peak_rss_mib": peak_rss, "files": tables.get("files_loaded", 0.0),
               "rows": tables.get("rows_loaded", 0.0) - tables.get("rows_freed", 0.0)}
    return Run(state, index, load, figures)


def _ready_after(requests: list[bytes], pids: list[int], first_sample_ns: int) -> float:
    """Seconds from the first sample to the end of the first report whose samples of ``pids``
    reach their entry at least READY_SHARE of the time; inf when none did."""
    by_report: dict[int, list[int]] = {}  # report end (ns) -> [reaching, all]
    for request in requests:
        for view in iter_samples(profiles_pb2.ProfilesData.FromString(request)):
            if view.resource.get("process.pid") not in pids:
                continue
            end = view.profile.time_unix_nano + view.profile.duration_nano
            counts = by_report.setdefault(end, [0, 0])
            count = sum(view.values)
            counts[0] += count if any(ENTRY.match(frame.function or "") for frame in view.frames) else 0
            counts[1] += count
    for end, (reaching, total) in sorted(by_report.items()):
        if total and reaching / total >= READY_SHARE:
            return max(0.0, (end - first_sample_ns) / 1e9)
    return float("inf")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _unwind_tables(port: int) -> dict[str, float]:
    """pycollector_profiling_unwind_tables by stat, from the agent's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found = {}
    for match in re.finditer(r'^pycollector_profiling_unwind_tables\{[^}]*stat="(\w+)"[^}]*\} (\S+)$', text, re.MULTILINE):
        found[match[1]] = float(match[2])
    return found


def _bpf_target(_ours: Summary, _peer: Summary, ratio: Summary) -> str:
    verdict = "met" if ratio.median <= BPF_TARGET else f"missed: {ratio.median:.2f}x"
    return f"≤ {BPF_TARGET:g}x the frame-pointer walk: {verdict}"


def _ready_target(ours: Summary, _peer: Summary, _ratio: Summary) -> str:
    verdict = "met" if ours.median <= READY_TARGET_S else f"missed by {ours.median - READY_TARGET_S:.2f} s"
    return f"≤ {READY_TARGET_S:g} s: {verdict}"


def rows(steady: list[Run], startups: list[Run]) -> list[Row]:
    ours, dwarf, bpfcc = PycollectorAgent.name, PerfDwarf.name, ProfileBpfcc.name
    section = "Unwinding"
    out = []
    for peer in (dwarf, bpfcc):
        out.append(Row(section, "Workload iterations, profiled / no profiler", _slowdown(steady, ours), peer, _slowdown(steady, peer), "{:.4f}"))
    out.append(Row(section, "BPF run time per sample, ns (bpf_stats)", per_round(steady, ours, "bpf_ns_per_sample"), bpfcc, per_round(steady, bpfcc, "bpf_ns_per_sample"), "{:.0f}", _bpf_target))
    for peer in (dwarf, bpfcc):
        out.append(Row(section, "CPU seconds per second, steady state", per_round(steady, ours, "agent_cpu_per_second"), peer, per_round(steady, peer, "agent_cpu_per_second"), "{:.4f}", cpu_target if peer == dwarf else None))
    for peer in (dwarf, bpfcc):
        out.append(Row(section, "Peak RSS (VmHWM), MiB", per_round(steady, ours, "peak_rss_mib"), peer, per_round(steady, peer, "peak_rss_mib"), "{:.0f}"))
    for state in (COLD, WARM):
        out.append(Row(section, f"Start-up, {state} row cache: first sample to stacks reaching their entry, s", per_round(startups, state, "ready_seconds"), "", [], "{:.2f}", _ready_target if state == WARM else None))
        out.append(Row(section, f"Start-up, {state} row cache: peak RSS, MiB", per_round(startups, state, "peak_rss_mib"), "", [], "{:.0f}"))
    out.append(Row(section, "Unwind tables loaded for this host: files", per_round(startups, WARM, "files"), "", [], "{:.0f}"))
    out.append(Row(section, "Unwind tables loaded for this host: rows", per_round(startups, WARM, "rows"), "", [], "{:.0f}"))
    out.append(Row(section, "Unwind tables loaded for this host: kernel memory, MiB", [rows * ROW_BYTES / 2**20 for rows in per_round(startups, WARM, "rows")], "", [], "{:.1f}"))
    return out


def _slowdown(runs: list[Run], mode: str) -> list[float]:
    return [profiled / alone for profiled, alone in zip(per_round(runs, mode, "iterations"), per_round(runs, NONE, "iterations"))]
