"""Kernel side of the profiling receiver: load bpf/profile.bpf.c, read what it counted.

One `Sampler` owns one BPF program instance:

    sampler = Sampler(SamplerSettings(frequency_hz=97, stack_storage_size=16384, count_map_size=16384),
                      on_new_process=processes.on_new_process)
    sampler.start()                 # compile, load, attach to cpu-clock on every CPU (and,
                                    # with off_cpu_threshold, to the scheduler: off_cpu.bpf.c)
    while running:
        sampler.poll(1000)          # new-process events -> on_new_process(tgid, pid, comm),
                                    # and samples whose stack collided (kept for collect()),
                                    # as soon as there are some (sampler.wake() ends the wait)
        if interval_elapsed:
            interval = sampler.collect()   # counts since the previous collect(), stacks resolved
    sampler.close()

Threading: `poll()` and `collect()` may run on different threads, but neither may run
concurrently with itself.  collect() makes sure the perf buffers were read after its flip (it polls
them itself, or waits for the poll under way on the other thread to end and the next one to
complete), so the collided samples of an interval are in that interval.  `counters()` may be called
from any thread.  Only the compiler child imports `bcc` (program.py), so importing this module does not need BCC.
What collect() returns is in samples.py; count_maps.py reads a retired slot.
"""

from __future__ import annotations

import contextlib
import ctypes as ct
import os
import select
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import structlog

from receivers.profiling.kernel import btf as kernel_btf, program as bpf_program, uprobes
from receivers.profiling.kernel.loader import UPROBE_MULTI
from receivers.profiling.kernel.count_maps import SlotReader
from receivers.profiling.kernel.counters import USER_COUNTERS, read_counter_names
from receivers.profiling.kernel.program import SamplerError
from receivers.profiling.kernel.program_cache import ProgramCache
from receivers.profiling.kernel.samples import Interval, stack_count
from receivers.profiling.kernel.settings import SamplerSettings, UnwindSizes
from receivers.profiling.kernel.throttled_waits import spread_throttled_time

_TGID = struct.Struct("<I")  # the first field of the kernel's thread_ctx_span

# The BPF sources: the repository's bpf/ folder, which receivers/profiling/bpf links to (a relative
# symlink), so a source checkout and an installed wheel (where the build copied the files in as
# package data) find them in the same place, next to this module. BCC needs a real directory: it
# compiles the text and clang reads profile.h through -I.
BPF_DIR = Path(__file__).resolve().parent.parent / "bpf"
BPF_SOURCE = BPF_DIR / "profile.bpf.c"

PROGRAM_NAME = b"on_cpu_sample"
UNWIND_STEP_NAME = b"unwind_step"  # tail-called from PROGRAM_NAME (bpf/unwind.bpf.c)
PYTHON_WALK_NAME = b"python_walk"  # tail-called before it for a Python process (bpf/python.bpf.c)
# Off-CPU (bpf/off_cpu.bpf.c): the program on the scheduler's sched_switch tracepoint, and its
# copies of the two programs above, in the same order (a program tail-calls only its own type).
OFF_CPU_PROGRAM_NAME = b"off_cpu_switch"
OFF_CPU_WALK_NAMES = (b"unwind_step_off_cpu", b"python_walk_off_cpu")
# With lock waits, the program on sched_waking that records who woke a lock waiter (it walks
# through the same copies).
OFF_CPU_WAKING_NAME = b"off_cpu_waking"
# Memory profiling (bpf/memory.bpf.c): the programs user space attaches to each process's
# otel_memory:alloc and :free probes (uprobes), and their copies of the walk's programs.
MEMORY_ALLOC_NAME = b"memory_alloc"
MEMORY_FREE_NAME = b"memory_free"
MEMORY_WALK_NAMES = (b"unwind_step_memory", b"python_walk_memory")

# How long collect() waits after flipping the active slot before draining the old one.  The BPF
# programs (the cpu-clock one in its hrtimer interrupt, the off-CPU one in the scheduler, their
# stack walks included) finish in microseconds; a program that
# read the old slot just before the flip is done long before this.  One that were not could count
# a key after the drain whose stack collect() then deletes: that key would come out two intervals
# later with its stack missing, or with whatever other stack took the bucket meanwhile.
FLIP_GRACE_S = 0.002

