"""The pprof exporter on profiles built by hand: what each file holds (read back with our own
classes and with `go tool pprof`), how files are named, and retention."""

from __future__ import annotations

import gzip
import shutil
import subprocess

import pytest

from pycollector.component import StartError
from pycollector.pdata import ProfilesBuilder
from pycollector.testing import TestHost, assert_conformance, make_settings

from exporters.pprof.factory import factory
from exporters.pprof.files import OUR_FILE
from exporters.pprof.profile_proto import Profile

START_NS = 1_700_000_000_123_000_000  # 2023-11-14T22:13:20.123Z
PERIOD_NS = 10_000_000
BUILD_ID = "4f1e2d3c4b5a69788796a5b4c3d2e1f0a1b2c3d4"


def two_processes(start_ns: int = START_NS):
    """app (pid 100): main -> work, with a helper inlined into work, and once into the kernel;
    db (pid 200): main -> query."""
    b = ProfilesBuilder()
    app = b.mapping(0x400000, 0x500000, 0, "/usr/bin/app", {"process.executable.build_id.gnu": BUILD_ID})
    libc = b.mapping(0x7F0000000000, 0x7F0000100000, 0x1000, "/usr/lib/libc.so.6")
    kernel = b.mapping(0xFFFFFFFF81000000, 0xFFFFFFFF82000000, 0, "[kernel.kallsyms]")
    native, in_kernel = {"profile.frame.type": "native"}, {"profile.frame.type": "kernel"}
    main = b.location(app, 0x401000, [(b.function("main", filename="app.c"), 10, 0)], native)
    work = b.location(app, 0x402000, [(b.function("helper", filename="helper.h"), 3, 0), (b.function("work", filename="app.c"), 20, 0)], native)
    write = b.location(libc, 0x7F0000000100, [(b.function("write"), 0, 0)], native)
    syscall = b.location(kernel, 0xFFFFFFFF81000100, [(b.function("do_syscall_64"), 0, 0)], in_kernel)
    query = b.location(app, 0x403000, [(b.function("query", filename="db.c"), 7, 0)], native)

    def process(pid, name, stacks):
        resource = b.resource_profiles({"process.pid": pid, "process.executable.name": name, "process.executable.path": "/usr/bin/app", "host.name": "testhost"})
        profile = b.profile(b.scope_profiles(resource), period=PERIOD_NS, time_unix_nano=start_ns, duration_nano=5_000_000_000)
        for locations, count in stacks:
            b.sample(profile, b.stack(locations), [count], attributes={"thread.id": pid, "thread.name": name})

    process(100, "app", [([work, main], 3), ([syscall, write, work, main], 1)])
    process(200, "db", [([query, main], 2)])
    return b.data


def with_off_cpu(start_ns: int = START_NS):
    """app (pid 100) as the profiling receiver sends it with off-CPU profiling: a CPU profile and,
    under the same scope and sharing the dictionary, an off-CPU one (no period; each value the
    nanoseconds a thread spent off the CPU there, its stack starting in the scheduler)."""
    b = ProfilesBuilder()
    app = b.mapping(0x400000, 0x500000, 0, "/usr/bin/app", {"process.executable.build_id.gnu": BUILD_ID})
    native, in_kernel = {"profile.frame.type": "native"}, {"profile.frame.type": "kernel"}
    main = b.location(app, 0x401000, [(b.function("main", filename="app.c"), 10, 0)], native)
    work = b.location(app, 0x402000, [(b.function("work", filename="app.c"), 20, 0)], native)
    wait = b.location(app, 0x404000, [(b.function("wait_for_job", filename="app.c"), 30, 0)], native)
    schedule = b.location(lines=[(b.function("__schedule"), 0, 0)], attributes=in_kernel)
    futex = b.location(lines=[(b.function("futex_wait"), 0, 0)], attributes=in_kernel)
    scope = b.scope_profiles(b.resource_profiles({"process.pid": 100, "process.executable.name": "app", "process.executable.path": "/usr/bin/app"}))
    cpu = b.profile(scope, period=PERIOD_NS, time_unix_nano=start_ns, duration_nano=5_000_000_000)
    b.sample(cpu, b.stack([work, main]), [3], attributes={"thread.id": 100})
    off_cpu = b.profile(scope, sample_type=("off_cpu", "nanoseconds"), period_type=("", ""), time_unix_nano=start_ns, duration_nano=5_000_000_000)
    b.sample(off_cpu, b.stack([schedule, futex, wait, main]), [1_500_000_000], attributes={"thread.id": 101})
    b.sample(off_cpu, b.stack([schedule, futex, work, main]), [2_500_000], attributes={"thread.id": 100})
    return b.data


