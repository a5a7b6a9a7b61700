"""Native unwinding (issue 12) end to end: real BPF, programs built without frame pointers, and
``perf record --call-graph dwarf`` profiling the same processes in the same test as the reference.

One receiver run profiles every workload (module fixture); each test reads what came out:
a C program and a Rust program built the usual way (-O2, no frame pointers), a Debian-packaged
compressor, a program that dlopen()s a library after its first samples, and processes that each
live 100 ms. "Reaches the entry" means the stack goes down to the C runtime's start
(``__libc_start_main`` or ``_start``): the unwinder found every caller.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from signal import SIGUSR1

import pytest

from pycollector.config.validate import build_plan
from pycollector.pdata import iter_samples
from pycollector.service import Service
from pycollector.testing import CapturingExporterFactory, registry_with
from receivers.profiling.config import DEFAULT_UNWIND_MAX_FRAMES, MAX_UNWIND_FRAMES

from tests.conftest import WORKLOADS, bpf_unavailable_reason, capturing_service, perf_leaves, rows_loaded, share_tolerance

pytestmark = pytest.mark.bpf

HZ = 499  # high enough for a 100 ms process to give tens of samples
SECONDS = 6
SHORT_RUNS = 8
ENTRY = re.compile(r"^(__libc_start_main|__libc_start_call_main|_start)\b")

DLOPEN_MAIN_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static volatile unsigned long sink;
static double cpu_seconds(void) {
    struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline)) static void before_the_library(double seconds) {
    double end = cpu_seconds() + seconds; unsigned long x = 1;
    while (cpu_seconds() < end) for (int i = 0; i < 10000; i++) sink = x = x * 6364136223846793005UL + 1;
}
int main(int argc, char **argv) {
    before_the_library(atof(argv[2]));
    void *library = dlopen(argv[1], RTLD_NOW);
    if (!library) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    void (*spin)(double) = (void (*)(double))dlsym(library, "library_spin");
    spin(atof(argv[3]));
    return 0;
}
"""

LIBRARY_C = r"""
#include <time.h>
static volatile unsigned long sink;
static double cpu_seconds(void) {
    struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline)) static unsigned long library_inner(unsigned long x) {
    for (int i = 0; i < 10000; i++) x = x * 2862933555777941757UL + 3037000493UL;
    return x;
}
__attribute__((noinline)) void library_spin(double seconds) {
    double end = cpu_seconds() + seconds; unsigned long x = 1;
    while (cpu_seconds() < end) sink = x = library_inner(x);
}
"""


SIGNAL_C = r"""
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
static volatile unsigned long sink;
static double cpu_seconds(void) {
    struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline)) static void handler_spin(double seconds) {
    double end = cpu_seconds() + seconds;
    while (cpu_seconds() < end) sink = sink * 6364136223846793005UL + 1;
}
__attribute__((noinline)) static void on_signal(int signal) { (void)signal; handler_spin(0.001); }
__attribute__((noinline)) static void main_spin(double seconds) {
    double end = cpu_seconds() + seconds;
    while (cpu_seconds() < end) sink = sink * 2862933555777941757UL + 3037000493UL;
}
static volatile sig_atomic_t told;
static void on_go(int signal) { (void)signal; told = 1; }
__attribute__((noinline)) static void spin_until_told(void) { while (!told) sink++; }
int main(int argc, char **argv) {
    signal(SIGUSR1, on_go);
    puts("ready");
    fflush(stdout);
    spin_until_told();  /* (on a CPU, so that the profiler hears of it and loads its rows) */
    struct sigaction action = {0};
    action.sa_handler = on_signal;
    sigaction(SIGPROF, &action, 0);
    struct itimerval every = {{0, 3000}, {0, 3000}};  /* each 3 ms of CPU: 1 ms of it in the handler */
    setitimer(ITIMER_PROF, &every, 0);
    main_spin(atof(argv[1]));
    return 0;
}
"""

# A stack deeper than unwind_max_frames: argv[1] calls of descend (not tail calls: it adds after
# the call returns), then spin_at_the_bottom for argv[2] CPU seconds.
DEEP_C = r"""
#include <stdlib.h>
#include <time.h>
static volatile unsigned long sink;
static double cpu_seconds(void) {
    struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline)) static void spin_at_the_bottom(double seconds) {
    double end = cpu_seconds() + seconds;
    while (cpu_seconds() < end) for (int i = 0; i < 100000; i++) sink = sink * 6364136223846793005UL + 1;
}
__attribute__((noinline)) static unsigned long descend(int depth, double seconds) {
    if (depth == 0) { spin_at_the_bottom(seconds); return sink; }
    unsigned long below = descend(depth - 1, seconds);
    sink += below;
    return below + depth;
}
int main(int argc, char **argv) { return (int)(descend(atoi(argv[1]), atof(argv[2])) & 1); }
"""
DEEP_CALLS = 200  # deeper than the default unwind_max_frames (128)


