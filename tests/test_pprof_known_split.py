"""A reader nobody here wrote agrees with us: `go tool pprof -top` on the file the pprof exporter
wrote while known_split ran under the profiling receiver shows its 3:1 split."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pycollector.config.validate import build_plan
from pycollector.service import Service
from pycollector.testing import registry_with

from tests.conftest import WORKLOADS, bpf_unavailable_reason, share_tolerance
from tests.test_profiling_receiver import compile_c

pytestmark = pytest.mark.bpf

HZ = 97
# Long enough for ~750 samples at full speed: the share then sits within a point or two of 75%
# even when other work on the host makes sampling land at random points of the loop.
RUN_SECONDS = 8
# With -unit=ms: `  2060ms 74.91% 74.91%  2070ms 75.28%  spin_heavy`: flat, flat%, sum%, cum, cum%, name
TOP_ROW = re.compile(r"^\s*([\d.]+)ms\s+[\d.]+%\s+[\d.]+%\s+\S+\s+[\d.]+%\s+(\S+)")


def pprof_file(binary: Path, seconds: float, out: Path) -> Path:
    """The file the pprof exporter wrote for ``binary`` run for ``seconds`` under the profiling
    receiver: one interval longer than the run, so the file written at shutdown covers all of it."""
    config = {
        "receivers": {"profiling": {"samples_per_second": HZ, "reporter_interval": "30s"}},
        "exporters": {"pprof": {"directory": str(out)}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["pprof"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }
    service = Service(build_plan(config, registry_with()))
    service.start()
    try:
        workload = subprocess.Popen([str(binary), str(seconds)], stdout=subprocess.DEVNULL)
        workload.wait(timeout=seconds + 30)
    finally:
        service.shutdown()
    [path] = out.glob(f"*-{binary.name}-{workload.pid}.pb.gz")
    return path


@pytest.mark.skipif(shutil.which("go") is None, reason="go (Debian golang-go) is not installed")
def test_go_tool_pprof_shows_the_known_split(tmp_path):
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    known_split = compile_c(tmp_path, "known_split", WORKLOADS / "known_split.c")
    path = pprof_file(known_split, RUN_SECONDS, tmp_path / "pprof")
    result = subprocess.run(["go", "tool", "pprof", "-top", "-unit=ms", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    print(result.stdout)
    flat = {match.group(2): float(match.group(1)) for match in map(TOP_ROW.match, result.stdout.splitlines()) if match}
    heavy, light = flat["spin_heavy"], flat["spin_light"]
    share = heavy / (heavy + light)
    samples = (heavy + light) * HZ / 1000  # each sample stands for one period of CPU time
    print(f"go tool pprof: spin_heavy {heavy}ms spin_light {light}ms -> spin_heavy share {100 * share:.1f}% of {samples:.0f} samples")
    assert abs(share - 0.75) <= share_tolerance(samples), result.stdout
    assert "File: known_split" in result.stdout and "Build ID: " in result.stdout
