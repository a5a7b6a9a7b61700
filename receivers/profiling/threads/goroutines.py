"""One reading of a Go program's goroutines: each live goroutine's stack, walked from what its g
holds, counted by stack.

From ``runtime.allgs`` (every g the runtime made; dead ones are kept for reuse): each g's status,
and where its stack was left: sched's pc and sp (a goroutine parked, runnable or preempted), or
syscallpc and syscallsp (one in a system call). A running goroutine's registers are its thread's,
not in its g: it is counted under RUNNING (its stack is in the threads profile, under its thread).
The walk steps as Go's own traceback does on x86-64: the return address of a frame is at its
sp + the frame size the function table's pcsp gives for its pc, the caller's sp just above it; it
ends at runtime.goexit (where every goroutine began) or at the first frame it cannot step. It
reads the goroutine's stack from sp up in one read, at most MAX_STACK_BYTES.

Everything read here is the process's to write. So each reading is bounded: at most
MAX_GOROUTINES goroutines, MAX_FRAMES frames a stack, ``max_bytes`` read and ``deadline`` (a
monotonic time) in all; a goroutine not read within them is counted all the same, under
NOT_READ, so the total is the runtime's. A g that does not look like one (its status out of
range, its stack pointer outside its stack) is counted under DAMAGED; a reading whose first g is
not goroutine 1 is refused as a whole (the layout does not fit this runtime).
"""

from __future__ import annotations

import collections
import struct
import time
from dataclasses import dataclass, field

from ..processes.memory import MAX_READ_BYTES, MemoryReadError
from .go_runtime import GoLayout

MAX_GOROUTINES = 100_000
MAX_FRAMES = 64
MAX_STACK_BYTES = 32 << 10  # of one goroutine's stack, from its sp (a parked goroutine's is 2-8 KiB)
GOEXIT = "runtime.goexit"

# runtime2.go's statuses; _Gscan (0x1000) is set while the garbage collector scans a stack.
G_IDLE, G_RUNNABLE, G_RUNNING, G_SYSCALL, G_WAITING, G_MORIBUND, G_DEAD, G_ENQUEUE, G_COPYSTACK, G_PREEMPTED = range(10)
G_SCAN = 0x1000
_NOT_GOROUTINES = frozenset((G_IDLE, G_MORIBUND, G_DEAD, G_ENQUEUE))  # (runtime.NumGoroutine leaves these out)

# Frames for goroutines whose stack is not read, named so in every output (README).
RUNNING = "[goroutine running: its stack is its thread's]"
NOT_READ = "[goroutines not read: past the reading's bounds]"
DAMAGED = "[goroutine unreadable: its g or stack did not hold together]"

_U64 = struct.Struct("<Q")


class LayoutMismatch(ValueError):
    """The process's goroutines do not fit the layout: its runtime is not the release said."""


@dataclass
class Reading:
    """Goroutines by (stack, leaf first, as addresses; a note frame or "")."""

    counts: collections.Counter = field(default_factory=collections.Counter)
    stats: collections.Counter = field(default_factory=collections.Counter)  # goroutines, not_read, damaged, truncated


def read_goroutines(memory, allgs: int, layout: GoLayout, frame_of, deadline: float, max_bytes: int) -> Reading:
    """The goroutines of the process ``memory`` reads, from the slice at ``allgs`` (its address in
    the process). ``frame_of(address)``: (entry, name, frame size) of the Go function there (the
    process's address), or None."""
    reading = Reading()
    spent = [0]

    def read(address: int, size: int) -> bytes:
        spent[0] += size
        return memory.read(address, size)

    array, length = struct.unpack("<QQ", read(allgs, 16))
    if length == 0:
        return reading
    readable = min(length, MAX_GOROUTINES)
    pointers: list[int] = []
    per_read = MAX_READ_BYTES // 8
    for first in range(0, readable, per_read):
        chunk = read(array + 8 * first, 8 * min(per_read, readable - first))
        pointers.extend(value for (value,) in _U64.iter_unpack(chunk))
    not_read = length - readable
    for index, g in enumerate(pointers):
        if time.monotonic() > deadline or spent[0] > max_bytes:
            not_read += len(pointers) - index
            break
        try:
            record = read(g, layout.size)
        except MemoryReadError:
            reading.counts[((), DAMAGED)] += 1
            reading.stats["damaged"] += 1
            continue
        status = struct.unpack_from("<I", record, layout.status)[0] & ~G_SCAN
        if index == 0:
            goid = struct.unpack_from("<Q", record, layout.goid)[0]
            if goid != 1 or status > G_PREEMPTED:
                raise LayoutMismatch(f"the first g is goroutine {goid}, status {status}: not main's")
        if status in _NOT_GOROUTINES:
            continue
        reading.stats["goroutines"] += 1
        if status == G_RUNNING:
            reading.counts[((), RUNNING)] += 1
            continue
        if status > G_PREEMPTED:
            reading.counts[((), DAMAGED)] += 1
            reading.stats["damaged"] += 1
            continue
        pc_at, sp_at = (layout.syscall_pc, layout.syscall_sp) if status == G_SYSCALL else (layout.sched_pc, layout.sched_sp)
        pc, sp = (struct.unpack_from("<Q", record, at)[0] for at in (pc_at, sp_at))
        lo, hi = (struct.unpack_from("<Q", record, at)[0] for at in (layout.stack_lo, layout.stack_hi))
        stack = _walk(read, pc, sp, lo, hi, frame_of, reading.stats)
        if stack is None:
            reading.counts[((), DAMAGED)] += 1
            reading.stats["damaged"] += 1
            continue
        reading.counts[(stack, "")] += 1
    if not_read:
        reading.counts[((), NOT_READ)] += not_read
        reading.stats["not_read"] += not_read
    return reading


def _walk(read, pc: int, sp: int, lo: int, hi: int, frame_of, stats) -> tuple[int, ...] | None:
    """The stack from (pc, sp), leaf first; None when sp is not inside [lo, hi)."""
    if not (0 < lo <= sp < hi) or hi - lo > 1 << 30:
        return None
    try:
        data = read(sp, min(hi - sp, MAX_STACK_BYTES))
    except MemoryReadError:
        return None
    frames = [pc]
    at = sp
    for _ in range(MAX_FRAMES - 1):
        found = frame_of(pc if len(frames) == 1 else pc - 1)  # (a caller's pc is a return address: name its call)
        if found is None or found[1] == GOEXIT:
            return tuple(frames)
        slot = at + found[2] - sp  # the return address, in data
        if slot < 0 or slot + 8 > len(data):
            stats["truncated"] += 1
            return tuple(frames)
        pc = _U64.unpack_from(data, slot)[0]
        at += found[2] + 8
        if pc == 0:
            return tuple(frames)
        frames.append(pc)
    stats["truncated"] += 1
    return tuple(frames)
