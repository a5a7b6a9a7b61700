"""The flame graph page in headless Chromium, fed by the profiling receiver while two known
workloads run: it loads with no console errors, shows the hot function, the process filter
narrows it, search finds frames, and the saved file works with no server behind it. Fed by hand
with CPU samples and off-CPU time: the type selector lists both, CPU first, and each type's graph
holds only its own values, off-CPU time shown as time."""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest

from pycollector.config.validate import build_plan
from pycollector.pdata import LOCK_WAIT, ProfilesBuilder
from pycollector.service import Service
from pycollector.testing import TestHost, make_settings, registry_with

from exporters.flamegraph.factory import factory
from exporters.flamegraph.page import missing_vendor_files
from tests.conftest import WORKLOADS, bpf_unavailable_reason, share_tolerance
from tests.test_flamegraph import PERIOD_NS, WORK, cpu_and_off_cpu, profiles
from tests.test_profiling_receiver import compile_c

HZ = 97
RUN_SECONDS = 3
TESTDATA = Path(__file__).parent / "testdata" / "flamegraph"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    # Console messages and uncaught errors go to stderr as `...:CONSOLE...` lines.
    "--enable-logging=stderr", "--v=0",
    # Lets timers and transitions run before the DOM is dumped or the screenshot taken.
    "--virtual-time-budget=3000", "--window-size=1400,900",
]


def skip_without_the_page_renderer() -> None:
    """Skip a test of the page where headless Chromium or the vendored renderer is missing."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs it)")
    if missing_vendor_files():
        pytest.skip("the flame graph renderer is not installed (scripts/setup.sh)")


class Frames(HTMLParser):
    """The flame graph's frames: d3-flame-graph draws each as <g name=... width=...>."""

    def __init__(self, dom: str):
        super().__init__()
        self.widths: dict[str, float] = {}  # the widest frame of each name
        self.totals: dict[str, float] = collections.defaultdict(float)  # all its frames together
        self.fills: dict[str, str] = {}  # the colour of the widest frame of each name
        self.titles: dict[str, str] = {}  # and its tooltip
        self.details = ""
        self._in_details = False
        self._frame: str | None = None  # the frame whose rect and title come next
        self._in_title = False
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "g" and "name" in attrs:
            width = float(attrs.get("width", 0))
            widest = width >= self.widths.get(attrs["name"], 0.0)
            self.widths[attrs["name"]] = max(self.widths.get(attrs["name"], 0.0), width)
            self.totals[attrs["name"]] += width
            self._frame = attrs["name"] if widest else None
        elif tag == "rect" and self._frame is not None:
            self.fills[self._frame] = attrs.get("fill", "")
        self._in_title = tag == "title" and self._frame is not None
        self._in_details = attrs.get("id") == "details"

    def handle_data(self, data):
        if self._in_details:
            self.details += data
        if self._in_title:
            self.titles[self._frame] = self.titles.get(self._frame, "") + data

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False


def chromium(url: str, work: Path, *action: str) -> tuple[str, list[str]]:
    """Load ``url``; returns (stdout, console lines)."""
    profile_dir = work / f"chromium-{time.monotonic_ns()}"
    result = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}", *action, url], capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout, [line for line in result.stderr.splitlines() if ":CONSOLE" in line]


