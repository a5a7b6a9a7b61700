"""The unwind row budget is shared (issue 25): a process that maps and runs many libraries, then
goes idle, does not leave a program started after it walked by frame pointer only.

A generated library with 6000 functions (12k rows, no frame pointers) is copied five times. The
"hog" loads four copies and runs in each for a while, then sleeps; the budget (60k rows) holds
libc, ld.so and only part of that. Then a "victim" runs in the fifth copy: its rows need room
that only the hog's idle copies can give. Its stacks must reach the program's entry, through the
library, as they do when the budget is not short; before, the fifth copy's rows failed for good
("row_budget_exhausted") and every stack stopped inside the library.
"""

from __future__ import annotations

import collections
import shutil
import subprocess
import time

import pytest

from pycollector.config.validate import build_plan
from pycollector.pdata import iter_samples
from pycollector.service import Service
from pycollector.testing import CapturingExporterFactory, receiver_of, registry_with

from receivers.profiling.processes.files import device_name
from receivers.profiling.unwind.registry import UnwindRegistry

from tests.conftest import WORKLOADS, bpf_unavailable_reason, capturing_service, wait_for

pytestmark = pytest.mark.bpf

FUNCTIONS = 6000
LIBRARY_C = "".join(f"__attribute__((noinline)) int f{i}(int x) {{ volatile int a[4]; a[0] = x; return a[0] * {i} + 1; }}\n"
                    for i in range(FUNCTIONS)) + \
    "int spin(long n) { int s = 0; for (long k = 0; k < n; k++) {" + "".join(f"s += f{i}(s);" for i in range(0, FUNCTIONS, 7)) + "} return s; }\n"
