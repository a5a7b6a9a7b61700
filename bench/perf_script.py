"""Samples out of a perf.data file, through `perf script`: per sample its pid and its frames,
leaf first, each with its address and symbol ("[unknown]" when perf found none)."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

# "<address> <symbol> (<object file>)"; a C++ symbol may hold spaces and parentheses.
FRAME = re.compile(r"^\s+([0-9a-f]+) (.*) \(.*\)$")
HEADER = re.compile(r"^\s*(\d+)/(\d+)\s*$")
UNKNOWN = "[unknown]"
KERNEL_SPACE_START = 0xFFFF_8000_0000_0000


@dataclasses.dataclass
class PerfFrame:
    address: int
    symbol: str

    @property
    def user(self) -> bool:
        return self.address < KERNEL_SPACE_START

    @property
    def named(self) -> bool:
        return self.symbol != UNKNOWN


@dataclasses.dataclass
class PerfSample:
    pid: int
    frames: list[PerfFrame]


def read_samples(data_path: Path) -> list[PerfSample]:
    printed = subprocess.run([shutil.which("perf") or "perf", "script", "-i", str(data_path), "-F", "pid,tid,ip,sym,dso"], capture_output=True, text=True, check=True).stdout
    samples: list[PerfSample] = []
    for line in printed.splitlines():
        header = HEADER.match(line)
        if header:
            samples.append(PerfSample(int(header.group(1)), []))
            continue
        frame = FRAME.match(line)
        if frame and samples:
            samples[-1].frames.append(PerfFrame(int(frame.group(1), 16), frame.group(2)))
    return samples
