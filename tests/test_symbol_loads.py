"""BackgroundLoads: work on files off the report thread, waited for only so long."""

from __future__ import annotations

import threading
import time

import pytest

from receivers.profiling.symbols.loads import BackgroundLoads


def test_a_quick_job_is_waited_for_and_its_value_returned_once():
    loads = BackgroundLoads("t", wait_s=2.0)
    assert loads.result("a", lambda: 42) == (True, 42)
    calls = []
    assert loads.result("a", lambda: calls.append(1) or 7) == (True, 7)  # done and handed over: a new job
    assert calls == [1]
    loads.close()


def test_a_job_that_never_returns_holds_one_thread_not_the_others():
    """A read that never returns (a file system that stops answering): the caller goes on after
    wait_s; once the job is past stuck_s another thread takes the queue, and later jobs are done."""
    hang = threading.Event()
    loads = BackgroundLoads("t", wait_s=0.05, stuck_s=0.2, parallel=1, max_threads=2)
    try:
        assert loads.result("hung", hang.wait) == (False, None)
        assert loads.result("next", lambda: "named") == (False, None)  # queued behind the hung one
        time.sleep(0.3)
        assert loads.result("hung", hang.wait) == (False, None)  # still hung: its thread is left to it
        assert loads.stats["loads_stuck"] == 1
        deadline = time.monotonic() + 5
        while (outcome := loads.result("next", lambda: "named")) != (True, "named") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert outcome == (True, "named")
    finally:
        hang.set()
        loads.close()


def test_a_long_read_does_not_hold_a_short_one_queued_behind_it():
    """One file that takes seconds to read (a runtime's big binary, a loaded host) and a small one
    asked for after it: the small one is read beside it, not after it."""
    long_read = threading.Event()
    loads = BackgroundLoads("t", wait_s=0.01, stuck_s=60)
    try:
        assert loads.result("big", long_read.wait) == (False, None)
        deadline = time.monotonic() + 5
        while (outcome := loads.result("small", lambda: "named")) != (True, "named") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert outcome == (True, "named") and not long_read.is_set()
        assert loads.stats["loads_stuck"] == 0
    finally:
        long_read.set()
        loads.close()


def test_a_report_waits_no_longer_than_its_allowance_in_all():
    hang = threading.Event()
    loads = BackgroundLoads("t", wait_s=0.2, report_wait_s=0.3, max_threads=4, stuck_s=60)
    try:
        loads.new_report()
        started = time.monotonic()
        for key in range(5):
            loads.result(key, hang.wait)
        assert time.monotonic() - started < 0.6  # 0.3 s in all, not 5 x 0.2
        loads.new_report()
        assert loads.stats["loads_deferred"] == 5
    finally:
        hang.set()
        loads.close()


def test_the_jobs_exception_reaches_the_caller():
    loads = BackgroundLoads("t")

    def fails():
        raise ValueError("damaged")

    with pytest.raises(ValueError, match="damaged"):
        loads.result("bad", fails)
    loads.close()