def dom_of(url: str, work: Path) -> Frames:
    dom, console = chromium(url, work, "--dump-dom")
    assert console == [], console
    return Frames(dom)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """The profiling receiver feeding the flame graph exporter while both workloads ran; the
    service keeps serving until the module's tests are done."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs it)")
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    work = tmp_path_factory.mktemp("flamegraph")
    known_split = compile_c(work, "known_split", WORKLOADS / "known_split.c")
    other_spin = compile_c(work, "other_spin", TESTDATA / "other_spin.c")
    config = {
        # Only the two workloads: on a host as busy as make test's, every other process's samples
        # (chromium's, the other workers') make theirs too narrow to draw in the all-processes graph.
        "receivers": {"profiling": {"samples_per_second": HZ, "reporter_interval": "1s",
                                    "process_filter": {"executable": "^(known_split|other_spin)$"}}},
        "exporters": {"flamegraph": {"endpoint": "localhost:0"}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["flamegraph"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }
    service = Service(build_plan(config, registry_with(exporters={"flamegraph": factory})))
    service.start()
    try:
        workloads = [subprocess.Popen([str(binary), str(RUN_SECONDS)], stdout=subprocess.DEVNULL) for binary in (known_split, other_spin)]
        cpu_seconds = []
        for workload in workloads:
            _, _, usage = os.wait4(workload.pid, 0)
            cpu_seconds.append(usage.ru_utime + usage.ru_stime)
        time.sleep(1.5)  # the last interval reaches the window
        exporter = next(node.component for node in service.graph.nodes.values() if node.key.kind == "exporters")
        yield {"url": exporter.url, "known_split": workloads[0].pid, "known_split_samples": cpu_seconds[0] * HZ, "work": work}
    finally:
        service.shutdown()


@pytest.mark.bpf
@pytest.mark.load_tolerant
def test_page_loads_without_console_errors_and_shows_both_workloads(live):
    frames = dom_of(live["url"], live["work"])
    assert {"spin_heavy", "spin_light", "other_spin", f"known_split [{live['known_split']}]"} <= set(frames.widths)
    screenshot = live["work"] / "all-processes.png"
    _, console = chromium(live["url"], live["work"], f"--screenshot={screenshot}")
    assert console == [] and screenshot.stat().st_size > 10_000
    print(f"screenshot: {screenshot}")


@pytest.mark.bpf
@pytest.mark.load_tolerant
def test_process_filter_narrows_the_graph_to_the_hot_function(live):
    url = f"{live['url']}#process={live['known_split']}"
    frames = dom_of(url, live["work"])
    assert "other_spin" not in frames.widths and "spin_heavy" in frames.widths
    # The hot function: spin_heavy does 3x spin_light's work, so its frames are about 3x as wide
    # (spin_light has two: under run_once, and under main where run_once tail-called it).
    share = frames.totals["spin_heavy"] / (frames.totals["spin_heavy"] + frames.totals["spin_light"])
    assert abs(share - 0.75) <= share_tolerance(live["known_split_samples"]), dict(frames.totals)
    screenshot = live["work"] / "known-split.png"
    _, console = chromium(url, live["work"], f"--screenshot={screenshot}")
    assert console == []
    print(f"screenshot: {screenshot}")


@pytest.mark.bpf
@pytest.mark.load_tolerant
def test_search_reports_the_share_of_matching_frames(live):
    frames = dom_of(f"{live['url']}#process={live['known_split']}&search=spin_heavy", live["work"])
    assert frames.details.startswith("search: ") and "total samples" in frames.details, frames.details


@pytest.mark.bpf
@pytest.mark.load_tolerant
def test_the_saved_file_works_without_the_server(live):
    saved = live["work"] / "shared.html"
    with urllib.request.urlopen(live["url"] + "flamegraph.html", timeout=10) as response:
        saved.write_bytes(response.read())
    frames = dom_of(saved.as_uri(), live["work"])
    assert {"spin_heavy", "other_spin"} <= set(frames.widths)


# -- sample types, on data built by hand (no BPF needed) --------------------------------------------


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    """Two exporters serving: one fed CPU samples and off-CPU time, one only CPU samples."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs it)")
    exporters = {}
    for name, data in (("both", cpu_and_off_cpu()), ("cpu", profiles(WORK))):
        exporter = exporters[name] = factory.create(make_settings("exporters", "flamegraph"), factory.config_model(endpoint="localhost:0"), None)
        exporter.start(TestHost())
        exporter.consume(data)
    try:
        yield {"both": exporters["both"].url, "cpu": exporters["cpu"].url, "work": tmp_path_factory.mktemp("flamegraph-types")}
    finally:
        for exporter in exporters.values():
            exporter.shutdown()


def page_texts(dom: str) -> dict[str, str]:
    """The title, summary and empty-page lines, and the type selector's opening tag and options."""
    texts = {key: re.search(pattern, dom, re.S).group(1) for key, pattern in (
        ("title", r'<span id="title">(.*?)</span>'), ("summary", r'<span id="summary">(.*?)</span>'),
        ("type_control", r'(<label id="type-control"[^>]*>)'))}
    texts["types"] = re.findall(r'<option value="([^"]*)"[^>]*>([^<]*)</option>', re.search(r'<select id="type">(.*?)</select>', dom, re.S).group(1))
    return texts


def test_the_type_selector_lists_cpu_first_and_the_cpu_graph_holds_no_off_cpu_time(fed):
    dom, console = chromium(fed["both"], fed["work"], "--dump-dom")
    assert console == [], console
    texts = page_texts(dom)
    assert texts["types"] == [("samples", "CPU"), ("off_cpu", "Off-CPU")] and "hidden" not in texts["type_control"]
    assert texts["title"] == "CPU flame graph" and texts["summary"].endswith("· 7 samples"), texts
    frames = Frames(dom)
    assert {"work", "query", "sys_write"} <= set(frames.widths)
    assert not {"__schedule", "sys_nanosleep", "sys_futex", "idle [30]"} & set(frames.widths)


