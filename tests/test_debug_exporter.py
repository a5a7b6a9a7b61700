"""The debug exporter's three verbosities, read as a person reads them."""

import collections
import io
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pycollector.pdata import ProfilesBuilder
from pycollector.testing import TestHost, make_settings, sample_data

from exporters.debug.config import DebugConfig
from exporters.debug.exporter import DebugExporter
from tests.conftest import REPO, WORKLOADS, share_tolerance


def two_process_profile():
    builder = ProfilesBuilder()
    kernel = builder.location(address=0xFFFF1, lines=[(builder.function("do_syscall_64"), 0, 0)], attributes={"profile.frame.type": "kernel"})
    mapping = builder.mapping(0x1000, 0x9000, 0, "/usr/bin/app", attributes={"process.executable.build_id.gnu": "abcd"})
    heavy = builder.location(mapping, 0x1100, [(builder.function("spin_heavy"), 0, 0)], {"profile.frame.type": "native"})
    light = builder.location(mapping, 0x1200, [(builder.function("spin_light"), 0, 0)], {"profile.frame.type": "native"})
    main = builder.location(mapping, 0x1300, [(builder.function("main", filename="app.c"), 42, 0)], {"profile.frame.type": "native"})
    app = builder.profile(builder.scope_profiles(builder.resource_profiles({"process.pid": 10, "process.executable.name": "app"})), period=10_309_278)
    builder.sample(app, builder.stack([heavy, main]), [30], attributes={"thread.id": 10, "thread.name": "app"})
    builder.sample(app, builder.stack([light, main]), [10], attributes={"thread.id": 11, "thread.name": "worker"})
    builder.sample(app, builder.stack([kernel, main]), [5], attributes={"thread.id": 10, "thread.name": "app"})
    other = builder.profile(builder.scope_profiles(builder.resource_profiles({"process.pid": 20, "process.executable.name": "other app"})))
    builder.sample(other, builder.stack([main]), [1], attributes={"thread.id": 20})
    return builder.data


def render(verbosity, data):
    output = io.StringIO()
    exporter = DebugExporter(make_settings("exporters", "debug"), DebugConfig(verbosity=verbosity, sampling_initial=100), output=output)
    exporter.start(TestHost())
    exporter.consume(data)
    exporter.shutdown()
    return output.getvalue()


def test_basic_prints_only_the_summary_line(log_output):
    assert render("basic", two_process_profile()) == ""
    line = log_output.getvalue()
    assert "Profiles" in line and "resource_profiles=2 profiles=2 samples=4" in line


def test_normal_lists_each_process_and_its_top_functions():
    text = render("normal", two_process_profile())
    lines = text.splitlines()
    assert lines[0] == "ResourceProfiles #0  process.pid=10 process.executable.name=app"
    assert lines[1].startswith("  Profile #0  samples/count  samples=3  total=45  period=10309278 cpu/nanoseconds")
    assert lines[2].split()[:3] == ["30", "66.7%", "spin_heavy"]
    assert lines[3].split()[:3] == ["10", "22.2%", "spin_light"]
    assert lines[4].split()[:3] == ["5", "11.1%", "do_syscall_64"]
    assert 'process.executable.name="other app"' in text


def test_a_sample_with_timestamps_and_no_values_counts_one_per_timestamp():
    # The OTel eBPF profiler sends CPU samples this way.
    builder = ProfilesBuilder()
    mapping = builder.mapping(0x1000, 0x9000, 0, "/usr/bin/app")
    heavy = builder.location(mapping, 0x1100, [(builder.function("spin_heavy"), 0, 0)], {"profile.frame.type": "native"})
    light = builder.location(mapping, 0x1200, [(builder.function("spin_light"), 0, 0)], {"profile.frame.type": "native"})
    idle = builder.profile(builder.scope_profiles(builder.resource_profiles({"process.pid": 20, "process.executable.name": "idle"})))
    builder.sample(idle, builder.stack([light]), [2])
    busy = builder.profile(builder.scope_profiles(builder.resource_profiles({"process.pid": 10, "process.executable.name": "busy"})))
    builder.sample(busy, builder.stack([heavy]), [], timestamps_unix_nano=[1, 2, 3])
    builder.sample(busy, builder.stack([light]), [], timestamps_unix_nano=[4])
    lines = render("normal", builder.data).splitlines()
    assert lines[0].startswith("ResourceProfiles #1  process.pid=10")  # 4 samples outweigh 2
    assert lines[1].startswith("  Profile #0  samples/count  samples=2  total=4")
    assert lines[2].split()[:3] == ["3", "75.0%", "spin_heavy"]
    assert lines[3].split()[:3] == ["1", "25.0%", "spin_light"]


