"""Memory profiles on the flame graph page and in `pycollector diff` (issue 39): the window keeps
allocation stacks from their site up (the sampler's and malloc's frames left out) and the live
heap's readings as readings (a process's latest, never a sum of reports); the page offers the
memory types and shows bytes; a leak (in-use growth between two times) is compared by value, on
the page (compare.js under node, and the page in headless Chromium) and by `pycollector diff` on
OTLP and pprof heap files.

The profiles are the receiver's own (tests/heap_profiles.py: ReportBuilder over a running process
under the native sampler, no BPF): 60/30/10 MiB allocated in alloc_hot/alloc_warm/alloc_leaky; in
use, alloc_warm 1 MiB and alloc_leaky 4 MiB at the first report, 9 MiB a minute later."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from exporters.flamegraph.page import PageTemplate, missing_vendor_files
from exporters.flamegraph.tree import page_data
from exporters.flamegraph.window import ProcessKey, ProfileWindow, merged
from tests.heap_profiles import HELD_BEFORE, MIB, MINUTE_NS, START_NS, heap_sites
from tests.test_flamegraph import FakeClock
from tests.test_flamegraph_browser import CHROMIUM, Frames, chromium, page_texts
from tests.test_flamegraph_diff import run_compare

INUSE, ALLOC = ("inuse_space", "bytes"), ("alloc_space", "bytes")


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """The receiver's reports a minute apart (the leak growing from 4 to 9 MiB), the process's key."""
    with heap_sites(tmp_path_factory.mktemp("heap_sites")) as workload:
        yield {"before": workload.report(held=HELD_BEFORE, cpu=0), "after": workload.report(start_ns=START_NS + MINUTE_NS, cpu=0),
               "allocations": workload.report(held=None, cpu=0), "key": ProcessKey(workload.pid, "heap_sites", "")}


def by_site(stacks) -> dict[str, int]:
    """Stack values by leaf (root-first stacks), each stack's leaf its allocation site."""
    return {stack[-1][0]: value for stack, value in stacks.items()}


# -- the window ----------------------------------------------------------------------------------


def test_the_window_keeps_allocation_stacks_from_their_site_up(reports):
    window = ProfileWindow(60)
    window.add(reports["allocations"])
    stacks = merged(window.totals()[ALLOC][reports["key"]])
    # Not sample <- malloc_sampled <- malloc <- alloc_hot <- main: the site is the leaf.
    assert dict(stacks) == {(("main", "native"), ("alloc_hot", "native")): 60 * MIB, (("main", "native"), ("alloc_warm", "native")): 30 * MIB,
                            (("main", "native"), ("alloc_leaky", "native")): 10 * MIB}


def test_a_process_latest_in_use_reading_replaces_the_earlier_ones(reports):
    clock = FakeClock()
    window = ProfileWindow(300, clock=clock)  # 5 s slices, 25 s segments
    window.add(reports["before"])
    window.add(reports["before"])  # (the same report twice in one slice: still one reading)
    assert by_site(merged(window.totals()[INUSE][reports["key"]])) == {"alloc_warm": 1 * MIB, "alloc_leaky": 4 * MIB}
    clock.now += 60
    window.add(reports["after"])
    totals = window.totals()
    assert by_site(merged(totals[INUSE][reports["key"]])) == {"alloc_warm": 1 * MIB, "alloc_leaky": 9 * MIB}  # not 2 + 13 MiB
    # Allocations are counts: the three reports' add up.
    assert by_site(merged(totals[ALLOC][reports["key"]])) == {"alloc_hot": 180 * MIB, "alloc_warm": 90 * MIB, "alloc_leaky": 30 * MIB}
    # Each segment holds the reading of its own time.
    assert [by_site(segment.totals[INUSE][reports["key"]]) for segment in window.segments()] == [
        {"alloc_warm": 1 * MIB, "alloc_leaky": 4 * MIB}, {"alloc_warm": 1 * MIB, "alloc_leaky": 9 * MIB}]


def test_one_export_holding_two_readings_of_a_process_keeps_the_later(reports):
    from pycollector.pdata import merge
    from opentelemetry.proto.profiles.v1development import profiles_pb2

    both = profiles_pb2.ProfilesData()
    merge(both, reports["after"])
    merge(both, reports["before"])  # (a batch may hold two reports, in any order)
    window = ProfileWindow(60)
    window.add(both)
    assert by_site(merged(window.totals()[INUSE][reports["key"]])) == {"alloc_warm": 1 * MIB, "alloc_leaky": 9 * MIB}