def build(directory: Path) -> dict[str, Path]:
    """The workloads, built as their ecosystems build them by default: no frame pointers."""
    binaries = {"c": directory / "known_split_c", "rust": directory / "known_split_rs", "main": directory / "dlopen_main", "library": directory / "libhot.so",
                "signal": directory / "signal_spin"}
    c_flags = ["gcc", "-O2", "-fomit-frame-pointer", "-g"]
    subprocess.run([*c_flags, "-o", binaries["c"], WORKLOADS / "known_split.c"], check=True)
    (directory / "main.c").write_text(DLOPEN_MAIN_C)
    (directory / "library.c").write_text(LIBRARY_C)
    subprocess.run([*c_flags, "-o", binaries["main"], directory / "main.c", "-ldl"], check=True)
    subprocess.run([*c_flags, "-shared", "-fPIC", "-o", binaries["library"], directory / "library.c"], check=True)
    (directory / "signal.c").write_text(SIGNAL_C)
    subprocess.run([*c_flags, "-o", binaries["signal"], directory / "signal.c"], check=True)
    binaries["deep"] = build_deep(directory)
    rustc = shutil.which("rustc") or os.path.expanduser("~/.cargo/bin/rustc")
    subprocess.run([rustc, "-C", "opt-level=3", "-o", binaries["rust"], WORKLOADS / "known_split.rs"], check=True, cwd=directory)
    return binaries


def build_deep(directory: Path) -> Path:
    (directory / "deep.c").write_text(DEEP_C)
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-fno-optimize-sibling-calls", "-g", "-o", directory / "deep", directory / "deep.c"], check=True)
    return directory / "deep"


def compressor_input(directory: Path) -> Path:
    """Text that compresses, so xz spends its time in its match finder and encoder."""
    path = directory / "input.txt"
    words = Path("/usr/share/dict/words").read_text().split() if Path("/usr/share/dict/words").exists() else [f"word{i}" for i in range(5000)]
    with path.open("w") as out:
        for line in range(120_000):
            out.write(" ".join(words[(line * 7 + k * 13) % len(words)] for k in range(12)) + "\n")
    return path


