"""The flame graph page's comparison (issue 27), on data built by hand: the window's time segments
and resource attributes, the shares compare.js computes (node, no browser), and the diff drawn in
headless Chromium: choosing a baseline and a comparison (two service.version values, two time
ranges, a pinned view) draws the comparison's shape coloured by the sign of each change, and the
table's first rows are the largest changes each way. Screenshots are printed with their paths."""

from __future__ import annotations

import json
import urllib.request
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from pycollector.pdata import ProfilesBuilder

from exporters.flamegraph.page import PageTemplate, missing_vendor_files
from exporters.flamegraph.tree import page_data
from exporters.flamegraph.window import ProcessKey, ProfileWindow
from tests.test_flamegraph import FakeClock
from tests.test_flamegraph_browser import CHROMIUM, Frames, chromium, skip_without_the_page_renderer

COMPARE_JS = Path(__file__).parent.parent / "exporters" / "flamegraph" / "assets" / "compare.js"
CPU = ("samples", "count")


def service_profiles(processes: list[tuple[dict, list[tuple[list[tuple[str, str]], int]]]], time_unix_nano: int = 0, duration_nano: int = 0):
    """One resource per process (its attributes given), its stacks root first as (function, frame
    type); each profile covering the time given (none by default)."""
    b = ProfilesBuilder()
    for attributes, stacks in processes:
        scope = b.scope_profiles(b.resource_profiles(attributes))
        profile = b.profile(scope, sample_type=CPU, period_type=("cpu", "nanoseconds"), period=10_000_000,
                            time_unix_nano=time_unix_nano, duration_nano=duration_nano)
        for frames, value in stacks:
            locations = [b.location(lines=[(b.function(function), 0, 0)], attributes={"profile.frame.type": kind}) for function, kind in reversed(frames)]
            b.sample(profile, b.stack(locations), [value])
    return b.data


