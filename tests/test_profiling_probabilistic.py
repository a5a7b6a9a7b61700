"""Probabilistic profiling (probabilistic_threshold, probabilistic_interval) with real BPF.

The draws come from a seeded generator, so the intervals profiled are known: with threshold 50
and 2 s intervals, seed 16 draws on, off, off, on, off, on, off, on. A busy process running the
first 12 s is then sampled for 6 of them: about half of what sampling all the time would give.
"""

from __future__ import annotations

import random
import subprocess

import pytest

from pycollector.config.validate import build_plan
from pycollector.pdata import iter_samples
from pycollector.service import Service
from pycollector.testing import CapturingExporterFactory, receiver_of, registry_with
from receivers.profiling.kernel import probabilistic

from tests.conftest import WORKLOADS, bpf_unavailable_reason

pytestmark = pytest.mark.bpf

HZ = 99
INTERVAL_S = 2
SEED = 16
DRAWS = [True, False, False, True, False, True, False, True]  # random.Random(16), threshold 50
SECONDS = 12


def test_only_the_intervals_drawn_are_profiled(tmp_path, monkeypatch):
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    generator = random.Random(SEED)
    assert [generator.randrange(100) < 50 for _ in DRAWS] == DRAWS
    monkeypatch.setattr(probabilistic, "_new_rng", lambda: random.Random(SEED))
    binary = tmp_path / "known_split"
    subprocess.run(["gcc", "-O2", "-fno-omit-frame-pointer", "-o", str(binary), str(WORKLOADS / "known_split.c")], check=True)
    config = {
        "receivers": {"profiling": {"samples_per_second": HZ, "reporter_interval": "1s", "unwind_cache_dir": str(tmp_path / "cache"),
                                    "probabilistic_threshold": 50, "probabilistic_interval": f"{INTERVAL_S}s"}},
        "exporters": {"capture": {}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["capture"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }
    capture = CapturingExporterFactory()
    service = Service(build_plan(config, registry_with(exporters={"capture": capture})))
    service.start()
    try:
        busy = subprocess.Popen([str(binary), str(SECONDS)], stdout=subprocess.DEVNULL)
        busy.wait(timeout=60)
        stats = dict(receiver_of(service).probabilistic.stats)
    finally:
        service.shutdown()
    samples = sum(sum(view.values) for message in capture.consumer.messages for view in iter_samples(message)
                  if view.resource.get("process.pid") == busy.pid)
    drawn = DRAWS[:SECONDS // INTERVAL_S]
    expected_share = drawn.count(True) / len(drawn)
    share = samples / (SECONDS * HZ)
    print(f"{samples} samples, {share:.2f} of sampling all the time; intervals drawn on {expected_share:.2f}; {stats}")
    assert stats["intervals_on"] >= drawn.count(True) and stats["intervals_off"] >= drawn.count(False)
    assert abs(share - expected_share) <= 0.15, "sampled in the intervals drawn, and only then"
