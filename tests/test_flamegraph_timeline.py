"""The flame graph page's timeline and table (issue 41), used in headless Chromium as a person
would (tests/browser.py: the mouse dragged, buttons clicked): the timeline draws the window's
values per second with the idle gap of a workload that was busy, idle and busy again; a range
dragged on it draws the graph of that range alone, whose total is the range's; "Compare with
another range" and a second drag make a diff; the link and the saved file keep the selection; the
table lists each function's self and total as the graph has them, sorted and searched. On data
built by hand, then with real BPF. Screenshots are saved in the test's directory (paths printed)."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from pycollector.config.validate import build_plan
from pycollector.service import Service
from pycollector.testing import make_settings, registry_with

from exporters.flamegraph.config import FlamegraphConfig
from exporters.flamegraph.exporter import FlamegraphExporter
from exporters.flamegraph.factory import factory
from exporters.flamegraph.page import PageTemplate
from exporters.flamegraph.tree import page_data
from exporters.flamegraph.window import ProfileWindow
from tests.browser import Browser
from tests.conftest import bpf_unavailable_reason
from tests.test_flamegraph import FakeClock
from tests.test_flamegraph_browser import CHROMIUM, TESTDATA, skip_without_the_page_renderer
from tests.test_flamegraph_diff import CPU, service_profiles
from tests.test_profiling_receiver import compile_c

BUSY_S = 10
ROOT = [("_start", "native"), ("main", "native")]


def busy(function: str, value: int) -> list:
    return [(ROOT + [(function, "native"), ("spin", "native")], value)]


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A minute's window as the exporter keeps it: 10 s busy in first_busy (a report a second), 10 s
    with nothing, 10 s busy in second_busy; saved as a file."""
    skip_without_the_page_renderer()
    clock = FakeClock()
    window = ProfileWindow(60, clock=clock)
    attributes = {"process.pid": 10, "process.executable.name": "worker"}
    for second in range(3 * BUSY_S):
        if second < BUSY_S:
            window.add(service_profiles([(attributes, busy("first_busy", 90 + second))]))
        elif second >= 2 * BUSY_S:
            window.add(service_profiles([(attributes, busy("second_busy", 50 + second))]))
        clock.now += 1
    clock.now -= 1
    work = tmp_path_factory.mktemp("flamegraph-timeline")
    path = work / "timeline.html"
    path.write_bytes(PageTemplate().render(page_data(window.totals(), 60, "testhost", 0, window.segments(), window.resources()), live=False))
    with Browser(CHROMIUM, work) as browser:
        yield {"uri": path.as_uri(), "work": work, "browser": browser, "first": sum(90 + s for s in range(BUSY_S)),
               "second": sum(50 + s for s in range(2 * BUSY_S, 3 * BUSY_S))}


def timed_report(function: str, value: int, start_s: float, seconds: float = 1.0):
    """A report of the profiling receiver's kind: its profile says the time it covers."""
    return service_profiles([({"process.pid": 10, "process.executable.name": "worker"}, busy(function, value))],
                            time_unix_nano=int(start_s * 1e9), duration_nano=int(seconds * 1e9))


def test_a_report_counts_in_the_slice_of_the_time_it_covers_not_of_its_arrival():
    """Two reports a second apart that arrive together (jitter, a batch) are two bars, not one
    twice as high beside a hole; a report that says a time outside the window counts where it
    arrives."""
    clock = FakeClock()
    window = ProfileWindow(60, clock=clock)
    now = time.time()
    window.add(timed_report("first_busy", 100, now - 3.2))
    window.add(timed_report("second_busy", 100, now - 2.2))
    window.add(timed_report("third_busy", 100, now - 86400))  # a day ago: not believed
    segments = window.segments()
    values = [{stack[-2][0]: value for stacks in segment.totals[CPU].values() for stack, value in stacks.items()} for segment in segments]
    assert values == [{"first_busy": 100}, {"second_busy": 100}, {"third_busy": 100}], values
    assert segments[1].start_unix - segments[0].start_unix == pytest.approx(1, abs=0.001)
    assert segments[0].start_unix - 0.01 <= now - 2.7 < segments[0].end_unix + 0.01  # the middle of the time it covered (boundaries to the ms)
    assert segments[2].start_unix - 0.01 <= now < segments[2].end_unix + 0.01  # arrived now