def test_memory_alone_opens_on_in_use_bytes_a_level_the_page_compares_by_value(reports):
    window = ProfileWindow(60)
    window.add(reports["after"])
    data = page_data(window.totals(), 60, "host", 0, window.segments(), window.resources())
    assert [(t["id"], t["snapshot"], t["total"]) for t in data["types"]] == [
        ("inuse_space", True, 10 * MIB), ("alloc_space", False, 100 * MIB), ("inuse_objects", True, 20), ("alloc_objects", False, 200)]


# -- compare.js, under node ----------------------------------------------------------------------


def test_compare_js_compares_levels_by_value():
    result = run_compare("""
        const frames = [["main", "native"], ["alloc_warm", "native"], ["alloc_leaky", "native"]];
        const stacks = [[0, 1], [0, 2]];
        const MiB = 1 << 20;
        const base = C.treeOf([[0, 1 * MiB], [1, 4 * MiB]], frames, stacks), after = C.treeOf([[0, 1 * MiB], [1, 9 * MiB]], frames, stacks);
        return { levels: C.changes(base, after, false, true).rows, shares: C.changes(base, after, false, false).rows,
                 over: C.denominators(5 * MiB, 10 * MiB, true) };
    """)
    levels = {row["function"]: row for row in result["levels"]}
    # The leaker grew by 5 MiB, half the larger total; alloc_warm held the same: no change.
    assert levels["alloc_leaky"]["afterSelfValue"] - levels["alloc_leaky"]["baseSelfValue"] == 5 * MIB
    assert levels["alloc_leaky"]["selfChange"] == pytest.approx(0.5) and levels["alloc_warm"]["selfChange"] == 0
    assert not any(row["noise"] for row in result["levels"]) and result["over"] == [10 * MIB, 10 * MIB]
    # By shares of each side's own total, alloc_warm would seem to shrink (20% -> 10%).
    assert {row["function"]: round(row["selfChange"], 3) for row in result["shares"]}["alloc_warm"] == -0.1


# -- pycollector diff ----------------------------------------------------------------------------


def otlp_file(path, *messages):
    from exporters.file.encoding import frame

    path.write_bytes(b"".join(frame(message, "json") for message in messages))
    return path


def test_diff_shows_in_use_growth_by_value(tmp_path, cli, reports):
    before, after = otlp_file(tmp_path / "before.json", reports["before"]), otlp_file(tmp_path / "after.json", reports["after"])
    result = cli("diff", "--sample-type", "inuse_space", str(before), str(after))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("base: 5.00MiB in use (") and "after: 10.0MiB in use (" in lines[0] and lines[0].endswith("type: inuse_space"), lines[0]
    more, less = lines.index("holds more"), lines.index("holds less")
    assert lines[more + 1].split() == ["+5.00MiB", "self", "4.00MiB", "9.00MiB", "alloc_leaky"], result.stdout
    assert less == more + 2  # alloc_warm held 1 MiB both times: it holds no less
    # A file of memory profiles alone opens on in-use bytes; each file's latest reading is its side.
    both = otlp_file(tmp_path / "both.json", reports["before"], reports["after"])
    assert cli("diff", str(before), str(both)).stdout == result.stdout.replace(str(after), str(both))
    allocated = cli("diff", "--type", "alloc_space", str(before), str(after)).stdout.splitlines()
    assert allocated[0].startswith("base: 100MiB allocated") and "allocates more" in allocated
    missing = cli("diff", "--type", "inuse_space", str(before), str(otlp_file(tmp_path / "alloc.json", reports["allocations"])))
    assert missing.returncode == 1 and "alloc.json: no sample type 'inuse_space' (it has alloc_objects, alloc_space)" in missing.stderr


def test_diff_reads_heap_files_the_pprof_exporter_wrote_by_their_sites(tmp_path, cli, reports):
    from tests.test_pprof_exporter import exporter_in

    files = []
    for name in ("before", "after"):
        exporter_in(tmp_path / name).consume(reports[name])
        [path] = (tmp_path / name).iterdir()
        files.append(str(path))
    result = cli("diff", *files)  # the heap file's default, inuse_space; its drop_frames applied
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[lines.index("holds more") + 1].split() == ["+5.00MiB", "self", "4.00MiB", "9.00MiB", "alloc_leaky"], result.stdout
    allocated = cli("diff", "--type", "alloc_space", *files).stdout
    assert "sample" not in allocated.split() and "malloc" not in allocated.split(), allocated


