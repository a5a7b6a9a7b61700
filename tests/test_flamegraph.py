"""The flame graph exporter without a browser: the sliding window, the call trees it sends, the
pages it serves and what they inline."""

from __future__ import annotations

import collections
import json
import re
import urllib.error
import urllib.request

import pytest

from pycollector.component import StartError
from pycollector.pdata import ProfilesBuilder
from pycollector.testing import TestHost, assert_conformance, make_settings

from exporters.flamegraph import page
from exporters.flamegraph.factory import factory
from exporters.flamegraph.tree import call_tree
from exporters.flamegraph.window import ProcessKey, ProfileWindow


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def profiles(stacks_by_process: dict[tuple[int, str], list[tuple[list[str], int]]], sample_type=("samples", "count"), container: str = ""):
    """Stacks given root first, as a reader thinks of them; stored leaf first as OTLP has them."""
    b = ProfilesBuilder()
    for (pid, name), stacks in stacks_by_process.items():
        attributes = {"process.pid": pid, "process.executable.name": name}
        if container:
            attributes["container.id"] = container
        profile = b.profile(b.scope_profiles(b.resource_profiles(attributes)), sample_type=sample_type)
        for functions, count in stacks:
            locations = [b.location(lines=[(b.function(function), 0, 0)], attributes={"profile.frame.type": "kernel" if function.startswith("sys_") else "native"}) for function in reversed(functions)]
            b.sample(profile, b.stack(locations), [count])
    return b.data


WORK = {(10, "app"): [(["main", "work"], 3), (["main", "work", "sys_write"], 1), (["main"], 1)], (20, "db"): [(["main", "query"], 2)]}


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
    assert window.add(profiles(WORK)) == 7
    totals = window.totals()
    app = totals[ProcessKey(10, "app", "")]
    assert app[(("main", "native"), ("work", "native"), ("sys_write", "kernel"))] == 1
    assert sum(totals[ProcessKey(20, "db", "")].values()) == 2


def test_window_forgets_samples_older_than_the_window():
    clock = FakeClock()
    window = ProfileWindow(60, clock=clock)
    window.add(profiles({(10, "app"): [(["old"], 5)]}))
    clock.now += 30
    window.add(profiles({(10, "app"): [(["new"], 1)]}))
    clock.now += 31
    assert dict(window.totals()[ProcessKey(10, "app", "")]) == {(("new", "native"),): 1}
    clock.now += 60
    assert window.totals() == {}


def test_window_keeps_only_cpu_samples():
    window = ProfileWindow(60)
    assert window.add(profiles(WORK, sample_type=("alloc_space", "bytes"))) == 0
    assert window.totals() == {}


def test_window_names_a_frame_without_a_symbol_by_its_file_and_address_in_the_file():
    b = ProfilesBuilder()
    libfoo = b.mapping(0x7F1200000000, 0x7F1200010000, 0x1000, "/usr/lib/libfoo.so")
    stripped = b.location(libfoo, 0x7F12000046CD, [], {"profile.frame.type": "native"})
    nowhere = b.location(0, 0x7F3A00001234, [], {"profile.frame.type": "native"})
    main = b.location(lines=[(b.function("main"), 0, 0)], attributes={"profile.frame.type": "native"})
    profile = b.profile(b.scope_profiles(b.resource_profiles({"process.pid": 10, "process.executable.name": "app"})))
    b.sample(profile, b.stack([stripped, nowhere, main]), [], timestamps_unix_nano=[1, 2, 3])
    window = ProfileWindow(60)
    assert window.add(b.data) == 3  # no values: one sample per timestamp
    stack = (("main", "native"), ("[unknown]+0x7f3a00001234", "native"), ("[libfoo.so]+0x56cd", "native"))
    assert dict(window.totals()[ProcessKey(10, "app", "")]) == {stack: 3}


def test_call_tree_values_include_callees():
    tree = call_tree(collections.Counter({(("main", "native"), ("work", "native")): 3, (("main", "native"),): 1}))
    assert tree == [{"name": "main", "value": 4, "libtype": "native", "children": [{"name": "work", "value": 3, "libtype": "native", "children": []}]}]


def test_page_inlines_renderer_script_and_data_and_loads_nothing_else(served):
    served.consume(profiles(WORK, container="c0ffee" * 10))
    status, headers, html = get(served.url)
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b"<script src" not in html and b"<link" not in html  # nothing fetched from anywhere
    assert b'data-live="true"' in html and b"d3-flame-graph" in html
    data = embedded_data(html)
    assert [(p["pid"], p["name"], p["samples"], p["container"]) for p in data["processes"]] == [(10, "app", 5, "c0ffee" * 10), (20, "db", 2, "c0ffee" * 10)]
    assert data["window_seconds"] == 300


def test_data_json_is_the_current_window(served):
    served.consume(profiles(WORK))
    status, headers, body = get(served.url + "data.json")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body)["processes"][1]["stacks"][0]["children"][0]["name"] == "query"


def test_the_shareable_file_is_an_attachment_that_needs_no_server(served):
    served.consume(profiles(WORK))
    status, headers, html = get(served.url + "flamegraph.html")
    assert status == 200 and re.fullmatch(r'attachment; filename="flamegraph-.+-\d{8}T\d{6}Z\.html"', headers["Content-Disposition"])
    assert b'data-live="false"' in html and embedded_data(html)["processes"]


def test_names_from_the_data_cannot_close_the_script_tag(served):
    served.consume(profiles({(1, "x"): [(["</script><b>bold</b>"], 1)]}))
    html = get(served.url)[2]
    assert b"<b>bold</b>" not in html
    assert embedded_data(html)["processes"][0]["stacks"][0]["name"] == "</script><b>bold</b>"


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
