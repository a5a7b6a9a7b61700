"""Memory profiling's cost (issue 39): what our heap samplers cost the programs that load them,
with no profiler attached and with pycollector attached, against heaptrack on the same loop.

Two workloads, each run on one CPU (the host's last) with its own figure timed by itself on its
CPU clock, which takes in the BPF programs the kernel runs in its context at each probe but not
the time other processes take the CPU from it:

loop    bench/heap_sampler.c, malloc(64) and free; ns per round trip
json    json.dumps and json.loads of a large document (python_heap_sampler's, built by the script
        below) in Debian's python3 with sdk/python installed; ms per round trip

and these modes, in an order rotated round by round:

none        the loop alone / the json script without PYCOLLECTOR_HEAP_SAMPLE_BYTES (the .pth imports
            nothing): the round's baseline
detached    the native sampler LD_PRELOADed / the Python sampler on at the default interval
            (512 KiB), no profiler: both semaphores zero, what every program with it pays
attached    the same, with a pycollector agent running with allocation_profiling and
            live_heap_profiling on; the program waits until the agent has attached to it (its
            semaphores raised) and settled, so every sampled allocation and its free fire a uprobe
heaptrack   (loop only) `heaptrack` of Debian, which records every call; its run does a tenth of
            the loop's round trips (its figure is per round trip), and heaptrack_print's summary of
            it is printed

Ratios are taken within a round. BPF: the run time and count of the agent's memory_alloc and
memory_free programs over the timed part (bpf_stats; the stack walks they tail-call are counted in
their time). The agent's alloc_objects and alloc_space for the loop's process, against what the
loop did, and heaptrack's count of calls.

Alone: `python -m bench.memory [--quick]` runs this section and prints its rows (RESULTS.md is left
as it is).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from opentelemetry.proto.profiles.v1development import profiles_pb2

from bench import alone, children, heap_sampler, peers, procfs, rounds
from bench.figures import Row, Summary, per_round
from bench.peers import PycollectorAgent
from bench.rounds import NONE, Run
from bench.settings import Settings
from bench.sink import ProfilesSink
from pycollector.pdata import ALLOC_OBJECTS, ALLOC_SPACE, iter_samples, sample_type
from receivers.profiling.elf.bounded import BoundedElf
from receivers.profiling.elf.stapsdt import read_probes
from tests.heap_samplers import DEBIAN_PYTHON, install_python_sampler

SECTION = "Memory"
DETACHED, ATTACHED, HEAPTRACK = "detached", "attached", "heaptrack"
LOOP_MODES = (NONE, DETACHED, ATTACHED, HEAPTRACK)
JSON_MODES = (NONE, DETACHED, ATTACHED)
HEAPTRACK_SHARE = 10  # heaptrack's run does 1/HEAPTRACK_SHARE of the loop's round trips
BLOCK_BYTES = 64
SAMPLE_BYTES = 524288  # the samplers' default interval (heap_sampling.h), named for the json runs
# The goals, on the json benchmark: slowdown with the sampler on and no profiler, and with
# pycollector attached.
DETACHED_GOAL, ATTACHED_GOAL = 1.02, 1.05
ATTACH_TIMEOUT_S = 30.0
MEMORY_PROGRAMS = ("memory_alloc", "memory_free")

# The document is python_heap_sampler's; the script waits for a line before the timed part, as
# the loop does with "wait" (allocating meanwhile: pycollector learns of a process, and of the
# sampler's file mapped in it, from its CPU samples), and times it on the process's CPU clock
# (the uprobes' BPF included).
JSON_SCRIPT = r"""
import json, select, sys, time
round_trips, orders = int(sys.argv[1]), int(sys.argv[2])
document = {"orders": [{"id": i, "customer": "customer-%d" % (i % 977), "total": i * 1.25, "paid": i % 3 == 0,
                        "lines": [{"sku": "sku-%d" % (i * 7 + j), "quantity": j, "price": j * 0.5} for j in range(5)]}
                       for i in range(orders)]}