def version(number: str, pid: int, heavy: int, light: int):
    """A Python service whose `heavy` share runs in `hot` and the rest in `cold`, each of them
    ending in the interpreter's C code, as the profiling receiver sees a Python process."""
    attributes = {"process.pid": pid, "process.executable.name": "python3.11", "service.name": "shop", "service.version": number}
    root = [("_start", "native"), ("main", "cpython"), ("serve", "cpython")]
    return attributes, [(root + [("hot", "cpython"), ("_PyEval_EvalFrameDefault", "native")], heavy),
                        (root + [("cold", "cpython"), ("_PyEval_EvalFrameDefault", "native")], light - light // 4),
                        (root + [("cold", "cpython"), ("PyLong_Add", "native")], light // 4)]


# -- the window: segments and resources ----------------------------------------------------------


def test_the_window_gives_its_samples_in_time_segments_and_each_processs_resource():
    clock = FakeClock()
    window = ProfileWindow(60, clock=clock)  # 1 s slices, each a segment
    window.add(service_profiles([version("1", 10, 20, 80)]))
    clock.now += 30
    window.add(service_profiles([version("2", 20, 60, 40)]))
    segments = window.segments()
    assert len(segments) == 2 and 29 <= segments[1].start_unix - segments[0].start_unix <= 31
    assert all(segment.end_unix - segment.start_unix == pytest.approx(1) for segment in segments)
    assert [set(key.pid for key in segment.totals[CPU]) for segment in segments] == [{10}, {20}]
    resources = window.resources()
    assert resources[ProcessKey(10, "python3.11 (shop)", "")]["service.version"] == "1"
    assert "process.pid" not in resources[ProcessKey(20, "python3.11 (shop)", "")]
    data = page_data(window.totals(), 60, "host", 0, segments, resources)
    type_ = data["types"][0]
    assert [process["resource"]["service.version"] for process in type_["processes"]] == ["1", "2"]  # heaviest first (equal: by name, then as inserted)
    assert len(type_["segments"]) == 2
    # A segment's stacks are indexes into the document's stack table, itself indexes into frames.
    index, pairs = type_["segments"][1]["processes"][0]
    assert type_["processes"][index]["pid"] == 20
    names = [[data["frames"][frame][0] for frame in data["stacks"][stack]] for stack, _ in pairs]
    assert ["_start", "main", "serve", "hot", "_PyEval_EvalFrameDefault"] in names
    clock.now += 40  # the first version's samples leave the window, and its segment with them
    assert [set(key.pid for key in segment.totals[CPU]) for segment in window.segments()] == [{20}]


# -- compare.js, under node ----------------------------------------------------------------------


def run_compare(script: str):
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    program = f"const C = require({json.dumps(str(COMPARE_JS))});\nconsole.log(JSON.stringify((() => {{ {script} }})()));"
    return json.loads(subprocess.run(["node", "-e", program], capture_output=True, text=True, check=True).stdout)


TREE_OF = """
const frames = [["main", "cpython"], ["hot (app.py:3)", "cpython"], ["hot (app.py:4)", "cpython"], ["eval", "native"], ["cold (app.py:9)", "cpython"], ["memcpy", "native"]];
const stacks = [[0, 1, 3], [0, 2, 3], [0, 4, 3], [0, 4, 5], [5]];
"""


def test_self_goes_to_the_innermost_frame_of_the_programs_language_and_total_counts_once_per_stack():
    tally = run_compare(TREE_OF + """
        const t = C.tally(C.treeOf([[0, 10], [1, 5], [2, 4], [3, 1], [4, 7]], frames, stacks));
        return { total: t.total, self: Object.fromEntries(t.self), totals: Object.fromEntries(t.totals) };
    """)
    # hot on two lines is one function; eval below hot is hot's self; memcpy with no Python frame is its own.
    assert tally["self"] == {"hot (app.py)": 15, "cold (app.py)": 5, "memcpy": 7}
    assert tally["total"] == 27
    assert tally["totals"]["main"] == 20 and tally["totals"]["eval"] == 19 and tally["totals"]["memcpy"] == 8


def test_changes_are_shares_of_each_sides_own_total_with_the_noise_flagged():
    result = run_compare(TREE_OF + """
        const base = C.treeOf([[0, 20], [2, 80]], frames, stacks);      // hot 20%
        const after = C.treeOf([[0, 600], [2, 400]], frames, stacks);   // hot 60%, ten times the samples
        const small = C.changes(C.treeOf([[0, 50], [2, 50]], frames, stacks), C.treeOf([[0, 52], [2, 48]], frames, stacks), true);
        return { big: C.changes(base, after, true), small: small.rows.map((row) => row.noise), offCpu: C.changes(base, after, false).rows.map((row) => row.noise) };
    """)
    first, last = result["big"]["rows"][0], result["big"]["rows"][-1]
    assert first["function"] == "hot (app.py)" and first["selfChange"] == pytest.approx(0.4) and not first["noise"]
    assert last["function"] == "cold (app.py)" and last["selfChange"] == pytest.approx(-0.4)
    assert result["big"]["baseTotal"] == 100 and result["big"]["afterTotal"] == 1000
    assert all(result["small"]) and not any(result["offCpu"])


def test_namesakes_of_two_frame_types_are_two_rows_in_the_diff_and_the_table():
    result = run_compare("""
        const frames = [["main", "native"], ["write", "native"], ["memcpy", "kernel"], ["encode", "native"], ["memcpy", "native"]];
        const stacks = [[0, 1, 2], [0, 3, 4]];
        const base = C.treeOf([[0, 50], [1, 50]], frames, stacks), after = C.treeOf([[0, 20], [1, 80]], frames, stacks);
        const table = C.tally(after, { leafSelf: true, namesakes: C.namesakes(after) });
        return { rows: C.changes(base, after, true).rows.map((row) => [row.function, row.selfChange]), table: Object.fromEntries(table.self) };
    """)
    changes = dict(result["rows"])
    assert changes["memcpy [native]"] == pytest.approx(0.3) and changes["memcpy [kernel]"] == pytest.approx(-0.3) and "memcpy" not in changes
    assert "main" in changes and "write" in changes  # (no namesake: as they are)
    assert result["table"] == {"memcpy [kernel]": 20, "memcpy [native]": 80}


def test_colours_follow_the_sign_of_the_change_and_saturate_at_the_scale():
    colours = run_compare("return [C.colour(0.2, 0.4), C.colour(-0.4, 0.4), C.colour(0, 0.4), C.colour(0.8, 0.4)];")
    rgb = [tuple(int(part) for part in re.findall(r"\d+", colour)) for colour in colours]
    assert rgb[0][0] > rgb[0][2] and rgb[1][2] > rgb[1][0] and rgb[2] == (224, 224, 224)
    assert rgb[3] == (214, 39, 40)  # past the scale: the most saturated red


# -- the page in Chromium ------------------------------------------------------------------------


class DiffTable(HTMLParser):
    """The diff table's rows: (function, the change it is ranked by) per row, costs more then
    costs less; by: function -> "self" or "total", what that change is of."""

    def __init__(self, dom: str):
        super().__init__()
        self.by: dict[str, str] = {}
        self.more: list[tuple[str, float]] = []
        self.less: list[tuple[str, float]] = []
        self.note = ""
        self._body = None
        self._in_note = False
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tbody" and attrs.get("id") in ("diff-more", "diff-less"):
            self._body = self.more if attrs["id"] == "diff-more" else self.less
        elif tag == "tr" and "data-function" in attrs and self._body is not None:
            self._body.append((attrs["data-function"], float(attrs["data-change"])))
            self.by[attrs["data-function"]] = attrs["data-by"]
        self._in_note = attrs.get("id") == "diff-note"

    def handle_endtag(self, tag):
        if tag == "tbody":
            self._body = None
        if tag == "span":
            self._in_note = False

    def handle_data(self, data):
        if self._in_note:
            self.note += data


@pytest.fixture(scope="module")
def saved_page(tmp_path_factory):
    """A page as the exporter saves it: version 1 (hot 20%) for 30 s, then version 2 (hot 60%)."""
    skip_without_the_page_renderer()
    clock = FakeClock()
    window = ProfileWindow(60, clock=clock)
    for _ in range(6):
        window.add(service_profiles([version("1.4", 10, 20, 80)]))
        clock.now += 5
    for _ in range(6):
        window.add(service_profiles([version("1.5", 20, 60, 40)]))
        clock.now += 5
    clock.now -= 5
    work = tmp_path_factory.mktemp("flamegraph-diff")
    page = work / "diff.html"
    data = page_data(window.totals(), 60, "testhost", 0, window.segments(), window.resources())
    page.write_bytes(PageTemplate().render(data, live=False))
    return {"uri": page.as_uri(), "work": work, "data": data}


def diff_dom(saved_page, fragment: str, screenshot: str | None = None) -> tuple[Frames, DiffTable]:
    url = saved_page["uri"] + "#" + fragment
    dom, console = chromium(url, saved_page["work"], "--dump-dom")
    assert console == [], console
    if screenshot:
        path = saved_page["work"] / screenshot
        _, console = chromium(url, saved_page["work"], f"--screenshot={path}")
        assert console == [] and path.stat().st_size > 10_000
        print(f"screenshot: {path}")
    return Frames(dom), DiffTable(dom)


def red_or_blue(fill: str) -> str:
    red, _, blue = (int(part) for part in re.findall(r"\d+", fill))
    return "red" if red > blue else "blue" if blue > red else "grey"


def test_two_service_versions_draw_the_diff_and_list_the_changes(saved_page):
    frames, table = diff_dom(saved_page, "compare=resource&key=service.version&base=1.4&after=1.5", "diff-versions.png")
    assert table.more[0][0] == "hot" and table.more[0][1] == pytest.approx(0.4, abs=0.001), table.more
    assert table.less[0][0] == "cold" and table.less[0][1] == pytest.approx(-0.4, abs=0.001), table.less
    # Drawn on the comparison's shape; hot's frame grew (red), cold's shrank (blue), the root did not.
    assert {"comparison", "hot", "cold", "serve"} <= set(frames.widths)
    assert red_or_blue(frames.fills["hot"]) == "red" and red_or_blue(frames.fills["cold"]) == "blue", frames.fills
    assert red_or_blue(frames.fills["comparison"]) == "grey"
    assert "baseline" in frames.titles["hot"] and "+40.0 pts" in frames.titles["hot"], frames.titles["hot"]
    assert "600 samples" in table.note and "120 samples" in table.note or "1.4" in table.note, table.note


def test_two_time_ranges_draw_the_same_diff(saved_page):
    segments = saved_page["data"]["types"][0]["segments"]
    assert len(segments) >= 4
    first, last = segments[0], segments[-1]
    fragment = (f"compare=time&bfrom={int(first['start_unix'])}&bto={int(first['end_unix']) + 1}"
                f"&afrom={int(last['start_unix'])}&ato={int(last['end_unix']) + 1}")
    frames, table = diff_dom(saved_page, fragment, "diff-time.png")
    assert table.more[0][0] == "hot" and table.more[0][1] == pytest.approx(0.4, abs=0.001), table.more
    assert table.less[0][0] == "cold"
    assert red_or_blue(frames.fills["hot"]) == "red" and red_or_blue(frames.fills["cold"]) == "blue"


def test_the_default_time_ranges_are_the_older_and_the_newer_half(saved_page):
    _, table = diff_dom(saved_page, "compare=time")
    assert table.more[0][0] == "hot" and table.less[0][0] == "cold"


def test_the_same_side_twice_is_all_grey_and_lists_no_change(saved_page):
    frames, table = diff_dom(saved_page, "compare=resource&key=service.version&base=1.5&after=1.5")
    assert table.more == [] and table.less == []
    assert {red_or_blue(fill) for fill in frames.fills.values()} == {"grey"}


def test_a_pinned_moment_compares_what_came_before_it_with_what_came_after(saved_page):
    segments = saved_page["data"]["types"][0]["segments"]
    middle = next(segment for segment in segments if segment["start_unix"] >= segments[0]["start_unix"] + 29)
    frames, table = diff_dom(saved_page, f"compare=pin&pin={int(middle['start_unix'])}")
    assert table.more[0][0] == "hot" and table.more[0][1] == pytest.approx(0.4, abs=0.001), table.more
    assert red_or_blue(frames.fills["hot"]) == "red" and "pinned at" in table.note


def test_a_pin_without_a_pinned_view_says_how_to_pin(saved_page):
    dom, console = chromium(saved_page["uri"] + "#compare=pin", saved_page["work"], "--dump-dom")
    assert console == []
    assert "Pin a view first" in dom


# -- with real BPF: two versions of a Python service, in turn under the receiver -----------------

VERSIONED = Path(__file__).parent / "testdata" / "flamegraph" / "versioned_split.py"
VERSION_SECONDS = 6
HOT_SHARES = {"1": 0.2, "2": 0.6}
# Three standard deviations of the difference of the two sampled shares, about 500 samples each
# (97 Hz for 6 s on a busy host). A fixed 0.05 (under two) failed a whole-suite run, 0.061 off.
CHANGE_TOLERANCE = 3 * sum(share * (1 - share) / 500 for share in HOT_SHARES.values()) ** 0.5


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory):
    """The profiling receiver feeding the flame graph page and a file while version 1 (20% in hot)
    ran, then version 2 (60%)."""
    import os
    import sys
    import time

    from pycollector.config.validate import build_plan
    from pycollector.service import Service
    from pycollector.testing import registry_with

    from tests.conftest import bpf_unavailable_reason

    pytest.importorskip("pycollector_otel_context", reason="the writer is installed by `make setup` (pip install ./sdk/python)")
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs it)")
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    work = tmp_path_factory.mktemp("flamegraph-versions")
    profiles_file = work / "profiles.json"
    config = {
        "receivers": {"profiling": {"samples_per_second": 97, "reporter_interval": "1s"}},
        "exporters": {"flamegraph": {"endpoint": "localhost:0"}, "file": {"path": str(profiles_file)}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["flamegraph", "file"]}},
                    "telemetry": {"metrics": {"level": "none"}}},
    }
    service = Service(build_plan(config, registry_with()))
    service.start()
    try:
        cpu_seconds, workloads = {}, {}
        for number, share in HOT_SHARES.items():  # (both at once, on two cores)
            env = {**os.environ, "OTEL_SERVICE_NAME": "shop", "OTEL_RESOURCE_ATTRIBUTES": f"service.version={number}"}
            workloads[number] = subprocess.Popen([sys.executable, str(VERSIONED), str(VERSION_SECONDS), str(share)], env=env)
        for number, workload in workloads.items():
            _, status, usage = os.wait4(workload.pid, 0)
            assert status == 0
            cpu_seconds[number] = usage.ru_utime + usage.ru_stime
        time.sleep(2.5)  # the last interval reaches the window, and the file
        exporter = next(node.component for node in service.graph.nodes.values() if node.key.kind == "exporters" and node.key.id == "flamegraph")
        page = work / "versions.html"
        with urllib.request.urlopen(exporter.url + "flamegraph.html", timeout=10) as response:
            page.write_bytes(response.read())
        yield {"url": exporter.url, "page": page, "file": profiles_file, "work": work, "cpu_seconds": cpu_seconds}
    finally:
        service.shutdown()


