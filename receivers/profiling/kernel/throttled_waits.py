"""The time of lock and I/O waits past their process's ``wait_events_per_second``, put back into
the lock_wait and io_wait profiles.

A process gets at most ``wait_events_per_second`` of its waits walked a second (bpf/off_cpu.bpf.c,
wait_budgets); the others are only timed, summed by process (throttled_time_N). Their stacks are
not known, so their time is spread over the process's walked waits of the same kind in the same
interval, in proportion to each one's time: the profile's shape is the walked waits' (a sample of
the process's waits: the first of each second) and its total is every wait's, as Go's mutex and
block profiles scale their sampled events up. lock_wake (the lock waits by waker) is scaled as
lock_wait is. A process's budget starts over with each report, so a report that has its throttled
waits has its first waits of that report walked; one with throttled time and no walked wait of
that kind (a wait throttled in one report that came back in the next, the process making no
other) has it under one frame that says so.
"""

from __future__ import annotations

import collections

from receivers.profiling.kernel.samples import ORIGIN_IO_WAIT, ORIGIN_LOCK_WAIT, ORIGIN_LOCK_WAKE, StackCount

THROTTLED_NOTE = "[waits past wait_events_per_second]"


def spread_throttled_time(stacks: list[StackCount], throttled: dict[tuple[int, int | None], tuple[int, int]]) -> list[StackCount]:
    """``stacks`` (an interval's, changed in place) with ``throttled``, {(tgid, start_ticks):
    (lock ns, I/O ns)}, added: over each process's walked waits, or in a row of its own."""
    if not throttled:
        return stacks
    rows: dict[tuple[int, int | None, int], list[StackCount]] = collections.defaultdict(list)
    for stack in stacks:
        if stack.origin in (ORIGIN_LOCK_WAIT, ORIGIN_IO_WAIT, ORIGIN_LOCK_WAKE) and (stack.tgid, stack.start_ticks) in throttled:
            rows[(stack.tgid, stack.start_ticks, stack.origin)].append(stack)
    for (tgid, started), (lock_ns, io_ns) in throttled.items():
        for origins, extra in (((ORIGIN_LOCK_WAIT, ORIGIN_LOCK_WAKE), lock_ns), ((ORIGIN_IO_WAIT,), io_ns)):
            if not extra:
                continue
            walked = rows.get((tgid, started, origins[0]))
            if not walked:
                stacks.append(StackCount(tgid=tgid, tid=tgid, comm="", kernel_addrs=[], user_addrs=[], count=extra, origin=origins[0],
                                         start_ticks=started, note=THROTTLED_NOTE))
                continue
            scale = extra / sum(stack.count for stack in walked)
            for origin in origins:
                _add_in_proportion(rows.get((tgid, started, origin), []), scale)
    return stacks


def _add_in_proportion(rows: list[StackCount], scale: float) -> None:
    """Each row's count grown by ``scale`` of itself, the rounding's remainder given to the largest."""
    if not rows:
        return
    extra = round(scale * sum(row.count for row in rows))
    given = 0
    for row in rows:
        share = int(scale * row.count)
        row.count += share
        given += share
    max(rows, key=lambda row: row.count).count += extra - given
