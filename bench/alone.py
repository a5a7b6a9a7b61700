"""One section of the bench on its own: `python -m bench.<section> [--quick]` measures it and prints
its rows (the whole bench writes RESULTS.md; a section alone is for working on it)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import bpf_stats, children, report
from bench.figures import Row
from bench.settings import FULL, QUICK, Settings
from bench.sink import ProfilesSink


def run_section(argv: list[str] | None, module: str, title: str, measure: Callable[[Settings, Path, ProfilesSink], list[Row]]) -> int:
    """Parse ``argv`` (--quick), then ``measure(settings, scratch folder, sink)`` with BPF run-time
    statistics on, every process it started stopped at the end even when interrupted; print the
    rows it gives."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=f"The {title} section of the bench alone; prints its rows.")
    parser.add_argument("--quick", action="store_true", help="one round on tiny durations")
    settings = QUICK if parser.parse_args(argv).quick else FULL
    if os.geteuid() != 0:
        print("bench: needs root (BPF, the bpf_stats sysctl)", file=sys.stderr)
        return 2
    handlers = children.stop_on_signals()
    began = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="pycollector-bench-") as scratch, bpf_stats.enabled(), ProfilesSink(keep_requests=True) as sink:
            rows = measure(settings, Path(scratch), sink)
    finally:
        children.kill_all()
        children.restore_signals(handlers)
    print("\n".join(report.table(report.HEADER, [row.cells() for row in rows])))
    print(f"bench: {title} section in {time.monotonic() - began:.0f} s", file=sys.stderr)
    return 0
