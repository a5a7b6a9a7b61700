"""What the profiler's BPF program counted, as plain data handed to the rest of the receiver."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

# /proc/PID/stat counts a process's start in these (USER_HZ); the kernel's nsec_to_clock_t()
# divides its start_boottime by the nanoseconds of one.
NS_PER_CLOCK_TICK = 1_000_000_000 // os.sysconf("SC_CLK_TCK")

# bpf/profile.h, enum sample_origin: what a count map entry counts.
ORIGIN_CPU = 0  # cpu-clock samples
ORIGIN_OFF_CPU = 1  # returns to a CPU, weighted by the nanoseconds the thread was away
ORIGIN_ALLOC_OBJECTS = 2  # sampled allocations (otel_memory:alloc), one each
ORIGIN_ALLOC_SPACE = 3  # the same, by their weights: the bytes they stand for
ORIGIN_LOCK_WAIT = 4  # returns to a CPU from a futex wait, weighted as ORIGIN_OFF_CPU
ORIGIN_IO_WAIT = 5  # returns to a CPU from uninterruptible sleep, likewise
ORIGIN_LOCK_WAKE = 6  # the lock waits again, each with who woke the waiter (StackCount.waker)
# Not the kernel's: what user space reads of the live heap (memory/live.py) at each report.
ORIGIN_INUSE_OBJECTS = 64
ORIGIN_INUSE_SPACE = 65
# Nor these (receivers/profiling/threads/): every live thread, one each, under its stacks where it
# last left a CPU; every goroutine of a Go program, one each, under its goroutine stack.
ORIGIN_THREADS = 66
ORIGIN_GOROUTINES = 67
MEMORY_ORIGINS = frozenset((ORIGIN_ALLOC_OBJECTS, ORIGIN_ALLOC_SPACE, ORIGIN_INUSE_OBJECTS, ORIGIN_INUSE_SPACE))


@dataclass(slots=True)
class Waker:
    """The thread that woke a lock waiter (bpf/profile.h, struct waker_key), as it woke it."""

    tgid: int  # 0 with tid 0: no waker was seen (see the errors)
    tid: int
    comm: str
    kernel_addrs: list[int]  # leaf first: from the wakeup (try_to_wake_up) out
    user_addrs: list[int]  # leaf first; empty when not walked (see user_stack_error)
    # 0, or a negative errno: -ENOENT no waker seen, -ESTALE its stacks went with a retired slot,
    # -ESRCH (user stack) another process's thread or none: not walked, -EEXIST not stored.
    kernel_stack_error: int = 0
    user_stack_error: int = 0


@dataclass(slots=True)
class StackCount:
    """How many samples one thread spent in one (kernel stack, user stack) pair or, for an
    off-CPU count, how many nanoseconds it spent away from the CPU there."""

    tgid: int
    tid: int
    comm: str
    kernel_addrs: list[int]  # leaf first; empty when the sample was taken in user mode
    user_addrs: list[int]  # leaf first; empty for kernel threads
    count: int  # samples; nanoseconds off the CPU when off_cpu; allocations or bytes (see origin)
    # 0, or the negative errno bpf_get_stackid() returned (-EFAULT: no such stack, -EEXIST:
    # collision in the stack map and the perf buffer was full, so the stack could not be sent by
    # value either), or -ENOENT when the stack id could not be read back.
    kernel_stack_error: int = 0
    user_stack_error: int = 0
    # What it counts (ORIGIN_*): CPU samples; where the thread waited (its stacks when it left the
    # CPU); sampled allocations or the bytes they stand for; the live heap's.
    origin: int = ORIGIN_CPU
    span: bytes = b""  # the trace id and span id it ran in (OpenTelemetry thread context), or b""
    # Which process had the pid: its start as /proc/PID/stat's starttime shows it (clock ticks
    # since boot), or None when the kernel could not say (see sample_key.process_start).
    start_ticks: int | None = None
    # ORIGIN_LOCK_WAKE: who woke the waiter whose stacks these are.
    waker: Waker | None = None
    # A frame to put outermost, saying why the stack is missing or what it is not (a thread whose
    # stack is not known: threads/thread_stacks.py); "" for none.
    note: str = ""
    # When a reading made off the report thread was made (the goroutines'), wall ns; 0: the report's time.
    timestamp_ns: int = 0
    # An I/O wait's device, as the kernel numbers it (dev_t: major << 20 | minor), where its
    # syscall's file told it (bpf/off_cpu.bpf.c io_device); 0 not known, and for other origins.
    device: int = 0

    @property
    def off_cpu(self) -> bool:
        return self.origin == ORIGIN_OFF_CPU

    @property
    def cpu(self) -> bool:
        return self.origin == ORIGIN_CPU


@dataclass(slots=True)
class Interval:
    """Everything counted between two collect() calls (or start() and the first collect())."""

    stacks: list[StackCount]
    start_monotonic_ns: int
    end_monotonic_ns: int
    start_wall_ns: int
    end_wall_ns: int
    frequency_hz: int = 0
    counters: dict[str, int] = field(default_factory=dict)  # cumulative, as of the end

    @property
    def sample_count(self) -> int:
        """CPU samples (off-CPU counts are nanoseconds, memory counts allocations or bytes)."""
        return sum(s.count for s in self.stacks if s.cpu)

    @property
    def period_ns(self) -> int:
        return 1_000_000_000 // self.frequency_hz if self.frequency_hz else 0


def stack_count(tgid: int, pid: int, comm: bytes, kaddrs, uaddrs, leaf_return: int, count: int,
                kerr: int, uerr: int, origin: int = ORIGIN_CPU, span: bytes = b"", process_start_ns: int = 0, device: int = 0) -> StackCount:
    """A StackCount from what the kernel sent, with the caller frame-pointer unwinding skips (see
    sample_key.user_leaf_return in profile.h) put back, and its process's start in /proc's unit."""
    uaddrs = list(uaddrs or ())
    if leaf_return and uaddrs and (len(uaddrs) < 2 or uaddrs[1] != leaf_return):
        uaddrs.insert(1, leaf_return)
    return StackCount(
        tgid=tgid, tid=pid, comm=comm.decode("utf-8", "replace"),
        kernel_addrs=list(kaddrs or ()), user_addrs=uaddrs, count=count,
        kernel_stack_error=kerr, user_stack_error=uerr, origin=origin, span=span,
        start_ticks=process_start_ns // NS_PER_CLOCK_TICK if process_start_ns else None, device=device,
    )
