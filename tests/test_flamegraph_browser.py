"""The flame graph page in headless Chromium, fed by the profiling receiver while two known
workloads run: it loads with no console errors, shows the hot function, the process filter
narrows it, search finds frames, and the saved file works with no server behind it."""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest

from pycollector.config.validate import build_plan
from pycollector.service import Service
from pycollector.testing import registry_with

from exporters.flamegraph.factory import factory
from tests.conftest import WORKLOADS, bpf_unavailable_reason, share_tolerance
from tests.test_profiling_receiver import compile_c

pytestmark = pytest.mark.bpf

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


class Frames(HTMLParser):
    """The flame graph's frames: d3-flame-graph draws each as <g name=... width=...>."""

    def __init__(self, dom: str):
        super().__init__()
        self.widths: dict[str, float] = {}  # the widest frame of each name
        self.totals: dict[str, float] = collections.defaultdict(float)  # all its frames together
        self.details = ""
        self._in_details = False
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "g" and "name" in attrs:
            width = float(attrs.get("width", 0))
            self.widths[attrs["name"]] = max(self.widths.get(attrs["name"], 0.0), width)
            self.totals[attrs["name"]] += width
        self._in_details = attrs.get("id") == "details"

    def handle_data(self, data):
        if self._in_details:
            self.details += data


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
        "receivers": {"profiling": {"samples_per_second": HZ, "reporter_interval": "1s"}},
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


def test_page_loads_without_console_errors_and_shows_both_workloads(live):
    frames = dom_of(live["url"], live["work"])
    assert {"spin_heavy", "spin_light", "other_spin", f"known_split [{live['known_split']}]"} <= set(frames.widths)
    screenshot = live["work"] / "all-processes.png"
    _, console = chromium(live["url"], live["work"], f"--screenshot={screenshot}")
    assert console == [] and screenshot.stat().st_size > 10_000
    print(f"screenshot: {screenshot}")


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


def test_search_reports_the_share_of_matching_frames(live):
    frames = dom_of(f"{live['url']}#process={live['known_split']}&search=spin_heavy", live["work"])
    assert frames.details.startswith("search: ") and "total samples" in frames.details, frames.details


def test_the_saved_file_works_without_the_server(live):
    saved = live["work"] / "shared.html"
    with urllib.request.urlopen(live["url"] + "flamegraph.html", timeout=10) as response:
        saved.write_bytes(response.read())
    frames = dom_of(saved.as_uri(), live["work"])
    assert {"spin_heavy", "other_spin"} <= set(frames.widths)