def bars(browser: Browser) -> list[dict]:
    """The timeline's bars as drawn: start (unix s), value, whether outside the selection, and x."""
    return browser.evaluate("[...document.querySelectorAll('#timeline rect.bar')].map((bar) => ({start: +bar.dataset.start, "
                            "end: +bar.dataset.end, value: +bar.dataset.value, outside: bar.classList.contains('outside'), "
                            "x: bar.getBoundingClientRect().x, width: bar.getBoundingClientRect().width, y: bar.getBoundingClientRect().y}))")


def graph(browser: Browser) -> dict[str, int]:
    """Each frame the graph draws and its value, as its tooltip says ("name (x%, N samples)")."""
    titles = browser.evaluate("[...document.querySelectorAll('#chart g title')].map((title) => title.textContent)")
    values: dict[str, int] = {}
    for title in titles:
        match = re.match(r"(.*) \([\d.]+%, ([\d,]+) samples?\)$", title)
        if match:
            values[match.group(1)] = values.get(match.group(1), 0) + int(match.group(2).replace(",", ""))
    return values


def table(browser: Browser) -> list[list[str]]:
    return browser.evaluate("[...document.querySelectorAll('#functions tbody tr')].map((row) => [...row.cells].map((cell) => cell.textContent))")


def drag_over(browser: Browser, chosen: list[dict]) -> None:
    """Drag across the timeline from the first to the last of ``chosen`` bars, a little inside them."""
    timeline = browser.box("#timeline")
    y = timeline["y"] + timeline["height"] / 3
    browser.drag((chosen[0]["x"] + 1, y), (chosen[-1]["x"] + chosen[-1]["width"] - 1, y))


def hash_of(browser: Browser) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(browser.evaluate("location.hash.slice(1)")))


def test_the_timeline_shows_the_gap_and_a_dragged_range_draws_that_range_alone(page):
    browser = page["browser"]
    browser.open(page["uri"])
    drawn = bars(browser)
    assert len(drawn) == 2 * BUSY_S, drawn  # a bar per second with samples
    gaps = [later["start"] - earlier["end"] for earlier, later in zip(drawn, drawn[1:])]
    assert max(gaps) == pytest.approx(BUSY_S, abs=0.01) and sorted(gaps)[-2] == pytest.approx(0, abs=0.01), gaps  # the idle gap
    assert drawn[BUSY_S]["x"] - (drawn[BUSY_S - 1]["x"] + drawn[BUSY_S - 1]["width"]) > 100  # and it shows: a tenth of the width is empty
    assert graph(browser)["worker [10]"] == page["first"] + page["second"]
    drag_over(browser, drawn[:BUSY_S])
    drawn = bars(browser)
    assert [bar["outside"] for bar in drawn] == [False] * BUSY_S + [True] * BUSY_S
    values = graph(browser)
    assert values["worker [10]"] == page["first"] == sum(bar["value"] for bar in drawn[:BUSY_S]), values
    assert "first_busy" in values and "second_busy" not in values
    selection = hash_of(browser)
    assert float(selection["from"]) == pytest.approx(drawn[0]["start"], abs=0.001) and float(selection["to"]) == pytest.approx(drawn[BUSY_S - 1]["end"], abs=0.001)
    assert browser.errors == []
    print("screenshot:", browser.screenshot(page["work"] / "timeline-range.png"))


