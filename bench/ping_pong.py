"""The off-CPU bench's workload, ping_pong.c: two processes on one CPU bouncing a byte over two
pipes, as many round trips a second as the host lets them (each blocks in read() once a round
trip, and the CPU switches from one to the other); or, ``futex``, a turn through a futex word in
a shared page (each blocks in FUTEX_WAIT: a lock wait)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

from bench import children

SOURCE = Path(__file__).resolve().with_name("ping_pong.c")


@dataclasses.dataclass
class PingPongResult:
    round_trips: int
    seconds: float  # as the parent timed its loop

    @property
    def rate(self) -> float:
        return self.round_trips / self.seconds


def build(directory: Path) -> Path:
    """With frame pointers, so the kernel's frame-pointer walk (offcputime's) can unwind it too."""
    binary = directory / "ping_pong"
    subprocess.run(["gcc", "-O2", "-fno-omit-frame-pointer", "-o", str(binary), str(SOURCE)], check=True)
    return binary


def run(binary: Path, seconds: float, futex: bool = False) -> PingPongResult:
    # Both processes on one CPU (see ping_pong.c): the host's last, as good as any.
    cpu = max(os.sched_getaffinity(0))
    process = children.start([str(binary), f"{seconds:g}", str(cpu), *(["futex"] if futex else [])], stdout=subprocess.PIPE)
    printed, _ = process.communicate()
    children.forget(process)
    if process.returncode != 0:
        raise RuntimeError(f"{binary} exited with {process.returncode}")
    round_trips, elapsed = printed.split()
    return PingPongResult(int(round_trips), float(elapsed))