def cpu_and_off_cpu_profiles():
    """As the profiling receiver sends them: app has both a CPU profile and an off-CPU one under
    its scope, sharing the dictionary; sleeper was only off the CPU, for far more nanoseconds than
    anyone's CPU sample count. Off-CPU stacks start in the scheduler."""
    builder = ProfilesBuilder()
    mapping = builder.mapping(0x1000, 0x9000, 0, "/usr/bin/app")
    libc = builder.mapping(0x7F0000000000, 0x7F0000100000, 0, "/usr/lib/libc.so.6")

    def kernel(name):
        return builder.location(lines=[(builder.function(name), 0, 0)], attributes={"profile.frame.type": "kernel"})

    schedule, nanosleep, futex = kernel("__schedule"), kernel("do_nanosleep"), kernel("futex_wait")
    main = builder.location(mapping, 0x1300, [(builder.function("main"), 0, 0)], {"profile.frame.type": "native"})
    sleep = builder.location(libc, 0x7F0000000100, [(builder.function("clock_nanosleep"), 0, 0)], {"profile.frame.type": "native"})
    lock = builder.location(libc, 0x7F0000000200, [(builder.function("pthread_mutex_lock"), 0, 0)], {"profile.frame.type": "native"})
    worker = builder.location(lines=[(builder.function("worker_thread"), 0, 0)], attributes={"profile.frame.type": "kernel"})

    scope = builder.scope_profiles(builder.resource_profiles({"process.pid": 10, "process.executable.name": "app"}))
    cpu = builder.profile(scope, period=10_309_278)
    builder.sample(cpu, builder.stack([main]), [7])
    off_cpu = builder.profile(scope, sample_type=("off_cpu", "nanoseconds"), period_type=("", ""))
    builder.sample(off_cpu, builder.stack([schedule, nanosleep, sleep, main]), [1_500_000_000], attributes={"thread.id": 10})
    builder.sample(off_cpu, builder.stack([schedule, futex, lock, main]), [2_500_000], attributes={"thread.id": 11})
    builder.sample(off_cpu, builder.stack([schedule, futex, lock, main]), [500_000], attributes={"thread.id": 12})
    sleeper = builder.resource_profiles({"process.pid": 30, "process.executable.name": "sleeper"})
    idle = builder.profile(builder.scope_profiles(sleeper), sample_type=("off_cpu", "nanoseconds"), period_type=("", ""))
    builder.sample(idle, builder.stack([schedule, worker]), [90_000_000_000])
    return builder.data


def test_normal_shows_off_cpu_time_as_its_own_profile_in_time_units(log_output):
    lines = render("normal", cpu_and_off_cpu_profiles()).splitlines()
    assert "resource_profiles=2 profiles=3 samples=5" in log_output.getvalue()
    # Busiest by CPU samples first: sleeper's 90 s off the CPU do not outweigh app's 7 samples.
    assert lines[0] == "ResourceProfiles #0  process.pid=10 process.executable.name=app"
    assert lines[1].startswith("  Profile #0  samples/count  samples=1  total=7  period=10309278 cpu/nanoseconds")
    assert lines[2].split() == ["7", "100.0%", "main", "[app]"]
    # Its own profile, its own type, no period; the total is 1.503 s, not 1503000000.
    assert lines[3] == "  Profile #1  off_cpu/nanoseconds  samples=3  total=1.50s"
    # Where the threads waited: the call that blocked, not the scheduler every stack starts in.
    assert lines[4].split() == ["1.50s", "99.8%", "clock_nanosleep", "[libc.so.6]"]
    assert lines[5].split() == ["3.00ms", "0.2%", "pthread_mutex_lock", "[libc.so.6]"]
    assert lines[6] == "ResourceProfiles #1  process.pid=30 process.executable.name=sleeper"
    assert lines[7] == "  Profile #0  off_cpu/nanoseconds  samples=1  total=1.50min"
    assert lines[8].split() == ["1.50min", "100.0%", "worker_thread"]  # a kernel thread: where it waits, past the scheduler
    assert "__schedule" not in "\n".join(lines[:6])


