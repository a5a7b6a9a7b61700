"""The flame graph exporter without a browser: the sliding window, the call trees it sends per
sample type (CPU samples and off-CPU time kept apart), the pages it serves and what they inline,
and how the page shows each type's values."""

from __future__ import annotations

import collections
import json
import re
import shutil
import subprocess
import urllib.error
import urllib.request

import pytest

from pycollector.component import StartError
from pycollector.pdata import ProfilesBuilder
from pycollector.testing import TestHost, assert_conformance, make_settings

from exporters.flamegraph import page
from exporters.flamegraph.factory import factory
from exporters.flamegraph.tree import call_tree, page_data, type_ids
from exporters.flamegraph.window import ProcessKey, ProfileWindow, merged

CPU = ("samples", "count")
OFF_CPU = ("off_cpu", "nanoseconds")
PERIOD_NS = 1_000_000_000 // 97


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def profiles(stacks_by_process: dict[tuple[int, str], list[tuple[list[str], int]]], sample_type=CPU, container: str = ""):
    """Stacks given root first, as a reader thinks of them; stored leaf first as OTLP has them."""
    return typed_profiles({process: {sample_type: stacks} for process, stacks in stacks_by_process.items()}, container)


def typed_profiles(by_process: dict[tuple[int, str], dict[tuple[str, str], list[tuple[list[str], int]]]], container: str = ""):
    """A profile per sample type under each process's one scope, sharing the dictionary, as the
    profiling receiver sends CPU samples and off-CPU time (which has no period)."""
    b = ProfilesBuilder()
    for (pid, name), by_type in by_process.items():
        attributes = {"process.pid": pid, "process.executable.name": name}
        if container:
            attributes["container.id"] = container
        scope = b.scope_profiles(b.resource_profiles(attributes))
        for sample_type, stacks in by_type.items():
            cpu = sample_type == CPU
            profile = b.profile(scope, sample_type=sample_type, period_type=("cpu", "nanoseconds") if cpu else ("", ""), period=PERIOD_NS if cpu else 0)
            for functions, value in stacks:
                locations = [b.location(lines=[(b.function(function), 0, 0)], attributes={"profile.frame.type": "kernel" if function.startswith(("sys_", "__")) else "native"})
                             for function in reversed(functions)]
                b.sample(profile, b.stack(locations), [value])
    return b.data


WORK = {(10, "app"): [(["main", "work"], 3), (["main", "work", "sys_write"], 1), (["main"], 1)], (20, "db"): [(["main", "query"], 2)]}
# app on the CPU as in WORK and, in the same interval, off it: 1 s asleep and 2.5 ms waiting on a
# lock; db only on the CPU; idle only off it. Off-CPU stacks start at the scheduler.
OFF_CPU_NS = {(10, "app"): [(["main", "sys_nanosleep", "__schedule"], 1_000_000_000), (["main", "work", "sys_futex", "__schedule"], 2_500_000)],
              (30, "idle"): [(["main", "sys_epoll_wait", "__schedule"], 60_000_000)]}


def cpu_and_off_cpu(container: str = ""):
    by_process: dict = {process: {CPU: stacks} for process, stacks in WORK.items()}
    for process, stacks in OFF_CPU_NS.items():
        by_process.setdefault(process, {})[OFF_CPU] = stacks
    return typed_profiles(by_process, container)


