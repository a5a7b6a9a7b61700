"""Reading a retired slot of the profiler's maps (see Sampler's docstring for the double
buffering): its count map, the stacks its keys refer to, and the stacks the unwinder walked, into
StackCounts; and leaving the slot's maps empty for its next turn."""

from __future__ import annotations

import contextlib
import errno
from dataclasses import dataclass
from typing import NamedTuple

from receivers.profiling.kernel.samples import NS_PER_CLOCK_TICK, StackCount, Waker, stack_count

STACK_HASHED = -61  # profile.h: the stack id of a stack stored by its hash in user_stacks_N
USER_ADDRESS_END = 1 << 56  # profile.h: no user address is at or above it (x86-64 with 5-level paging)
KERNEL_ADDRESS_START = 0xFFFF800000000000  # x86-64: kernel text is in the top half
VSYSCALL_PAGE = 0xFFFFFFFFFF600000  # (a user page up there: a user stack may start in it)
# A stack id whose bucket held another stack when read: the kernel's stack map race. Two CPUs that
# store different stacks in the same empty bucket at once both get its id, and the second
# replaces the first's stack (kernel/bpf/stackmap.c: each reads the bucket empty, then swaps its
# own in). Seen as a user stack of kernel addresses, or the other way round; counted.
STACK_RACED = -errno.ESTALE


class CountRow(NamedTuple):
    """One count map entry (bpf/profile.h, struct sample_key, and its value)."""

    tgid: int
    pid: int
    comm: bytes
    kernel_stack_id: int
    user_stack_id: int
    user_leaf_return: int
    count: int
    user_stack_hash: int
    origin: int
    kernel_stack_hash: int
    span: bytes  # trace id and span id (24 bytes), or b"" outside any span
    process_start: int  # the process's start_boottime (ns), or 0 unknown
    device: int  # an I/O wait's device (kernel dev_t), or 0

    @classmethod
    def of(cls, key, value) -> CountRow:
        span = bytes(key.trace_id) + bytes(key.span_id)
        return cls(key.tgid, key.pid, key.comm, key.kernel_stack_id, key.user_stack_id, key.user_leaf_return,
                   map_int(value), key.user_stack_hash, key.origin, key.kernel_stack_hash, span if any(span) else b"",
                   key.process_start, key.device)


@dataclass
class SlotContents:
    stacks: list[StackCount]
    missing: int  # stack ids that could not be read back
    freed: int  # stacks deleted from the slot's stack map
    raced: int = 0  # stack ids that held another stack (STACK_RACED)


def map_int(value) -> int:
    """A map value as int (batch lookups give plain ints, item lookups ctypes objects)."""
    return value if isinstance(value, int) else value.value