HOT, COLD = "hot (versioned_split.py)", "cold (versioned_split.py)"
TRUE_CHANGE = HOT_SHARES["2"] - HOT_SHARES["1"]


@pytest.mark.bpf
def test_the_page_puts_the_function_that_grew_first_with_its_change(two_versions):
    url = two_versions["url"] + "#compare=resource&key=service.version&base=1&after=2"
    dom, console = chromium(url, two_versions["work"], "--dump-dom")
    assert console == [], console
    table, frames = DiffTable(dom), Frames(dom)
    print(f"page: {table.more[:2]} / {table.less[:2]}; {table.note}; CPU seconds {two_versions['cpu_seconds']}")
    assert table.more[0][0] == HOT and abs(table.more[0][1] - TRUE_CHANGE) <= CHANGE_TOLERANCE, table.more
    assert table.less[0][0] == COLD, table.less
    hot_frame = next(name for name in frames.fills if name.startswith("hot (versioned_split.py:"))
    cold_frame = next(name for name in frames.fills if name.startswith("cold (versioned_split.py:"))
    assert red_or_blue(frames.fills[hot_frame]) == "red" and red_or_blue(frames.fills[cold_frame]) == "blue"
    screenshot = two_versions["work"] / "versions-diff.png"
    _, console = chromium(url, two_versions["work"], f"--screenshot={screenshot}")
    assert console == [] and screenshot.stat().st_size > 10_000
    print(f"screenshot: {screenshot}")