def get(url: str) -> tuple[int, dict, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


@pytest.fixture
def served():
    exporter = factory.create(make_settings("exporters", "flamegraph"), factory.config_model(endpoint="localhost:0"), None)
    exporter.start(TestHost())
    yield exporter
    exporter.shutdown()


def embedded_data(html: bytes) -> dict:
    return json.loads(re.search(rb'<script type="application/json" id="profile-data">(.*?)</script>', html, re.S).group(1))


def test_keeps_the_contract():
    assert_conformance(factory, "exporters", {"endpoint": "localhost:0"})


def test_window_counts_stacks_per_process_root_first():
    window = ProfileWindow(60)
    assert window.add(profiles(WORK)) == {CPU: 7}
    totals = window.totals()[CPU]
    app = merged(totals[ProcessKey(10, "app", "")])
    assert app[(("main", "native"), ("work", "native"), ("sys_write", "kernel"))] == 1
    assert sum(merged(totals[ProcessKey(20, "db", "")]).values()) == 2


def test_window_forgets_samples_older_than_the_window():
    clock = FakeClock()
    window = ProfileWindow(60, clock=clock)
    window.add(profiles({(10, "app"): [(["old"], 5)]}))
    clock.now += 30
    window.add(profiles({(10, "app"): [(["new"], 1)]}))
    clock.now += 31
    assert dict(merged(window.totals()[CPU][ProcessKey(10, "app", "")])) == {(("new", "native"),): 1}
    clock.now += 60
    assert window.totals() == {}


def test_window_keeps_each_sample_type_apart():
    window = ProfileWindow(60)
    assert window.add(cpu_and_off_cpu()) == {CPU: 7, OFF_CPU: 1_062_500_000}
    totals = window.totals()
    assert set(totals) == {CPU, OFF_CPU}
    # CPU counts as they were sent: no nanosecond of off-CPU time is added to them.
    assert {key.name: sum(merged(by_span).values()) for key, by_span in totals[CPU].items()} == {"app": 5, "db": 2}
    app = merged(totals[OFF_CPU][ProcessKey(10, "app", "")])
    assert dict(app) == {
        (("main", "native"), ("sys_nanosleep", "kernel"), ("__schedule", "kernel")): 1_000_000_000,
        (("main", "native"), ("work", "native"), ("sys_futex", "kernel"), ("__schedule", "kernel")): 2_500_000,
    }
    assert ProcessKey(30, "idle", "") not in totals[CPU]


def test_window_keeps_any_sample_type_under_its_own_unit():
    window = ProfileWindow(60)
    assert window.add(profiles(WORK, sample_type=("alloc_space", "bytes"))) == {("alloc_space", "bytes"): 7}
    assert set(window.totals()) == {("alloc_space", "bytes")}


def test_window_names_a_frame_without_a_symbol_by_its_file_and_address_in_the_file():
    b = ProfilesBuilder()
    libfoo = b.mapping(0x7F1200000000, 0x7F1200010000, 0x1000, "/usr/lib/libfoo.so")
    stripped = b.location(libfoo, 0x7F12000046CD, [], {"profile.frame.type": "native"})
    nowhere = b.location(0, 0x7F3A00001234, [], {"profile.frame.type": "native"})
    main = b.location(lines=[(b.function("main"), 0, 0)], attributes={"profile.frame.type": "native"})
    profile = b.profile(b.scope_profiles(b.resource_profiles({"process.pid": 10, "process.executable.name": "app"})))
    b.sample(profile, b.stack([stripped, nowhere, main]), [], timestamps_unix_nano=[1, 2, 3])
    window = ProfileWindow(60)
    assert window.add(b.data) == {CPU: 3}  # no values: one sample per timestamp
    stack = (("main", "native"), ("[unknown]+0x7f3a00001234", "native"), ("[libfoo.so]+0x56cd", "native"))
    assert dict(merged(window.totals()[CPU][ProcessKey(10, "app", "")])) == {stack: 3}


def test_page_data_lists_cpu_first_then_each_other_type_with_its_processes():
    window = ProfileWindow(60)
    window.add(profiles(WORK, sample_type=("alloc_space", "bytes")))
    window.add(cpu_and_off_cpu())
    data = page_data(window.totals(), 60, "testhost")
    # CPU, off-CPU, then memory (sample_types.display_order).
    assert [(t["id"], t["type"], t["unit"], t["total"], t["snapshot"]) for t in data["types"]] == [
        ("samples", "samples", "count", 7, False), ("off_cpu", "off_cpu", "nanoseconds", 1_062_500_000, False), ("alloc_space", "alloc_space", "bytes", 7, False)]
    off_cpu = data["types"][1]
    # Heaviest first, in nanoseconds: app's 1.0025 s, then idle's 60 ms.
    assert [(p["pid"], p["name"], p["total"]) for p in off_cpu["processes"]] == [(10, "app", 1_002_500_000), (30, "idle", 60_000_000)]
    assert off_cpu["processes"][0]["stacks"][0]["children"][0] == {
        "name": "sys_nanosleep", "value": 1_000_000_000, "libtype": "kernel",
        "children": [{"name": "__schedule", "value": 1_000_000_000, "libtype": "kernel", "children": []}]}


def test_a_type_is_named_by_its_unit_too_when_its_name_is_not_enough():
    assert type_ids([CPU, ("samples", "bytes"), OFF_CPU, ("", "")]) == {
        CPU: "samples/count", ("samples", "bytes"): "samples/bytes", OFF_CPU: "off_cpu", ("", ""): "/"}


def test_call_tree_values_include_callees():
    tree = call_tree(collections.Counter({(("main", "native"), ("work", "native")): 3, (("main", "native"),): 1}))
    assert tree == [{"name": "main", "value": 4, "libtype": "native", "children": [{"name": "work", "value": 3, "libtype": "native", "children": []}]}]


def test_page_inlines_renderer_script_and_data_and_loads_nothing_else(served):
    served.consume(profiles(WORK, container="c0ffee" * 10))
    status, headers, html = get(served.url)
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b"<script src" not in html and b"<link" not in html  # nothing fetched from anywhere
    assert b'data-live="true"' in html and b"d3-flame-graph" in html
    assert b"var FlameUnits" in html and b'<select id="type">' in html
    data = embedded_data(html)
    [cpu] = data["types"]
    assert (cpu["type"], cpu["unit"]) == CPU
    assert [(p["pid"], p["name"], p["total"], p["container"]) for p in cpu["processes"]] == [(10, "app", 5, "c0ffee" * 10), (20, "db", 2, "c0ffee" * 10)]
    assert data["window_seconds"] == 300


def test_data_json_is_the_current_window(served):
    served.consume(profiles(WORK))
    status, headers, body = get(served.url + "data.json")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body)["types"][0]["processes"][1]["stacks"][0]["children"][0]["name"] == "query"