def perf_record(output: Path, *command: str) -> subprocess.Popen:
    return subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", str(HZ), "--call-graph", "dwarf", "-o", str(output), "--", *command], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def unwound(tmp_path_factory):
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    if shutil.which("perf") is None:
        pytest.fail("perf (Debian's linux-perf) is the reference here: scripts/setup.sh installs it")
    work = tmp_path_factory.mktemp("unwind")
    binaries = build(work)
    text = compressor_input(work)
    capture = CapturingExporterFactory()
    config = {
        "receivers": {"profiling": {"samples_per_second": HZ, "reporter_interval": "1s", "unwind_cache_dir": str(work / "cache")}},
        "exporters": {"capture": {}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["capture"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }
    service = Service(build_plan(config, registry_with(exporters={"capture": capture})))
    service.start()
    # When the unwinder last learned each process's maps (it is told before this watcher).
    maps_known = {}
    receiver = next(node.component for node in service.graph.nodes.values() if node.key.kind == "receivers")
    receiver.processes.watch(changed=lambda info: maps_known.__setitem__(info.pid, time.monotonic()))
    pids, perf_data, rows_waiting, known_after = {}, {}, {}, {}
    try:
        running = {}
        for name, command in {
            "c": [str(binaries["c"]), str(SECONDS)],
            "rust": [str(binaries["rust"]), str(SECONDS)],
        }.items():
            perf_data[name] = work / f"{name}.perf"
            running[name] = perf_record(perf_data[name], *command)
        # One xz for the whole run (about 1.7 s of CPU per copy of the text).
        running["xz"] = subprocess.Popen(["sh", "-c", f'for i in $(seq {SECONDS * 2 // 3}); do cat "$0"; done | xz -9 -T1 -c >/dev/null', str(text)])
        running["dlopen"] = subprocess.Popen([str(binaries["main"]), str(binaries["library"]), "1.0", "4.0"])
        for name, process in running.items():
            process.wait(timeout=60)
            assert process.returncode == 0, f"{name} failed"
        pids = {name: process.pid for name, process in running.items()}
        # The handler runs once the program's rows are in: what is tested is the walk through its
        # signal frame, not how soon a loaded host builds a new program's rows (ci6 of session 28:
        # the first 0.9 s of handler samples stopped right past handler_spin, as a walk of a file
        # whose rows are not in yet does).
        signal = subprocess.Popen([str(binaries["signal"]), "2"], stdout=subprocess.PIPE, text=True)
        assert signal.stdout.readline() == "ready\n"
        rows_waiting["signal"] = rows_loaded(service, signal.pid, (binaries["signal"].name, "libc.so.6"))
        signal.send_signal(SIGUSR1)
        signal.wait(timeout=60)
        pids["signal"] = signal.pid
        deep = subprocess.Popen([str(binaries["deep"]), str(DEEP_CALLS), "1.5"])
        deep.wait(timeout=30)
        pids["deep"] = deep.pid
        pids["short"] = []
        for _ in range(SHORT_RUNS):  # one after the other: each lives 100 ms
            began = time.monotonic()
            short = subprocess.Popen([str(binaries["c"]), "0.1"], stdout=subprocess.DEVNULL)
            short.wait(timeout=10)
            pids["short"].append(short.pid)
            known_after[short.pid] = maps_known.get(short.pid, time.monotonic()) - began
        time.sleep(0.2)
    finally:
        service.shutdown()  # reports the last partial interval
    return {"messages": capture.consumer.messages, "pids": pids, "perf": perf_data, "rows_waiting": rows_waiting, "known_after": known_after}


def stacks_of(unwound, pid_or_pids) -> list[tuple[list[str], int]]:
    """(function names leaf first, samples) of one process's stacks, or of several processes'.
    perf runs the C and Rust workloads as its children: their pid is perf's child, found by
    name among the processes profiled."""
    pids = set(pid_or_pids) if isinstance(pid_or_pids, list) else {pid_or_pids}
    out = []
    for message in unwound["messages"]:
        for view in iter_samples(message):
            if view.resource.get("process.pid") in pids:
                out.append(([frame.function or "" for frame in view.frames if frame.frame_type != "kernel"], sum(view.values)))
    return out


def stacks_by_executable(unwound, name: str, *, steady: bool = False) -> list[tuple[list[str], int]]:
    """With ``steady``, a process's first report (one second) is left out: until user space has
    read a new process's maps and loaded its files' rows (tens of ms, cold), its stacks are
    walked by frame pointer. What a continuous profiler shows is the rest."""
    out = []
    seen_in: dict[int, int] = {}
    for index, message in enumerate(unwound["messages"]):
        for view in iter_samples(message):
            if view.resource.get("process.executable.name") != name:
                continue
            pid = view.resource.get("process.pid")
            if steady and seen_in.setdefault(pid, index) == index:
                continue
            out.append(([frame.function or "" for frame in view.frames if frame.frame_type != "kernel"], sum(view.values)))
    return out


def reaching_by_report(unwound, name: str) -> list[str]:
    """Per report, "reached/samples" of the processes of executable ``name`` (for failure
    messages: a gap at the start, or one in the middle of the run)."""
    out = []
    for message in unwound["messages"]:
        stacks = [([frame.function or "" for frame in view.frames if frame.frame_type != "kernel"], sum(view.values))
                  for view in iter_samples(message) if view.resource.get("process.executable.name") == name]
        total = sum(count for _, count in stacks)
        if total:
            out.append(f"{round(reaching_entry(stacks) * total)}/{total}")
    return out


def not_reaching(stacks, limit: int = 6) -> list:
    """The commonest stacks that stop short of the entry (for failure messages)."""
    short: collections.Counter = collections.Counter()
    for names, count in stacks:
        if not any(ENTRY.match(name) for name in names):
            short[tuple(names[:limit])] += count
    return short.most_common(5)


def reaching_entry(stacks) -> float:
    total = sum(count for _, count in stacks)
    reached = sum(count for names, count in stacks if any(ENTRY.match(name) for name in names))
    return reached / total if total else 0.0


def share_of(stacks, heavy: str, light: str) -> tuple[float, int]:
    weights: collections.Counter = collections.Counter()
    for names, count in stacks:
        leaf = names[0] if names else ""
        for function in (heavy, light):
            if function in leaf:
                weights[function] += count
    total = weights[heavy] + weights[light]
    return (weights[heavy] / total if total else 0.0), total


def perf_share(data: Path, heavy: str, light: str) -> tuple[float, int]:
    """perf's share of ``heavy``, and its samples in either."""
    leaves = perf_leaves(data)
    heavy_count = sum(count for leaf, count in leaves.items() if heavy in leaf)
    light_count = sum(count for leaf, count in leaves.items() if light in leaf)
    return heavy_count / (heavy_count + light_count), heavy_count + light_count


@pytest.mark.parametrize("language,executable", [("c", "known_split_c"), ("rust", "known_split_rs")])
def test_known_split_without_frame_pointers_reaches_the_entry_and_matches_perf(unwound, language, executable):
    stacks = stacks_by_executable(unwound, executable, steady=True)
    reached = reaching_entry(stacks)
    print(f"{executable}: {reaching_entry(stacks_by_executable(unwound, executable)):.1%} reach the entry counting the first second")
    ours, samples = share_of(stacks, "spin_heavy", "spin_light")
    theirs, reference_samples = perf_share(unwound["perf"][language], "spin_heavy", "spin_light")
    print(f"{executable}: {samples} samples, {reached:.1%} reach the entry; spin_heavy {ours:.3f} here, {theirs:.3f} by perf --call-graph dwarf")
    assert reached >= 0.95, (not_reaching(stacks, 8), "reaching the entry by report:", reaching_by_report(unwound, executable))
    both = 1 / (1 / max(samples, 1) + 1 / max(reference_samples, 1))  # (two samplings of the run, each with its noise)
    assert abs(ours - theirs) <= share_tolerance(both), (ours, theirs, samples, reference_samples)
    # The callers are the program's own: spin_heavy under run_once (unless inlined) under main.
    heavy = next(names for names, _ in sorted(stacks, key=lambda s: -s[1]) if names and "spin_heavy" in names[0])
    assert any("main" in name for name in heavy[1:]), heavy
    if language == "rust":  # named as the source has them: demangled, without the ::h<hash> suffix
        assert heavy[0] == "known_split::spin_heavy", heavy


def test_a_debian_binary_without_frame_pointers_reaches_the_entry(unwound):
    stacks = stacks_by_executable(unwound, "xz", steady=True)
    samples = sum(count for _, count in stacks)
    reached = reaching_entry(stacks)
    print(f"xz: {reaching_entry(stacks_by_executable(unwound, 'xz')):.1%} reach the entry counting the first second")
    print(f"xz: {samples} samples, {reached:.1%} reach the entry")
    assert samples >= HZ, "xz should have run for seconds"
    assert reached >= 0.95, (not_reaching(stacks, 8), "reaching the entry by report:", reaching_by_report(unwound, "xz"))


def test_a_library_opened_after_the_first_samples_unwinds(unwound):
    """Until user space has read the process's maps again and loaded the new library's rows
    (tens of ms; ci20, on a loaded host, 0.19 s), its frames are walked by frame pointer, which a
    library built without them cannot do: the report the library first appears in is allowed
    that, the later ones must reach the entry."""
    by_report = []
    for message in unwound["messages"]:
        stacks = stacks_of({"messages": [message]}, unwound["pids"]["dlopen"])
        in_library = [(names, count) for names, count in stacks if names and names[0].startswith("library_")]
        if in_library:
            by_report.append(in_library)
    first, steady = by_report[0], [stack for report in by_report[1:] for stack in report]
    samples = sum(count for report in by_report for _, count in report)
    print(f"dlopen: {samples} samples in the library; {reaching_entry(first):.1%} of its first report's "
          f"{sum(count for _, count in first)} reach the entry, {reaching_entry(steady):.1%} of the rest")
    assert samples >= HZ, "the library ran for 4 CPU seconds"
    assert reaching_entry(steady) >= 0.98, not_reaching(steady)
    short_first = sum(count for names, count in first if not any(ENTRY.match(name) for name in names))
    assert short_first <= HZ * 0.5, not_reaching(first)  # (its rows within half a second of the dlopen)
    assert all("main" in names for report in by_report for names, _ in report if any(ENTRY.match(n) for n in names))


def test_a_signal_handler_is_walked_through_to_the_code_it_interrupted(unwound):
    """glibc's sigreturn trampoline (__restore_rt) is where a handler returns: its CFI finds the
    interrupted registers in the ucontext on the stack (a CFA_SIGNAL row), not at a return
    address. Before, the walk stopped there: no handler sample reached the entry."""
    assert not unwound["rows_waiting"]["signal"], f"rows not loaded in time: {unwound['rows_waiting']['signal']}"
    stacks = [(names, count) for names, count in stacks_of(unwound, unwound["pids"]["signal"]) if "spin_until_told" not in names]
    # (on_signal jumps to handler_spin, which gcc may call handler_spin.constprop.0)
    handler = lambda names: next((at for at, name in enumerate(names) if name.startswith("handler_spin")), None)  # noqa: E731
    in_handler = [(names, count) for names, count in stacks if handler(names) is not None]
    samples, handled = sum(count for _, count in stacks), sum(count for _, count in in_handler)
    through = sum(count for names, count in in_handler if "main_spin" in names[handler(names):])
    print(f"signal: {samples} samples, {handled} in the handler, {through} of them through to main_spin; "
          f"{reaching_entry(in_handler):.1%} of those reach the entry")
    assert handled >= 0.15 * samples, "most of its CPU is the handler's"
    # (before signal frames were walked, none got through)
    assert through >= 0.95 * handled, not_reaching(in_handler)
    assert reaching_entry(in_handler) >= 0.9, not_reaching(in_handler)


def test_processes_of_100_ms_get_full_named_stacks(unwound):
    """Every sample taken once the unwinder knows the process's maps reaches the entry. The ones
    before cannot (no frame pointers, no rows for a process not read yet): user space reads a new
    process's maps when the kernel announces it, a few ms after it starts on an idle host, 10 to
    30 ms on a saturated one (ci1 of session 32: 83% of the samples reached the entry)."""
    stacks = stacks_of(unwound, unwound["pids"]["short"])
    samples = sum(count for _, count in stacks)
    reached = reaching_entry(stacks)
    known_after = unwound["known_after"]
    # A 100 ms process on a CPU of its own: the share of its samples taken before its maps were known.
    before_known = sum(min(1.0, delay / 0.1) for delay in known_after.values()) / len(known_after)
    print(f"{SHORT_RUNS} processes of 100 ms: {samples} samples, {reached:.1%} reach the entry; maps known after "
          f"{', '.join(f'{1000 * delay:.0f}' for delay in known_after.values())} ms ({before_known:.1%} of their time)")
    assert samples >= SHORT_RUNS * HZ * 0.1 * 0.5
    assert max(known_after.values()) < 0.1, "a process of 100 ms ended before its maps were read"
    assert reached >= 0.95 * (1 - before_known), not_reaching(stacks)


def test_a_stack_deeper_than_unwind_max_frames_is_walked_to_that_many_frames(unwound):
    """The walk is chained BPF programs of a few frames each (as few as reach unwind_max_frames:
    kernel/settings.py); a stack deeper than the limit still gets all of its frames up to it."""
    stacks = [(names, count) for names, count in stacks_of(unwound, unwound["pids"]["deep"]) if names and names[0] == "spin_at_the_bottom"]
    samples = sum(count for _, count in stacks)
    depths = collections.Counter(len(names) for names, count in stacks for _ in range(count))
    print(f"deep: {samples} samples at the bottom, by their frames {depths.most_common(4)}")
    assert samples >= HZ * 0.5, "it spun 1.5 CPU seconds"
    whole = sum(count for names, count in stacks if len(names) == DEFAULT_UNWIND_MAX_FRAMES and set(names[1:]) == {"descend"})
    # (its first samples, before user space has read its maps, are walked by frame pointer, which
    # a program built without them cannot do)
    assert whole >= 0.9 * samples, depths.most_common(4)


def test_at_the_most_frames_a_stack_that_deep_reaches_the_entry(tmp_path):
    """unwind_max_frames at its highest (480): the walk's programs step the most frames each, and
    a stack 400 calls deep is walked to the C runtime's entry."""
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    deep_binary = build_deep(tmp_path)
    service, capture = capturing_service(tmp_path, HZ, unwind_max_frames=MAX_UNWIND_FRAMES)
    service.start()
    try:
        time.sleep(0.5)  # (the walk's rows come from the first samples' report; a second's spin outlasts it)
        deep = subprocess.Popen([str(deep_binary), "400", "2"])
        deep.wait(timeout=30)
        time.sleep(0.2)
    finally:
        service.shutdown()
    stacks = [(names, count) for names, count in stacks_of({"messages": capture.consumer.messages}, deep.pid) if names and names[0] == "spin_at_the_bottom"]
    samples = sum(count for _, count in stacks)
    whole = sum(count for names, count in stacks if names.count("descend") == 401 and any(ENTRY.match(name) for name in names))
    print(f"deep at {MAX_UNWIND_FRAMES} frames: {samples} samples at the bottom, {whole} whole; {not_reaching(stacks, 3)}")
    assert samples >= HZ, "it spun 2 CPU seconds"
    assert whole >= 0.9 * samples, collections.Counter(len(names) for names, _ in stacks).most_common(4)
