"""Settings of the profiling receiver, named and defaulted as the Go ``profiling`` receiver's.

Keys the Go receiver has and we do not act on yet are accepted, so its configs run unchanged, and
each one set away from its default is logged once as not implemented (``not_implemented``).
Older distributions spelled keys in CamelCase (``SamplesPerSecond``, ``Tracers``); those still
work and are logged once as deprecated (``deprecated_keys``).
"""

from __future__ import annotations

import os
from typing import Any, Literal

import pydantic

from pycollector.component import ComponentConfig
from pycollector.config.types import Duration, NonNegativeDuration

from receivers.profiling.processes.targeting import ProcessFilter

DEFAULT_SAMPLES_PER_SECOND = 20
DEFAULT_REPORTER_INTERVAL = 5.0
DEFAULT_REPORTER_JITTER = 0.2
MAX_MAP_SCALE_FACTOR = 8
# Native unwinding. Rows: libc has about 20k, libpython 70k, a large C++ program a million; the
# default holds a busy host's distinct files (12 bytes a row: 24 MiB of kernel memory).
DEFAULT_UNWIND_ROW_BUDGET = 2 << 20
DEFAULT_UNWIND_MAX_FRAMES = 128
DEFAULT_UNWIND_ROW_IDLE_TIMEOUT = 120.0
# The unwinder steps up to 16 frames per BPF program and may chain 30 of them (the kernel allows
# 33 tail calls a sample; kernel/settings.py).
MAX_UNWIND_FRAMES = 16 * 30
DEFAULT_UNWIND_CACHE_DIR = "/var/cache/pycollector/unwind"
DEFAULT_BPF_CACHE_DIR = "/var/cache/pycollector/bpf"
DEFAULT_DEBUGINFOD_CACHE_DIR = "/var/cache/pycollector/debuginfod"

class DebuginfodConfig(ComponentConfig):
    """Where the debug files of stripped files are fetched from, by build id, and what a fetch may
    cost (symbols/debuginfod.py)."""

    # The servers, asked in order; unset: those $DEBUGINFOD_URLS names (space-separated, as
    # elfutils' clients read it); empty: none, nothing is fetched.
    urls: list[str] | None = None
    cache_dir: str = DEFAULT_DEBUGINFOD_CACHE_DIR
    cache_size_mib: int = pydantic.Field(2048, ge=1)
    # One file at most (libLLVM's debug file is about 700 MiB).
    max_file_size_mib: int = pydantic.Field(1024, ge=1)
    # To connect and for each read, and for a whole fetch.
    timeout: Duration = pydantic.Field(10.0, gt=0)
    fetch_timeout: Duration = pydantic.Field(300.0, gt=0)
    # A build id no server has, or whose fetch failed, is not asked for again this long
    # (elfutils' clients wait 600 s too).
    negative_cache_expiry: Duration = pydantic.Field(600.0, gt=0)
    # Fetches the host may start a minute, and each process (as many at once).
    fetches_per_minute: int = pydantic.Field(60, ge=1)
    fetches_per_process_per_minute: int = pydantic.Field(20, ge=1)

    @pydantic.field_validator("urls")
    @classmethod
    def _http_urls(cls, urls: list[str] | None) -> list[str] | None:
        for url in urls or ():
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return urls

    def server_urls(self, environment: dict[str, str] | None = None) -> list[str]:
        """The servers to ask: ``urls``, else $DEBUGINFOD_URLS's (those of http and https)."""
        if self.urls is not None:
            return list(self.urls)
        named = (os.environ if environment is None else environment).get("DEBUGINFOD_URLS", "").split()
        return [url for url in named if url.startswith(("http://", "https://"))]


# CamelCase keys of older profiling distributions -> today's key.
LEGACY_KEYS = {
    "SamplesPerSecond": "samples_per_second",
    "Tracers": "tracers",
    "BpfVerifierLogLevel": "bpf_verifier_log_level",
    "VerboseMode": "verbose_mode",
    "SendErrorFrames": "send_error_frames",
    "OffCPUThreshold": "off_cpu_threshold",
    "ReporterInterval": "reporter_interval",
    "MapScaleFactor": "map_scale_factor",
}