def stripped_library(start_ns: int = START_NS):
    """tool (pid 300): a frame in a stripped library, called from a frame in no mapping at all.
    libfoo.so's code is mapped at 0x7f1200000000 from file offset 0x1000."""
    b = ProfilesBuilder()
    libfoo = b.mapping(0x7F1200000000, 0x7F1200010000, 0x1000, "/usr/lib/libfoo.so")
    leaf = b.location(libfoo, 0x7F12000046CD, [], {"profile.frame.type": "native"})
    jitted = b.location(0, 0x7F3A00001234, [], {"profile.frame.type": "native"})
    resource = b.resource_profiles({"process.pid": 300, "process.executable.name": "tool"})
    profile = b.profile(b.scope_profiles(resource), period=PERIOD_NS, time_unix_nano=start_ns, duration_nano=1_000_000_000)
    b.sample(profile, b.stack([leaf, jitted]), [4])
    return b.data


def exporter_in(directory, **config):
    exporter = factory.create(make_settings("exporters", "pprof"), factory.config_model(directory=str(directory), **config), None)
    exporter.start(TestHost())
    return exporter


def read(path) -> Profile:
    return Profile.FromString(gzip.decompress(path.read_bytes()))


def strings(profile, *indices):
    return tuple(profile.string_table[index] for index in indices)


def test_keeps_the_contract(tmp_path):
    assert_conformance(factory, "exporters", {"directory": str(tmp_path)})


def test_per_process_files_are_named_by_time_and_process(tmp_path):
    exporter = exporter_in(tmp_path)
    exporter.consume(two_processes())
    assert sorted(path.name for path in tmp_path.iterdir()) == ["20231114T221320.123Z-app-100.pb.gz", "20231114T221320.123Z-db-200.pb.gz"]


def test_a_profile_holds_functions_files_lines_inlining_and_mappings(tmp_path):
    exporter_in(tmp_path).consume(two_processes())
    profile = read(tmp_path / "20231114T221320.123Z-app-100.pb.gz")
    assert [strings(profile, t.type, t.unit) for t in profile.sample_type] == [("samples", "count"), ("cpu", "nanoseconds")]
    assert strings(profile, profile.period_type.type, profile.period_type.unit) == ("cpu", "nanoseconds")
    assert (profile.period, profile.time_nanos, profile.duration_nanos) == (PERIOD_NS, START_NS, 5_000_000_000)
    assert "process.pid=100" in [profile.string_table[index] for index in profile.comment]

    functions = {function.id: function for function in profile.function}
    locations = {location.id: location for location in profile.location}

    def frames(sample):  # leaf first; each location's lines innermost first
        return [[(profile.string_table[functions[line.function_id].name], profile.string_table[functions[line.function_id].filename], line.line) for line in locations[id_].line] for id_ in sample.location_id]

    samples = {tuple(sample.value): frames(sample) for sample in profile.sample}
    assert samples[(3, 3 * PERIOD_NS)] == [[("helper", "helper.h", 3), ("work", "app.c", 20)], [("main", "app.c", 10)]]
    assert samples[(1, PERIOD_NS)][:2] == [[("do_syscall_64", "", 0)], [("write", "", 0)]]
    labels = {(profile.string_table[label.key], label.num or profile.string_table[label.str]) for label in profile.sample[0].label}
    assert labels == {("thread.id", 100), ("thread.name", "app")}

    main_binary = profile.mapping[0]  # pprof reads mapping[0] as the main binary
    assert strings(profile, main_binary.filename, main_binary.build_id) == ("/usr/bin/app", BUILD_ID)
    assert (main_binary.memory_start, main_binary.memory_limit) == (0x400000, 0x500000)
    assert main_binary.has_functions and main_binary.has_filenames and main_binary.has_line_numbers and main_binary.has_inline_frames
    assert sorted(profile.string_table[m.filename] for m in profile.mapping) == ["/usr/bin/app", "/usr/lib/libc.so.6", "[kernel.kallsyms]"]
    assert {location.mapping_id for location in profile.location} <= {m.id for m in profile.mapping}