def test_the_off_cpu_graph_shows_its_time_in_nanoseconds_given(fed):
    frames = dom_of(f"{fed['both']}#type=off_cpu&search=sys_nanosleep", fed["work"])
    assert {"__schedule", "sys_nanosleep", "sys_futex", "app [10]", "idle [30]"} <= set(frames.widths)
    assert not {"query", "sys_write", "db [20]"} & set(frames.widths)  # CPU-only frames and process
    # Widths follow the nanoseconds: app's sleep is 1 s of the 1.0625 s off the CPU, its lock wait 2.5 ms.
    assert frames.widths["sys_nanosleep"] / frames.widths["all"] == pytest.approx(1_000_000_000 / 1_062_500_000, rel=0.01)
    assert frames.widths["sys_futex"] / frames.widths["all"] == pytest.approx(2_500_000 / 1_062_500_000, rel=0.2)
    assert frames.details.strip() == "search: 1.00 s of 1.06 s total off-CPU time (94.1%)", frames.details
    dom, console = chromium(f"{fed['both']}#type=off_cpu", fed["work"], "--dump-dom")
    assert console == [], console
    texts = page_texts(dom)
    assert texts["title"] == "Off-CPU flame graph" and texts["summary"].endswith("· 1.06 s off-CPU time"), texts


def test_a_cpu_only_page_has_no_type_selector_and_counts_samples(fed):
    dom, console = chromium(f"{fed['cpu']}#search=work", fed["work"], "--dump-dom")
    assert console == [], console
    texts = page_texts(dom)
    assert texts["types"] == [("samples", "CPU")] and "hidden" in texts["type_control"]
    assert texts["title"] == "CPU flame graph" and texts["summary"].endswith("· 7 samples")
    assert Frames(dom).details.strip() == "search: 4 of 7 total samples (57.1%)"


# Names a sampled process controls (a perf map line, a thread or file name), meant to run script
# in whoever opens the page: each would set the title if it ran.
HOSTILE_NAMES = [
    '<img src=x onerror="document.title=\'PWNED-img\'">',
    "</script><script>document.title='PWNED-script'</script>",
    '"><svg onload="document.title=\'PWNED-svg\'">',
    "javascript:document.title='PWNED-js'//\u202e\x1b[2J",
]


class Markup(HTMLParser):
    """The elements of a page and the event handler attributes any of them has."""

    def __init__(self, dom: str):
        super().__init__()
        self.tags: set[str] = set()
        self.handlers: list[tuple[str, str]] = []
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.handlers += [(tag, name) for name, _ in attrs if name.startswith("on")]


def test_names_holding_html_are_shown_as_text_and_run_nothing(tmp_path):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs it)")
    exporter = factory.create(make_settings("exporters", "flamegraph"), factory.config_model(endpoint="localhost:0"), None)
    exporter.start(TestHost())
    try:
        exporter.consume(profiles({(66, HOSTILE_NAMES[0]): [(["main", name], 5) for name in HOSTILE_NAMES]}))
        dom, console = chromium(exporter.url, tmp_path, "--dump-dom")
    finally:
        exporter.shutdown()
    title = re.search(r"<title>(.*?)</title>", dom, re.S).group(1)
    assert "PWNED" not in title, title
    frames = Frames(dom)
    for name in HOSTILE_NAMES:
        assert name in frames.widths, (name, sorted(frames.widths))  # there, as the very text
    markup = Markup(dom)
    assert "img" not in markup.tags and not markup.handlers, "a name became markup"
    assert not [line for line in console if "PWNED" in line], console


# -- spans, on data built by hand ---------------------------------------------------------------

CHECKOUT_SPAN, BROWSE_SPAN, OTHER_TRACE_SPAN = bytes([0x11] * 8), bytes([0x22] * 8), bytes([0x33] * 8)
TRACE, OTHER_TRACE = bytes([0xAB] * 16), bytes([0xCD] * 16)


def spans_profiles():
    """A service's CPU samples: 30 in its /checkout span, 10 in its /browse span (same trace),
    6 in another /browse span of another trace, 5 in none; thread.* attributes on all."""
    b = ProfilesBuilder()
    scope = b.scope_profiles(b.resource_profiles({"process.pid": 40, "process.executable.name": "shop"}))
    profile = b.profile(scope, sample_type=("samples", "count"), period_type=("cpu", "nanoseconds"), period=PERIOD_NS)
    for functions, value, link, route in ((["main", "checkout_total"], 30, (TRACE, CHECKOUT_SPAN), "/checkout"),
                                          (["main", "browse_catalog"], 10, (TRACE, BROWSE_SPAN), "/browse"),
                                          (["main", "browse_catalog"], 6, (OTHER_TRACE, OTHER_TRACE_SPAN), "/browse"),
                                          (["main", "idle_loop"], 5, None, None)):
        stack = b.stack([b.location(lines=[(b.function(function), 0, 0)]) for function in reversed(functions)])
        attributes = {"thread.id": 41, "thread.name": "worker", **({"http.route": route} if route else {})}
        b.sample(profile, stack, [value], attributes=attributes, link_index=b.link(*link) if link else 0)
    return b.data