class SlotReader:
    def __init__(self, log) -> None:
        self.log = log
        self.batch_ok = True  # BPF_MAP_LOOKUP_AND_DELETE_BATCH works (kernel 5.6+)

    def read(self, count_map, stack_map, user_stack_map, wake_map=None) -> SlotContents:
        """Read and empty one retired slot (user_stack_map: the stacks stored by their hash;
        wake_map: lock waits by who woke them, with lock_profiling)."""
        rows: list[tuple[CountRow, object]] = [(row, None) for row in self._drain_counts(count_map)]
        # Lock waits by who woke them: the waiter's row, and the waker's key, whose stacks are in this slot too.
        if wake_map is not None:
            rows += self._drain_counts(wake_map, _wake_row)
        used = {sid for row, _ in rows for sid in (row.kernel_stack_id, row.user_stack_id) if sid >= 0}
        stacks = {sid: _read_stack(stack_map, sid) for sid in used}
        # Every id in this map belongs to the interval just drained (see Sampler's docstring).
        freed = _empty_stack_map(stack_map, used)
        walked = self._drain_user_stacks(user_stack_map)
        missing = raced = 0
        out = []
        for row, waker_key in rows:
            kid, uid = row.kernel_stack_id, row.user_stack_id
            kaddrs = uaddrs = None
            kerr = kid if kid < 0 else 0
            uerr = uid if uid < 0 else 0
            if uid == STACK_HASHED:
                uerr, uaddrs = 0, walked.get(row.user_stack_hash)
                if uaddrs is None:
                    uerr = -errno.ENOENT
                    missing += 1
            if kid == STACK_HASHED:  # an off-CPU sample's kernel stack
                kerr, kaddrs = 0, walked.get(row.kernel_stack_hash)
                if kaddrs is None:
                    kerr = -errno.ENOENT
                    missing += 1
            if kid >= 0:
                kaddrs = stacks[kid]
                if kaddrs is None:
                    kerr = -errno.ENOENT
                    missing += 1
                elif kaddrs and kaddrs[0] < KERNEL_ADDRESS_START:
                    kerr, kaddrs = STACK_RACED, None
                    raced += 1
            if uid >= 0:
                uaddrs = stacks[uid]
                if uaddrs is None:
                    uerr = -errno.ENOENT
                    missing += 1
                elif uaddrs and uaddrs[0] >= USER_ADDRESS_END and not VSYSCALL_PAGE <= uaddrs[0] < VSYSCALL_PAGE + 4096:
                    uerr, uaddrs = STACK_RACED, None
                    raced += 1
                else:
                    uaddrs = _within_user_space(uaddrs)
            out.append(stack_count(row.tgid, row.pid, row.comm, kaddrs, uaddrs, row.user_leaf_return, row.count,
                                   kerr, uerr, row.origin, row.span, row.process_start, row.device))
            if waker_key is not None:
                out[-1].waker, lost = _waker(waker_key, walked)
                missing += lost
        return SlotContents(out, missing, freed, raced)

    def _drain_counts(self, table, row=CountRow.of) -> list:
        """Read and delete every entry of a retired count map, each made a row by ``row(key, value)``."""
        if self.batch_ok:
            try:
                entries = list(table.items_lookup_and_delete_batch())
            except Exception as e:  # kernel without BPF_MAP_LOOKUP_AND_DELETE_BATCH (< 5.6)
                self.batch_ok = False
                self.log.info("batch map operations unavailable, using per-key delete", error=str(e))
            else:
                return [row(key, value) for key, value in entries]
        # Fallback: a late increment between the read and the delete of a key is lost.
        out = []
        for key, value in table.items():
            out.append(row(key, value))
            with contextlib.suppress(KeyError):
                del table[key]
        return out

    def drain_throttled_time(self, table) -> dict[tuple[int, int | None], tuple[int, int]]:
        """A retired throttled_time_N read and emptied: {(tgid, its start in /proc's unit): (lock
        ns, I/O ns)} (bpf/off_cpu.bpf.c)."""
        out: dict[tuple[int, int | None], tuple[int, int]] = {}
        for tgid, started_ns, lock_ns, io_ns in self._drain_counts(table, row=lambda key, value: (key.tgid, key.process_start, value.lock_ns, value.io_ns)):
            process = (tgid, started_ns // NS_PER_CLOCK_TICK if started_ns else None)
            lock_before, io_before = out.get(process, (0, 0))
            out[process] = (lock_before + lock_ns, io_before + io_ns)
        return out

    def _drain_user_stacks(self, table) -> dict[int, list[int]]:
        """Read and delete every stack the unwinder stored in a retired slot: {hash: frames}."""
        if self.batch_ok:
            try:
                entries = list(table.items_lookup_and_delete_batch())
            except Exception:
                entries = None
            if entries is not None:
                return {map_int(key): list(stack.ips[: stack.len]) for key, stack in entries}
        out = {}
        for key, stack in list(table.items()):
            out[map_int(key)] = list(stack.ips[: stack.len])
            with contextlib.suppress(KeyError):
                del table[key]
        return out


def _wake_row(key, value) -> tuple[CountRow, object]:
    """A wake_counts_N entry (struct wake_key): the waiter's row, and the waker's key."""
    return CountRow.of(key.waiter, value), key.waker


def _waker(key, walked: dict[int, list[int]]) -> tuple[Waker, int]:
    """The waker a wake_key names, its stacks from the slot's stored ones (``walked``), and how
    many of those were missing."""
    missing = 0
    resolved = []
    for stack_id, stack_hash in ((key.kernel_stack_id, key.kernel_stack_hash), (key.user_stack_id, key.user_stack_hash)):
        if stack_id != STACK_HASHED:
            resolved.append(([], stack_id if stack_id < 0 else 0))
            continue
        addresses = walked.get(stack_hash)
        if addresses is None:
            missing += 1
            resolved.append(([], -errno.ENOENT))
        else:
            resolved.append((addresses, 0))
    (kaddrs, kerr), (uaddrs, uerr) = resolved
    return Waker(key.tgid, key.pid, key.comm.decode("utf-8", "replace"), kaddrs, uaddrs, kerr, uerr), missing


def _read_stack(table, stack_id: int) -> list[int] | None:
    try:
        trace = table[table.Key(stack_id)]
    except KeyError:
        return None
    ips = list(trace.ip)
    try:
        return ips[: ips.index(0)]
    except ValueError:
        return ips


def _within_user_space(addresses: list[int]) -> list[int]:
    """A stack the kernel walked by frame pointer into its stack map, up to its first "return
    address" beyond user space: the kernel stores what it reads from the process's stack, which
    can be anything (or forged), and one with bit 63 would pass for a runtime's frame
    (RUNTIME_FRAME_TAG in profile.h). The stacks stored by their hash (user_stacks_N, a waker's)
    and those sent by value were cut there in the kernel (within_user_space in profile.bpf.c), as
    the unwinder stops there itself (COUNTER_UNWIND_NOT_USER_ADDRESS): the runtimes' tagged
    frames among them are true."""
    for i, address in enumerate(addresses):
        if address >= USER_ADDRESS_END:
            return addresses[:i]
    return addresses


def _empty_stack_map(table, known: set[int]) -> int:
    """Delete every stack in a retired stack map; return how many were deleted.

    BCC's StackTrace.clear() does nothing and stack maps have no batch delete, so each stack
    costs a syscall.  The ids the drained keys used are deleted directly; the walk after that
    only finds the stacks no key refers to (samples dropped for a full count map), so it
    costs one get_next_key in the usual case instead of one per stack."""
    freed = 0
    for sid in known:
        with contextlib.suppress(KeyError):
            del table[table.Key(sid)]
            freed += 1
    # Listed before deleting, so the walk never continues from a key deleted under it.
    for sid in [key.value for key in table.keys()]:
        with contextlib.suppress(KeyError):
            del table[table.Key(sid)]
            freed += 1
    return freed
