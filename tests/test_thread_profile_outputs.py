"""The threads and goroutines profiles in every output (issue 44): the console (debug exporter)
names where they sit, the pprof exporter writes each type, the flame graph page offers both and
keeps a process's latest reading (a level, as the live heap's: never a sum of reports), its units
name them, and `pycollector diff` compares two readings by value. The profiles are as the
receiver sends them: one sample a thread (thread.id, value 1) under its stack, one a distinct
goroutine stack (no thread) with how many sit there."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from exporters.debug.config import DebugConfig
from exporters.debug.exporter import _render
from exporters.flamegraph import page
from exporters.flamegraph.tree import page_data
from exporters.flamegraph.window import ProcessKey, ProfileWindow, merged
from exporters.pprof.convert import to_pprof
from pycollector.pdata import ProfilesBuilder
from tests.test_flamegraph import FakeClock
from tests.test_flamegraph_memory import otlp_file

START_NS = 1_700_000_000_000_000_000
THREADS, GOROUTINES = ("threads", "count"), ("goroutines", "count")
PID = 4321


def reading(pool: int, door: int, goroutines_in_pool: int, start_ns: int = START_NS):
    """One report of a process: ``pool`` + ``door`` threads parked and the main one; its goroutines."""
    b = ProfilesBuilder()
    resource = b.resource_profiles({"process.pid": PID, "process.executable.name": "server"})
    scope = b.scope_profiles(resource)

    def stack(*names: str, kinds: tuple[str, ...] = ()) -> int:
        return b.stack([b.location(0, 0, [(b.function(name), 0, 0)], {"profile.frame.type": (kinds[i] if i < len(kinds) else "native")})
                        for i, name in enumerate(names)])

    threads = b.profile(scope, sample_type=THREADS, period_type=("", ""), time_unix_nano=start_ns, duration_nano=1_000_000_000)
    tid = 100
    for site, count in (("park_in_the_pool", pool), ("park_at_the_door", door), ("wait_for_the_end", 1)):
        for _ in range(count):
            tid += 1
            b.sample(threads, stack("__schedule", "futex_wait", site, "main", kinds=("kernel", "kernel")), [1], attributes={"thread.id": tid})
    goroutines = b.profile(scope, sample_type=GOROUTINES, period_type=("", ""), time_unix_nano=start_ns, duration_nano=1_000_000_000)
    b.sample(goroutines, stack("runtime.gopark", "runtime.chanrecv1", "main.waitInThePool", "runtime.goexit"), [goroutines_in_pool])
    b.sample(goroutines, stack("runtime.gopark", "runtime.chanrecv1", "main.waitAtTheDoor", "runtime.goexit"), [10])
    return b.data


def test_the_console_says_how_many_threads_and_goroutines_sit_where():
    text = _render("profiles", reading(50, 5, 100), DebugConfig())
    lines = text.splitlines()
    threads = next(i for i, line in enumerate(lines) if "threads/count" in line)
    assert "total=56 threads" in lines[threads] and "duration" not in lines[threads], lines[threads]  # (a reading: no duration)
    assert lines[threads + 1].split()[0:3] == ["50", "89.3%", "park_in_the_pool"], lines[threads + 1]  # (where it waits, not __schedule)
    goroutines = next(i for i, line in enumerate(lines) if "goroutines/count" in line)
    assert "total=110 goroutines" in lines[goroutines]
    assert lines[goroutines + 1].split()[0:3] == ["100", "90.9%", "main.waitInThePool"], lines[goroutines + 1]  # (not runtime.gopark)


def test_pprof_writes_each_type_its_own_file():
    written = {profile.sample_type: profile for profile in to_pprof(reading(50, 5, 100), merged=False)}
    assert set(written) == {"threads", "goroutines"}
    for name, total in (("threads", 56), ("goroutines", 110)):
        profile = written[name].profile
        assert [(profile.string_table[t.type], profile.string_table[t.unit]) for t in profile.sample_type] == [(name, "count")]
        assert sum(sample.value[0] for sample in profile.sample) == total


def test_the_page_offers_both_types_and_keeps_a_process_latest_reading():
    clock = FakeClock()
    window = ProfileWindow(300, clock=clock)
    window.add(reading(50, 5, 100))
    clock.now += 60
    window.add(reading(50, 5, 400, start_ns=START_NS + 60_000_000_000))  # the pool's goroutines leak
    totals = window.totals()
    key = ProcessKey(PID, "server", "")
    by_leaf = {stack[1][0]: value for stack, value in merged(totals[GOROUTINES][key]).items()}  # (root first: goexit, then the site)
    assert by_leaf == {"main.waitInThePool": 400, "main.waitAtTheDoor": 10}, by_leaf  # (the latest reading, not 500)
    assert sum(merged(totals[THREADS][key]).values()) == 56
    data = page_data(totals, 300, "host", 0, window.segments(), window.resources())
    assert {(t["id"], t["snapshot"], t["total"]) for t in data["types"]} == {("threads", True, 56), ("goroutines", True, 410)}


def test_the_page_names_the_types_and_their_values():
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    script = """
        const units = require(process.argv[1]);
        const threads = {type: "threads", unit: "count"}, goroutines = {type: "goroutines", unit: "count"};
        console.log(JSON.stringify([units.describe(threads).label, units.phrase(56, threads), units.describe(goroutines).label,
                                    units.phrase(410, goroutines), units.describe(goroutines).more]));
    """
    result = subprocess.run(["node", "-e", script, str(page.ASSETS / "units.js")], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["Threads", "56 threads", "Goroutines", "410 goroutines", "More goroutines"]


def test_diff_shows_the_goroutine_leak_by_value(tmp_path, cli):
    before = otlp_file(tmp_path / "before.json", reading(50, 5, 100))
    after = otlp_file(tmp_path / "after.json", reading(50, 5, 400, start_ns=START_NS + 60_000_000_000))
    result = cli("diff", "--type", "goroutines", str(before), str(after))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("base: 110 goroutines (") and "after: 410 goroutines (" in lines[0], lines[0]
    more = lines.index("more goroutines sit in")
    assert lines[more + 1].split() == ["+300", "self", "100", "400", "main.waitInThePool"], result.stdout
    threads = cli("diff", "--type", "threads", str(before), str(after)).stdout.splitlines()
    assert threads[0].startswith("base: 56 threads (") and "after: 56 threads (" in threads[0]
