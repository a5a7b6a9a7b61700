"""Threads and goroutines profiles (issue 44), with real BPF: at each report every live thread of a
profiled process is counted once under its stacks where it last left a CPU (threads/count:
bpf/off_cpu.bpf.c's thread_stacks, receivers/profiling/threads/thread_stacks.py), and every
goroutine of a Go program once under its goroutine stack, read from the Go runtime's memory
(goroutines/count: receivers/profiling/threads/go_programs.py). The workloads park threads and
goroutines at known places and run as an ordinary user (nobody): tests/testdata/threads/,
tests/testdata/goroutines/."""

from __future__ import annotations

import collections
import subprocess
import threading
import time
from pathlib import Path

import pytest

from pycollector.pdata import iter_samples, sample_type
from pycollector.testing import receiver_of

from receivers.profiling.threads.thread_stacks import NOT_KNOWN
from tests.conftest import NOBODY, build_go_program, capturing_service

pytestmark = pytest.mark.bpf

TESTDATA = Path(__file__).parent / "testdata"
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def wait_for(condition, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)


def reading_after(capture, pid: int, kind: str, after_ns: int, timeout: float = 30.0) -> tuple[list, object]:
    """The samples of ``kind`` for ``pid`` in the first report whose interval began after
    ``after_ns`` (its reading was made at its end), and that report's profile."""
    found: list = []

    def arrived() -> bool:
        for message in list(capture.consumer.messages):
            views = [view for view in iter_samples(message) if view.resource.get("process.pid") == pid
                     and sample_type(message, view.profile)[0] == kind and view.profile.time_unix_nano >= after_ns]
            if views:
                found[:] = views
                return True
        return False

    wait_for(arrived, timeout, f"a {kind} reading of pid {pid}")
    return found, found[0].profile


def by_site(views, sites) -> collections.Counter:
    """Values by the first of ``sites`` among each sample's frames (None: none of them)."""
    out: collections.Counter = collections.Counter()
    for view in views:
        out[next((frame.function for frame in view.frames if frame.function in sites), None)] += sum(view.values)
    return out


def build_c(name: str, workdir: Path) -> Path:
    program = workdir / name
    subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-pthread", "-o", str(program), str(TESTDATA / "threads" / f"{name}.c")],
                   check=True, capture_output=True)
    return program


