"""The workload every profiler is measured on: copies of known_split, one per CPU, saturating
the host for a fixed time and reporting how many iterations they managed."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

from bench import children

SOURCE = Path(__file__).resolve().parents[2] / "shared" / "workloads" / "known_split.c"


@dataclasses.dataclass
class WorkloadResult:
    iterations: int
    cpu_seconds: float  # what the copies really ran, from wait4
    pids: list[int]


def build_known_split(directory: Path) -> Path:
    """The frame-pointer build, so perf and both BPF profilers can unwind it."""
    binary = directory / "known_split"
    subprocess.run(["gcc", "-O2", "-fno-omit-frame-pointer", "-o", str(binary), str(SOURCE)], check=True)
    return binary


def run(binary: Path, seconds: float, copies: int) -> WorkloadResult:
    processes = [children.start([str(binary), f"{seconds:g}"], stdout=subprocess.PIPE) for _ in range(copies)]
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
