"""The time of waits past a process's wait_events_per_second, spread over its walked waits
(receivers/profiling/kernel/throttled_waits.py). No BPF: rows as the sampler reads them. The kernel side
is tests/test_lock_io_waits.py's I/O test, run under a budget of 50 waits a second."""

from __future__ import annotations

from receivers.profiling.kernel.samples import ORIGIN_CPU, ORIGIN_IO_WAIT, ORIGIN_LOCK_WAIT, ORIGIN_LOCK_WAKE, StackCount
from receivers.profiling.kernel.throttled_waits import THROTTLED_NOTE, spread_throttled_time


def row(count: int, origin: int, leaf: int, tgid: int = 10, started: int | None = 500) -> StackCount:
    return StackCount(tgid=tgid, tid=tgid + 1, comm="worker", kernel_addrs=[], user_addrs=[leaf], count=count, origin=origin, start_ticks=started)


def counts(stacks, origin: int, tgid: int = 10) -> dict:
    return {(stack.user_addrs[0] if stack.user_addrs else stack.note): stack.count for stack in stacks if stack.origin == origin and stack.tgid == tgid}


def test_throttled_time_is_spread_over_the_walked_waits_in_proportion():
    stacks = [row(300, ORIGIN_LOCK_WAIT, 0xA), row(100, ORIGIN_LOCK_WAIT, 0xB), row(300, ORIGIN_LOCK_WAKE, 0xA), row(100, ORIGIN_LOCK_WAKE, 0xB),
              row(1000, ORIGIN_IO_WAIT, 0xC), row(7, ORIGIN_CPU, 0xA)]
    spread_throttled_time(stacks, {(10, 500): (400, 1001)})
    assert counts(stacks, ORIGIN_LOCK_WAIT) == {0xA: 600, 0xB: 200}
    assert counts(stacks, ORIGIN_LOCK_WAKE) == {0xA: 600, 0xB: 200}, "the waits by waker scaled as the waits are"
    assert counts(stacks, ORIGIN_IO_WAIT) == {0xC: 2001}
    assert counts(stacks, ORIGIN_CPU) == {0xA: 7}, "CPU samples are no waits"


def test_the_total_is_exact_whatever_the_rounding():
    stacks = [row(1, ORIGIN_IO_WAIT, leaf) for leaf in range(7)]
    spread_throttled_time(stacks, {(10, 500): (0, 10)})
    assert sum(stack.count for stack in stacks) == 17
    assert all(stack.count >= 2 for stack in stacks)


def test_a_process_with_no_walked_wait_in_the_interval_has_its_time_under_a_frame_that_says_so():
    stacks = [row(50, ORIGIN_LOCK_WAIT, 0xA)]
    spread_throttled_time(stacks, {(10, 500): (0, 900), (20, 600): (700, 0)})
    assert counts(stacks, ORIGIN_IO_WAIT) == {THROTTLED_NOTE: 900}
    assert counts(stacks, ORIGIN_LOCK_WAIT) == {0xA: 50}
    assert counts(stacks, ORIGIN_LOCK_WAIT, tgid=20) == {THROTTLED_NOTE: 700}
    [alone] = [stack for stack in stacks if stack.tgid == 20]
    assert (alone.start_ticks, alone.kernel_addrs, alone.user_addrs) == (600, [], [])


def test_another_process_under_the_same_pid_keeps_its_own_waits():
    """A pid reused within the interval: the throttled time is the process's whose start it has."""
    stacks = [row(100, ORIGIN_LOCK_WAIT, 0xA, started=500), row(100, ORIGIN_LOCK_WAIT, 0xB, started=900)]
    spread_throttled_time(stacks, {(10, 900): (300, 0)})
    assert counts(stacks, ORIGIN_LOCK_WAIT) == {0xA: 100, 0xB: 400}
