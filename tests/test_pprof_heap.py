"""The pprof exporter on memory profiles: a process's allocation and live-heap profiles become one
heap file as Go writes one, which `go tool pprof -sample_index=inuse_space` (and alloc_space)
reads, with the allocator's frames dropped so each allocation shows under its site.

The profiles are the receiver's own (tests/heap_profiles.py: ReportBuilder over a running
process under the native sampler, no BPF): 120/60/20 sampled blocks of 512 KiB allocated in
alloc_hot/alloc_warm/alloc_leaky (60/30/10 MiB), 2 and 18 held by alloc_warm and alloc_leaky
(1 and 9 MiB: the leaker 90%), and 5 CPU samples in alloc_hot."""

from __future__ import annotations

import gzip
import shutil
import subprocess

import pytest

from pycollector.pdata import ProfilesBuilder

from exporters.allocation_sites import ALLOCATOR_FRAMES
from exporters.pprof.profile_proto import Profile
from tests.heap_profiles import MIB, START_NS, heap_sites
from tests.test_pprof_exporter import exporter_in, go_pprof

needs_go = pytest.mark.skipif(shutil.which("go") is None, reason="go (Debian golang-go) is not installed")
HEAP_TYPES = [("alloc_objects", "count"), ("alloc_space", "bytes"), ("inuse_objects", "count"), ("inuse_space", "bytes")]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """The receiver's reports: with the live heap, and with allocation profiling alone."""
    with heap_sites(tmp_path_factory.mktemp("heap_sites")) as workload:
        yield {"pid": workload.pid, "both": workload.report(), "alloc_only": workload.report(held=None, cpu=0)}


def written(directory, data, **config) -> dict[str, Profile]:
    exporter_in(directory, **config).consume(data)
    return {path.name: Profile.FromString(gzip.decompress(path.read_bytes())) for path in directory.iterdir()}


def types(profile: Profile, field: str = "sample_type") -> list[tuple[str, str]]:
    return [(profile.string_table[value_type.type], profile.string_table[value_type.unit]) for value_type in getattr(profile, field)]


def sites(profile: Profile) -> dict[str, list[int]]:
    """Each sample's values by the function its stack holds after the allocator's frames (the
    fourth frame, leaf first: sample, malloc_sampled, malloc, the site, main)."""
    functions = {function.id: profile.string_table[function.name] for function in profile.function}
    names = {location.id: functions[location.line[0].function_id] for location in profile.location}
    return {names[sample.location_id[3]]: list(sample.value) for sample in profile.sample}


def test_a_process_memory_profiles_are_one_heap_file_as_go_writes_it(tmp_path, reports):
    pid = reports["pid"]
    files = written(tmp_path, reports["both"])
    assert sorted(files) == sorted([f"20231114T221320.123Z-heap_sites-{pid}.pb.gz", f"20231114T221320.123Z-heap_sites-{pid}-heap.pb.gz"])
    heap = files[f"20231114T221320.123Z-heap_sites-{pid}-heap.pb.gz"]
    assert types(heap) == HEAP_TYPES
    assert heap.string_table[heap.default_sample_type] == "inuse_space"
    assert (heap.string_table[heap.period_type.type], heap.string_table[heap.period_type.unit]) == ("space", "bytes")
    assert heap.string_table[heap.drop_frames] == ALLOCATOR_FRAMES
    # One sample per stack and labels, its value of each type; 0 where a type has none there.
    assert sites(heap) == {"alloc_hot": [120, 60 * MIB, 0, 0], "alloc_warm": [60, 30 * MIB, 2, 1 * MIB], "alloc_leaky": [20, 10 * MIB, 18, 9 * MIB]}
    assert all({heap.string_table[label.key] for label in sample.label} == {"thread.id", "thread.name"} for sample in heap.sample)
    # The CPU profile is a file of its own, as before.
    cpu = files[f"20231114T221320.123Z-heap_sites-{pid}.pb.gz"]
    assert types(cpu) == [("samples", "count"), ("cpu", "nanoseconds")] and [list(sample.value) for sample in cpu.sample] == [[5, 5 * 50_000_000]]
    assert not cpu.drop_frames and not cpu.default_sample_type


def test_without_the_live_heap_the_heap_file_has_the_allocation_types(tmp_path, reports):
    [(name, heap)] = written(tmp_path, reports["alloc_only"]).items()
    assert name.endswith("-heap.pb.gz")
    assert types(heap) == HEAP_TYPES[:2] and heap.string_table[heap.default_sample_type] == "alloc_space"
    assert sites(heap) == {"alloc_hot": [120, 60 * MIB], "alloc_warm": [60, 30 * MIB], "alloc_leaky": [20, 10 * MIB]}


