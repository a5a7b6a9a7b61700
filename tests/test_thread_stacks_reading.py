"""The threads profile's reading of the kernel's thread_stacks (receivers/profiling/threads/
thread_stacks.py), without BPF: every thread /proc lists counted once, under its kept stacks or a
frame saying why there are none, and the entries of threads gone deleted."""

from __future__ import annotations

import types

from receivers.profiling.kernel.samples import NS_PER_CLOCK_TICK, ORIGIN_THREADS
from receivers.profiling.threads.thread_stacks import NOT_KNOWN, OUT_OF_DATE, STACK_HASHED, ThreadStacks


class FakeTable(dict):
    """thread_stacks as BCC shows it: Key(tid) -> an entry."""

    class Key(int):
        @property
        def value(self) -> int:
            return int(self)

    def items_lookup_batch(self):
        return list(self.items())


def entry(tgid: int, tid: int, user: list[int], stale: int = 0, started_ticks: int = 500):
    stack = types.SimpleNamespace(ips=user + [0] * 4, len=len(user))
    key = types.SimpleNamespace(tgid=tgid, pid=tid, comm=b"worker\0", process_start=started_ticks * NS_PER_CLOCK_TICK, kernel_stack_id=-14,
                                user_stack_id=STACK_HASHED, user_leaf_return=0)
    return types.SimpleNamespace(key=key, kernel=types.SimpleNamespace(ips=[], len=0), user=stack, stale=stale)


def fake_proc(tmp_path, tasks: dict[int, list[int]]):
    for tgid, tids in tasks.items():
        for tid in tids:
            (tmp_path / str(tgid) / "task" / str(tid)).mkdir(parents=True)
    return str(tmp_path)


def test_every_listed_thread_counts_once_and_entries_of_threads_gone_are_deleted(tmp_path):
    table = FakeTable()
    table[FakeTable.Key(11)] = entry(10, 11, [0x1000, 0x2000])
    table[FakeTable.Key(12)] = entry(10, 12, [0x1000, 0x3000], stale=1)
    table[FakeTable.Key(13)] = entry(10, 13, [0x1000])  # exited: /proc no longer lists it
    table[FakeTable.Key(21)] = entry(20, 21, [0x4000])  # its process is gone
    table[FakeTable.Key(31)] = entry(30, 31, [0x5000], started_ticks=400)  # the pid's earlier process
    reader = ThreadStacks(table, proc=fake_proc(tmp_path, {10: [10, 11, 12], 30: [30, 31]}))
    counts = reader.read([(10, 500, {10: "main"}, "server"), (30, 500, {}, "other")])
    assert all(count.count == 1 and count.origin == ORIGIN_THREADS for count in counts)
    by_tid = {count.tid: (count.user_addrs, count.note) for count in counts}
    assert by_tid == {10: ([], NOT_KNOWN), 11: ([0x1000, 0x2000], ""), 12: ([0x1000, 0x3000], OUT_OF_DATE), 30: ([], NOT_KNOWN), 31: ([], NOT_KNOWN)}
    assert sorted(table) == [11, 12], "the gone thread's, the gone process's and the earlier process's entries are deleted"
    assert {count.tid: count.comm for count in counts}[10] == "main" and {count.tid: count.comm for count in counts}[30] == "other"
    assert reader.stats["entries_pruned"] == 3 and reader.stats["threads_not_known"] == 3 and reader.stats["threads_out_of_date"] == 1