# How long collect() waits for the other thread's poll of the perf buffers to end.
POLL_WAIT_S = 1.0

# A new-process event handled this long after the sample that raised it is counted as late: a
# process that lives shorter than that may be gone before /proc/<pid> is read (the reader thread
# was starved of CPU, or of the GIL).
LATE_ANNOUNCEMENT_NS = 50_000_000

_NEW_PROCESS_CALLBACK = Callable[[int, int, str], None]


# --------------------------------------------------------------------------------------------
# Plain data handed to the rest of the receiver.


@dataclass(frozen=True)
class UnwindMaps:
    """The maps user space fills for the unwinder (receivers/profiling/unwind/; maps.py)."""

    rows: object  # unwind_rows: struct unwind_row per index
    files: object  # unwind_files: file id -> (first row, row count)
    processes: object  # unwind_processes: tgid -> its executable mappings
    demand: object  # unwind_demand: file id -> frames that waited for its rows
    used: object  # unwind_used: file id -> 1 when a walk used its rows since user space reset it
    python: object  # python_processes: tgid -> where its CPython keeps threads and frames
    v8: object  # v8_processes: tgid -> where V8 keeps a JavaScript frame's function
    hotspot: object  # hotspot_processes: tgid -> a JVM's code cache and how its CodeBlobs are laid out


@dataclass(frozen=True)
class MemoryMaps:
    """What user space needs to attach the memory programs and read the live heap (memory.bpf.c)."""

    alloc_program: int  # the descriptor of memory_alloc, for otel_memory:alloc's uprobes
    free_program: int | None  # memory_free's, with the live heap (else free is not attached)
    probes: object  # memory_probes: (tgid, probe address) -> where its arguments are
    live_allocs: object | None  # (tgid, ptr) -> a sampled allocation not freed yet
    live_stacks: object | None  # stack hash -> the stack of live allocations
    live_counts: object | None  # tgid -> its entries in live_allocs (each process's share)
    budgets: object  # memory_budgets: tgid -> its allocations walked this second, and what it owes
    multi: bool  # the programs are attached by uprobe_multi links (else by the uprobe PMU: kernel/uprobes.py)


