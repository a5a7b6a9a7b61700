"""The sizes and switches the BPF program is compiled with, checked once, in one place.

`SamplerSettings` holds everything that becomes a ``-D`` flag of bpf/profile.bpf.c (map sizes, the
sampling frequency, off-CPU, targeting, probabilistic profiling); `Sampler` takes one and adds only
what it learns from the running kernel (BTF offsets). The receiver builds it from its config.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class UnwindSizes:
    """The unwinder's tables (bpf/unwind.h), sized by the receiver's settings."""

    row_budget: int = 1 << 20  # rows of all files together, 12 bytes each
    max_files: int = 4096
    max_processes: int = 4096
    max_frames: int = 128  # frames walked a stack: at most 30 tail calls of 16

    def cflags(self) -> list[str]:
        return [
            f"-DUNWIND_ROW_BUDGET={self.row_budget}",
            f"-DUNWIND_MAX_FILES={self.max_files}",
            f"-DUNWIND_MAX_PROCESSES={self.max_processes}",
            f"-DUNWIND_MAX_FRAMES={self.max_frames}",
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
    # Probabilistic profiling: samples are taken only while Sampler.set_profiling(True) holds.
    probabilistic: bool = False
    # Where compiled programs are kept, so a restart loads without compiling ("": compile each start).
    program_cache_dir: str = ""

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

    @property
    def period_ns(self) -> int:
        return 1_000_000_000 // self.frequency_hz

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
              if self.off_cpu_threshold else []),
            *(["-DPROBABILISTIC=1"] if self.probabilistic else []),
        ]
