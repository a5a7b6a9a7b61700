"""Shared fixtures. eBPF tests run for real; they skip only when BPF cannot work here and the
environment does not demand it (CI sets PYCOLLECTOR_REQUIRE_BPF=1, and then they fail instead)."""

from __future__ import annotations

import collections
import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pycollector import logs

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = REPO.parent / "shared" / "workloads"

logs.configure("console", "warn")


@functools.lru_cache(maxsize=None)
def bpf_unavailable_reason() -> str | None:
    """Why BPF programs cannot be loaded here, or None when they can."""
    if os.geteuid() != 0:
        return "not running as root (the profiling receiver needs CAP_BPF and CAP_PERFMON)"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "the bcc module is missing (Debian package python3-bpfcc)"
    if not Path(f"/lib/modules/{os.uname().release}/build/include").exists():
        return "kernel headers are missing (run scripts/setup.sh)"
    return None


def share_tolerance(samples: float, share: float = 0.75, floor: float = 0.05) -> float:
    """How far a sampled share may stray from the true ``share``: three standard deviations of a
    binomial proportion over ``samples`` samples, and never less than ``floor``. A busy CI host
    gives a workload little CPU time, and with 120 samples one standard deviation is 4 points."""
    return max(floor, 3 * (share * (1 - share) / max(samples, 1.0)) ** 0.5)


def pytest_runtest_setup(item):
    if item.get_closest_marker("bpf") is None:
        return
    reason = bpf_unavailable_reason()
    if reason is None:
        return
    if os.environ.get("PYCOLLECTOR_REQUIRE_BPF") == "1":
        pytest.fail(f"eBPF is required (PYCOLLECTOR_REQUIRE_BPF=1) but unavailable: {reason}")
    pytest.skip(f"eBPF unavailable: {reason}")


def run_cli(*args: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """Run the installed ``pycollector`` console script, as a user would."""
    executable = shutil.which("pycollector", path=str(Path(sys.executable).parent)) or "pycollector"
    return subprocess.run([executable, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, **kwargs)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def log_output():
    """Logs at info level into a buffer for the duration of a test (read with .getvalue())."""
    import io

    buffer = io.StringIO()
    logs.configure("console", "info", stream=buffer)
    yield buffer
    logs.configure("console", "warn")


def perf_leaves(data: Path) -> collections.Counter:
    """Samples by leaf function, as perf's own DWARF unwinding and symbolization saw them."""
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,sym"], capture_output=True, text=True, check=True).stdout
    leaves: collections.Counter = collections.Counter()
    for block in script.strip().split("\n\n"):
        lines = block.strip().splitlines()
        if lines:
            leaves[lines[0].split(None, 1)[-1]] += 1
    return leaves