def test_off_cpu_time_is_served_as_its_own_type_in_nanoseconds(served):
    served.consume(cpu_and_off_cpu())
    cpu, off_cpu = json.loads(get(served.url + "data.json")[2])["types"]
    assert (cpu["id"], cpu["total"]) == ("samples", 7)
    assert [(p["name"], p["total"]) for p in cpu["processes"]] == [("app", 5), ("db", 2)]
    assert (off_cpu["id"], off_cpu["type"], off_cpu["unit"]) == ("off_cpu", "off_cpu", "nanoseconds")
    assert [(p["name"], p["total"]) for p in off_cpu["processes"]] == [("app", 1_002_500_000), ("idle", 60_000_000)]
    work = next(node for node in off_cpu["processes"][0]["stacks"][0]["children"] if node["name"] == "work")
    assert work["value"] == 2_500_000 and work["children"][0]["children"][0]["name"] == "__schedule"
    # The saved page carries both types, for its selector.
    assert [t["id"] for t in embedded_data(get(served.url + "flamegraph.html")[2])["types"]] == ["samples", "off_cpu"]


def test_the_shareable_file_is_an_attachment_that_needs_no_server(served):
    served.consume(profiles(WORK))
    status, headers, html = get(served.url + "flamegraph.html")
    assert status == 200 and re.fullmatch(r'attachment; filename="flamegraph-.+-\d{8}T\d{6}Z\.html"', headers["Content-Disposition"])
    assert b'data-live="false"' in html and embedded_data(html)["types"][0]["processes"]


def test_names_from_the_data_cannot_close_the_script_tag(served):
    served.consume(profiles({(1, "x"): [(["</script><b>bold</b>"], 1)]}))
    html = get(served.url)[2]
    assert b"<b>bold</b>" not in html
    assert embedded_data(html)["types"][0]["processes"][0]["stacks"][0]["name"] == "</script><b>bold</b>"


def test_unknown_paths_are_not_found(served):
    assert get(served.url + "nope")[0] == 404


def test_start_says_how_to_install_a_missing_renderer(tmp_path, monkeypatch):
    monkeypatch.setattr(page, "VENDOR", tmp_path)
    exporter = factory.create(make_settings("exporters", "flamegraph"), factory.config_model(endpoint="localhost:0"), None)
    with pytest.raises(StartError, match="run scripts/setup.sh"):
        exporter.start(TestHost())