def park_threads(receiver, workdir: Path) -> subprocess.Popen:
    """parked_threads with 50 + 5 threads, as nobody, told to go once its unwind rows are loaded
    (a thread that parks before keeps the stack walked then: README); returns once all parked."""
    program = build_c("parked_threads", workdir)
    process = subprocess.Popen([*AS_NOBODY, str(program), "50", "5"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=workdir)

    def rows_loaded() -> bool:
        info = receiver.processes.current(process.pid)
        if info is None or not (info.exe_path or "").endswith("parked_threads"):
            return False
        files = [mapping for mapping in info.mappings if mapping.file_backed and ("parked_threads" in mapping.path or "libc.so" in mapping.path)]
        return len(files) >= 2 and all(receiver.unwind.file_state(mapping.identity) == "loaded" for mapping in files)

    try:
        wait_for(rows_loaded, what="the program's and libc's unwind rows")
        process.stdin.write("go\n")
        process.stdin.flush()
        assert process.stdout.readline().split() == ["parked", "55"]
    except BaseException:
        process.kill()
        raise
    return process


def assert_parked_exactly(views) -> None:
    sites = by_site(views, ("park_in_the_pool", "park_at_the_door"))
    threads = collections.Counter(view.attributes["thread.id"] for view in views)
    print(f"threads by site: {dict(sites)}")
    assert sites["park_in_the_pool"] == 50 and sites["park_at_the_door"] == 5, sites
    assert sum(sites.values()) == 56 and set(threads.values()) == {1}, "every thread once: 55 parked and main"
    assert not any(frame.function == NOT_KNOWN for view in views for frame in view.frames)


def test_fifty_five_parked_threads_are_counted_exactly_where_they_park(workdir):
    """50 threads parked in park_in_the_pool and 5 in park_at_the_door (each in a condition wait
    no one signals) are counted 50 and 5 in the threads profile, every thread of the process
    once, none of them unknown."""
    service, capture = capturing_service(workdir, 49, thread_profiling=True)
    service.start()
    process = None
    try:
        receiver = receiver_of(service)
        process = park_threads(receiver, workdir)
        # (a second on: the last thread to park may still be on its way into its wait on a loaded host)
        views, _ = reading_after(capture, process.pid, "threads", time.time_ns() + 1_000_000_000)
    finally:
        if process is not None:
            process.stdin.close()
            process.wait(timeout=30)
        service.shutdown()
    print(f"thread stacks: {receiver.thread_stacks.stats}")
    assert_parked_exactly(views)


def test_a_process_whose_threads_never_rest_costs_its_own_budget_and_not_the_others_counts(workdir):
    """100 threads that never leave a CPU twice at one place ask for a walk at every switch: they
    get their process's wait_events_per_second (1000) and no more, the rest counted
    (thread_stacks_throttled); every one of its threads is still counted once; and the parked
    threads of another process started beside it (its own budget: 55 threads walked a few times
    each as they park) are counted exactly as alone."""
    restless_program = build_c("restless_threads", workdir)
    service, capture = capturing_service(workdir, 49, thread_profiling=True)
    service.start()
    restless = parked = None
    try:
        receiver = receiver_of(service)
        restless = subprocess.Popen([*AS_NOBODY, str(restless_program), "100"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=workdir)
        assert restless.stdout.readline().split() == ["running", "100"]
        before = receiver._sampler.counters()["thread_stacks_throttled"]
        parked = park_threads(receiver, workdir)
        after_ns = time.time_ns() + 1_000_000_000
        views, _ = reading_after(capture, parked.pid, "threads", after_ns)
        hostile, _ = reading_after(capture, restless.pid, "threads", after_ns)
        throttled = receiver._sampler.counters()["thread_stacks_throttled"] - before
    finally:
        for process in (restless, parked):
            if process is not None:
                process.stdin.close()
                process.wait(timeout=60)
        service.shutdown()
    notes = collections.Counter(next((frame.function for frame in view.frames if frame.function and frame.function.startswith("[")), "walked")
                                for view in hostile)
    print(f"the restless process's 101 threads: {dict(notes)}; thread walks throttled meanwhile: {throttled}")
    assert throttled > 0
    assert sum(sum(view.values) for view in hostile) == 101 and len({view.attributes["thread.id"] for view in hostile}) == 101
    assert_parked_exactly(views)


def test_threads_asleep_since_before_the_profiler_started_are_counted_as_not_known(workdir):
    """The same 55 threads parked before the collector starts: they never leave a CPU again, so
    no stack of theirs is known; each is counted all the same, under NOT_KNOWN, and the main
    thread (it wakes every 100 ms, always at one place) under its wait."""
    program = build_c("parked_threads", workdir)
    process = subprocess.Popen([*AS_NOBODY, str(program), "50", "5"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=workdir)
    service = None
    try:
        process.stdin.write("go\n")
        process.stdin.flush()
        assert process.stdout.readline().split() == ["parked", "55"]
        time.sleep(0.5)  # (into their waits)
        service, capture = capturing_service(workdir, 49, thread_profiling=True)
        service.start()
        views, _ = reading_after(capture, process.pid, "threads", time.time_ns() + 1_000_000_000)
    finally:
        process.stdin.close()
        process.wait(timeout=30)
        if service is not None:
            service.shutdown()
    under = collections.Counter()
    for view in views:
        names = [frame.function for frame in view.frames]
        under[NOT_KNOWN if NOT_KNOWN in names else "wait_for_the_end" if "wait_for_the_end" in names else None] += sum(view.values)
    print(f"threads: {dict(under)}")
    assert under == {NOT_KNOWN: 55, "wait_for_the_end": 1}


def read_pprof_profile(stdout) -> tuple[int, collections.Counter] | None:
    """(when, goroutines by the program's own function each stack holds) from a runtime/pprof
    goroutine profile (debug=1) as parked_goroutines.go prints it; None at the output's end."""
    header = stdout.readline().split()
    if not header:
        return None
    assert header[0] == "profile", header
    counts: collections.Counter = collections.Counter()
    count = 0
    for line in iter(stdout.readline, ""):
        line = line.strip()
        if line == "end":
            return int(header[1]), counts
        if " @ " in line:
            count = int(line.split()[0])
        elif line.startswith("#") and ("main.waitInThePool" in line or "main.waitAtTheDoor" in line):
            counts[line.split()[2].split("+")[0]] += count
    raise AssertionError("the profile did not end")


def test_goroutines_are_counted_as_the_program_own_runtime_pprof_counts_them(workdir):
    """A Go program (Debian's go, a default build: symbol table kept) parks 100 goroutines in a
    channel receive in waitInThePool and 10 in waitAtTheDoor, and prints its own runtime/pprof
    goroutine profile four times a second: the goroutines profile counts the same under each as
    the program's profile nearest the reading's time (its samples carry it) says."""
    program = build_go_program(TESTDATA / "goroutines" / "parked_goroutines.go", workdir / "parked_goroutines")
    service, capture = capturing_service(workdir, 49, thread_profiling=True)
    service.start()
    process = None
    profiles: list[tuple[int, collections.Counter]] = []
    try:
        receiver = receiver_of(service)
        process = subprocess.Popen([*AS_NOBODY, str(program), "100", "10"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=workdir)
        wait_for(lambda: receiver.go_programs.knows(process.pid), what="the Go program's registration")
        process.stdin.write("go\n")
        process.stdin.flush()
        profiles.append(read_pprof_profile(process.stdout))
        reader = threading.Thread(target=lambda: profiles.extend(iter(lambda: read_pprof_profile(process.stdout), None)), daemon=True)
        reader.start()  # (until stdin's end: the program's last profile, then EOF ends read_pprof_profile with an error)
        # (two seconds on: the reading a report takes was made within the interval before it)
        views, _ = reading_after(capture, process.pid, "goroutines", profiles[0][0] + 2_000_000_000)
        read_at = views[0].sample.timestamps_unix_nano[0]
        wait_for(lambda: profiles[-1][0] > read_at + 500_000_000, what="the program's profiles after the reading")
    finally:
        if process is not None:
            process.stdin.close()
            process.wait(timeout=30)
        service.shutdown()
    when, theirs = min(profiles, key=lambda profile: abs(profile[0] - read_at))
    ours = by_site(views, ("main.waitInThePool", "main.waitAtTheDoor"))
    print(f"goroutines by site: ours {dict(ours)}, runtime/pprof {dict(theirs)} {(when - read_at) / 1e9:+.3f} s from our reading; "
          f"{receiver.go_programs.stats}")
    assert theirs == {"main.waitInThePool": 100, "main.waitAtTheDoor": 10}
    assert ours["main.waitInThePool"] == theirs["main.waitInThePool"] and ours["main.waitAtTheDoor"] == theirs["main.waitAtTheDoor"]
    assert all(view.sample.timestamps_unix_nano[0] == read_at for view in views), "one reading"
    assert not any("thread.id" in view.attributes for view in views), "a goroutine is no thread's"