def lock_wait_profiles():
    """Another program's lock waits, as the profiling receiver sends them: 700 ms waiting for a
    mutex under take_order, 300 ms in a condition variable's wait under wait_for_work, each
    sample with the lock.kind its stack told."""
    b = ProfilesBuilder()
    scope = b.scope_profiles(b.resource_profiles({"process.pid": 50, "process.executable.name": "orders"}))
    profile = b.profile(scope, sample_type=LOCK_WAIT, period_type=LOCK_WAIT, period=0)
    for functions, nanoseconds, kind in ((["main", "take_order", "pthread_mutex_lock"], 700_000_000, "mutex"),
                                         (["main", "wait_for_work", "pthread_cond_wait"], 300_000_000, "condvar")):
        stack = b.stack([b.location(lines=[(b.function(function), 0, 0)]) for function in reversed(functions)])
        b.sample(profile, stack, [nanoseconds], attributes={"thread.id": 51, "lock.kind": kind})
    return b.data


@pytest.fixture(scope="module")
def spans_page(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs it)")
    exporter = factory.create(make_settings("exporters", "flamegraph"), factory.config_model(endpoint="localhost:0"), None)
    exporter.start(TestHost())
    exporter.consume(spans_profiles())
    exporter.consume(lock_wait_profiles())
    try:
        yield {"url": exporter.url, "work": tmp_path_factory.mktemp("flamegraph-spans")}
    finally:
        exporter.shutdown()


def span_rows(dom: str) -> list[list[str]]:
    body = re.search(r'<table id="spans">.*?<tbody>(.*?)</tbody>', dom, re.S).group(1)
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]


def test_the_spans_with_the_most_samples_are_listed_heaviest_first(spans_page):
    dom, console = chromium(spans_page["url"], spans_page["work"], "--dump-dom")
    assert console == [], console
    rows = span_rows(dom)
    assert [(row[0], row[3], row[4]) for row in rows] == [
        ("30", CHECKOUT_SPAN.hex(), "http.route=/checkout"), ("10", BROWSE_SPAN.hex(), "http.route=/browse"),
        ("6", OTHER_TRACE_SPAN.hex(), "http.route=/browse")], rows
    assert rows[0][1] == "58.8%" and rows[0][2] == TRACE.hex()  # (of the 51 samples shown)
    assert "http.route=/checkout" in re.search(r'<select id="attribute">(.*?)</select>', dom, re.S).group(1)
    assert {"checkout_total", "browse_catalog", "idle_loop"} <= set(Frames(dom).widths)


def test_a_span_id_shows_that_spans_graph_and_a_trace_id_its_spans(spans_page):
    frames = dom_of(f"{spans_page['url']}#span={CHECKOUT_SPAN.hex()}", spans_page["work"])
    assert "checkout_total" in frames.widths and not {"browse_catalog", "idle_loop"} & set(frames.widths)
    frames = dom_of(f"{spans_page['url']}#span={TRACE.hex()[:8]}", spans_page["work"])  # a prefix of the trace id
    assert {"checkout_total", "browse_catalog"} <= set(frames.widths) and "idle_loop" not in frames.widths
    # browse_catalog's frame holds its span of this trace only: 10 of the 40 samples shown.
    assert frames.widths["browse_catalog"] / frames.widths["main"] == pytest.approx(10 / 40, rel=0.05)


def test_a_lock_kind_narrows_the_lock_wait_graph_to_its_waits(spans_page):
    """Issue 44: the lock_wait type in the type selector, each lock.kind in the attribute
    selector, and a kind chosen shows only its waits."""
    dom, console = chromium(f"{spans_page['url']}#type=lock_wait", spans_page["work"], "--dump-dom")
    assert console == [], console
    attributes = re.search(r'<select id="attribute">(.*?)</select>', dom, re.S).group(1)
    assert "lock.kind=mutex" in attributes and "lock.kind=condvar" in attributes, attributes
    assert {"take_order", "wait_for_work"} <= set(Frames(dom).widths)
    frames = dom_of(f"{spans_page['url']}#type=lock_wait&attr=lock.kind%3Dcondvar", spans_page["work"])
    assert "wait_for_work" in frames.widths and "take_order" not in frames.widths, sorted(frames.widths)


def test_an_attribute_value_narrows_the_graph_to_its_samples(spans_page):
    frames = dom_of(f"{spans_page['url']}#attr=http.route%3D%2Fbrowse", spans_page["work"])
    assert "browse_catalog" in frames.widths and not {"checkout_total", "idle_loop"} & set(frames.widths)
    dom, _ = chromium(f"{spans_page['url']}#attr=http.route%3D%2Fbrowse", spans_page["work"], "--dump-dom")
    assert [row[3] for row in span_rows(dom)] == [BROWSE_SPAN.hex(), OTHER_TRACE_SPAN.hex()]
