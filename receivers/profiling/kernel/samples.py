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


@dataclass(slots=True)
class StackCount:
    """How many samples one thread spent in one (kernel stack, user stack) pair or, for an
    off-CPU count, how many nanoseconds it spent away from the CPU there."""

    tgid: int
    tid: int
    comm: str
    kernel_addrs: list[int]  # leaf first; empty when the sample was taken in user mode
    user_addrs: list[int]  # leaf first; empty for kernel threads
    count: int  # samples; nanoseconds off the CPU when off_cpu
    # 0, or the negative errno bpf_get_stackid() returned (-EFAULT: no such stack, -EEXIST:
    # collision in the stack map and the perf buffer was full, so the stack could not be sent by
    # value either), or -ENOENT when the stack id could not be read back.
    kernel_stack_error: int = 0
    user_stack_error: int = 0
    off_cpu: bool = False  # where the thread waited (its stacks when it left the CPU)
    span: bytes = b""  # the trace id and span id it ran in (OpenTelemetry thread context), or b""
    # Which process had the pid: its start as /proc/PID/stat's starttime shows it (clock ticks
    # since boot), or None when the kernel could not say (see sample_key.process_start).
    start_ticks: int | None = None


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
        """CPU samples (off-CPU counts are nanoseconds, not samples)."""
        return sum(s.count for s in self.stacks if not s.off_cpu)

    @property
    def period_ns(self) -> int:
        return 1_000_000_000 // self.frequency_hz if self.frequency_hz else 0


def stack_count(tgid: int, pid: int, comm: bytes, kaddrs, uaddrs, leaf_return: int, count: int,
                kerr: int, uerr: int, origin: int = ORIGIN_CPU, span: bytes = b"", process_start_ns: int = 0) -> StackCount:
    """A StackCount from what the kernel sent, with the caller frame-pointer unwinding skips (see
    sample_key.user_leaf_return in profile.h) put back, and its process's start in /proc's unit."""
    uaddrs = list(uaddrs or ())
    if leaf_return and uaddrs and (len(uaddrs) < 2 or uaddrs[1] != leaf_return):
        uaddrs.insert(1, leaf_return)
    return StackCount(
        tgid=tgid, tid=pid, comm=comm.decode("utf-8", "replace"),
        kernel_addrs=list(kaddrs or ()), user_addrs=uaddrs, count=count,
        kernel_stack_error=kerr, user_stack_error=uerr, off_cpu=origin == ORIGIN_OFF_CPU, span=span,
        start_ticks=process_start_ns // NS_PER_CLOCK_TICK if process_start_ns else None,
    )