def test_detailed_shows_off_cpu_samples_with_their_nanoseconds():
    text = render("detailed", cpu_and_off_cpu_profiles())
    off_cpu = text.split("  Profile #1  off_cpu/nanoseconds  samples=3  total=1.50s\n")[1]
    assert off_cpu.splitlines()[0] == "    Sample #0  values=[1500000000]  thread.id=10"
    assert off_cpu.splitlines()[1] == "      Instrumentation: kernel, Function: __schedule"


def test_normal_lists_the_busiest_process_first():
    data = two_process_profile()
    light_first = type(data)(dictionary=data.dictionary, resource_profiles=reversed(data.resource_profiles))
    headers = [line for line in render("normal", light_first).splitlines() if line.startswith("ResourceProfiles")]
    assert headers[0].startswith("ResourceProfiles #1  process.pid=10")
    assert headers[1].startswith("ResourceProfiles #0  process.pid=20")


def test_detailed_prints_every_sample_and_its_stack_leaf_first():
    text = render("detailed", two_process_profile())
    assert "    Sample #0  values=[30]  thread.id=10 thread.name=app" in text
    stack = text.split("Sample #2")[1].splitlines()[1:3]
    assert stack == ["      Instrumentation: kernel, Function: do_syscall_64", "      Instrumentation: native, Function: main, File: app.c, Line: 42"]


def test_sampling_limits_prints_per_second():
    output = io.StringIO()
    exporter = DebugExporter(make_settings(), DebugConfig(verbosity="normal", sampling_initial=2, sampling_thereafter=0), output=output)
    for _ in range(5):
        exporter.consume(two_process_profile())
    assert output.getvalue().count("ResourceProfiles #0") == 2


def test_other_signals_print_their_resources():
    for signal_name in ("traces", "metrics", "logs"):
        assert "service.name=conformance" in render("normal", sample_data(signal_name))
        assert "service.name" in render("detailed", sample_data(signal_name))


# What a sampled process may call itself or its functions: an OSC that retitles the terminal, a
# clear-screen, a C1 control, a right-to-left override that reverses the rest of the line.
HOSTILE = "evil\x1b]0;pwned\x07\x1b[2J\x9b31m\u202eexe"


def hostile_profile():
    builder = ProfilesBuilder()
    mapping = builder.mapping(0x1000, 0x9000, 0, f"/tmp/{HOSTILE}", attributes={})
    leaf = builder.location(mapping, 0x1100, [(builder.function(f"fn_{HOSTILE}", filename=HOSTILE), 7, 0)], {"profile.frame.type": "native"})
    profile = builder.profile(builder.scope_profiles(builder.resource_profiles({"process.pid": 66, "process.executable.name": HOSTILE})), period=10_000_000)
    builder.sample(profile, builder.stack([leaf]), [3], attributes={"thread.id": 66, "thread.name": HOSTILE})
    return builder.data


def test_no_escape_sequence_from_a_name_reaches_the_console(log_output):
    for verbosity in ("normal", "detailed"):
        text = render(verbosity, hostile_profile())
        assert "evil" in text
        assert not any(character in text for character in "\x1b\x07\x9b\u202e"), repr(text)
        assert "evil\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\u202eexe" in text  # shown, as escapes
    assert "\x1b]0;" not in log_output.getvalue()


def test_console_logs_escape_the_values_they_print(log_output):
    from pycollector import logs

    logs.get_logger().warning("a file of a sampled process", path=f"/tmp/{HOSTILE}")
    line = log_output.getvalue()
    assert "\x1b]0;" not in line and "\u202e" not in line and "pwned" in line, repr(line)


def test_detailed_shows_the_trace_and_span_a_sample_ran_in():
    builder = ProfilesBuilder()
    work = builder.location(0, 0x401000, [(builder.function("work"), 0, 0)], {"profile.frame.type": "native"})
    profile = builder.profile(builder.scope_profiles(builder.resource_profiles({"process.pid": 10})))
    builder.sample(profile, builder.stack([work]), [3], attributes={"thread.id": 10}, link_index=builder.link(bytes(range(16)), bytes(range(8))))
    text = render("detailed", builder.data)
    assert f"    Sample #0  values=[3]  trace_id={bytes(range(16)).hex()} span_id={bytes(range(8)).hex()}  thread.id=10" in text


