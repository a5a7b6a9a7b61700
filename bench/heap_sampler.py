"""The native heap sampler's cost on a malloc(64)/free loop (bench/heap_sampler.c): the loop alone,
under LD_PRELOAD with no profiler (both semaphores zero: what every program pays for having the
library loaded), and with the semaphores raised as an attached profiler raises them (the test
trace, written to /dev/null: the sampler's own work, without the uprobe the profiler adds per
sampled event), the last also with 256 MiB kept alive before the loop (about 512 sampled blocks
alive at the default interval, so each free looks itself up in the table of sampled blocks). Rounds
interleave the modes, so a busy host slows them alike; each figure is the median ns per
malloc+free over the rounds, the ratios are taken within a round, and the fastest run of each mode
against the fastest without the library says what the library costs when nothing else gets in
the way (on a shared VM the same loop runs at two speeds, ~60% apart, from one run to the next).

    python -m bench.heap_sampler [--rounds 7] [--iterations 20000000]

Prints figures; asserts nothing (a timed assertion would fail on a loaded host, not on a slow
sampler). The tests check what it does; this tells what it costs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOOP_SOURCE = Path(__file__).resolve().with_name("heap_sampler.c")
NATIVE = REPO / "sdk" / "native"
LIBRARY = "libpycollector_heap.so"

MODES = ("no library", "library, no profiler", "library, semaphores raised", "raised, sampled blocks alive")
KEEP_MIB = {"raised, sampled blocks alive": 256}


def build(directory: Path) -> tuple[Path, Path]:
    """The library through sdk/native's Makefile, and the loop, into ``directory``."""
    subprocess.run(["make", "-s", "-C", str(NATIVE), f"OUT={directory}"], check=True)
    loop = directory / "heap_sampler_loop"
    subprocess.run(["gcc", "-O2", "-o", str(loop), str(LOOP_SOURCE)], check=True)
    return directory / LIBRARY, loop


def environment(mode: str, library: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("LD_PRELOAD", "PYCOLLECTOR_HEAP_"))}
    if mode != "no library":
        env["LD_PRELOAD"] = str(library)
    if mode in ("library, semaphores raised", "raised, sampled blocks alive"):
        env["PYCOLLECTOR_HEAP_SAMPLE_TRACE"] = os.devnull
    return env


def on_the_last_cpu(command: list[str]) -> list[str]:
    """``command`` run on the host's last CPU, as the off-CPU bench picks (two CPUs of a VM differ
    by more than what is measured here), by taskset: a preexec_fn would run Python in a child
    forked from a bench whose gRPC sink has threads, which Python warns may deadlock (one json
    run here died of SIGABRT before it was ready)."""
    return ["taskset", "--cpu-list", str(max(os.sched_getaffinity(0))), *command]


def run_pinned(command: list[str], env: dict[str, str]) -> float:
    """The figure ``command`` prints, run on the host's last CPU (on_the_last_cpu)."""
    printed = subprocess.run(on_the_last_cpu(command), env=env, check=True, capture_output=True, text=True).stdout
    return float(printed)


def interleaved(modes: tuple[str, ...], rounds: int, run: Callable[[str], float]) -> dict[str, list[float]]:
    """``run(mode)`` for every mode, round after round, the order rotated: no mode always first."""
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for index in range(rounds):
        for mode in modes[index % len(modes):] + modes[:index % len(modes)]:
            times[mode].append(run(mode))
    return times


def measure(rounds: int, iterations: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="pycollector-heap-bench-") as scratch:
        library, loop = build(Path(scratch))
        return interleaved(MODES, rounds, lambda mode: run_pinned([str(loop), str(iterations), str(KEEP_MIB.get(mode, 0))],
                                                                   environment(mode, library)))


def report(times: dict[str, list[float]], title: str = "malloc(64)+free, ns per round trip", unit: str = "ns") -> str:
    """Each mode's median [min-max], and its ratios to the first mode's (the baseline)."""
    base_mode, base = next(iter(times.items()))
    lines = [f"{title}, median [min-max] of {len(base)} rounds:"]
    for mode, values in times.items():
        line = f"  {mode:30s} {statistics.median(values):7.2f} [{min(values):.2f}-{max(values):.2f}]"
        if mode != base_mode:
            ratios = [value / alone for value, alone in zip(values, base)]
            line += (f"   ratio to {base_mode} {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}],"
                     f" fastest to fastest {min(values) / min(base):.3f} (+{min(values) - min(base):.1f} {unit})")
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.heap_sampler", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=20_000_000, help="malloc+free per run")
    args = parser.parse_args(argv)
    print(report(measure(args.rounds, args.iterations)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