json.loads(json.dumps(document))  # warm-up
print("ready", flush=True)
while not select.select([sys.stdin], [], [], 0)[0]:  # allocating meanwhile, as heap_sampler.c's loop
    json.loads(json.dumps(document["orders"][:100]))
sys.stdin.readline()
began = time.process_time()
for _ in range(round_trips):
    assert json.loads(json.dumps(document)) == document
print((time.process_time() - began) / round_trips * 1000, flush=True)
"""


class Programs:
    """What run_rounds needs built: the native sampler and the loop, and a python3 with the
    Python sampler installed."""

    def __init__(self, workdir: Path) -> None:
        self.library, self.loop = heap_sampler.build(workdir)
        self.python = install_python_sampler(DEBIAN_PYTHON, workdir / "python-sampler")


def run_rounds(settings: Settings, workdir: Path, sink: ProfilesSink) -> tuple[list[Run], list[Run]]:
    """(the loop's runs, the json script's runs)."""
    programs = Programs(workdir)
    loop_runs = rounds.rotated(settings.rounds, LOOP_MODES, workdir, "memory loop", lambda mode, index, rundir: _loop_run(mode, index, settings, programs, rundir, sink))
    json_runs = rounds.rotated(settings.rounds, JSON_MODES, workdir, "memory json", lambda mode, index, rundir: _json_run(mode, index, settings, programs, rundir, sink))
    return loop_runs, json_runs


def _clean_environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if not key.startswith(("LD_PRELOAD", "PYCOLLECTOR_HEAP_", "PYTHON"))}


def _loop_run(mode: str, index: int, settings: Settings, programs: Programs, rundir: Path, sink: ProfilesSink) -> Run:
    env = _clean_environment()
    iterations = settings.memory_loop_iterations
    if mode == HEAPTRACK:
        iterations //= HEAPTRACK_SHARE
        output = rundir / "heaptrack"
        command = ["heaptrack", "-o", str(output), str(programs.loop), str(iterations), "0", "wait"]
        load = procfs.load_average()
        figure, counts = _timed(command, env)
        calls = _heaptrack_calls(output.with_suffix(".zst"))
        return Run(mode, index, load, {"ns_per_round_trip": figure, "allocations_counted_per_malloc": calls / (iterations + counts["spun"])})
    if mode != NONE:
        env["LD_PRELOAD"] = str(programs.library)
    command = [str(programs.loop), str(iterations), "0", "wait"]
    if mode != ATTACHED:
        load = procfs.load_average()
        return Run(mode, index, load, {"ns_per_round_trip": _timed(command, env)[0]})
    attached = _attached(settings, rundir, sink, command, env, programs.library.name, marks=True)
    allocations, space = _pycollector_allocations(sink.take(), attached.pid)
    # The agent counts those made while it settled too, not those before it attached.
    mallocs = iterations + attached.counts["spun"] - attached.unseen
    figures = {"ns_per_round_trip": attached.figure, **attached.bpf_figures,
               "allocations_counted_per_malloc": allocations / mallocs, "bytes_counted_per_byte": space / (mallocs * BLOCK_BYTES)}
    return Run(mode, index, attached.load, figures)


def _json_run(mode: str, index: int, settings: Settings, programs: Programs, rundir: Path, sink: ProfilesSink) -> Run:
    env = _clean_environment()
    if mode != NONE:
        env["PYCOLLECTOR_HEAP_SAMPLE_BYTES"] = str(SAMPLE_BYTES)
    command = [str(programs.python), "-c", JSON_SCRIPT, str(settings.memory_json_round_trips), str(settings.memory_json_orders)]
    if mode != ATTACHED:
        load = procfs.load_average()
        return Run(mode, index, load, {"ms_per_round_trip": _timed(command, env)[0]})
    attached = _attached(settings, rundir, sink, command, env, "pycollector_heap")
    sink.take()
    return Run(mode, index, attached.load, {"ms_per_round_trip": attached.figure, **attached.bpf_figures})


def _start_pinned(command: list[str], env: dict[str, str]) -> subprocess.Popen:
    """``command`` on the host's last CPU (heap_sampler.on_the_last_cpu), up to its "ready"."""
    process = children.start(heap_sampler.on_the_last_cpu(command), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for line in process.stdout:  # (heaptrack says a few words first)
        if line.strip() == "ready":
            return process
    raise RuntimeError(f"{command[0]} exited with {process.wait()} before it was ready")


def _go(process: subprocess.Popen) -> tuple[float, dict[str, int]]:
    """Let it run its timed part: the figure it prints last, and the counts it prints as
    "name N" lines (the loop's "spun": its round trips before the timed part)."""
    process.stdin.write("go\n")
    process.stdin.close()
    printed = process.stdout.read().splitlines()
    code = process.wait()
    children.forget(process)
    figures = [line for line in printed if re.fullmatch(r"[0-9.]+", line.strip())]  # (heaptrack says more after it)
    if code != 0 or not figures:
        raise RuntimeError(f"the timed program exited with {code}, printing {printed}")
    counts = {match[1]: int(match[2]) for match in (re.fullmatch(r"(\w+) (\d+)", line.strip()) for line in printed) if match}
    return float(figures[-1]), counts


def _timed(command: list[str], env: dict[str, str]) -> tuple[float, dict[str, int]]:
    return _go(_start_pinned(command, env))


@dataclasses.dataclass
class AttachedRun:
    figure: float  # what the program printed last
    counts: dict[str, int]  # and the counts it printed
    unseen: int  # the loop's round trips before the agent attached
    load: str  # /proc/loadavg as its timed part began
    pid: int  # the program's (its reports are in the sink)
    bpf_figures: dict[str, float]  # the agent's memory programs over the timed part


def _attached(settings: Settings, rundir: Path, sink: ProfilesSink, command: list[str], env: dict[str, str], sampler_file: str,
              marks: bool = False) -> AttachedRun:
    """The program under a pycollector agent with memory profiling on: started once the agent
    samples, timed once the agent has attached to it and settled; the agent stopped after it.
    ``marks``: the program answers "mark" (the loop), asked as the agent has attached."""
    agent = PycollectorAgent(rundir, settings.hz, sink.endpoint, settings.reporter_interval_s, rounds.unwind_cache_dir(rundir),
                             receiver_settings={"allocation_profiling": True, "live_heap_profiling": True})  # (the heap samplers' probes, the live heap too)
    sink.take()  # only this run's reports are read after it
    agent.launch()
    try:
        agent.wait_until_sampling()
        process = _start_pinned(command, env)
        _wait_until_attached(process.pid, sampler_file)
        unseen = _mark(process) if marks else 0
        time.sleep(settings.settle_seconds)  # the agent's first report (it symbolizes the host) out of the way
        load = procfs.load_average()
        before = _memory_program_stats(agent.pid)
        figure, counts = _go(process)
        after = _memory_program_stats(agent.pid)
    finally:
        peers.stop(agent)  # it reports its last partial interval
    bpf_figures = {}
    for name in MEMORY_PROGRAMS:
        run_time_ns, run_count = (a - b for a, b in zip(after.get(name, (0, 0)), before.get(name, (0, 0))))
        bpf_figures[f"bpf_ns_per_{name}"] = run_time_ns / run_count if run_count else float("nan")
        bpf_figures[f"{name}_runs"] = run_count
    return AttachedRun(figure, counts, unseen, load, process.pid, bpf_figures)


def _mark(process: subprocess.Popen) -> int:
    """The loop's round trips so far (heap_sampler.c's "mark")."""
    process.stdin.write("mark\n")
    process.stdin.flush()
    line = process.stdout.readline().split()
    if len(line) != 2 or line[0] != "marked":
        raise RuntimeError(f"the loop answered {line} to mark")
    return int(line[1])


def _wait_until_attached(pid: int, sampler_file: str) -> None:
    """Until the probes of the sampler mapped in ``pid`` (the file whose name holds
    ``sampler_file``) have their semaphores raised: the kernel raises them as the agent attaches."""
    deadline = time.monotonic() + ATTACH_TIMEOUT_S
    while time.monotonic() < deadline:
        if all(_semaphores(pid, sampler_file)):
            return
        time.sleep(0.05)
    raise RuntimeError(f"pycollector did not attach to process {pid} within {ATTACH_TIMEOUT_S:g} s")


def _semaphores(pid: int, sampler_file: str) -> list[int]:
    """The otel_memory probes' semaphores in ``pid``: at the file's first mapping (its load bias)
    plus the semaphore's address in the file."""
    maps = [line.split() for line in Path(f"/proc/{pid}/maps").read_text().splitlines()]
    mapped = [fields for fields in maps if len(fields) >= 6 and sampler_file in Path(fields[5]).name]
    if not mapped:
        return [0]
    path, base = mapped[0][5], min(int(fields[0].split("-")[0], 16) for fields in mapped)
    with open(path, "rb") as file:
        probes = read_probes(BoundedElf(file), "otel_memory")
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        return [int.from_bytes(os.pread(fd, 2, base + probe.semaphore), "little") for probe in probes]
    finally:
        os.close(fd)


def _memory_program_stats(pid: int) -> dict[str, tuple[int, int]]:
    """(run_time_ns, run_cnt) of the agent's memory programs, by name (uprobes are kprobe programs)."""
    stats = {}
    for program in procfs.sampling_bpf_programs(pid, (procfs.BPF_PROG_TYPE_KPROBE,)):
        name = _program_name(program["prog_id"])
        if name in MEMORY_PROGRAMS:
            run_time_ns, run_count = stats.get(name, (0, 0))
            stats[name] = (run_time_ns + program["run_time_ns"], run_count + program["run_cnt"])
    return stats


_names: dict[int, str] = {}


def _program_name(prog_id: int) -> str:
    if prog_id not in _names:
        shown = subprocess.run(["bpftool", "prog", "show", "id", str(prog_id)], capture_output=True, text=True, check=True).stdout
        _names[prog_id] = re.search(r"name (\S+)", shown)[1] if "name " in shown else ""
    return _names[prog_id]


def _pycollector_allocations(requests: list[bytes], pid: int) -> tuple[float, float]:
    """(alloc_objects, alloc_space) the agent reported for process ``pid``."""
    totals = {ALLOC_OBJECTS: 0.0, ALLOC_SPACE: 0.0}
    for request in requests:
        data = profiles_pb2.ProfilesData.FromString(request)
        for view in iter_samples(data):
            kind = sample_type(data, view.profile)
            if kind in totals and str(view.resource.get("process.pid")) == str(pid):
                totals[kind] += sum(view.values)
    return totals[ALLOC_OBJECTS], totals[ALLOC_SPACE]


def _heaptrack_calls(recording: Path) -> int:
    """heaptrack_print's count of calls to allocation functions; its summary goes to stderr, the
    figures people read heaptrack for, beside ours."""
    printed = subprocess.run(["heaptrack_print", "--print-peaks=0", "--print-allocators=0", "--print-temporary=0",
                              "--print-leaks=0", str(recording)], capture_output=True, text=True, check=True).stdout
    summary = printed[printed.index("total runtime"):] if "total runtime" in printed else printed[-600:]
    print("bench: heaptrack_print of the loop:\n  " + "\n  ".join(summary.strip().splitlines()), file=sys.stderr)
    return int(re.search(r"calls to allocation functions: (\d+)", printed)[1])


def _slowdown(runs: list[Run], mode: str, figure: str) -> list[float]:
    return [profiled / alone for profiled, alone in zip(per_round(runs, mode, figure), per_round(runs, NONE, figure))]


def _at_most(goal: float):
    def verdict(ours: Summary, _theirs: Summary, _ratio: Summary) -> str:
        outcome = "met" if ours.median <= goal else f"missed by {100 * (ours.median - goal):.1f} pt"
        return f"≤ {goal:.2f}: {outcome} (rounds {ours.low:.3f}–{ours.high:.3f})"
    return verdict


def rows(loop_runs: list[Run], json_runs: list[Run]) -> list[Row]:
    loop, js = "malloc(64)+free loop", "json dumps+loads (python3, Python sampler)"

    def bpf_rows(runs: list[Run], workload: str) -> list[Row]:
        return [Row(SECTION, f"{workload}: BPF run time per {name} (a sampled {name.removeprefix('memory_')}), ns (bpf_stats)",
                    per_round(runs, ATTACHED, f"bpf_ns_per_{name}"), "", [], "{:.0f}") for name in MEMORY_PROGRAMS] + [
            Row(SECTION, f"{workload}: sampled allocations reaching BPF in a run (memory_alloc runs)", per_round(runs, ATTACHED, "memory_alloc_runs"), "", [], "{:.0f}")]

    return [
        Row(SECTION, f"{loop}: ns per round trip, no library (the baseline)", per_round(loop_runs, NONE, "ns_per_round_trip"), "", [], "{:.2f}"),
        Row(SECTION, f"{loop}: ns per round trip, sampler loaded, no profiler", per_round(loop_runs, DETACHED, "ns_per_round_trip"), "", [], "{:.2f}"),
        Row(SECTION, f"{loop}: ns per round trip, profiled (pycollector attached; heaptrack)", per_round(loop_runs, ATTACHED, "ns_per_round_trip"),
            HEAPTRACK, per_round(loop_runs, HEAPTRACK, "ns_per_round_trip"), "{:.2f}"),
        Row(SECTION, f"{loop}: slowdown, sampler loaded, no profiler / the baseline", _slowdown(loop_runs, DETACHED, "ns_per_round_trip"), "", [], "{:.3f}"),
        Row(SECTION, f"{loop}: slowdown, profiled / the baseline", _slowdown(loop_runs, ATTACHED, "ns_per_round_trip"),
            HEAPTRACK, _slowdown(loop_runs, HEAPTRACK, "ns_per_round_trip"), "{:.3f}"),
        Row(SECTION, f"{loop}: allocations recorded per malloc (pycollector: sampled ones, alloc_objects; heaptrack: every call)",
            per_round(loop_runs, ATTACHED, "allocations_counted_per_malloc"), HEAPTRACK, per_round(loop_runs, HEAPTRACK, "allocations_counted_per_malloc"), "{:.3g}"),
        Row(SECTION, f"{loop}: bytes counted per byte allocated (alloc_space)", per_round(loop_runs, ATTACHED, "bytes_counted_per_byte"), "", [], "{:.3f}"),
        *bpf_rows(loop_runs, loop),
        Row(SECTION, f"{js}: ms per round trip, sampler not loaded (the baseline)", per_round(json_runs, NONE, "ms_per_round_trip"), "", [], "{:.1f}"),
        Row(SECTION, f"{js}: ms per round trip, sampler on, no profiler", per_round(json_runs, DETACHED, "ms_per_round_trip"), "", [], "{:.1f}"),
        Row(SECTION, f"{js}: ms per round trip, pycollector attached", per_round(json_runs, ATTACHED, "ms_per_round_trip"), "", [], "{:.1f}"),
        Row(SECTION, f"{js}: slowdown, sampler on, no profiler / the baseline", _slowdown(json_runs, DETACHED, "ms_per_round_trip"), "", [], "{:.3f}", _at_most(DETACHED_GOAL)),
        Row(SECTION, f"{js}: slowdown, pycollector attached / the baseline", _slowdown(json_runs, ATTACHED, "ms_per_round_trip"), "", [], "{:.3f}", _at_most(ATTACHED_GOAL)),
        *bpf_rows(json_runs, js),
    ]


def main(argv: list[str] | None = None) -> int:
    return alone.run_section(argv, "bench.memory", "memory", lambda settings, workdir, sink: rows(*run_rounds(settings, workdir, sink)))


if __name__ == "__main__":
    sys.exit(main())