def test_normal_names_a_python_process_functions_in_python():
    """Its native leaf says only the interpreter; the Python list names the functions, by file
    and the line most samples were at, one row whatever line each sample was on."""
    builder = ProfilesBuilder()
    libpython = builder.mapping(0x1000, 0x9000, 0, "/usr/lib/libpython3.11.so", attributes={})
    eval_loop = builder.location(libpython, 0x1100, [(builder.function("_PyEval_EvalFrameDefault"), 0, 0)], {"profile.frame.type": "native"})

    def python(function, line):
        return builder.location(lines=[(builder.function(function, filename="/srv/known_split.py"), line, 0)], attributes={"profile.frame.type": "cpython"})

    main = python("main", 34)
    app = builder.profile(builder.scope_profiles(builder.resource_profiles({"process.pid": 7, "process.executable.name": "python3.11"})), period=10_309_278)
    builder.sample(app, builder.stack([eval_loop, python("spin_heavy", 16), main]), [50])
    builder.sample(app, builder.stack([eval_loop, python("spin_heavy", 17), main]), [25])
    builder.sample(app, builder.stack([eval_loop, python("spin_light", 21), main]), [20])
    builder.sample(app, builder.stack([eval_loop]), [5])
    lines = render("normal", builder.data).splitlines()
    assert lines[2].split()[:3] == ["100", "100.0%", "_PyEval_EvalFrameDefault"]
    python_at = lines.index("    Python functions (the innermost Python frame of each sample):")
    assert lines[python_at + 1].split() == ["75", "75.0%", "spin_heavy", "(known_split.py:16)"]
    assert lines[python_at + 2].split() == ["20", "20.0%", "spin_light", "(known_split.py:21)"]
    assert lines[python_at + 3].split() == ["5", "5.0%", "(no", "Python", "frame)"]


DEBIAN_PYTHON = Path("/usr/bin/python3.11")
KNOWN_SPLIT_SECONDS = 5