def test_start_names_the_endpoint_it_cannot_listen_on(served):
    port = served.url.rsplit(":", 1)[1].strip("/")
    clash = factory.create(make_settings("exporters", "flamegraph"), factory.config_model(endpoint=f"localhost:{port}"), None)
    with pytest.raises(StartError, match=f"cannot listen on localhost:{port}"):
        clash.start(TestHost())


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed (scripts/setup.sh installs it)")
def test_values_are_shown_in_their_types_unit():
    script = """
        const units = require(process.argv[1]);
        const cpu = {type: "samples", unit: "count"}, offCpu = {type: "off_cpu", unit: "nanoseconds"};
        console.log(JSON.stringify([
            units.phrase(1234, cpu), units.phrase(2500000, offCpu), units.phrase(1002500000, offCpu), units.format(90e9, offCpu),
            units.format(750, offCpu), units.format(3 * 2 ** 20, {type: "alloc_space", unit: "bytes"}),
            units.describe(cpu).label, units.describe(offCpu).label, units.describe({type: "mapped", unit: "bytes"}).label,
            units.phrase(9 * 2 ** 20, {type: "inuse_space", unit: "bytes"}), units.phrase(100 * 2 ** 20, {type: "alloc_space", unit: "bytes"}),
            units.phrase(20, {type: "inuse_objects", unit: "count"}), units.phrase(200, {type: "alloc_objects", unit: "count"}),
            units.describe({type: "inuse_space", unit: "bytes"}).label, units.describe({type: "alloc_space", unit: "bytes"}).more,
        ]));
    """
    result = subprocess.run(["node", "-e", script, str(page.ASSETS / "units.js")], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [
        "1234 samples", "2.50 ms off-CPU time", "1.00 s off-CPU time", "1.50 min", "750 ns", "3.00 MiB", "CPU", "Off-CPU", "mapped (bytes)",
        "9.00 MiB in use", "100 MiB allocated", "20 objects in use", "200 allocations", "In-use memory", "Allocates more"]


def test_spans_past_a_slices_cap_keep_their_samples_and_attributes_not_their_ids(monkeypatch):
    from exporters.flamegraph import window as window_module
    from tests.test_flamegraph_browser import spans_profiles

    monkeypatch.setattr(window_module, "MAX_SPANS_PER_SLICE", 2)
    window = ProfileWindow(60)
    window.add(spans_profiles())  # three spans, 46 samples in them, 5 in none
    by_span = window.totals()[CPU][ProcessKey(40, "shop", "")]
    assert window.spans_cut == 1 and sum(merged(by_span).values()) == 51
    kept = {span.span_id for span in by_span if span.span_id}
    assert len(kept) == 2
    assert any(not span.span_id and span.attributes == (("http.route", "/browse"),) for span in by_span)
    data = page_data(window.totals(), 60, "host", window.spans_cut)
    assert data["spans_cut"] == 1 and [span["span_id"] for span in data["types"][0]["spans"]] == sorted(kept, key=lambda s: s != "11" * 8)
    groups = {group["attributes"].get("http.route"): group["total"] for group in data["types"][0]["processes"][0]["groups"]}
    assert groups == {"/checkout": 30, "/browse": 16, None: 5}


def test_a_process_is_named_by_its_executable_and_the_service_its_sdk_says_it_is():
    from exporters.flamegraph.window import process_key

    assert process_key({"process.pid": 7, "process.executable.name": "python3.11", "service.name": "shop"}).name == "python3.11 (shop)"
    assert process_key({"process.pid": 7, "process.executable.name": "nginx"}).name == "nginx"
    assert process_key({"service.name": "remote"}) == ProcessKey(None, "remote", "")


def test_a_span_whose_attributes_changed_while_it_ran_is_listed_once():
    """http.route is set after a server span starts: its first samples carry no route."""
    b = ProfilesBuilder()
    scope = b.scope_profiles(b.resource_profiles({"process.pid": 50, "process.executable.name": "api"}))
    profile = b.profile(scope, sample_type=CPU, period_type=("cpu", "nanoseconds"), period=PERIOD_NS)
    stack = b.stack([b.location(lines=[(b.function("handler"), 0, 0)])])
    link = b.link(bytes([1] * 16), bytes([2] * 8))
    b.sample(profile, stack, [2], link_index=link)
    b.sample(profile, stack, [7], attributes={"http.route": "/orders"}, link_index=link)
    window = ProfileWindow(60)
    window.add(b.data)
    spans = page_data(window.totals(), 60, "host")["types"][0]["spans"]
    assert [(span["span_id"], span["total"], span["attributes"]) for span in spans] == [("02" * 8, 9, {"http.route": "/orders"})]