def test_off_cpu_time_is_a_file_of_its_own_in_nanoseconds(tmp_path):
    exporter_in(tmp_path).consume(with_off_cpu())
    assert sorted(path.name for path in tmp_path.iterdir()) == ["20231114T221320.123Z-app-100-off_cpu.pb.gz", "20231114T221320.123Z-app-100.pb.gz"]
    cpu = read(tmp_path / "20231114T221320.123Z-app-100.pb.gz")
    assert [tuple(sample.value) for sample in cpu.sample] == [(3, 3 * PERIOD_NS)]  # no off-CPU time in it
    profile = read(tmp_path / "20231114T221320.123Z-app-100-off_cpu.pb.gz")
    assert [strings(profile, t.type, t.unit) for t in profile.sample_type] == [("off_cpu", "nanoseconds")]
    # No period: off-CPU time is measured, not sampled at a rate.
    assert (profile.period_type.type, profile.period_type.unit, profile.period) == (0, 0, 0)
    assert (profile.time_nanos, profile.duration_nanos) == (START_NS, 5_000_000_000)
    functions = {function.id: profile.string_table[function.name] for function in profile.function}
    locations = {location.id: location for location in profile.location}
    stacks = {tuple(functions[locations[id_].line[0].function_id] for id_ in sample.location_id): list(sample.value) for sample in profile.sample}
    assert stacks == {("__schedule", "futex_wait", "wait_for_job", "main"): [1_500_000_000], ("__schedule", "futex_wait", "work", "main"): [2_500_000]}


def test_merged_mode_writes_off_cpu_time_to_a_file_of_its_own(tmp_path):
    exporter_in(tmp_path, mode="merged").consume(with_off_cpu())
    assert sorted(path.name for path in tmp_path.iterdir()) == ["20231114T221320.123Z-all-off_cpu.pb.gz", "20231114T221320.123Z-all.pb.gz"]
    assert sum(sample.value[0] for sample in read(tmp_path / "20231114T221320.123Z-all-off_cpu.pb.gz").sample) == 1_502_500_000


def test_a_frame_without_a_symbol_is_named_by_its_file_and_address_in_the_file(tmp_path):
    exporter_in(tmp_path).consume(stripped_library())
    profile = read(tmp_path / "20231114T221320.123Z-tool-300.pb.gz")
    functions = {function.id: profile.string_table[function.name] for function in profile.function}
    locations = {location.id: location for location in profile.location}
    [sample] = profile.sample
    # speedscope leaves out a location with no line: each one has a named function.
    assert [[functions[line.function_id] for line in locations[id_].line] for id_ in sample.location_id] == [["[libfoo.so]+0x56cd"], ["[unknown]+0x7f3a00001234"]]
    assert [locations[id_].address for id_ in sample.location_id] == [0x7F12000046CD, 0x7F3A00001234]
    # A made-up name is no symbol: pprof may still look the address up in the file.
    [libfoo] = profile.mapping
    assert not libfoo.has_functions


def test_a_process_file_holds_only_what_its_samples_reach(tmp_path):
    exporter_in(tmp_path).consume(two_processes())
    profile = read(tmp_path / "20231114T221320.123Z-db-200.pb.gz")
    assert sorted(profile.string_table[f.name] for f in profile.function) == ["main", "query"]
    assert [profile.string_table[m.filename] for m in profile.mapping] == ["/usr/bin/app"]


def test_merged_mode_writes_one_file_whose_samples_name_their_process(tmp_path):
    exporter_in(tmp_path, mode="merged").consume(two_processes())
    [path] = tmp_path.iterdir()
    assert path.name == "20231114T221320.123Z-all.pb.gz"
    profile = read(path)
    pids = sorted(label.num for sample in profile.sample for label in sample.label if profile.string_table[label.key] == "process.pid")
    assert pids == [100, 100, 200]
    assert sum(sample.value[0] for sample in profile.sample) == 6


def test_retention_deletes_the_oldest_files_first_and_leaves_other_files_alone(tmp_path):
    (tmp_path / "notes.txt").write_text("not ours")
    exporter = exporter_in(tmp_path, mode="merged", max_files=3)
    for second in range(5):
        exporter.consume(two_processes(START_NS + second * 1_000_000_000))
    ours = sorted(path.name for path in tmp_path.iterdir() if OUR_FILE.match(path.name))
    assert ours == [f"20231114T2213{second}.123Z-all.pb.gz" for second in (22, 23, 24)]
    assert (tmp_path / "notes.txt").exists()


