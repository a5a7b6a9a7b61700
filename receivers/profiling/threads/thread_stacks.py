"""The threads profile at a report: every live thread of each profiled process, counted once
under its stacks where it last left a CPU (bpf/off_cpu.bpf.c's thread_stacks, ORIGIN_THREADS).

The kernel keeps a thread's stacks from its last switch off a CPU at a new place (a sleeping
thread's stack is where it sleeps; a running one's where it last stopped). User space cannot walk
another thread's stack, nor can BPF: so the thread list comes from /proc/PID/task, and each thread
is looked up in what the kernel kept. A thread the kernel kept nothing of (asleep since before the
agent started; or its first switch came past its process's walks a second, or with thread_stacks
full: both counted in the kernel) is counted all the same, under NOT_KNOWN; one that moved
since its stacks were taken, past its process's walks a second, under OUT_OF_DATE above the stacks
it had. Entries of threads gone (an exec's, or whose last switch was missed) are deleted here, so
the map holds live threads only.

Read on the report thread, as the live heap is: one batch read of the map, and one listing of
/proc/PID/task a process, at most MAX_THREADS_A_PROCESS threads each (the rest counted, not
listed).
"""

from __future__ import annotations

import collections
import contextlib
import os

import structlog

from receivers.profiling.kernel.count_maps import map_int
from receivers.profiling.kernel.samples import ORIGIN_THREADS, StackCount, stack_count

STACK_HASHED = -61  # profile.h: a stack kept by value (here: in the entry itself)
MAX_THREADS_A_PROCESS = 100_000  # /proc/PID/task entries listed a report (a process may make more)
# The frames a thread is counted under when its stacks are not known, or are older than its
# last switch (named so in every output: see the README's threads profile).
NOT_KNOWN = "[stack not known: asleep since before the profiler started, or not walked]"
OUT_OF_DATE = "[stack out of date: moved past wait_events_per_second]"


class ThreadStacks:
    """``read(processes)``: the threads profile's counts for those (tgid, start_ticks, comm)."""

    def __init__(self, table, proc: str = "/proc", logger=None) -> None:
        self.table = table  # the kernel's thread_stacks
        self.proc = proc
        self.log = logger or structlog.get_logger("pycollector.receivers.profiling.threads")
        self.stats = dict.fromkeys(("threads", "threads_not_known", "threads_out_of_date", "entries_pruned", "threads_not_listed"), 0)

    def read(self, processes) -> list[StackCount]:
        """One StackCount of 1 for every thread /proc lists of ``processes`` ((tgid, start ticks
        or None, {tid: thread name} as last seen, the process's name) each): under its kept
        stacks, or a frame saying why none are."""
        kept: dict[int, dict[int, object]] = collections.defaultdict(dict)  # tgid -> tid -> entry
        for key, entry in self._entries():
            kept[entry.key.tgid][map_int(key)] = entry
        out: list[StackCount] = []
        counted: set[int] = set()
        for tgid, started, names, comm in processes:
            tids = self._threads(tgid)
            if tids is None:
                continue
            counted.add(tgid)
            entries = kept.get(tgid, {})
            for tid in tids:
                entry = entries.pop(tid, None)
                out.append(self._count(tgid, tid, started, names.get(tid, comm), entry))
            for tid in entries:  # kept, but not a thread of the process now
                self._delete(tid)
        for tgid, entries in kept.items():
            if tgid not in counted and not os.path.exists(f"{self.proc}/{tgid}"):
                for tid in entries:
                    self._delete(tid)
        self.stats["threads"] += len(out)
        return out

    def _count(self, tgid: int, tid: int, started: int | None, comm: str, entry) -> StackCount:
        if entry is None:
            self.stats["threads_not_known"] += 1
            count = StackCount(tgid=tgid, tid=tid, comm=comm, kernel_addrs=[], user_addrs=[], count=1, origin=ORIGIN_THREADS,
                               start_ticks=started)
            count.note = NOT_KNOWN
            return count
        key = entry.key
        kernel = list(entry.kernel.ips[: min(entry.kernel.len, len(entry.kernel.ips))]) if key.kernel_stack_id == STACK_HASHED else []
        user = list(entry.user.ips[: min(entry.user.len, len(entry.user.ips))]) if key.user_stack_id == STACK_HASHED else []
        count = stack_count(tgid, tid, bytes(key.comm).split(b"\0", 1)[0], kernel, user, key.user_leaf_return, 1,
                            0 if kernel else key.kernel_stack_id, 0 if user else key.user_stack_id, ORIGIN_THREADS, b"", key.process_start)
        if started is not None and count.start_ticks is not None and count.start_ticks != started:
            # (an entry of the pid's earlier process, never deleted: not this one's stack)
            self._delete(tid)
            return self._count(tgid, tid, started, comm, None)
        count.start_ticks = started if started is not None else count.start_ticks
        if entry.stale:
            self.stats["threads_out_of_date"] += 1
            count.note = OUT_OF_DATE
        return count

    def _threads(self, tgid: int) -> list[int] | None:
        """The thread ids /proc lists for tgid now (at most MAX_THREADS_A_PROCESS), or None when it is gone."""
        tids = []
        try:
            with os.scandir(f"{self.proc}/{tgid}/task") as listing:
                for entry in listing:
                    if len(tids) >= MAX_THREADS_A_PROCESS:
                        self.stats["threads_not_listed"] += 1
                        continue
                    with contextlib.suppress(ValueError):
                        tids.append(int(entry.name))
        except OSError:
            return None
        return tids

    def _entries(self) -> list:
        try:
            return list(self.table.items_lookup_batch())
        except Exception:  # noqa: BLE001 - a kernel without batch lookups: one by one
            return list(self.table.items())

    def _delete(self, tid: int) -> None:
        with contextlib.suppress(KeyError):
            del self.table[self.table.Key(tid)]
            self.stats["entries_pruned"] += 1
