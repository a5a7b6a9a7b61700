"""Kernel run time of BPF programs: `kernel.bpf_stats_enabled` on for the run, restored after,
and `bpftool prog show` for a program's run_time_ns and run_cnt."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")


@contextlib.contextmanager
def enabled() -> Iterator[None]:
    """The kernel counts each program's runs and their time only while this sysctl is 1."""
    before = SYSCTL.read_text().strip()
    SYSCTL.write_text("1")
    try:
        yield
    finally:
        SYSCTL.write_text(before)


def program_stats(prog_id: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of one loaded program, as bpftool reports them."""
    shown = subprocess.run(["bpftool", "prog", "show", "id", str(prog_id), "--json"], capture_output=True, text=True, check=True)
    program = json.loads(shown.stdout)
    return program.get("run_time_ns", 0), program.get("run_cnt", 0)