class ProfilingConfig(ComponentConfig):
    samples_per_second: int = pydantic.Field(DEFAULT_SAMPLES_PER_SECOND, ge=1, le=10_000)
    reporter_interval: Duration = pydantic.Field(DEFAULT_REPORTER_INTERVAL, gt=0)
    # Each interval is stretched or shrunk by up to this fraction, so a fleet of agents started
    # together does not report in lockstep.
    reporter_jitter: float = pydantic.Field(DEFAULT_REPORTER_JITTER, ge=0, le=1)
    # Comma-separated names of environment variables copied onto each process's resource.
    include_env_vars: str = ""
    # Map sizes grow by 2**map_scale_factor, for hosts with many distinct stacks per interval.
    map_scale_factor: int = pydantic.Field(0, ge=0, le=MAX_MAP_SCALE_FACTOR)
    bpf_verifier_log_level: int = pydantic.Field(0, ge=0, le=2)
    send_idle_frames: bool = False
    verbose_mode: bool = False
    # `propagate`: a profiler that cannot start stops the collector. `ignore`: log and go on.
    error_mode: Literal["propagate", "ignore"] = "propagate"
    # Native unwinding: stacks of code without frame pointers are walked with the unwind rows of
    # each file's .eh_frame. The rows of all mapped files together (kernel memory: 12 bytes each),
    # the frames walked per stack, and where built rows are kept across restarts ("" : nowhere).
    unwind_row_budget: int = pydantic.Field(DEFAULT_UNWIND_ROW_BUDGET, ge=1024, le=1 << 28)
    unwind_max_frames: int = pydantic.Field(DEFAULT_UNWIND_MAX_FRAMES, ge=16, le=MAX_UNWIND_FRAMES)
    unwind_cache_dir: str = DEFAULT_UNWIND_CACHE_DIR
    # Where the compiled BPF program is kept, so a restart loads it without compiling (""
    # compiles at every start). Only a directory that root alone can write is used.
    bpf_cache_dir: str = DEFAULT_BPF_CACHE_DIR
    # When the budget is short, the rows of files no walk used for this long go to a file whose
    # code is running (the processes mapping them are walked by frame pointer there meanwhile).
    unwind_row_idle_timeout: Duration = pydantic.Field(DEFAULT_UNWIND_ROW_IDLE_TIMEOUT, gt=0)
    # Stripped files' debug files, fetched by build id from debuginfod servers (none by default
    # but those $DEBUGINFOD_URLS names).
    debuginfod: DebuginfodConfig = DebuginfodConfig()

    # Which runtimes' frames are read or named (Go's comma-separated list; "" or "all": every one
    # in TRACERS), and per runtime {enabled: false} to leave one out.
    tracers: str = ""
    interpreters: dict[str, Any] | None = None
    # How often each JVM is asked to write its perf map (Compiler.perfmap, through its attach
    # socket), which names its compiled methods; 0: never (the default: the first request starts
    # the JVM's attach listener with SIGQUIT, and each has it write into its /tmp).
    jvm_perf_map_interval: NonNegativeDuration = 0.0

    # Off-CPU profiling: the probability that a thread's switch off a CPU is recorded, with where
    # it blocked and for how long (0: off). Go's key and meaning; bpf/off_cpu.bpf.c.
    off_cpu_threshold: float = pydantic.Field(0.0, ge=0, le=1)

    # Lock and I/O waits (bpf/off_cpu.bpf.c, issue 44): every switch off a CPU in a futex wait as a
    # lock_wait profile (each sample's lock.kind told from its stack: receivers/profiling/waits/),
    # and every one into uninterruptible sleep as an io_wait profile, at most
    # wait_events_per_second of a process's walked a second (the rest counted and timed: their
    # time spread over its walked waits, kernel/throttled_waits.py). Off: nothing of it runs.
    lock_profiling: bool = False
    io_profiling: bool = False
    wait_events_per_second: int = pydantic.Field(1000, ge=1, le=100_000)
    # Threads and goroutines (issue 44): at each report, how many threads of each process sit in
    # each stack (threads/count: where each last left a CPU, kept by bpf/off_cpu.bpf.c, its walks
    # within wait_events_per_second) and, for Go programs, how many goroutines in each goroutine
    # stack (goroutines/count, read from the Go runtime's memory: receivers/profiling/threads/).
    thread_profiling: bool = False

    # Memory profiling (issue 39), named after the OpenTelemetry eBPF profiler's flags: the
    # allocations a process's sampler reports through OpenTelemetry's USDT probes
    # (otel_memory:alloc) as alloc_space and alloc_objects profiles; with live_heap_profiling on
    # top, those not freed yet (otel_memory:free) as inuse_space and inuse_objects. Off: nothing
    # is attached to any process (bpf/memory.bpf.c, receivers/profiling/memory/).
    allocation_profiling: bool = False
    live_heap_profiling: bool = False
    # A process's sampled allocations walked a second, whatever it allocates (bpf/memory.bpf.c's
    # memory_budgets): the rest are counted and their bytes carried by its next walked one, so a
    # process allocating without pause costs the host a bounded share and its totals stay whole
    # (but for what it owes when it exits: counted, memory/attach.py).
    allocation_events_per_second: int = pydantic.Field(1000, ge=1, le=100_000)

    # Probabilistic profiling (probabilistic.py): every interval the host is profiled with a
    # probability of threshold/100. Go accepts intervals of 1 to 5 minutes; shorter ones work here.
    probabilistic_interval: Duration = pydantic.Field(60.0, ge=1)
    probabilistic_threshold: int = pydantic.Field(100, ge=1, le=100)

    # Accepted for compatibility; see NOT_IMPLEMENTED.
    monitor_interval: Duration = 5.0
    clock_sync_interval: Duration = 180.0
    send_error_frames: bool = False
    probe_links: list[str] = []
    load_probe: bool = False
    go_labels_map_scale_factor: int = 0
    no_kernel_version_check: bool = False
    max_grpc_retries: int = 5
    max_rpc_msg_size: int = 32 << 20
    bpf_fs_root: str = "/sys/fs/bpf/"
    obi_process_ctx: bool = False
    # Only processes this old are profiled (0: all); with process_filter, see targeting.py.
    filter_min_process_age: NonNegativeDuration = 0.0
    process_filter: ProcessFilter = ProcessFilter()
    frame_cache_size: int | None = None
    enable_sw_cpu_clock: bool = True

    @pydantic.model_validator(mode="before")
    @classmethod
    def _accept_legacy_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        renamed, legacy = dict(data), []
        for old, new in LEGACY_KEYS.items():
            if old in renamed:
                renamed.setdefault(new, renamed.pop(old))
                legacy.append(old)
        if legacy:
            renamed["legacy_keys_used"] = legacy
        return renamed

    @pydantic.field_validator("live_heap_profiling")
    @classmethod
    def _live_heap_needs_allocations(cls, value: bool, info: pydantic.ValidationInfo) -> bool:
        # As the Go profiler refuses its live-heap flag alone: the live heap is the sampled
        # allocations not freed yet. (A field's validator, so the error names this key;
        # allocation_profiling is declared before it, so it is validated already.)
        if value and not info.data.get("allocation_profiling", False):
            raise ValueError("needs allocation_profiling: true as well (the live heap is made of the sampled allocations)")
        return value

    # Filled by the validator above, never by users: which CamelCase keys the config used.
    legacy_keys_used: list[str] = pydantic.Field(default_factory=list, exclude=True)

    @pydantic.field_validator("tracers", mode="before")
    @classmethod
    def _tracers_as_text(cls, value: Any) -> Any:
        return ",".join(value) if isinstance(value, list) else value

    def env_var_names(self) -> list[str]:
        return [name.strip() for name in self.include_env_vars.split(",") if name.strip()]

    def _tracer_names(self) -> set[str]:
        return {name.strip().lower() for name in self.tracers.split(",") if name.strip()}

    def targeting(self) -> bool:
        """Whether only some processes are profiled (targeting.py)."""
        return self.process_filter.is_set() or self.filter_min_process_age > 0

    def tracer_enabled(self, name: str) -> bool:
        """Whether the frames of runtime ``name`` (a TRACERS name) are read or named: ``tracers``
        ("all" by default, as Go's; a list without ``name`` leaves it out) and
        ``interpreters: {name: {enabled: false}}`` (or ``name: false``)."""
        names = self._tracer_names()
        if names and not names & {"all", name}:
            return False
        settings = (self.interpreters or {}).get(name)
        if isinstance(settings, bool):
            return settings
        return not isinstance(settings, dict) or settings.get("enabled", True) is not False

    def python_frames(self) -> bool:
        return self.tracer_enabled("python")

    def unsupported_tracers(self) -> list[str]:
        """The runtimes ``tracers`` or ``interpreters`` name that this receiver does not read
        (their frames stay native), in the order given."""
        named = [name.strip().lower() for name in self.tracers.split(",") if name.strip()] + [str(name).lower() for name in self.interpreters or {}]
        return [name for name in dict.fromkeys(named) if name not in TRACERS and name != "all"]

    def not_implemented(self) -> list[str]:
        """Keys set to something other than their default that this receiver does not act on yet
        (runtimes it does not read are in unsupported_tracers)."""
        defaults = type(self)()
        return [key for key in NOT_IMPLEMENTED if getattr(self, key) != getattr(defaults, key)]


# The Go receiver's tracer names this receiver acts on: CPython's frames are read; Go programs are
# named from their .gopclntab; V8's (Node) and HotSpot's (Java) compiled code from perf maps.
TRACERS = ("python", "go", "v8", "hotspot")


# These Go receiver features are not built yet.
NOT_IMPLEMENTED = (
    "send_error_frames",
    "probe_links",
    "load_probe",
    "go_labels_map_scale_factor",
    "obi_process_ctx",
    # The BPF program always leaves out the idle task; sampling always uses the software
    # cpu-clock (this machine class has no PMU); no separate frame cache, BPF filesystem pinning,
    # clock sync or gRPC transport of the Go agent exists here.
    "send_idle_frames",
    "verbose_mode",
    "enable_sw_cpu_clock",
    "monitor_interval",
    "clock_sync_interval",
    "frame_cache_size",
    "bpf_fs_root",
    "max_grpc_retries",
    "max_rpc_msg_size",
    "no_kernel_version_check",
)