def test_merged_mode_writes_every_process_heap_in_one_file_labelled_by_process(tmp_path, reports):
    files = written(tmp_path, reports["both"], mode="merged")
    assert sorted(files) == ["20231114T221320.123Z-all-heap.pb.gz", "20231114T221320.123Z-all.pb.gz"]
    heap = files["20231114T221320.123Z-all-heap.pb.gz"]
    assert types(heap) == HEAP_TYPES and sites(heap)["alloc_leaky"] == [20, 10 * MIB, 18, 9 * MIB]
    assert all({(heap.string_table[label.key], label.num) for label in sample.label} >= {("process.pid", reports["pid"])} for sample in heap.sample)


def test_samples_of_one_stack_with_other_labels_stay_apart():
    """An allocation linked to a span and the live heap's reading of the same stack (which carries
    none) are two samples, as are two threads': a sample is a stack and its labels."""
    from exporters.pprof.convert import to_pprof

    b = ProfilesBuilder()
    site = b.location(0, 0x401000, [(b.function("site"), 0, 0)], {"profile.frame.type": "native"})
    scope = b.scope_profiles(b.resource_profiles({"process.pid": 7, "process.executable.name": "app"}))
    alloc = b.profile(scope, sample_type=("alloc_space", "bytes"), period_type=("", ""), time_unix_nano=START_NS)
    inuse = b.profile(scope, sample_type=("inuse_space", "bytes"), period_type=("", ""), time_unix_nano=START_NS)
    b.sample(alloc, b.stack([site]), [300], attributes={"thread.id": 7}, link_index=b.link(bytes([1] * 16), bytes([2] * 8)))
    b.sample(alloc, b.stack([site]), [100], attributes={"thread.id": 8})
    b.sample(inuse, b.stack([site]), [40], attributes={"thread.id": 7})
    b.sample(inuse, b.stack([site]), [60], attributes={"thread.id": 8})
    [heap] = to_pprof(b.data, merged=False)
    labelled = sorted((tuple(sorted(heap.profile.string_table[label.key] for label in sample.label)), list(sample.value)) for sample in heap.profile.sample)
    assert labelled == [(("span_id", "thread.id", "trace_id"), [300, 0]), (("thread.id",), [0, 40]), (("thread.id",), [100, 60])]


def top(output: str) -> dict[str, tuple[str, str]]:
    """``go tool pprof -top``'s rows: function -> (flat, flat%)."""
    rows = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) == 6 and fields[1].endswith("%") and fields[4].endswith("%"):
            rows[fields[5]] = (fields[0], fields[1])
    return rows


@needs_go
def test_go_tool_pprof_reads_the_heap_file_by_each_sample_index(tmp_path, reports):
    exporter_in(tmp_path).consume(reports["both"])
    path = str(tmp_path / f"20231114T221320.123Z-heap_sites-{reports['pid']}-heap.pb.gz")
    inuse = go_pprof("-sample_index=inuse_space", "-top", path)
    # The leaker holds 90%; the allocator's frames (sample, malloc_sampled, malloc) are dropped.
    assert "Type: inuse_space" in inuse and "Total samples = 10MB" in inuse, inuse
    assert top(inuse) == {"alloc_leaky": ("9MB", "90.00%"), "alloc_warm": ("1MB", "10.00%"), "main": ("0", "0%")}, inuse
    assert top(go_pprof("-top", path)) == top(inuse)  # inuse_space is the default, as in Go's heap profiles
    allocated = go_pprof("-sample_index=alloc_space", "-top", path)
    assert "Type: alloc_space" in allocated and "Total samples = 100MB" in allocated, allocated
    assert top(allocated) == {"alloc_hot": ("60MB", "60.00%"), "alloc_warm": ("30MB", "30.00%"), "alloc_leaky": ("10MB", "10.00%"), "main": ("0", "0%")}
    assert top(go_pprof("-sample_index=inuse_objects", "-top", path))["alloc_leaky"] == ("18", "90.00%")
    raw = go_pprof("-raw", path)
    assert "alloc_objects/count alloc_space/bytes inuse_objects/count inuse_space/bytes[dflt]" in raw, raw
    assert "PeriodType: space bytes" in raw
    values = sorted(line.split(":")[0].split() for line in raw.splitlines() if line.strip().endswith(" 5") and ":" in line)
    assert values == sorted([["120", str(60 * MIB), "0", "0"], ["60", str(30 * MIB), "2", str(MIB)], ["20", str(10 * MIB), "18", str(9 * MIB)]]), raw


@needs_go
def test_go_tool_pprof_opens_an_allocation_only_heap_file_on_alloc_space(tmp_path, reports):
    exporter_in(tmp_path).consume(reports["alloc_only"])
    [path] = tmp_path.iterdir()
    allocated = go_pprof("-top", str(path))
    assert "Type: alloc_space" in allocated and top(allocated)["alloc_hot"] == ("60MB", "60.00%"), allocated
    result = subprocess.run(["go", "tool", "pprof", "-sample_index=inuse_space", "-top", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "inuse_space" in result.stderr  # not there, and pprof says so