class Sampler:
    """Loads the profiler into the kernel and reads its double-buffered counts.

    Stack-id lifetime.  Each slot has a count map and a stack map of its own (counts_N and
    stack_traces_N), and the BPF program stores a sample's stacks in the stack map of the slot it
    counts the sample in, so every id in stack_traces_N belongs to the interval counts_N holds.
    collect() flips the slot, waits FLIP_GRACE_S, drains the old count map, reads the stacks it
    refers to, then empties the old stack map entirely.  Nothing writes to that slot until the
    next flip, so no stack can be deleted from under a key, nor a bucket reused by another stack
    while a key still points at it.  Emptying it also frees the stacks of samples dropped for a
    full count map, which no key refers to; left there, they would make every other stack
    hashing to their bucket fail with -EEXIST.  (A stack id is the hash bucket of the stack's
    contents; with one stack map shared by both slots, deleting A's ids raced with B counting
    keys that used them, and a later stack in the same bucket gave those keys wrong frames.)
    """

    def __init__(
        self,
        settings: SamplerSettings,
        *,
        on_new_process: _NEW_PROCESS_CALLBACK | None = None,
        on_unwind_request: Callable[[int, int], None] | None = None,
        on_exec: Callable[[int], None] | None = None,
        source: Path | str = BPF_SOURCE,
        logger=None,
    ) -> None:
        self.settings = settings
        self.on_new_process = on_new_process
        # A sampled pc in no mapping the unwinder knew: on_unwind_request(tgid, pc).
        self.on_unwind_request = on_unwind_request
        # With targeting (settings.target_tgids_size), every exec: on_exec(tgid).
        self.on_exec = on_exec
        self.target_tgids = None
        self._profiling_on = None
        self._off_cpu_waits = None
        self._throttled_maps: list = []  # throttled_time_N: the time of waits past their process's budget (lock or I/O waits)
        self.thread_stacks = None  # thread_stacks (settings.thread_stacks): tid -> its stacks where it last left a CPU
        self.source = Path(source)
        self.log = logger or structlog.get_logger("pycollector.receivers.profiling.sampler")
        self.counter_names = read_counter_names(self.source.parent / "profile.h")
        self.compile_log = ""  # whatever clang / the verifier printed during start()
        # Where task_struct keeps a thread's TLS base, which CPython's thread states are matched
        # on; None when the kernel's BTF does not say (then no Python frames: python_frames_error).
        self.task_fsbase_offset: int | None = None
        self.python_frames_error = ""
        try:
            self.task_fsbase_offset = kernel_btf.task_fsbase_offset()
        except kernel_btf.BtfError as error:
            self.python_frames_error = str(error)
        # Where task_struct keeps its leader and start time, which date each sample's process (its
        # pid may be another process's by the time user space reads it); None: samples are
        # attributed by pid alone.
        self.task_start_offsets: tuple[int, int] | None = None
        try:
            self.task_start_offsets = kernel_btf.task_start_offsets()
        except kernel_btf.BtfError as error:
            self.log.warning("samples are attributed to processes by pid alone: the kernel's BTF does not say where a process's start time is kept",
                             reason=str(error))

        # Where the kernel keeps what an I/O wait's device is read through (off_cpu.bpf.c
        # io_device); None: I/O waits carry no device.
        self.file_device_offsets: dict[str, int] | None = None
        if settings.io_waits:
            try:
                self.file_device_offsets = kernel_btf.file_device_offsets()
            except kernel_btf.BtfError as error:
                self.log.warning("I/O waits carry no device: the kernel's BTF does not say where a file's device is kept", reason=str(error))

        self.program_cache = ProgramCache(settings.program_cache_dir, self.log)
        self._bpf = None
        self._closed = False
        self._slot = 0
        self._count_maps: list = []
        self._stack_maps: list = []  # stack_traces_N, indexed like _count_maps
        self._user_stack_maps: list = []  # user_stacks_N: stacks the unwinder walked
        self._wake_maps: list = []  # wake_counts_N: lock waits by who woke them (with lock_waits)
        self.unwind_maps: UnwindMaps | None = None
        self.memory_maps: MemoryMaps | None = None
        self._memory_multi = False  # (start() finds whether the kernel has uprobe_multi links)
        self._counters_map = None
        self._known = None
        self._user = dict.fromkeys(USER_COUNTERS, 0)
        self._user_lock = threading.Lock()
        self._slots = SlotReader(self.log)
        self._interval_start = (0, 0)
        self._final_counters: dict[str, int] = {}  # BPF counters as of close()
        # Samples whose stack collided in the stack map, sent by value: {(tgid, tid, comm,
        # kernel addrs, user addrs, user_leaf_return, kernel error, user error, origin, span,
        # process start): count}
        self._overflow: dict[tuple, int] = {}
        self._overflow_lock = threading.Lock()
        # Who is reading the perf buffers, and how many reads started / ended (see collect()).
        self._poll_cond = threading.Condition()
        self._poll_busy = False
        self._polls_started = 0
        self._polls_finished = 0
        # What wait_for_events waits on: the perf buffers' readers and a wake-up of its own (stop).
        self._event_sources: select.poll | None = None
        self._wake_fd: int | None = None

    # ---------------------------------------------------------------------------------------

    @property
    def frequency_hz(self) -> int:
        return self.settings.frequency_hz

    @property
    def period_ns(self) -> int:
        return self.settings.period_ns

    @property
    def unwind(self) -> UnwindSizes:
        return self.settings.unwind

    @property
    def probabilistic(self) -> bool:
        return self.settings.probabilistic

    @property
    def started(self) -> bool:
        return self._bpf is not None

    def cflags(self) -> list[str]:
        """The settings' flags, and the offsets in the running kernel's structures they need."""
        settings = self.settings
        return [
            f"-I{self.source.parent}",
            *settings.cflags(),
            *([f"-DTASK_FSBASE_OFFSET={self.task_fsbase_offset}"] if self.task_fsbase_offset is not None else []),
            *([f"-DTASK_GROUP_LEADER_OFFSET={self.task_start_offsets[0]}", f"-DTASK_START_BOOTTIME_OFFSET={self.task_start_offsets[1]}"]
              if self.task_start_offsets is not None else []),
            *([f"-DTASK_TGID_OFFSET={kernel_btf.task_tgid_offset()}"] if settings.target_tgids_size else []),
            *([f"-DTASK_PID_OFFSET={kernel_btf.task_pid_offset()}"] if settings.records_waits else []),
            *(["-DIO_DEVICE=1", *(f"-D{flag}={offset}" for flag, offset in self.file_device_offsets.items())]
              if settings.io_waits and self.file_device_offsets else []),
        ]

    def describe_program(self) -> str:
        """The final program as BCC compiles it: cflags, then the source (for --debug output)."""
        return f"// cflags: {' '.join(self.cflags())}\n{bpf_program.program_text(self.source)}"

    def start(self) -> None:
        """Compile, load and attach on every online CPU.  Raises a SamplerError subclass."""
        if self._closed:
            raise SamplerError("Sampler was closed; create a new one")
        if self._bpf is not None:
            raise SamplerError("Sampler already started")
        settings = self.settings
        programs = {PROGRAM_NAME: "PERF_EVENT", UNWIND_STEP_NAME: "PERF_EVENT", PYTHON_WALK_NAME: "PERF_EVENT"}
        if settings.records_waits:
            programs.update(dict.fromkeys((OFF_CPU_PROGRAM_NAME, *OFF_CPU_WALK_NAMES), "RAW_TRACEPOINT"))
        if settings.lock_waits:
            programs[OFF_CPU_WAKING_NAME] = "RAW_TRACEPOINT"
        if settings.memory_profiling:  # (attached later, to each process's probes: receivers/profiling/memory/)
            # uprobe_multi links where the kernel has them (what the deployments' capabilities allow),
            # else the uprobe PMU; the walk's copies alike, as a tail call needs the same attach type.
            self._memory_multi = uprobes.multi_supported()
            programs.update(dict.fromkeys((MEMORY_ALLOC_NAME, *MEMORY_WALK_NAMES, *((MEMORY_FREE_NAME,) if settings.live_heap else ())),
                                          UPROBE_MULTI if self._memory_multi else "KPROBE"))
        bpf, self.compile_log = bpf_program.load(self.source, self.cflags(), settings.verifier_log_level, programs, self.program_cache)
        try:
            self._fill_tail_call_arrays(bpf)
            self._find_maps(bpf)
            self._open_event_readers(bpf)
            self._watch_event_readers(bpf)
            # Attached last, once every perf buffer is open: an event sent to a CPU's buffer
            # before its reader exists fails (the first process announced was lost that way).
            if settings.records_waits:
                bpf_program.attach_raw_tracepoint(bpf, b"sched_switch", OFF_CPU_PROGRAM_NAME,
                                                  hint="off-CPU profiling reads its prev_state argument: Linux 5.18 or later")
            if settings.lock_waits:
                bpf_program.attach_raw_tracepoint(bpf, b"sched_waking", OFF_CPU_WAKING_NAME, hint="who woke a lock waiter")
            bpf_program.attach_cpu_clock(bpf, PROGRAM_NAME, settings.frequency_hz)
        except OSError as error:  # (a map the kernel refused to fill: a perf buffer, a program array)
            with contextlib.suppress(Exception):
                bpf.cleanup()
            raise bpf_program.BPFAttachError(f"could not set the profiler up: {error}") from error
        except BaseException:
            with contextlib.suppress(Exception):
                bpf.cleanup()
            raise
        if settings.verifier_log_level and self.compile_log:
            sys.stderr.write(self.compile_log)  # the user asked to see the verifier log
        self._bpf = bpf
        self._interval_start = (time.monotonic_ns(), time.time_ns())
        if bpf.compile_seconds is not None:
            self.log.info("BPF program compiled (by a child process) for this kernel and configuration",
                          seconds=round(bpf.compile_seconds, 2), cache=settings.program_cache_dir or "none: bpf_cache_dir is empty")
        self.log.debug("profiler attached", frequency_hz=settings.frequency_hz, cpus=os.cpu_count())

    def _fill_tail_call_arrays(self, bpf) -> None:
        """The programs a walk tail-calls, at their places: bpf/unwind.bpf.c's
        UNWIND_STEP_PROGRAM and PYTHON_WALK_PROGRAM (load() loaded them)."""
        for index, name in enumerate((UNWIND_STEP_NAME, PYTHON_WALK_NAME)):
            bpf[b"unwind_programs"][ct.c_int(index)] = ct.c_int(bpf.function_fd(name))
        if self.settings.records_waits:
            for index, name in enumerate(OFF_CPU_WALK_NAMES):
                bpf[b"off_cpu_programs"][ct.c_int(index)] = ct.c_int(bpf.function_fd(name))
        if self.settings.memory_profiling:
            for index, name in enumerate(MEMORY_WALK_NAMES):
                bpf[b"memory_programs"][ct.c_int(index)] = ct.c_int(bpf.function_fd(name))

    def _find_maps(self, bpf) -> None:
        """The maps user space reads and fills, and the switches it sets before the first sample."""
        self._count_maps = [bpf[b"counts_0"], bpf[b"counts_1"]]
        self._stack_maps = [bpf[b"stack_traces_0"], bpf[b"stack_traces_1"]]
        self._user_stack_maps = [bpf[b"user_stacks_0"], bpf[b"user_stacks_1"]]
        self._wake_maps = [bpf[b"wake_counts_0"], bpf[b"wake_counts_1"]] if self.settings.lock_waits else []
        self.unwind_maps = UnwindMaps(bpf[b"unwind_rows"], bpf[b"unwind_files"], bpf[b"unwind_processes"],
                                      bpf[b"unwind_demand"], bpf[b"unwind_used"], bpf[b"python_processes"],
                                      bpf[b"v8_processes"], bpf[b"hotspot_processes"])
        self._counters_map = bpf[b"counters"]
        self._thread_ctx_locations = bpf[b"thread_ctx_locations"]
        self._thread_ctx_attributes = bpf[b"thread_ctx_attributes"]
        self._known = bpf[b"known_tgids"]
        self._active = bpf[b"active_slot"]
        self._active[ct.c_int(0)] = ct.c_uint32(0)
        self._slot = 0
        if self.settings.probabilistic:
            self._profiling_on = bpf[b"profiling_on"]
            self._profiling_on[ct.c_int(0)] = ct.c_uint32(1)  # until the first draw
        if self.settings.target_tgids_size:
            self.target_tgids = bpf[b"target_tgids"]
        if self.settings.records_waits:
            self._off_cpu_waits = bpf[b"off_cpu_waits"]
        if self.settings.lock_waits or self.settings.io_waits:
            self._throttled_maps = [bpf[b"throttled_time_0"], bpf[b"throttled_time_1"]]
        if self.settings.thread_stacks:
            self.thread_stacks = bpf[b"thread_stacks"]
        if self.settings.memory_profiling:
            live = self.settings.live_heap
            self.memory_maps = MemoryMaps(bpf.function_fd(MEMORY_ALLOC_NAME), bpf.function_fd(MEMORY_FREE_NAME) if live else None,
                                          bpf[b"memory_probes"], bpf[b"live_allocs"] if live else None, bpf[b"live_stacks"] if live else None,
                                          bpf[b"live_counts"] if live else None, bpf[b"memory_budgets"], self._memory_multi)

    def _open_event_readers(self, bpf) -> None:
        """A reader on each perf buffer, each event decoded with the struct BCC derived from
        profile.h when it compiled the program."""
        pages = self.settings.perf_buffer_pages
        unwind_events = bpf[b"unwind_events"]
        self._unwind_event_type = unwind_events.event_type
        unwind_events.open_perf_buffer(self._on_unwind_event, page_cnt=8, lost_cb=self._on_lost)
        events = bpf[b"new_processes"]
        self._event_type = events.event_type
        events.open_perf_buffer(self._on_event, page_cnt=pages, lost_cb=self._on_lost)
        overflow = bpf[b"stack_overflow"]
        overflow_type = overflow.event_type
        self._overflow_header = overflow_type.user_ips.offset
        self._overflow_kernel_offset = overflow_type.kernel_ips.offset
        self._overflow_type = overflow_type
        overflow.open_perf_buffer(self._on_overflow, page_cnt=pages, lost_cb=self._on_overflow_lost)
        if self.settings.target_tgids_size:
            exec_events = bpf[b"exec_events"]
            self._exec_event_type = exec_events.event_type
            exec_events.open_perf_buffer(self._on_exec_event, page_cnt=pages, lost_cb=self._on_lost)

    def _watch_event_readers(self, bpf) -> None:
        self._event_sources = select.poll()
        for fd in bpf.perf_reader_fds():
            self._event_sources.register(fd, select.POLLIN)
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._event_sources.register(self._wake_fd, select.POLLIN)

    # ---------------------------------------------------------------------------------------

    def _on_event(self, cpu: int, data, size: int) -> None:
        event = ct.cast(data, ct.POINTER(self._event_type)).contents
        comm = event.comm.decode("utf-8", "replace")
        if time.monotonic_ns() - event.ktime_ns > LATE_ANNOUNCEMENT_NS:
            with self._user_lock:
                self._user["late_announcements"] += 1
        self._call("on_new_process", self.on_new_process, event.tgid, event.pid, comm)

    def _on_exec_event(self, cpu: int, data, size: int) -> None:
        event = ct.cast(data, ct.POINTER(self._exec_event_type)).contents
        self._call("on_exec", self.on_exec, event.tgid)

    def _on_unwind_event(self, cpu: int, data, size: int) -> None:
        """A sampled pc in no mapping the unwinder knew: the process's maps should be read again."""
        event = ct.cast(data, ct.POINTER(self._unwind_event_type)).contents
        self._call("on_unwind_request", self.on_unwind_request, event.tgid, event.pc)

    def _call(self, name: str, callback: Callable | None, tgid: int, *args) -> None:
        """Hand an event to its callback, if set. A failure is counted (callback_errors) and logged
        here, not left to the ctypes callback BCC reads the perf buffer through."""
        if callback is None:
            return
        try:
            callback(tgid, *args)
        except Exception:
            with self._user_lock:
                self._user["callback_errors"] += 1
            self.log.exception(f"{name} callback failed", tgid=tgid)

    def _on_lost(self, lost: int) -> None:
        with self._user_lock:
            self._user["lost_events"] += lost

    def _on_overflow(self, cpu: int, data, size: int) -> None:
        """A sample whose kernel or user stack collided in the stack map, both stacks by value."""
        if size < self._overflow_kernel_offset:
            return
        event = ct.cast(data, ct.POINTER(self._overflow_type)).contents
        # The event ends after the used part of kernel_ips: read no further than `size`.
        klen = min(event.kernel_len, size - self._overflow_kernel_offset) // 8
        ulen = min(event.user_len, self._overflow_kernel_offset - self._overflow_header) // 8
        kaddrs = tuple((ct.c_uint64 * klen).from_address(data + self._overflow_kernel_offset))
        uaddrs = tuple((ct.c_uint64 * ulen).from_address(data + self._overflow_header))
        span = bytes(event.trace_id) + bytes(event.span_id)
        key = (event.tgid, event.pid, event.comm, kaddrs, uaddrs, event.user_leaf_return,
               event.kernel_error, event.user_error, event.origin, span if any(span) else b"", event.process_start, event.device)
        with self._overflow_lock:
            self._overflow[key] = self._overflow.get(key, 0) + event.value
        with self._user_lock:
            self._user["stack_overflow_received"] += 1

    def _on_overflow_lost(self, lost: int) -> None:
        # The BPF program saw perf_submit fail for these and counted them in the count map
        # without the collided stack (stack_overflow_errors): the samples themselves are kept.
        with self._user_lock:
            self._user["stack_overflow_lost"] += lost

    def poll(self, timeout_ms: int = 0) -> None:
        """Wait up to timeout_ms for perf buffer events (wait_for_events), then handle what the
        buffers hold: run on_new_process for each new-process event, and keep each collided
        sample for the next collect()."""
        self._require_started()
        if timeout_ms:
            self.wait_for_events(timeout_ms)
        with self._poll_cond:
            while self._poll_busy:  # collect() reading the buffers: a poll(0), short
                self._poll_cond.wait()
            mine = self._claim_perf_buffers()
        self._read_perf_buffers(mine)

    def wait_for_events(self, timeout_ms: int) -> bool:
        """Wait until a perf buffer has data, ``wake`` is called, or timeout_ms (-1: no limit)
        has passed; whether a buffer has data. The buffers are not read: an idle host costs a
        thread waiting here nothing, where a poll that timed out every 100 ms cost 1-2 ms of CPU
        a second on a crowded one. Waiting holds nothing collect() needs."""
        self._require_started()
        ready = self._event_sources.poll(timeout_ms)
        woken = any(fd == self._wake_fd for fd, _ in ready)
        if woken:
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self._wake_fd)
        return len(ready) > woken

    def wake(self) -> None:
        """End a wait_for_events under way now (or the next one, at once): to stop."""
        if self._wake_fd is not None:
            with contextlib.suppress(OSError):
                os.eventfd_write(self._wake_fd, 1)

    def _claim_perf_buffers(self) -> int:
        """Mark a read of the perf buffers as under way (self._poll_cond held); its number."""
        self._poll_busy = True
        self._polls_started += 1
        return self._polls_started

    def _read_perf_buffers(self, number: int) -> None:
        try:
            self._bpf.perf_buffer_consume()  # (wait_for_events took the buffers' wake-ups: see there)
        finally:
            with self._poll_cond:
                self._poll_busy = False
                self._polls_finished = max(self._polls_finished, number)
                self._poll_cond.notify_all()

    def _read_perf_buffers_now(self) -> None:
        """Make sure the perf buffers are read after this call began: poll them here, or, when
        another thread is polling, wait for a poll that started after this call to end."""
        deadline = time.monotonic() + POLL_WAIT_S
        with self._poll_cond:
            target = self._polls_started + 1
            while True:
                if self._polls_finished >= target:
                    return
                if not self._poll_busy:
                    mine = self._claim_perf_buffers()
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._poll_cond.wait(remaining):
                    return  # this interval's last collided samples go in the next one
        self._read_perf_buffers(mine)

    def set_profiling(self, on: bool) -> None:
        """Probabilistic profiling: take samples (and record off-CPU waits) or not, from now on."""
        self._require_started()
        if self._profiling_on is None:
            raise SamplerError("set_profiling needs a Sampler made with probabilistic=True")
        self._profiling_on[ct.c_int(0)] = ct.c_uint32(1 if on else 0)

    def prune_off_cpu_waits(self, proc: str = "/proc") -> int:
        """Drop the recorded waits of threads that no longer exist: a wait ends when its thread
        comes back to a CPU, and one that never does (it died in a way its last switch did not
        show) would hold its entry for good, until off_cpu_threads were all taken. Returns how
        many were dropped (counted in off_cpu_waits_pruned)."""
        self._require_started()
        if self._off_cpu_waits is None:
            return 0
        gone = [key for key in self._off_cpu_waits.keys() if not os.path.exists(f"{proc}/{key.value}")]
        for key in gone:
            with contextlib.suppress(KeyError):
                del self._off_cpu_waits[key]
        with self._user_lock:
            self._user["off_cpu_waits_pruned"] += len(gone)
        return len(gone)

    def set_thread_context(self, tgid: int, tp_offset: int | None, module: int = 0, offset: int = 0) -> None:
        """Where process tgid keeps its OpenTelemetry thread context variable: at the thread
        pointer plus tp_offset, or (tp_offset None) at dtv[module] + offset."""
        self._require_started()
        table = self._thread_ctx_locations
        table[table.Key(tgid)] = table.Leaf(tp_offset or 0, module, offset, 1 if tp_offset is not None else 0, 0)

    def span_attributes(self, spans: Iterable[tuple[int, bytes]]) -> dict[tuple[int, bytes], bytes]:
        """{(tgid, span (trace id + span id)): the attrs-data that process's thread context record
        held at its last sample in the span} for those of ``spans`` the kernel still keeps."""
        self._require_started()
        table, out = self._thread_ctx_attributes, {}
        for tgid, span in spans:
            try:
                value = table[table.Key.from_buffer_copy(_TGID.pack(tgid) + span)]
            except KeyError:
                continue
            out[(tgid, span)] = bytes(value.data[: value.size])
        return out

    def clear_thread_context(self, tgid: int) -> None:
        self._require_started()
        with contextlib.suppress(KeyError):
            del self._thread_ctx_locations[self._thread_ctx_locations.Key(tgid)]

    def forget_process(self, tgid: int) -> None:
        """Drop tgid from the kernel's known set, so its next sample announces it again
        (call when a process has exited, so a reused pid is announced)."""
        self._require_started()
        with contextlib.suppress(KeyError):
            del self._known[self._known.Key(tgid)]

    # ---------------------------------------------------------------------------------------

    def collect(self) -> Interval:
        """Flip the active count map, drain the other one and resolve its stacks."""
        self._require_started()
        end_mono, end_wall = time.monotonic_ns(), time.time_ns()
        drained_slot = self._slot
        self._slot ^= 1
        self._active[ct.c_int(0)] = ct.c_uint32(self._slot)
        time.sleep(FLIP_GRACE_S)
        # Collided samples sent before the flip are in the perf buffer by now.
        self._read_perf_buffers_now()
        with self._overflow_lock:
            overflow, self._overflow = self._overflow, {}

        slot = self._slots.read(self._count_maps[drained_slot], self._stack_maps[drained_slot],
                                self._user_stack_maps[drained_slot], self._wake_maps[drained_slot] if self._wake_maps else None)
        out = slot.stacks
        for (tgid, pid, comm, kaddrs, uaddrs, leaf_return, kerr, uerr, origin, span, started, device), count in overflow.items():
            out.append(stack_count(tgid, pid, comm, kaddrs, uaddrs, leaf_return, count, kerr, uerr, origin, span, started, device))
        if self._throttled_maps:
            spread_throttled_time(out, self._slots.drain_throttled_time(self._throttled_maps[drained_slot]))

        with self._user_lock:
            self._user["missing_stacks"] += slot.missing
            self._user["stack_map_races"] += slot.raced
            self._user["stacks_freed"] += slot.freed
            self._user["intervals"] += 1

        start_mono, start_wall = self._interval_start
        self._interval_start = (end_mono, end_wall)
        return Interval(stacks=out, start_monotonic_ns=start_mono, end_monotonic_ns=end_mono,
                        start_wall_ns=start_wall, end_wall_ns=end_wall,
                        frequency_hz=self.settings.frequency_hz, counters=self.counters())

    def counters(self) -> dict[str, int]:
        """Cumulative counts since start(): the BPF per-CPU counters summed, plus user-side ones
        (lost_events from the perf buffer, late_announcements, missing_stacks, stacks_freed,
        intervals, callback_errors)."""
        out = dict.fromkeys(self.counter_names, 0)
        out.update(self._final_counters)
        if self._counters_map is not None:
            table = self._counters_map
            for i, name in enumerate(self.counter_names):
                out[name] = int(table.sum(table.Key(i)).value)
        with self._user_lock:
            out.update(self._user)
        return out

    def close(self) -> None:
        """Detach and unload.  Safe before start() and safe twice."""
        if self._bpf is not None:
            self._final_counters = self.counters()
        self._closed = True
        bpf, self._bpf = self._bpf, None
        if bpf is not None:
            bpf.cleanup()
        wake_fd, self._wake_fd, self._event_sources = self._wake_fd, None, None
        if wake_fd is not None:
            os.close(wake_fd)
        self._count_maps = []
        self._stack_maps = []
        self._user_stack_maps = []
        self._wake_maps = []
        self.unwind_maps = None
        self.memory_maps = None
        self._counters_map = self._known = self.target_tgids = self._profiling_on = self._off_cpu_waits = self.thread_stacks = None

    def _require_started(self) -> None:
        if self._bpf is None:
            raise SamplerError("Sampler is not started" if not self._closed else "Sampler closed")

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()