@pytest.mark.bpf
@pytest.mark.skipif(not DEBIAN_PYTHON.exists(), reason="Debian's python3.11 is not installed")
def test_the_console_names_a_python_process_hottest_function_in_python(tmp_path):
    """`pycollector` with the debug exporter, as a user runs it, while known_split.py runs under
    Debian's python3.11 (stripped: its native leaves read `(no symbol)`): each report of the
    process lists spin_heavy with its file and line first among Python functions, and over the run
    its share is spin_heavy's (3/4 of the work) within four standard deviations (7 points at least)."""
    config = tmp_path / "debug.yaml"
    config.write_text(
        "receivers: {profiling: {samples_per_second: 97, reporter_interval: 1s}}\n"
        # One batch for the whole run, printed at shutdown: the process's reports together.
        "processors: {batch: {timeout: 120s, send_batch_size: 0}}\n"
        "exporters: {debug: {verbosity: normal}}\n"
        "service: {telemetry: {metrics: {level: none}}, pipelines: {profiles: {receivers: [profiling], processors: [batch], exporters: [debug]}}}\n")
    collector = subprocess.Popen([str(Path(sys.executable).parent / "pycollector"), "--config", str(config)], cwd=REPO,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for line in collector.stderr:
            if "pycollector started" in line:
                break
        workload = subprocess.Popen([str(DEBIAN_PYTHON), str(WORKLOADS / "known_split.py"), str(KNOWN_SPLIT_SECONDS)], stdout=subprocess.DEVNULL)
        assert workload.wait(timeout=60) == 0
        time.sleep(2)  # its last report
    finally:
        collector.send_signal(signal.SIGINT)
    output = collector.communicate(timeout=60)[1]
    python_functions = _python_functions_per_report(output, workload.pid)
    assert len(python_functions) >= 3, output[-3000:]
    total: collections.Counter = collections.Counter()
    for report in python_functions:
        if sum(report.values()) >= 50:  # (a report of the first or last moments has too few samples to judge)
            assert max(report, key=report.get).startswith("spin_heavy (known_split.py:"), report
        for name, value in report.items():
            total[name.split(" (")[0]] += value
    share = total["spin_heavy"] / sum(total.values())
    print(f"spin_heavy {share:.3f} of {sum(total.values())} samples over {len(python_functions)} reports")
    # Debian's 3.11 puts less than 3/4 of this workload's time in spin_heavy: 0.728 and 0.733 in
    # two runs alone here, 0.690 and 0.700 in two whole-suite runs (py-spy sees it near 0.73 too,
    # test_profiling_python): the floor leaves room for that, as the threads' test does.
    assert abs(share - 0.75) <= share_tolerance(sum(total.values()), floor=0.07), total


def _python_functions_per_report(output: str, pid: int) -> list[dict[str, int]]:
    """Each report of process ``pid``: its Python functions' values."""
    reports = []
    for section in re.split(r"(?m)^ResourceProfiles #\d+ ", output)[1:]:
        if f"process.pid={pid} " not in section.splitlines()[0]:
            continue
        listing = section.split("Python functions (the innermost Python frame of each sample):\n", 1)
        if len(listing) < 2:
            continue
        report = {}
        for line in listing[1].splitlines():
            match = re.match(r"\s+(\d+)\s+[\d.]+%\s+(.+)$", line)
            if not match:
                break
            report[match.group(2)] = int(match.group(1))
        reports.append(report)
    return reports


def test_output_paths_write_plain_text_to_each_path_when_not_through_the_collectors_log(tmp_path):
    first, second = tmp_path / "one.txt", tmp_path / "two.txt"
    exporter = DebugExporter(make_settings("exporters", "debug"),
                             DebugConfig.model_validate({"verbosity": "normal", "use_internal_logger": False, "output_paths": f"{first},{second}"}))
    exporter.start(TestHost())
    exporter.consume(two_process_profile())
    exporter.shutdown()
    for path in (first, second):
        text = path.read_text()
        assert text.startswith("Profiles resource_profiles=2 profiles=2 samples=4\n") and "spin_heavy  [app]" in text, text


@pytest.mark.parametrize("config, problem", [
    ({"output_paths": ["stdout"]}, "output_paths is only valid when use_internal_logger is false"),
    ({"use_internal_logger": False, "output_paths": []}, "output_paths must not be empty"),
])
def test_output_paths_are_refused_where_go_refuses_them(config, problem):
    import pydantic

    with pytest.raises(pydantic.ValidationError, match=problem):
        DebugConfig.model_validate(config)


# -- memory profiles -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def heap_report(tmp_path_factory):
    """The receiver's report of a process under the native sampler (tests/heap_profiles.py): 60/30/10
    MiB allocated in alloc_hot/warm/leaky, 9 of the 10 MiB in use held by alloc_leaky, 5 CPU samples."""
    from tests.heap_profiles import heap_sites

    with heap_sites(tmp_path_factory.mktemp("heap_sites")) as workload:
        yield workload.report()


def test_normal_lists_each_memory_profile_top_allocation_sites_in_bytes(heap_report):
    lines = render("normal", heap_report).splitlines()
    assert lines[1].startswith("  Profile #0  samples/count  samples=1  total=5  period=50000000 cpu/nanoseconds")
    # Sites, not the sampler's frames every stack starts in (sample, malloc_sampled, malloc).
    assert lines[3:] == [
        "  Profile #1  alloc_objects/count  stacks=3  total=200 allocations  duration=60.0s",
        "    Top allocation sites (the code that called the allocator):",
        "         120   60.0%  alloc_hot  [heap_sites]",
        "          60   30.0%  alloc_warm  [heap_sites]",
        "          20   10.0%  alloc_leaky  [heap_sites]",
        "  Profile #2  alloc_space/bytes  stacks=3  total=100MiB allocated  duration=60.0s",
        "    Top allocation sites (the code that called the allocator):",
        "     60.0MiB   60.0%  alloc_hot  [heap_sites]",
        "     30.0MiB   30.0%  alloc_warm  [heap_sites]",
        "     10.0MiB   10.0%  alloc_leaky  [heap_sites]",
        # A reading of the live heap at the report: no duration, and what it holds.
        "  Profile #3  inuse_objects/count  stacks=2  total=20 objects in use",
        "    Top allocation sites of the memory in use (the code that called the allocator):",
        "          18   90.0%  alloc_leaky  [heap_sites]",
        "           2   10.0%  alloc_warm  [heap_sites]",
        "  Profile #4  inuse_space/bytes  stacks=2  total=10.0MiB in use",
        "    Top allocation sites of the memory in use (the code that called the allocator):",
        "     9.00MiB   90.0%  alloc_leaky  [heap_sites]",
        "     1.00MiB   10.0%  alloc_warm  [heap_sites]",
    ]


def python_heap_profile():
    """A Python service's memory profiles as the receiver sends them under the native sampler:
    stacks from the sampler through malloc and CPython's allocator to the interpreter, then the
    Python frames. allocate_big and allocate_small allocate 3:1 by bytes; the cache's function
    holds 90% of what is in use. A second process allocates nothing but holds more."""
    builder = ProfilesBuilder()
    heap = builder.mapping(0x7F0000000000, 0x7F0000010000, 0, "/opt/pycollector/libpycollector_heap.so")
    libpython = builder.mapping(0x1000, 0x900000, 0, "/usr/bin/python3.11")

    def native(mapping, address, name):
        return builder.location(mapping, address, [(builder.function(name), 0, 0)], {"profile.frame.type": "native"})

    def python(function, line):
        return builder.location(lines=[(builder.function(function, filename="/srv/app.py"), line, 0)], attributes={"profile.frame.type": "cpython"})

    allocator = [native(heap, 0x7F00000017EC, "sample"), native(heap, 0x7F0000002144, "malloc_sampled"), native(heap, 0x7F00000022B4, "malloc"),
                 native(libpython, 0x1100, "_PyMem_RawMalloc"), native(libpython, 0x1200, "PyObject_Malloc")]
    new_bytes, eval_loop = native(libpython, 0x1300, "PyBytes_FromStringAndSize"), native(libpython, 0x1400, "_PyEval_EvalFrameDefault")
    main = python("main", 40)

    def stack(function, line):
        return builder.stack([*allocator, new_bytes, eval_loop, python(function, line), main])

    scope = builder.scope_profiles(builder.resource_profiles({"process.pid": 7, "process.executable.name": "python3.11"}))
    allocated = builder.profile(scope, sample_type=("alloc_space", "bytes"), period_type=("", ""))
    builder.sample(allocated, stack("allocate_big", 12), [60 << 20])
    builder.sample(allocated, stack("allocate_big", 13), [15 << 20])
    builder.sample(allocated, stack("allocate_small", 20), [25 << 20])
    held = builder.profile(scope, sample_type=("inuse_space", "bytes"), period_type=("", ""))
    builder.sample(held, stack("remember", 30), [9 << 20])
    builder.sample(held, stack("allocate_small", 20), [1 << 20])
    other = builder.scope_profiles(builder.resource_profiles({"process.pid": 8, "process.executable.name": "holder"}))
    builder.sample(builder.profile(other, sample_type=("inuse_space", "bytes"), period_type=("", "")), stack("remember", 30), [64 << 20])
    return builder.data


def test_normal_names_a_python_process_allocation_sites_in_python():
    lines = render("normal", python_heap_profile()).splitlines()
    # The process holding the most in use first, when neither has CPU samples.
    assert [line.split("  ")[1] for line in lines if line.startswith("ResourceProfiles")] == ["process.pid=8 process.executable.name=holder",
                                                                                              "process.pid=7 process.executable.name=python3.11"]
    at = lines.index("  Profile #0  alloc_space/bytes  stacks=3  total=100MiB allocated")
    assert lines[at + 1:at + 7] == [
        "    Top allocation sites (the code that called the allocator):",
        "      100MiB  100.0%  PyBytes_FromStringAndSize  [python3.11]",  # (native: past malloc and CPython's allocator)
        "    Python allocation sites (the innermost Python frame of each allocation):",
        "     75.0MiB   75.0%  allocate_big (app.py:12)",
        "     25.0MiB   25.0%  allocate_small (app.py:20)",
        "  Profile #1  inuse_space/bytes  stacks=2  total=10.0MiB in use",
    ]
    assert lines[at + 7:at + 12] == [
        "    Top allocation sites of the memory in use (the code that called the allocator):",
        "     10.0MiB  100.0%  PyBytes_FromStringAndSize  [python3.11]",
        "    Python allocation sites (the innermost Python frame of each allocation):",
        "     9.00MiB   90.0%  remember (app.py:30)",
        "     1.00MiB   10.0%  allocate_small (app.py:20)",
    ]