def test_a_range_and_a_second_drag_make_a_diff(page):
    browser = page["browser"]
    browser.open(page["uri"])
    drawn = bars(browser)
    drag_over(browser, drawn[:BUSY_S])
    browser.click("#compare-range")
    assert hash_of(browser)["compare"] == "time"
    drag_over(browser, drawn[BUSY_S:])
    selection = hash_of(browser)
    assert float(selection["bto"]) == pytest.approx(drawn[BUSY_S - 1]["end"], abs=0.001), selection
    assert float(selection["afrom"]) == pytest.approx(drawn[BUSY_S]["start"], abs=0.001), selection
    more = browser.evaluate("[...document.querySelectorAll('#diff-more tr[data-function]')].map((row) => row.dataset.function)")
    less = browser.evaluate("[...document.querySelectorAll('#diff-less tr[data-function]')].map((row) => row.dataset.function)")
    assert more[:1] == ["second_busy"] and less[:1] == ["first_busy"], (more, less)
    assert browser.errors == []
    print("screenshot:", browser.screenshot(page["work"] / "timeline-diff.png"))


def test_the_link_keeps_the_range(page):
    browser = page["browser"]
    browser.open(page["uri"])
    drawn = bars(browser)
    browser.open(page["uri"] + f"#from={drawn[BUSY_S]['start']:.3f}&to={drawn[-1]['end']:.3f}")
    assert graph(browser)["worker [10]"] == page["second"]
    assert [bar["outside"] for bar in bars(browser)] == [True] * BUSY_S + [False] * BUSY_S
    # Boundaries as the page writes them (to the millisecond), of two segments: those two alone.
    browser.open(page["uri"] + f"#from={drawn[1]['start']:.3f}&to={drawn[2]['end']:.3f}")
    assert graph(browser)["worker [10]"] == drawn[1]["value"] + drawn[2]["value"]


def test_the_table_has_the_graphs_numbers_sorted_and_searched(page):
    browser = page["browser"]
    browser.open(page["uri"])
    rows = table(browser)
    assert rows[0][0].startswith("all") and rows[0][2] == "0.0%" and rows[0][4] == "100.0%", rows[0]
    totals = [int(row[3].replace(",", "")) for row in rows[1:]]
    assert totals == sorted(totals, reverse=True) and rows[1][0] in ("_start", "main")
    values = graph(browser)
    by_name = {row[0]: row for row in rows[1:]}
    for function in ("first_busy", "second_busy", "spin", "main"):  # each once in the graph: its value is its total
        assert int(by_name[function][3].replace(",", "")) == values[function], (function, by_name[function], values[function])
    assert int(by_name["spin"][1].replace(",", "")) == values["spin"]  # a leaf: all of it self
    assert by_name["first_busy"][1] == "0"
    browser.click("#functions th[data-sort='self']")
    assert table(browser)[1][0] == "spin" and hash_of(browser)["sort"] == "self"
    browser.evaluate("(() => { const box = document.getElementById('search'); box.value = 'busy'; box.dispatchEvent(new Event('input')); })()")
    browser.settle()
    assert sorted(row[0] for row in table(browser)[1:]) == ["first_busy", "second_busy"]
    assert browser.errors == []
    print("screenshot:", browser.screenshot(page["work"] / "table.png"))
    browser.open(page["uri"] + "#view=table")
    assert graph(browser) == {} and len(table(browser)) > 3


def test_the_saved_file_opens_on_the_view_it_was_saved_from(page, tmp_path):
    """The page's download link passes its fragment; the file the server gives opens on it."""
    clock = FakeClock()
    exporter = FlamegraphExporter(make_settings(), FlamegraphConfig(endpoint="127.0.0.1:0", window="60s"))
    exporter.window = ProfileWindow(60, clock=clock)
    attributes = {"process.pid": 10, "process.executable.name": "worker"}
    for second in range(6):
        exporter.consume(service_profiles([(attributes, busy("first_busy" if second < 3 else "second_busy", 10))]))
        clock.now += 1
    exporter.start(None)
    try:
        browser = page["browser"]
        browser.open(exporter.url)
        drawn = bars(browser)
        drag_over(browser, drawn[3:])
        href = browser.evaluate("document.getElementById('download').href")
        assert "fragment=" in href and "from%3D" in href, href
        saved = tmp_path / "saved.html"
        with urllib.request.urlopen(href, timeout=10) as response:
            saved.write_bytes(response.read())
    finally:
        exporter.shutdown()
    browser.open(saved.as_uri())
    values = graph(browser)
    assert values["worker [10]"] == 30 and "first_busy" not in values, values