def test_retention_by_bytes_keeps_at_least_the_newest_file(tmp_path):
    exporter = exporter_in(tmp_path, mode="merged", max_bytes=1)
    for second in range(3):
        exporter.consume(two_processes(START_NS + second * 1_000_000_000))
    assert [path.name for path in tmp_path.iterdir()] == ["20231114T221322.123Z-all.pb.gz"]


def test_a_directory_that_cannot_be_created_fails_the_start(tmp_path):
    (tmp_path / "file").write_text("")
    exporter = factory.create(make_settings("exporters", "pprof"), factory.config_model(directory=str(tmp_path / "file" / "sub")), None)
    with pytest.raises(StartError, match="directory: cannot create"):
        exporter.start(TestHost())


def go_pprof(*args: str) -> str:
    result = subprocess.run(["go", "tool", "pprof", *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.skipif(shutil.which("go") is None, reason="go (Debian golang-go) is not installed")
def test_go_tool_pprof_reads_functions_files_lines_and_inlining(tmp_path):
    exporter_in(tmp_path).consume(two_processes())
    path = str(tmp_path / "20231114T221320.123Z-app-100.pb.gz")
    traces = go_pprof("-traces", path)
    assert "File: app" in traces and f"Build ID: {BUILD_ID}" in traces
    # One stack per sample, leaf first, the inlined helper marked as such, labels shown above it.
    assert [line.split() for line in traces.splitlines() if line.split()[:1] in (["30ms"], ["work"], ["main"])][:3] == [["30ms", "helper", "(inline)"], ["work"], ["main"]]
    assert "thread.name:  app" in traces
    by_line = go_pprof("-top", "-lines", path)
    assert "helper helper.h:3 (inline)" in by_line and "work app.c:20" in by_line and "main app.c:10" in by_line, by_line


@pytest.mark.skipif(shutil.which("go") is None, reason="go (Debian golang-go) is not installed")
def test_go_tool_pprof_shows_frames_without_a_symbol_by_file_and_address(tmp_path):
    exporter_in(tmp_path).consume(stripped_library())
    top = go_pprof("-top", str(tmp_path / "20231114T221320.123Z-tool-300.pb.gz"))
    assert "[libfoo.so]+0x56cd" in top and "[unknown]+0x7f3a00001234" in top, top


@pytest.mark.skipif(shutil.which("go") is None, reason="go (Debian golang-go) is not installed")
def test_go_tool_pprof_reads_off_cpu_time_as_time(tmp_path):
    exporter_in(tmp_path).consume(with_off_cpu())
    # -nodefraction=0: keep work's 2.5 ms, which -top alone drops as under 0.5% of the total.
    # -unit=ms: pprof converts the nanoseconds, a time unit it knows, to the unit asked for.
    top = go_pprof("-top", "-nodefraction=0", "-unit=ms", str(tmp_path / "20231114T221320.123Z-app-100-off_cpu.pb.gz"))
    assert "Type: off_cpu" in top and "of 1502.50ms total" in top, top
    # 1.5 s waited under wait_for_job, 2.5 ms under work, all of it in the scheduler (the leaf).
    cumulative = {line.split()[-1]: line.split()[3] for line in top.splitlines() if line.split()[-1:] in (["wait_for_job"], ["work"], ["__schedule"])}
    assert cumulative == {"__schedule": "1502.50ms", "wait_for_job": "1500ms", "work": "2.50ms"}, top


def test_a_sample_that_ran_in_a_span_is_labelled_with_its_trace_and_span(tmp_path):
    """As Pyroscope's span profiles read them: trace_id and span_id labels, lower-case hex."""
    b = ProfilesBuilder()
    work = b.location(0, 0x401000, [(b.function("work"), 0, 0)], {"profile.frame.type": "native"})
    profile = b.profile(b.scope_profiles(b.resource_profiles({"process.pid": 100, "process.executable.name": "app"})),
                        period=PERIOD_NS, time_unix_nano=START_NS, duration_nano=1_000_000_000)
    b.sample(profile, b.stack([work]), [3], attributes={"thread.id": 100}, link_index=b.link(bytes([0xAB] * 16), bytes([0x11] * 8)))
    b.sample(profile, b.stack([work]), [1], attributes={"thread.id": 100})
    exporter_in(tmp_path).consume(b.data)
    [written] = tmp_path.iterdir()
    labels = [{profile_.string_table[label.key]: label.num or profile_.string_table[label.str] for label in sample.label}
              for profile_ in [read(written)] for sample in profile_.sample]
    assert labels == [{"thread.id": 100, "trace_id": "ab" * 16, "span_id": "11" * 8}, {"thread.id": 100}]
