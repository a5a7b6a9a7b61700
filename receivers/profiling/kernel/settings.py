"""The sizes and switches the BPF program is compiled with, checked once, in one place.

`SamplerSettings` holds everything that becomes a ``-D`` flag of bpf/profile.bpf.c (map sizes, the
sampling frequency, off-CPU, targeting, probabilistic profiling); `Sampler` takes one and adds only
what it learns from the running kernel (BTF offsets). The receiver builds it from its config.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The native walk's programs (bpf/unwind.bpf.c's unwind_step) chain at most 30 tail calls a sample,
# of which a Python process's Python frames (python_walk) take up to 3: 27 are the native walk's
# for sure.
NATIVE_WALK_TAIL_CALLS = 27
# Frames each of them steps. The kernel verifies every path of a program at each start, in time
# that grows with its frames (about 65 ms a frame here: 1 s for 16, per copy of the walk), so the
# program steps as few as reach max_frames in NATIVE_WALK_TAIL_CALLS, and at least 8 (fewer tail
# calls a sample for the usual stacks).
MIN_FRAMES_PER_CALL, MAX_FRAMES_PER_CALL = 8, 16


@dataclass(frozen=True)
class UnwindSizes:
    """The unwinder's tables (bpf/unwind.h), sized by the receiver's settings."""

    row_budget: int = 1 << 20  # rows of all files together, 12 bytes each
    max_files: int = 4096
    max_processes: int = 4096
    max_frames: int = 128  # frames walked a stack: at most 30 tail calls of frames_per_call

    @property
    def frames_per_call(self) -> int:
        needed = -(-self.max_frames // NATIVE_WALK_TAIL_CALLS)
        return min(MAX_FRAMES_PER_CALL, max(MIN_FRAMES_PER_CALL, needed))

    def cflags(self) -> list[str]:
        return [
            f"-DUNWIND_ROW_BUDGET={self.row_budget}",
            f"-DUNWIND_MAX_FILES={self.max_files}",
            f"-DUNWIND_MAX_PROCESSES={self.max_processes}",
            f"-DUNWIND_MAX_FRAMES={self.max_frames}",
            f"-DUNWIND_FRAMES_PER_CALL={self.frames_per_call}",
        ]


@dataclass(frozen=True)
class SamplerSettings:
    frequency_hz: int
    stack_storage_size: int
    count_map_size: int
    verifier_log_level: int = 0  # 1 or 2: print the verifier's log (the user asked to see it)
    known_processes_size: int = 8192
    perf_buffer_pages: int = 64
    unwind: UnwindSizes = field(default_factory=UnwindSizes)
    # Targeting (processes/targeting.py): with a size, only the tgids in target_tgids are sampled,
    # and every exec is reported, for user space to decide whether it is a target.
    target_tgids_size: int = 0
    # Off-CPU: the share of switches off a CPU that are recorded (0: none, nothing attached to the
    # scheduler), and how many threads can be away at once with their switch recorded.
    off_cpu_threshold: float = 0.0
    off_cpu_threads: int = 16384
    # Lock and I/O waits (off_cpu.bpf.c, on the same switch program): every switch off a CPU in a
    # futex wait (lock_waits) or in uninterruptible sleep (io_waits) is recorded, whatever the
    # threshold, at most waits_per_second of a process's a second.
    lock_waits: bool = False
    io_waits: bool = False
    waits_per_second: int = 1000
    # With lock_waits, the rows of each wake_counts_N: lock waits by who woke the waiter.
    wake_counts_size: int = 4096
    # Thread stacks (off_cpu.bpf.c, the threads/count profile): how many threads' stacks, where each
    # last left a CPU, can be kept (0: none kept). Their walks draw on waits_per_second too.
    thread_stacks: int = 0
    # Probabilistic profiling: samples are taken only while Sampler.set_profiling(True) holds.
    probabilistic: bool = False
    # Where compiled programs are kept, so a restart loads without compiling ("": compile each start).
    program_cache_dir: str = ""
    # Memory profiling (bpf/memory.bpf.c): sampled allocations through OpenTelemetry's USDT probes,
    # and on top of it the live heap (the allocations not freed yet, at most live_allocs of them,
    # their stacks at most live_stacks).
    memory_profiling: bool = False
    live_heap: bool = False
    memory_probes: int = 4096
    memory_events_per_second: int = 1000  # a process's allocations walked a second (the rest carried)
    live_allocs: int = 65536
    live_stacks: int = 16384

    def __post_init__(self) -> None:
        if not 1 <= self.frequency_hz <= 100_000:
            raise ValueError(f"frequency_hz must be in 1..100000, got {self.frequency_hz}")
        for name in ("stack_storage_size", "count_map_size", "known_processes_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.perf_buffer_pages < 1 or self.perf_buffer_pages & (self.perf_buffer_pages - 1):
            raise ValueError(f"perf_buffer_pages must be a power of two, got {self.perf_buffer_pages}")
        if self.verifier_log_level not in (0, 1, 2):
            raise ValueError(f"verifier_log_level must be 0, 1 or 2, got {self.verifier_log_level}")
        if not 0.0 <= self.off_cpu_threshold <= 1.0:
            raise ValueError(f"off_cpu_threshold must be in 0..1, got {self.off_cpu_threshold}")
        if self.live_heap and not self.memory_profiling:
            raise ValueError("live_heap needs memory_profiling")

    @property
    def period_ns(self) -> int:
        return 1_000_000_000 // self.frequency_hz

    @property
    def records_waits(self) -> bool:
        """Whether the switch program is attached: off-CPU, lock or I/O waits are recorded."""
        return bool(self.off_cpu_threshold) or self.lock_waits or self.io_waits or bool(self.thread_stacks)

    @property
    def off_cpu_threshold_u32(self) -> int:
        """The threshold as the BPF program compares it with bpf_get_prandom_u32()."""
        return min(0xFFFFFFFF, round(self.off_cpu_threshold * 0xFFFFFFFF))

    def cflags(self) -> list[str]:
        """The flags of these settings (the kernel's offsets are the Sampler's to add)."""
        return [
            f"-DSTACK_STORAGE_SIZE={self.stack_storage_size}",
            f"-DCOUNT_MAP_SIZE={self.count_map_size}",
            f"-DKNOWN_PROCESSES_SIZE={self.known_processes_size}",
            *self.unwind.cflags(),
            *(["-DTARGETING=1", f"-DTARGET_TGIDS_SIZE={self.target_tgids_size}"] if self.target_tgids_size else []),
            *(["-DOFF_CPU=1", f"-DOFF_CPU_THRESHOLD={self.off_cpu_threshold_u32}U", f"-DOFF_CPU_THREADS={self.off_cpu_threads}"]
              if self.records_waits else []),
            *(["-DLOCK_WAITS=1", f"-DWAKE_COUNTS_SIZE={self.wake_counts_size}"] if self.lock_waits else []),
            *(["-DIO_WAITS=1"] if self.io_waits else []),
            *([f"-DTHREAD_STACKS={self.thread_stacks}"] if self.thread_stacks else []),
            *([f"-DWAITS_PER_SECOND={self.waits_per_second}"] if self.lock_waits or self.io_waits or self.thread_stacks else []),
            *(["-DPROBABILISTIC=1"] if self.probabilistic else []),
            *(["-DMEMORY_PROFILING=1", f"-DMEMORY_PROBES={self.memory_probes}", f"-DMEMORY_EVENTS_PER_SECOND={self.memory_events_per_second}"]
              if self.memory_profiling else []),
            *(["-DLIVE_HEAP=1", f"-DLIVE_ALLOCS={self.live_allocs}", f"-DLIVE_STACKS={self.live_stacks}"] if self.live_heap else []),
        ]