# -- with real BPF: a program busy 10 s, idle 10 s, busy 10 s under the profiling receiver ---------

@pytest.mark.bpf
def test_a_busy_idle_busy_program_shows_its_gap_and_its_first_busy_range(page, tmp_path):
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    program = compile_c(tmp_path, "busy_idle_busy", TESTDATA / "busy_idle_busy.c")
    config = {
        "receivers": {"profiling": {"samples_per_second": 97, "reporter_interval": "1s",
                                    "process_filter": {"executable": "^busy_idle_busy$"}}},
        "exporters": {"flamegraph": {"endpoint": "127.0.0.1:0", "window": "60s"}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["flamegraph"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }
    service = Service(build_plan(config, registry_with(exporters={"flamegraph": factory})))
    service.start()
    try:
        workload = subprocess.Popen([str(program), str(BUSY_S)])
        assert workload.wait(timeout=3 * BUSY_S + 30) == 0
        time.sleep(2.5)  # the last report reaches the window
        exporter = next(node.component for node in service.graph.nodes.values() if node.key.kind == "exporters")
        browser = page["browser"]
        browser.open(f"{exporter.url}#process={workload.pid}")
        drawn = [bar for bar in bars(browser) if bar["value"]]
        print("the timeline, (seconds from the first bar, value):", [(round(bar["start"] - drawn[0]["start"]), bar["value"]) for bar in drawn])
        gaps = [later["start"] - earlier["end"] for earlier, later in zip(drawn, drawn[1:])]
        widest = max(range(len(gaps)), key=gaps.__getitem__)
        assert BUSY_S - 3 <= gaps[widest] <= BUSY_S + 1, gaps  # asleep: no sample for about 10 s (a report may straddle)
        first = drawn[:widest + 1]
        drag_over(browser, first)
        values = graph(browser)
        assert values[f"busy_idle_busy [{workload.pid}]"] == sum(bar["value"] for bar in first), (values, first)
        assert values.get("first_busy", 0) > 0.9 * sum(bar["value"] for bar in first) and "second_busy" not in values, values
        assert browser.errors == []
        print("screenshot:", browser.screenshot(tmp_path / "busy-idle-busy.png"))
    finally:
        service.shutdown()


def test_labels_sit_inside_their_frames_and_children_inside_their_parents(page):
    """What a person reads: each frame's label within its box, each callee under its caller and
    within its width (in the graph of a range too)."""
    browser = page["browser"]
    browser.open(page["uri"])
    drawn = bars(browser)
    for fragment in ("", f"#from={drawn[0]['start']:.3f}&to={drawn[4]['end']:.3f}"):
        browser.open(page["uri"] + fragment)
        frames = browser.evaluate("""(() => {
            const boxes = new Map();
            for (const g of document.querySelectorAll('#chart g')) {
                const node = d3.select(g).datum();
                const rect = g.querySelector('rect');
                if (node && rect) boxes.set(node, {g: g, box: rect.getBoundingClientRect()});
            }
            return [...boxes].map(([node, {g, box}]) => {
                const label = g.querySelector('foreignObject div, text');
                const text = label ? label.getBoundingClientRect() : null;
                const parent = node.parent && boxes.get(node.parent);
                return {name: node.data.name, box: [box.x, box.y, box.width, box.height],
                        label: label && label.textContent ? [text.x, text.y, text.width, text.height] : null,
                        parent: parent ? [parent.box.x, parent.box.y, parent.box.width, parent.box.height] : null};
            });
        })()""")
        assert len(frames) >= 5 and sum(1 for frame in frames if frame["label"]) >= 5, frames
        for frame in frames:
            x, y, width, height = frame["box"]
            if frame["label"] and width > 30:
                lx, ly, lw, lh = frame["label"]
                assert x - 0.5 <= lx and lx + lw <= x + width + 0.5 and y - 0.5 <= ly and ly + lh <= y + height + 0.5, frame
            if frame["parent"]:
                px, py, pw, _ = frame["parent"]
                assert px - 0.5 <= x and x + width <= px + pw + 0.5 and y > py, frame