@pytest.mark.bpf
def test_pycollector_diff_puts_the_function_that_grew_first_with_its_change(two_versions, cli):
    path = str(two_versions["file"])
    result = cli("diff", path, path, "--base-where", "service.version=1", "--after-where", "service.version=2")
    assert result.returncode == 0, result.stderr
    print(result.stdout)
    lines = result.stdout.splitlines()
    first_more, first_less = lines[lines.index("costs more") + 1], lines[lines.index("costs less") + 1]
    assert first_more.endswith(HOT) and abs(float(first_more.split()[0].rstrip("%~")) / 100 - TRUE_CHANGE) <= CHANGE_TOLERANCE, result.stdout
    assert first_less.endswith(COLD), result.stdout


@pytest.fixture(scope="module")
def off_cpu_page(tmp_path_factory):
    """Off-CPU time of two versions: version 1 waits 1 s in `read` of each 4, version 2 3 s of 4."""
    if CHROMIUM is None or missing_vendor_files():
        pytest.skip("chromium or the flame graph renderer is not installed (scripts/setup.sh)")
    b = ProfilesBuilder()
    for number, pid, read_ns, sleep_ns in (("1", 10, 1_000_000_000, 3_000_000_000), ("2", 20, 3_000_000_000, 1_000_000_000)):
        scope = b.scope_profiles(b.resource_profiles({"process.pid": pid, "process.executable.name": "app", "service.version": number}))
        profile = b.profile(scope, sample_type=("off_cpu", "nanoseconds"))
        for function, value in (("read", read_ns), ("sleep", sleep_ns)):
            frames = [b.location(lines=[(b.function(name), 0, 0)], attributes={"profile.frame.type": kind})
                      for name, kind in (("__schedule", "kernel"), (function, "native"), ("main", "native"))]
            b.sample(profile, b.stack(frames), [value])
    window = ProfileWindow(60)
    window.add(b.data)
    work = tmp_path_factory.mktemp("flamegraph-diff-off-cpu")
    page = work / "off-cpu.html"
    page.write_bytes(PageTemplate().render(page_data(window.totals(), 60, "testhost", 0, window.segments(), window.resources()), live=False))
    return {"uri": page.as_uri(), "work": work}


def test_off_cpu_time_diffs_in_its_own_unit_with_no_noise_judged(off_cpu_page):
    frames, table = diff_dom(off_cpu_page, "type=off_cpu&compare=resource&key=service.version&base=1&after=2")
    # Self is the leaf, the scheduler: both sides 100%. Total: read's share went 25% -> 75%.
    assert "4.00 s off-CPU time" in table.note and "sampling noise" not in table.note, table.note
    assert red_or_blue(frames.fills["read"]) == "red" and red_or_blue(frames.fills["sleep"]) == "blue"
    assert "+50.0 pts" in frames.titles["read"], frames.titles["read"]


def test_the_process_filter_and_search_still_act_on_the_diff(saved_page):
    # Only version 1.5's process: the baseline (1.4) has nothing left to compare with.
    dom, console = chromium(saved_page["uri"] + "#process=20&compare=resource&key=service.version&base=1.4&after=1.5", saved_page["work"], "--dump-dom")
    assert console == [] and "The baseline has no samples (yet)." in dom
    frames, _ = diff_dom(saved_page, "compare=resource&key=service.version&base=1.4&after=1.5&search=hot")
    assert frames.details.startswith("search: 360 of 600 total samples"), frames.details
