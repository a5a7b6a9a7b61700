"""The bench's quick mode end to end on tiny durations: every scenario runs and the table it
writes has each section. The figures themselves come from `make bench`; nothing here times them."""

from __future__ import annotations

import pytest

from bench.__main__ import main

pytestmark = [pytest.mark.bpf, pytest.mark.load_tolerant]  # (what it reports: make test runs it beside others)

SECTIONS = ("Overhead", "Agent cost", "Start-up", "Truth", "Python frames", "Java and JavaScript frames", "Off-CPU", "Span context", "Memory", "Pipeline", "Gateway workers", "Persistent queue", "Sizes", "Agent memory", "Crowded host")


def test_quick_bench_writes_every_section(tmp_path):
    results = tmp_path / "RESULTS.md"
    assert main(["--quick", "--output", str(results)]) == 0
    table = [line for line in results.read_text().splitlines() if line.startswith("| ")]
    sections = {line.split("|")[1].strip() for line in table}
    assert set(SECTIONS) <= sections, f"missing sections: {set(SECTIONS) - sections}"
    for line in table:
        if line.split("|")[1].strip() in SECTIONS:
            assert "n/a" not in line.split("|")[3], f"pycollector has no figure: {line}"