# -- the page in Chromium ------------------------------------------------------------------------


class DiffRows(HTMLParser):
    """The diff table's rows as their cells' texts, under their heading."""

    def __init__(self, dom: str):
        super().__init__()
        self.rows: dict[str, list[list[str]]] = {}
        self._heading, self._row, self._cell = None, None, None
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = ""

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag == "td" and self._row is not None:
            self._row.append(self._cell)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if len(self._row) == 1:
                self._heading = self._row[0]
                self.rows[self._heading] = []
            elif len(self._row) == 7 and self._heading:
                self.rows[self._heading].append(self._row)
            self._row = None


@pytest.fixture(scope="module")
def memory_page(tmp_path_factory, reports):
    """The page as saved, fed the two reports a minute apart (two segments of the window)."""
    if CHROMIUM is None or missing_vendor_files():
        pytest.skip("chromium or the flame graph renderer is not installed (scripts/setup.sh)")
    clock = FakeClock()
    window = ProfileWindow(300, clock=clock)
    window.add(reports["before"])
    clock.now += 60
    window.add(reports["after"])
    work = tmp_path_factory.mktemp("flamegraph-memory")
    page = work / "memory.html"
    page.write_bytes(PageTemplate().render(page_data(window.totals(), 300, "testhost", 0, window.segments(), window.resources()), live=False))
    return {"uri": page.as_uri(), "work": work}


def test_the_page_offers_the_memory_types_and_shows_in_use_bytes(memory_page):
    dom, console = chromium(memory_page["uri"] + "#search=alloc_leaky", memory_page["work"], "--dump-dom")
    assert console == [], console
    texts = page_texts(dom)
    assert texts["types"] == [("inuse_space", "In-use memory"), ("alloc_space", "Allocated memory"), ("inuse_objects", "In-use objects"),
                              ("alloc_objects", "Allocations")] and "hidden" not in texts["type_control"]
    assert texts["title"] == "In-use memory flame graph", texts
    assert texts["summary"].endswith("· each process's latest reading in the last 5 min up to " + texts["summary"].split(" up to ")[1].split(" · ")[0]
                                     + " · 10.0 MiB in use"), texts["summary"]
    frames = Frames(dom)
    assert {"alloc_leaky", "alloc_warm", "main"} <= set(frames.widths) and not {"malloc", "sample", "alloc_hot"} & set(frames.widths)
    assert frames.widths["alloc_leaky"] / frames.widths["main"] == pytest.approx(0.9, rel=0.01)
    assert "9.00 MiB in use" in frames.titles["alloc_leaky"], frames.titles
    assert frames.details.strip() == "search: 9.00 MiB of 10.0 MiB total in use (90.0%)", frames.details


def test_the_allocated_bytes_graph_is_the_sum_over_the_window(memory_page):
    dom, console = chromium(memory_page["uri"] + "#type=alloc_space", memory_page["work"], "--dump-dom")
    assert console == [], console
    assert page_texts(dom)["summary"].endswith("· 200 MiB allocated")
    frames = Frames(dom)
    assert frames.widths["alloc_hot"] / frames.widths["main"] == pytest.approx(0.6, rel=0.01)


def test_comparing_two_times_shows_the_leak_as_in_use_growth(memory_page):
    url = memory_page["uri"] + "#compare=time"  # (by default the older half against the newer)
    dom, console = chromium(url, memory_page["work"], "--dump-dom")
    assert console == [], console
    rows = DiffRows(dom).rows
    assert rows["Holds more"] == [["alloc_leaky", "+5.00 MiB", "4.00 MiB", "9.00 MiB", "+5.00 MiB", "4.00 MiB", "9.00 MiB"]], rows
    assert rows["Holds less"] == []
    frames = Frames(dom)
    fill = [int(part) for part in re.findall(r"\d+", frames.fills["alloc_leaky"])]
    assert fill[0] > fill[2] and frames.fills["alloc_warm"] == "rgb(224,224,224)", frames.fills  # grew: red; the same: grey
    assert "baseline 4.00 MiB, +5.00 MiB" in frames.titles["alloc_leaky"], frames.titles["alloc_leaky"]
    screenshot = memory_page["work"] / "memory-diff.png"
    _, console = chromium(url, memory_page["work"], f"--screenshot={screenshot}")
    assert console == [] and screenshot.stat().st_size > 10_000
    print(f"screenshot: {screenshot}")
