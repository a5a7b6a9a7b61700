"""CPython's GIL and threading.Lock in the lock_wait profile (issue 44), with real BPF: Debian's
python3 (libpython linked into the executable, its static functions unnamed: take_gil is not
there to find, receivers/profiling/waits/lock_kinds.py tells the GIL from the interpreter's own
unnamed code) run as an ordinary user (nobody). The workload measures its own waits:
tests/testdata/waits/gil_contention.py."""

from __future__ import annotations

import collections
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from pycollector.testing import receiver_of

from tests.conftest import capturing_service, wait_for
from tests.test_lock_io_waits import NOBODY, WAITS, waits_by_site
from tests.test_profiling_python import warm_row_cache

pytestmark = pytest.mark.bpf

PYTHON = "/usr/bin/python3"
SECONDS = 3
SPINNERS = ("spin_alpha", "spin_bravo", "spin_charlie", "spin_delta")
SITES = (*SPINNERS, "wait_for_the_lock", "hold_the_lock")
# Every lock or I/O wait recorded: four threads handing the GIL round every 5 ms (the switch
# interval) wait about 800 times a second, near the default budget of 1000.
UNTHROTTLED = {"wait_events_per_second": 100_000}


@pytest.fixture(scope="module")
def gil_run():
    """gil_contention.py run once as nobody under Debian's python3 with lock_profiling on:
    (its pid, what it printed, the messages exported, the receiver's counters)."""
    if not Path(PYTHON).exists():
        pytest.skip("no /usr/bin/python3")
    work = Path(tempfile.mkdtemp(prefix="pycollector-gil-", dir="/var/tmp"))  # (pytest's are root's alone)
    work.chmod(0o755)
    try:
        yield _run_workload(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_workload(work: Path, python: str = PYTHON, as_nobody: bool = True):
    script = work / "gil_contention.py"
    shutil.copy(WAITS / "gil_contention.py", script)
    script.chmod(0o644)
    # The interpreter's unwind rows built before the run, as a host's cache is after the
    # collector's first start: a wait whose walk stops in python3 has no Python frames.
    warm_row_cache(work / "cache", [python])
    # Only the workload profiled: the unwind rows of the host's other processes (a shared CI host's
    # tests) are not built first, with libc's waiting behind them (its frames then stepped by frame
    # pointer: a GIL wait's stack ends in __futex_abstimed_wait_common).
    # off_cpu_threshold 1.0: every switch off a CPU in the off-CPU profile as well, the threads'
    # preemptions among them (see the GIL test).
    service, capture = capturing_service(work, 49, lock_profiling=True, off_cpu_threshold=1.0, process_filter={"command_line": "gil_contention"},
                                         **UNTHROTTLED)
    service.start()
    process = None
    try:
        receiver = receiver_of(service)
        user = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] if as_nobody else []
        process = subprocess.Popen([*user, python, str(script), str(SECONDS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=work)
        assert process.stdout.readline() == "ready\n"
        assert wait_for(lambda: receiver.python.knows(process.pid)), "the profiler found the interpreter"
        assert wait_for(lambda: not rows_waiting(receiver, process.pid), 60), (rows_waiting(receiver, process.pid), receiver.unwind.stats)
        time.sleep(1)  # (its files' names read)
        process.stdin.write("go\n")
        process.stdin.flush()
        printed = []
        for line in process.stdout:
            if line == "done\n":
                break
            printed.append(line.split())
        time.sleep(2.5)  # two reports more, the process alive to name its Python frames
        process.stdin.close()
        assert process.wait(30) == 0
        counters = receiver._sampler.counters()
    finally:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        service.shutdown()
    figures = {tuple(words[:-1]): int(words[-1]) for words in printed}
    return process.pid, figures, capture.consumer.messages, counters


def rows_waiting(receiver, pid: int) -> list[str]:
    """The files ``pid`` maps whose unwind rows are not in the kernel yet."""
    info = receiver.processes.lookup(pid)
    if info is None:
        return ["(not registered)"]
    return [mapping.path for mapping in info.mappings
            if mapping.file_backed and receiver.unwind.file_state(mapping.identity) in ("queued", "no_room", "evicted")]


def lock_waits_by_site(messages, pid: int) -> collections.Counter:
    """{(the workload's innermost function of SITES the wait was in, lock.kind): nanoseconds}."""
    return waits_by_site(messages, pid, "lock_wait", SITES)


def in_futex_wait(view) -> bool:
    """Whether an off-CPU sample's thread left in a futex wait (its kernel stack says so)."""
    return any(frame.frame_type == "kernel" and "futex" in (frame.function or "") for frame in view.frames)


def off_cpu_by_site(messages, pid: int) -> collections.Counter:
    """{(the workload's innermost function of SITES, whether the thread left in a futex wait): ns}
    of the off-CPU profile (every switch: off_cpu_threshold 1.0). Not in a futex wait, a CPU-bound
    thread left preempted (its kernel stack the scheduler's return-to-user or interrupt path)."""
    return waits_by_site(messages, pid, "off_cpu", SITES, label=in_futex_wait)


def test_gil_waits_by_python_function_within_a_tenth_of_what_each_thread_measured(gil_run):
    """Four CPU-bound threads, each in its own Python function: the lock_wait of kind gil under
    each function is the time that thread measured off its CPU (perf_counter - thread_time)
    within 10%, less the time it was preempted: on a loaded 2-core host the thread holding the GIL
    is preempted (by the host's other work, by the waiters its 5 ms switch interval wakes), which
    its own measure counts and no lock wait is. That time comes from the off-CPU profile (every
    switch recorded), whose whole under each function is first checked against what the thread
    measured, within 10%. The waits there are the GIL's, not a condition variable's."""
    pid, figures, messages, counters = gil_run
    waits, away = lock_waits_by_site(messages, pid), off_cpu_by_site(messages, pid)
    print(f"the workload measured {figures}; lock_wait by (site, lock.kind): {dict(waits)}; off_cpu by (site, in a futex wait): "
          f"{dict(away)}; counters {counters}")
    for function in SPINNERS:
        measured, gil = figures[("gil_wait_ns", function)], waits[(function, "gil")]
        preempted = away[(function, False)]
        print(f"{function}: measured {measured / 1e9:.3f} s off its CPU (run delay {figures[('run_delay_ns', function)] / 1e9:.3f} s); "
              f"off_cpu {(away[(function, True)] + preempted) / 1e9:.3f} s, of it preempted {preempted / 1e9:.3f} s; "
              f"lock_wait gil {gil / 1e9:.3f} s against {(measured - preempted) / 1e9:.3f} s")
        assert measured > 0.5e9, f"{function} waited for the GIL ({measured} ns)"
        assert abs(away[(function, True)] + preempted - measured) <= 0.1 * measured
        assert abs(gil - (measured - preempted)) <= 0.1 * (measured - preempted)
        others = sum(value for (site, kind), value in waits.items() if site == function and kind != "gil")
        assert others <= 0.02 * gil, f"{function}: lock waits there that are not the GIL's: {others} ns"


def test_a_threading_lock_is_told_apart_from_the_gil(gil_run):
    """Three threads take one threading.Lock in turn, each holding it 5 ms asleep: the lock_wait
    under wait_for_the_lock is python_lock, within 10% of the time they measured in acquire();
    none of the GIL waits is python_lock; holding the lock asleep is no Python lock wait."""
    pid, figures, messages, _counters = gil_run
    waits = lock_waits_by_site(messages, pid)
    measured = figures[("lock_wait_ns",)]
    python_lock = waits[("wait_for_the_lock", "python_lock")]
    assert measured > 1e9
    assert abs(python_lock - measured) <= 0.1 * measured, f"python_lock {python_lock} ns, measured {measured} ns"
    assert not any(kind == "python_lock" for (site, kind) in waits if site in SPINNERS)
    assert waits[("hold_the_lock", "python_lock")] == 0