RUNNER_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
/* runner BUSY_S SLEEP_S LIBRARY...: runs spin() of each library in turn for BUSY_S, then sleeps. */
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(int argc, char **argv) {
    int (*spins[16])(long);
    int count = 0;
    for (int i = 3; i < argc && count < 16; i++) {
        void *library = dlopen(argv[i], RTLD_NOW);
        if (!library) { fprintf(stderr, "%s\n", dlerror()); return 1; }
        spins[count++] = (int (*)(long))dlsym(library, "spin");
    }
    double end = now() + atof(argv[1]);
    while (now() < end)
        for (int i = 0; i < count; i++)
            spins[i](200);
    sleep(atoi(argv[2]));
    return 0;
}
"""
ENTRY = {"_start", "__libc_start_main", "__libc_start_call_main", "main"}


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    work = tmp_path_factory.mktemp("row-budget")
    (work / "library.c").write_text(LIBRARY_C)
    subprocess.run(["gcc", "-O2", "-fPIC", "-shared", "-fomit-frame-pointer", "-o", str(work / "library-0.so"), str(work / "library.c")], check=True)
    for copy in range(1, 5):  # distinct files, each its own rows
        shutil.copy(work / "library-0.so", work / f"library-{copy}.so")
    (work / "runner.c").write_text(RUNNER_C)
    subprocess.run(["gcc", "-O2", "-fno-omit-frame-pointer", "-o", str(work / "runner"), str(work / "runner.c"), "-ldl"], check=True)
    return work


def test_idle_files_give_their_rows_to_a_program_that_runs(programs, tmp_path):
    config = {
        "receivers": {"profiling": {"samples_per_second": 199, "reporter_interval": "1s", "unwind_row_budget": 60_000,
                                    "unwind_row_idle_timeout": "2s", "unwind_cache_dir": str(tmp_path / "cache")}},
        "exporters": {"capture": {}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["capture"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }
    capture = CapturingExporterFactory()
    service = Service(build_plan(config, registry_with(exporters={"capture": capture})))
    service.start()
    hog = victim = None
    try:
        unwind = receiver_of(service).unwind
        hog = subprocess.Popen([str(programs / "runner"), "4", "120", *(str(programs / f"library-{copy}.so") for copy in range(4))])
        time.sleep(4 + 2 + 1)  # busy, then idle past the timeout (the next sweep sees it: waited for below)
        assert unwind.stats["row_budget_exhausted"] > 0, unwind.stats  # the budget is short indeed
        victim = subprocess.Popen([str(programs / "runner"), "30", "0", str(programs / "library-4.so")])
        # Its rows come once an idle file gave its own up (a sweep, then the load): on a busy
        # host (the suite's other work) that takes longer than alone, so wait for them, then 1 s.
        # (Not for an eviction: the agent profiles the whole host, and another process's files
        # may take the first room made.)
        # And runner, which its stacks go through up to main (where they count as reaching the
        # entry): the idle hog's too, its rows given back while it slept, and loaded again for the
        # victim once its walks want them (ci15: library-4 loaded, 61% of the stacks stopped in it,
        # the walk unable to step into runner). (Not libc or ld.so: no walk needs their rows past
        # main, and they wait for room.)
        library = programs / "library-4.so"
        key = (device_name(library.stat().st_dev), library.stat().st_ino)
        processes = receiver_of(service).processes

        def waiting() -> list:
            info = processes.lookup(victim.pid)
            states = {mapping.path: unwind.file_state(mapping.identity) for mapping in (info.mappings if info else [])
                      if mapping.file_backed and mapping.path.endswith("/runner")}
            return [path for path, state in states.items() if state in ("queued", "no_room", "evicted")] if info else ["(not registered)"]

        began = time.monotonic()
        while (unwind.file_state(key) != "loaded" or waiting()) and time.monotonic() < began + 30:
            time.sleep(0.1)
        assert unwind.file_state(key) == "loaded" and not waiting(), (waiting(), unwind.stats)
        print(f"the victim's rows loaded {time.monotonic() - began:.1f} s after it started")
        # Samples of the intervals that began a second after the load: not those a report built
        # late on a busy host, or carried to a later report, took before (reports' times are the
        # intervals' own).
        after = time.time_ns() + 1_000_000_000
        time.sleep(6)
        roots: collections.Counter = collections.Counter()
        ends: collections.Counter = collections.Counter()  # where the stacks that fall short end
        for message in capture.consumer.messages:
            for view in iter_samples(message):
                if view.resource.get("process.pid") == victim.pid and view.frames and view.profile.time_unix_nano >= after:
                    reached = view.frames[-1].function in ENTRY
                    roots[reached] += sum(view.values)
                    if not reached:
                        last = view.frames[-1]
                        ends[(last.function, last.mapping_filename.rsplit("/", 1)[-1] if last.mapping_filename else "")] += sum(view.values)
        print(f"{roots[True]} of {roots[True] + roots[False]} samples reached the entry")
        assert roots[True] + roots[False] > 100, roots
        assert roots[True] / (roots[True] + roots[False]) > 0.9, (roots, ends.most_common(6), unwind.stats)
        assert unwind.stats["files_evicted"] >= 1, unwind.stats
    finally:
        for process in (hog, victim):
            if process is not None:
                process.kill()
                process.wait()
        service.shutdown()


def test_an_error_choosing_the_next_file_leaves_the_workers_building(tmp_path, monkeypatch):
    """Choosing the next file to build raises (injected: the first three calls), which ended the
    worker thread that met it, for good: both workers meet it as they start, and no file got rows
    again. Now each error is counted (worker_errors) and the worker chooses again: a program
    started after has its rows loaded."""
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    program = tmp_path / "known_split"
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-o", str(program), str(WORKLOADS / "known_split.c")], check=True)
    eligible, raised = UnwindRegistry._eligible, []

    def failing_first(registry, keys):
        if len(raised) < 3:
            raised.append(len(keys))
            raise RuntimeError("injected")
        return eligible(registry, keys)

    monkeypatch.setattr(UnwindRegistry, "_eligible", failing_first)
    service, _ = capturing_service(tmp_path, 99)
    service.start()
    process = None
    try:
        unwind = receiver_of(service).unwind
        process = subprocess.Popen([str(program), "30"], stdout=subprocess.DEVNULL)
        key = (device_name(program.stat().st_dev), program.stat().st_ino)
        assert wait_for(lambda: unwind.file_state(key) == "loaded", 30), unwind.stats
        assert len(raised) == 3 and unwind.stats["worker_errors"] == 3, unwind.stats
    finally:
        if process is not None:
            process.kill()
            process.wait()
        service.shutdown()
