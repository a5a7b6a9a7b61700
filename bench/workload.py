"""The workload every profiler is measured on: copies of known_split, one per CPU, saturating
the host for a fixed time and reporting how many iterations they managed."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

from bench import children

WORKLOADS = Path(__file__).resolve().parents[2] / "shared" / "workloads"  # one known 75/25 workload per language
SOURCE = WORKLOADS / "known_split.c"


@dataclasses.dataclass
class WorkloadResult:
    iterations: int
    cpu_seconds: float  # what the copies really ran, from wait4
    pids: list[int]


def build_known_split(directory: Path, frame_pointers: bool = True) -> Path:
    """The frame-pointer build, so perf and both BPF profilers can unwind it; without frame
    pointers (as distributions and release builds ship code), for the unwinding rounds."""
    binary = directory / ("known_split" if frame_pointers else "known_split_nofp")
    flag = "-fno-omit-frame-pointer" if frame_pointers else "-fomit-frame-pointer"
    subprocess.run(["gcc", "-O2", flag, "-o", str(binary), str(SOURCE)], check=True)
    return binary


def run(binary: Path, seconds: float, copies: int) -> WorkloadResult:
    return finish(start(binary, seconds, copies), binary)


def start(binary: Path, seconds: float, copies: int) -> list[subprocess.Popen]:
    """The copies, started and left running: ``finish`` waits for them."""
    return [children.start([str(binary), f"{seconds:g}"], stdout=subprocess.PIPE) for _ in range(copies)]


def finish(processes: list[subprocess.Popen], binary: Path) -> WorkloadResult:
    iterations, cpu_seconds = 0, 0.0
    for process in processes:
        printed = process.stdout.read()  # until the copy exits and closes its stdout
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        process.stdout.close()
        children.forget(process)
        if process.returncode != 0:
            raise RuntimeError(f"{binary} exited with {process.returncode}")
        iterations += int(printed)
        cpu_seconds += usage.ru_utime + usage.ru_stime
    return WorkloadResult(iterations, cpu_seconds, [process.pid for process in processes])
