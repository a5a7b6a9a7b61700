"""The sample types profilers send, as (type, unit) pairs, and what their values mean.

Named as opentelemetry-ebpf-profiler names them (CPU samples counted at a period of CPU time;
off-CPU time, no period, each value nanoseconds) and, for memory, as OpenTelemetry's memory
profiling design and Go's heap profiles name them: sampled allocations by count and by the bytes
their weights stand for, and the live heap's alike.

Values of one type are of two kinds. Most add up over time: two reports' CPU samples or allocated
bytes are the sum of each. The live heap's (``inuse_*``) are a snapshot: what was held when the
report was made, so two reports of a process are two readings of one level, and adding them would
count every block held across both twice. Whoever puts reports together (a window of the last
minutes, a time range to compare) takes a process's latest reading of such a type instead.
"""

from __future__ import annotations

CPU_SAMPLES = ("samples", "count")
CPU_TIME = ("cpu", "nanoseconds")
OFF_CPU_TIME = ("off_cpu", "nanoseconds")
# Waits told apart (off-CPU time of a kind): for a lock (a futex wait, its lock.kind attribute), for I/O
# (uninterruptible sleep).
LOCK_WAIT = ("lock_wait", "nanoseconds")
IO_WAIT = ("io_wait", "nanoseconds")
# The lock waits again, each under its waiter's stack and, joined by a marker frame, the stack of
# the thread that woke it (who held the lock), as BCC's offwaketime folds them: the same time as
# lock_wait's, so the two are never added together.
LOCK_WAKE = ("lock_wake", "nanoseconds")
# The profile.frame.type of a frame that is no code: lock_wake's join between a waiter's frames and
# its waker's, named for what the waker was ("[woken by]", "[woken by an interrupt]"...).
MARKER_FRAME_TYPE = "marker"
# How many threads, and goroutines of Go programs, sit in each stack at the report: a reading, as
# the live heap's.
THREADS = ("threads", "count")
GOROUTINES = ("goroutines", "count")
ALLOC_OBJECTS = ("alloc_objects", "count")
ALLOC_SPACE = ("alloc_space", "bytes")
INUSE_OBJECTS = ("inuse_objects", "count")
INUSE_SPACE = ("inuse_space", "bytes")

# A heap profile's sample types, in the order Go's heap profiles list them (`go tool pprof
# -sample_index` names them; a tool that knows heap profiles looks for these four).
HEAP_TYPES = (ALLOC_OBJECTS, ALLOC_SPACE, INUSE_OBJECTS, INUSE_SPACE)
# The live heap's, the threads' and goroutines': each value is what was held (where they sat) at
# the report (see the module's doc).
SNAPSHOT_TYPES = frozenset((INUSE_OBJECTS, INUSE_SPACE, THREADS, GOROUTINES))
# The order a person is shown the types of one process or file in, the first being what is shown
# when they do not choose: CPU first, then off-CPU time, then memory with the question a heap
# profile answers first (what holds memory now, as `go tool pprof` opens a heap profile on
# inuse_space), then what allocates; bytes before counts. Other types follow, by name.
_DISPLAY_ORDER = (CPU_SAMPLES, OFF_CPU_TIME, LOCK_WAIT, LOCK_WAKE, IO_WAIT, INUSE_SPACE, ALLOC_SPACE, INUSE_OBJECTS, ALLOC_OBJECTS, THREADS,
                  GOROUTINES)


def is_memory(value_type: tuple[str, str]) -> bool:
    """Whether the values are of allocations: each sample's stack ends in the allocator."""
    return value_type in HEAP_TYPES


def is_snapshot(value_type: tuple[str, str]) -> bool:
    """Whether the values are a level at the report's time rather than a count over its duration."""
    return value_type in SNAPSHOT_TYPES


def display_order(value_type: tuple[str, str]) -> tuple[int, tuple[str, str]]:
    """Sort key: ``sorted(types, key=display_order)[0]`` is the type to show by default."""
    try:
        return (_DISPLAY_ORDER.index(value_type), value_type)
    except ValueError:
        return (len(_DISPLAY_ORDER), value_type)
