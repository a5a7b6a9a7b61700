"""The profiling receiver at run time: two threads around one BPF program.

events thread   drains the perf buffers, so a new process is snapshotted (name, path, maps,
                cgroup) the moment it is first sampled, before it can exit, and the samples whose
                stack collided in the stack map (sent with their stacks by value) are kept for the
                report thread's next collect().
report thread   every reporter_interval (+/- jitter): flip the count maps, symbolize, build one
                ProfilesData and push it down the pipeline. On shutdown it reports once more, so
                the last partial interval is not lost.

A refusal from downstream (memory_limiter, a full queue) does not lose the interval: it is held
and merged into the next report, up to ``MAX_HELD_REPORTS``; beyond that the oldest is dropped,
counted and logged.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from pycollector.component import Component, PermanentError, RefusedError, StartError
from pycollector.logs import log_once
from pycollector.pdata import merge, sample_count
from pycollector.process_memory import trim_heap

from receivers.profiling.config import TRACERS, ProfilingConfig
from receivers.profiling.elf import bounded as elf_bounds
from receivers.profiling.jit.jvm_perfmap import JvmPerfMapRequester
from receivers.profiling.jit.names import TRACER_OF_RUNTIME, JitNames
from receivers.profiling.jit.perfmap import PerfMaps
from receivers.profiling.kernel.counters import counter_warnings, unwind_warnings
from receivers.profiling.kernel.probabilistic import ALWAYS, ProbabilisticProfiling
from receivers.profiling.kernel.program import BPFPermissionError, SamplerError
from receivers.profiling.kernel.sampler import Sampler
from receivers.profiling.kernel.settings import SamplerSettings, UnwindSizes
from receivers.profiling.memory.attach import MemoryProbes
from receivers.profiling.memory.live import LiveHeap
from receivers.profiling.processes import files as process_files
from receivers.profiling.processes import memory as process_memory
from receivers.profiling.processes.credentials import missing_process_access
from receivers.profiling.processes.table import ProcessTable
from receivers.profiling.processes.targeting import Targeting
from receivers.profiling.python.interpreters import PythonInterpreters
from receivers.profiling.otel_context.contexts import ProcessContexts
from receivers.profiling.report import ReportBuilder
from receivers.profiling.stall_watch import Progress, StallWatch
from receivers.profiling.threads.go_programs import GoPrograms
from receivers.profiling.threads.thread_stacks import ThreadStacks
from receivers.profiling.symbols.detection import FileDetector
from receivers.profiling.symbols.debuginfod import DebuginfodClient
from receivers.profiling.symbols.symbolizer import Symbolizer
from receivers.profiling.unwind.registry import RowSource, UnwindRegistry
from receivers.profiling.hotspot.runtimes import HotSpotRuntimes
from receivers.profiling.v8.runtimes import V8Runtimes

# Map sizes at map_scale_factor 0; each step of the factor doubles them.
BASE_COUNT_MAP_SIZE = 10_240
BASE_STACK_STORAGE_SIZE = 16_384
BASE_TARGETS_SIZE = 8192  # target_tgids entries, times 2**map_scale_factor
BASE_OFF_CPU_THREADS = 16_384  # threads off a CPU at once whose switch can be recorded, likewise
BASE_LIVE_ALLOCS = 65_536  # sampled allocations alive at once (live heap), likewise: 64 bytes each
BASE_LIVE_STACKS = 8192  # their distinct stacks, likewise: 1 KiB each at 128 frames
BASE_THREAD_STACKS = 16_384  # threads whose stacks are kept (thread_profiling), likewise: 2 KiB each at 128 frames, as used
MAX_HELD_REPORTS = 3
# The events thread waits this long at most for the kernel's events (they end the wait at once, as
# shutdown does): the limit only bounds what a lost wake-up could cost.
EVENT_WAIT_MS = 2000
# How long shutdown waits for the threads after the last report was handed downstream; a pipeline
# still blocked after that (e.g. a full queue with block_on_overflow) is abandoned, not waited for.
SHUTDOWN_JOIN_TIMEOUT = 30.0
# How long a thread may stay in one stage (one report's step, one batch of kernel events) before
# the health check hears the receiver is stuck.
STALL_ALLOWANCE_S = 60.0
PRUNE_EVERY_REPORTS = 12  # waits of threads gone without coming back: a minute at the default interval


class ProfilingReceiver(Component):
    def __init__(self, settings, config: ProfilingConfig, next_consumer):
        self.log = settings.logger
        self.source = f"{settings.kind}::{settings.id}"  # as the service names it in status events
        self.config = config
        self.next_consumer = next_consumer
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sampler: Sampler | None = None
        self._held: Any = None  # a refused report, merged into the next one
        self._held_intervals = 0  # how many intervals `_held` spans
        self._last_counters: dict[str, int] = {}
        telemetry = settings.telemetry
        self._bpf_counters = telemetry.counter("pycollector_profiling_bpf_events", "Events counted by the profiling receiver's BPF program and its reader.", ("event",))
        self._dropped = telemetry.counter("pycollector_profiling_dropped_samples", "Samples the profiling receiver dropped, by reason: downstream kept refusing them (refused, shutdown), their process could not be built (build_error), or it was gone and its pid another process's (pid_reused).", ("reason",))
        self._dropped_off_cpu = telemetry.counter("pycollector_profiling_dropped_off_cpu_seconds", "Off-CPU time the profiling receiver dropped.", ("reason",))
        self._report_errors = telemetry.counter("pycollector_profiling_report_errors", "Reports of the profiling receiver that failed as a whole (their samples are lost).")
        self._processes_gauge = telemetry.gauge("pycollector_profiling_known_processes", "Processes whose /proc snapshot the receiver holds.")
        # Cumulative counts kept by the symbolizer and the process table, read at scrape time:
        # an ELF file that will not parse or a snapshot that came back partial costs names.
        self._stats = telemetry.gauge("pycollector_profiling_symbolization", "Symbolizer and /proc snapshot counts since start.", ("stat",))
        self._unwind_stats = telemetry.gauge("pycollector_profiling_unwind_tables", "Native unwinding: files and rows loaded into the kernel, the row cache's hits, counts since start.", ("stat",))
        self._last_unwind_stats: dict[str, int] = {}
        self._context_stats = telemetry.gauge("pycollector_profiling_otel_context", "Process contexts OpenTelemetry SDKs publish (OTEP 4719): processes with one, reads, updates, errors, attributes dropped, counts since start.", ("stat",))
        self._python_stats = telemetry.gauge("pycollector_profiling_python", "Python frames: processes running a CPython the walker knows, frames named and not, code objects read, counts since start.", ("stat",))
        self.python: PythonInterpreters | None = None
        self.v8: V8Runtimes | None = None
        self.hotspot: HotSpotRuntimes | None = None
        self.detector: FileDetector | None = None
        self._hotspot_stats = telemetry.gauge("pycollector_profiling_hotspot", "Java frames of HotSpot JVMs: processes whose JVM the walker knows, frames named and not, methods read, counts since start.", ("stat",))
        self._v8_stats = telemetry.gauge("pycollector_profiling_v8", "JavaScript frames of Node.js processes: processes running a V8 the walker knows, frames named and not, functions read, counts since start.", ("stat",))
        self.jvm_perf_maps: JvmPerfMapRequester | None = None
        self.targeting: Targeting | None = None
        self.probabilistic: ProbabilisticProfiling | None = None
        self.memory: MemoryProbes | None = None
        self.live_heap: LiveHeap | None = None
        self.thread_stacks: ThreadStacks | None = None
        self.go_programs: GoPrograms | None = None
        self._thread_stats = telemetry.gauge("pycollector_profiling_threads", "Threads and goroutines profiles: threads counted and those whose stack was not known or out of date, kernel entries of threads gone, goroutines read and dropped, counts since start.", ("stat",))
        self._memory_stats = telemetry.gauge("pycollector_profiling_memory", "Memory profiling (otel_memory USDT probes): files examined, probes attached and refused, processes attached, counts since start.", ("stat",))
        self._reports = 0
        self._report_progress = Progress("report", STALL_ALLOWANCE_S)
        self._events_progress = Progress("events", STALL_ALLOWANCE_S)
        self._stall_watch: StallWatch | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, host) -> None:
        self._warn_about_settings()
        self.processes = ProcessTable(self.config.env_var_names(), logger=self.log)
        jit_runtimes = {runtime for runtime, tracer in TRACER_OF_RUNTIME.items() if self.config.tracer_enabled(tracer)}
        self.jit = JitNames(PerfMaps(), jit_runtimes)
        self.symbolizer = Symbolizer(self.processes, jit=self.jit, go_names=self.config.tracer_enabled("go"),
                                     debuginfod=self._debuginfod_client(), logger=self.log)
        # A report waits for files being read at most half its interval (3 s at most), so it is never late for it.
        self.symbolizer.loads.report_wait_s = min(3.0, self.config.reporter_interval / 2)
        self.symbolizer.loads.wait_s = min(2.0, self.symbolizer.loads.report_wait_s)
        self.reports = ReportBuilder(self.processes, self.symbolizer, progress=self._report_progress)
        # The runtimes' reads to name a report's frames take at most its interval, all processes
        # together (processes/report_budget.py): a backstop for slow reads (the bytes' bound comes
        # first, at 0.3 s of reads at their usual 8 us; half the interval left a JVM starting in a
        # test on a loaded machine, its reads at 90 us, with most frames unnamed).
        self.reports.naming_read_seconds = self.config.reporter_interval
        self.contexts = self.reports.contexts = ProcessContexts(self.processes, self.log)
        sampler = Sampler(
            self._sampler_settings(),
            on_new_process=self.processes.on_new_process,
            # A pc in no mapping the unwinder knew (a library opened since): read the maps again;
            # the process table tells its watchers, the unwind registry among them.
            on_unwind_request=lambda tgid, pc: self.processes.find_mapping(tgid, pc, rate_limited=False),
            on_exec=self._on_exec,
            logger=self.log,
        )
        # Runtime detection (Python, V8, HotSpot) off the events thread: a process whose file is
        # not read yet is told to the watchers again once it is. Its helper starts now, beside the
        # program's compile, so that it is ready for the first processes (a JVM started with the
        # collector was otherwise walked unregistered for its first second, as long as the
        # helper took to start).
        self.detector = FileDetector(self.log)
        self.detector.retell = self.processes.tell_again
        self.detector.start(runtime.DETECTION_READER for runtime in (PythonInterpreters, V8Runtimes, HotSpotRuntimes, GoPrograms))
        try:
            if (missing := missing_process_access()) is not None:
                raise BPFPermissionError(missing)
            sampler.start()
        except SamplerError as error:
            self.detector.close()
            if self.config.error_mode == "ignore":
                self.log.error("profiler could not start; running without it (error_mode: ignore)", reason=str(error))
                return
            raise StartError(str(error)) from error
        self._sampler = sampler
        if sampler.task_fsbase_offset is not None:  # (the thread pointer's place in task_struct, from BTF)
            self.contexts.thread_contexts = sampler  # the kernel reads each sample's span where an SDK publishes it
            self.reports.span_attributes = sampler.span_attributes
        # The rooms that keep state per process, in the order the process table tells them of
        # a process's life (each _start_* watches it): unwind tables, Python, then the JIT names,
        # targeting and, last, the kernel's set of announced tgids, so a reused pid is announced
        # again only once everything of its predecessor is gone.
        self._start_targeting(sampler)
        self._start_v8(sampler)  # before the unwind registry: it asks where a process's V8 code is
        self._start_hotspot(sampler)  # (and a JVM's code cache)
        self._start_unwinding(sampler)
        self._start_python(sampler)
        self._start_memory(sampler)
        self._start_threads(sampler)
        self._start_jvm_perf_maps()
        self._start_probabilistic(sampler)
        self.processes.watch(exited=self.jit.forget)
        if self.targeting is not None:
            self.processes.watch(exited=self.targeting.forget)
        self.processes.watch(exited=sampler.forget_process)
        self._publish_stats()
        # Compiling the program with BCC's LLVM leaves tens of MiB of freed heap mapped; hand it
        # back (measured: steady RSS 204 -> 149 MiB; the peak during the compile stays).
        trim_heap()
        self.log.info("profiling every CPU", samples_per_second=self.config.samples_per_second, reporter_interval=f"{self.config.reporter_interval:g}s",
                      **({"off_cpu_threshold": self.config.off_cpu_threshold} if self.config.off_cpu_threshold else {}))
        # The kernel's symbols now, not in the first report, which would read them (0.3 s alone,
        # seconds on a busy host) while a short-lived JVM or Node process it must name from its
        # memory exits: its frames then stay unnamed.
        self.symbolizer.load_kernel()
        for name, target in (("profiling-events", self._events_loop), ("profiling-report", self._report_loop)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        self._stall_watch = StallWatch([self._report_progress, self._events_progress], host.report_status, self.source, self.log)
        self._stall_watch.start()

    def _sampler_settings(self) -> SamplerSettings:
        scale = 2 ** self.config.map_scale_factor
        return SamplerSettings(
            frequency_hz=self.config.samples_per_second,
            stack_storage_size=BASE_STACK_STORAGE_SIZE * scale,
            # Off-CPU keys (a thread's every distinct wait) and allocations' (two a stack) share the
            # count maps with CPU samples.
            count_map_size=BASE_COUNT_MAP_SIZE * scale * (1 + bool(self.config.off_cpu_threshold) + self.config.allocation_profiling
                                                          + (self.config.lock_profiling or self.config.io_profiling)),
            verifier_log_level=self.config.bpf_verifier_log_level,
            unwind=UnwindSizes(row_budget=self.config.unwind_row_budget, max_frames=self.config.unwind_max_frames),
            target_tgids_size=BASE_TARGETS_SIZE * scale if self.config.targeting() else 0,
            off_cpu_threshold=self.config.off_cpu_threshold,
            lock_waits=self.config.lock_profiling,
            io_waits=self.config.io_profiling,
            waits_per_second=self.config.wait_events_per_second,
            # (lock waits again, a row for each waiter's stacks and waker's together)
            wake_counts_size=BASE_COUNT_MAP_SIZE * scale // 2,
            thread_stacks=BASE_THREAD_STACKS * scale if self.config.thread_profiling else 0,
            off_cpu_threads=BASE_OFF_CPU_THREADS * scale,
            probabilistic=self.config.probabilistic_threshold < ALWAYS,
            program_cache_dir=self.config.bpf_cache_dir,
            memory_profiling=self.config.allocation_profiling,
            live_heap=self.config.live_heap_profiling,
            memory_events_per_second=self.config.allocation_events_per_second,
            live_allocs=BASE_LIVE_ALLOCS * scale,
            live_stacks=BASE_LIVE_STACKS * scale,
        )

    def _start_targeting(self, sampler: Sampler) -> None:
        if sampler.target_tgids is None:
            return
        self.targeting = Targeting(sampler.target_tgids, self.config.process_filter, self.config.filter_min_process_age, self.log)
        self.processes.admits = self.targeting.consider  # a reused pid's new process, too
        self.targeting.start()

    def _start_unwinding(self, sampler: Sampler) -> None:
        self.row_source = RowSource(self.config.unwind_cache_dir, self.log)
        self.row_source.start()
        self.unwind = UnwindRegistry(sampler.unwind_maps, self.row_source, self.log, max_files=sampler.unwind.max_files,
                                     row_budget=sampler.unwind.row_budget, idle_s=self.config.unwind_row_idle_timeout)
        # (before watching: the processes known already are registered at once)
        runtimes = [runtime for runtime in (self.v8, self.hotspot) if runtime is not None]
        self.unwind.runtime_code = lambda info: [bounds for runtime in runtimes for bounds in runtime.code_ranges(info)]
        if self.hotspot is not None:
            self.hotspot.on_found = self.unwind.register
        self.processes.watch(changed=self.unwind.register, exited=self.unwind.forget)

    def _start_memory(self, sampler: Sampler) -> None:
        """With allocation_profiling, the memory programs attached to each process's otel_memory
        probes as the process table tells of it (memory/attach.py); without, nothing is."""
        if sampler.memory_maps is None:
            return
        if sampler.memory_maps.live_allocs is not None:
            self.live_heap = LiveHeap(sampler.memory_maps, self.log)
        self.memory = MemoryProbes(sampler.memory_maps, self.log, on_detached=self.live_heap.forget if self.live_heap is not None else None)
        self.memory.start()
        self.processes.watch(changed=self.memory.changed, exited=self.memory.exited)

    def _start_threads(self, sampler: Sampler) -> None:
        """With thread_profiling, the threads profile from the stacks the kernel keeps of each thread."""
        if sampler.thread_stacks is None:
            return
        self.thread_stacks = ThreadStacks(sampler.thread_stacks, logger=self.log)
        self.go_programs = GoPrograms(self.config.reporter_interval, self.log, detector=self.detector)
        self.processes.watch(changed=self.go_programs.register, exited=self.go_programs.forget)
        self.go_programs.start()

    def _profiled_processes(self) -> list[tuple[int, int | None, dict[int, str], str]]:
        """(tgid, start ticks, its thread names, its name) of each process the table holds, alive and not a kernel thread."""
        out = []
        for tgid in self.processes.tgids():
            info = self.processes.current(tgid)
            if info is not None and not info.exited and not info.kernel_thread:
                out.append((tgid, info.start_time_ticks, dict(info.threads), info.comm))
        return out

    def _debuginfod_client(self) -> DebuginfodClient | None:
        """The client of the servers the config (or $DEBUGINFOD_URLS) names; None when it names none."""
        settings = self.config.debuginfod
        urls = settings.server_urls()
        if not urls:
            return None
        self.log.info("debug files of stripped files are fetched from debuginfod", servers=urls, cache_dir=settings.cache_dir)
        return DebuginfodClient(urls, cache_dir=settings.cache_dir, cache_bytes=settings.cache_size_mib << 20,
                                max_file_bytes=settings.max_file_size_mib << 20, timeout_s=settings.timeout,
                                fetch_timeout_s=settings.fetch_timeout, negative_expiry_s=settings.negative_cache_expiry,
                                fetches_per_minute=settings.fetches_per_minute,
                                fetches_per_process_per_minute=settings.fetches_per_process_per_minute, logger=self.log)

    def _start_probabilistic(self, sampler: Sampler) -> None:
        if not sampler.probabilistic:
            return
        self.probabilistic = ProbabilisticProfiling(sampler.set_profiling, self.config.probabilistic_interval, self.config.probabilistic_threshold, self.log)
        self.probabilistic.start()

    def _publish_stats(self) -> None:
        """Each component's cumulative counts on its gauge, read at scrape time."""
        _publish(self._stats, self.symbolizer, names=("files_parsed", "files_failed", "files_unreadable", "files_over_time", "symbol_tables_too_large",
                                                      "mini_debuginfo_read", "mini_debuginfo_unreadable"))
        _publish(self._stats, self.symbolizer.loads, "symbol_", ("loads_deferred", "loads_stuck"))
        if self.symbolizer.debuginfod is not None:  # debug files fetched, kept, refused and why
            _publish(self._stats, self.symbolizer.debuginfod, "debuginfod_")
        _publish(self._stats, self.reports, names=("samples_carried", "samples_carried_for_names"))
        _publish(self._stats, self.processes, names=("snapshots", "partial_snapshots", "predecessors", "incarnations_read", "incarnations_gone",
                                                     "told_again"))
        _publish(self._context_stats, self.contexts)
        _publish(self._stats, self.jit.perf_maps, "perf_map_", ("files_read", "malformed_lines", "entries_dropped", "files_refused",
                                                              "files_over_budget", "long_lines", "names_truncated"))
        _publish(self._stats, process_files, "process_files_")  # the files of sampled processes: opened, refused and why
        _publish(self._stats, process_memory, "process_memory_")  # reads of pages not in memory: checked, refused
        _publish(self._stats, elf_bounds, "elf_")  # what of their ELF files was past its bounds, and not read
        _publish(self._unwind_stats, self.unwind)
        _publish(self._unwind_stats, self.row_source.cache, "cache_")
        if self.memory is not None:
            _publish(self._memory_stats, self.memory)
        if self.live_heap is not None:
            _publish(self._memory_stats, self.live_heap, "live_heap_")
        if self.thread_stacks is not None:
            _publish(self._thread_stats, self.thread_stacks)
            _publish(self._thread_stats, self.go_programs, "go_")
        for component, prefix in ((self.targeting, "targeting_"), (self.jvm_perf_maps, "jvm_perf_map_"), (self.probabilistic, "probabilistic_")):
            if component is not None:
                _publish(self._stats, component, prefix)
        # Each runtime's detections (deferred, refused, killed past their deadline and why) on its own gauge.
        if self.python is not None:
            _publish(self._python_stats, self.python)
            _publish(self._python_stats, self.python.code, "code_")
            _publish(self._python_stats, self.python.files)
        if self.v8 is not None:
            _publish(self._v8_stats, self.v8)
            _publish(self._v8_stats, self.v8.files)
        if self.hotspot is not None:
            _publish(self._hotspot_stats, self.hotspot)
            _publish(self._hotspot_stats, self.hotspot.files)

    def _start_v8(self, sampler: Sampler) -> None:
        """JavaScript frames of Node.js processes, walked and named without perf maps."""
        if not self.config.tracer_enabled("v8"):
            return
        self.v8 = V8Runtimes(sampler.unwind_maps.v8, self.log, detector=self.detector)
        self.reports.runtimes.append(self.v8)
        self.processes.watch(changed=self.v8.register, exited=self.v8.forget)

    def _start_hotspot(self, sampler: Sampler) -> None:
        """Java frames of HotSpot JVMs, walked and named without perf maps."""
        if not self.config.tracer_enabled("hotspot"):
            return
        self.hotspot = HotSpotRuntimes(sampler.unwind_maps.hotspot, self.log, detector=self.detector)
        self.hotspot.current = self.processes.lookup
        self.reports.runtimes.append(self.hotspot)
        self.processes.watch(changed=self.hotspot.register, exited=self.hotspot.forget)

    def _start_python(self, sampler: Sampler) -> None:
        """Python frames, unless the settings leave them out or the kernel cannot say where a
        thread's TLS base is (which is how the walker finds the sampled thread's state)."""
        if not self.config.python_frames():
            return
        if sampler.task_fsbase_offset is None:
            self.log.warning("no Python frames: the kernel's BTF does not say where a thread's TLS base is kept", reason=sampler.python_frames_error)
            return
        self.python = PythonInterpreters(sampler.unwind_maps.python, self.log, detector=self.detector)
        self.reports.runtimes.append(self.python)
        self.processes.watch(changed=self.python.register, exited=self.python.forget)

    def _on_exec(self, tgid: int) -> None:
        """A program was exec'd (heard only when targeting): is it one to profile? One that is
        gets its /proc snapshot, unwind tables and Python registration now, as an announcement
        from the kernel would: otherwise they wait for its first sample, and its first stacks
        (an off-CPU wait taken as it leaves the CPU) are walked without them."""
        if self.targeting is not None and self.targeting.consider(tgid):
            self.processes.on_new_process(tgid, tgid, "")

    def _start_jvm_perf_maps(self) -> None:
        if self.config.jvm_perf_map_interval <= 0 or not self.config.tracer_enabled("hotspot"):
            return
        self.jvm_perf_maps = JvmPerfMapRequester(self.processes, self.config.jvm_perf_map_interval, self.log)
        self.jvm_perf_maps.start()

    def shutdown(self) -> None:
        self._stop.set()
        if self._sampler is not None:
            self._sampler.wake()  # (the events thread's wait)
        if self._stall_watch is not None:
            self._stall_watch.close()
        deadline = time.monotonic() + SHUTDOWN_JOIN_TIMEOUT
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                self.log.error("a profiling thread did not stop in time; abandoning it", thread=thread.name, seconds=SHUTDOWN_JOIN_TIMEOUT)
        self._threads.clear()
        if self._held is not None:  # the last report was refused: nothing will take it now
            self._drop(self._held, "shutdown", "the pipeline refused the last report while stopping")
            self._held = None
        if self._sampler is not None:
            if self.jvm_perf_maps is not None:
                self.jvm_perf_maps.close()
            if self.probabilistic is not None:
                self.probabilistic.close()
            if self.go_programs is not None:
                self.go_programs.close()
            self.detector.close()  # (before the process table's watchers go: it tells them again)
            if self.memory is not None:
                self.memory.close()  # (its uprobes before the programs they run)
            self.row_source.close()  # first: the registry's worker may be waiting on it
            self.unwind.close()
            self._sampler.close()
            self._sampler = None
            self.symbolizer.close()
            self.contexts.close()

    def _warn_about_settings(self) -> None:
        for key in self.config.legacy_keys_used:
            log_once(self.log, ("legacy-key", key), "warning", "deprecated key; use the snake_case name", key=key)
        for key in self.config.not_implemented():
            log_once(self.log, ("not-implemented", key), "warning", "setting accepted but not implemented yet; it has no effect", key=key)
        for name in self.config.unsupported_tracers():
            log_once(self.log, ("unsupported-tracer", name), "warning", "this runtime's frames are not read yet; they stay native frames",
                     tracer=name, supported=",".join(TRACERS))

    # -- threads -------------------------------------------------------------------------------

    def _events_loop(self) -> None:
        while not self._stop.is_set():
            self._events_progress.idle()  # (waiting for events is no stall, however long)
            try:
                self._sampler.wait_for_events(EVENT_WAIT_MS)
                self._events_progress.stage("handling the kernel's events")
                self._sampler.poll()
            except Exception:  # keep reading: a lost event costs one process, a dead thread all
                log_once(self.log, ("events-failed", id(self)), "exception", "could not handle the kernel's events; reading on")

    def _report_loop(self) -> None:
        """A report every interval (with its jitter), counted from when the last was due, not
        from when it was done: a report that takes 0.4 s of a 1 s interval does not make them
        1.4 s apart. One that overruns its interval is followed by the next at once, not by a
        burst catching up."""
        self._report_progress.idle()
        due = time.monotonic()
        while True:
            due = max(due, time.monotonic() - self.config.reporter_interval) + self._next_interval()
            if self._stop.wait(max(0.0, due - time.monotonic())):
                break
            self._report_guarded()
        self._report_guarded(final=True)  # the partial interval since the last report

    def _report_guarded(self, final: bool = False) -> None:
        """One report; whatever it raises is logged and counted, and the next interval reports
        again (an escaped error used to end this thread for good while the kernel kept counting)."""
        try:
            self._report(final)
        except Exception as error:
            self._report_errors.inc()
            self.log.exception("this interval's report failed; the next one runs", error=repr(error))
        finally:
            self._report_progress.idle()

    def _next_interval(self) -> float:
        jitter = self.config.reporter_jitter
        return self.config.reporter_interval * (1 + random.uniform(-jitter, jitter))

    def _report(self, final: bool = False) -> None:
        self._report_progress.stage("reading the kernel's counts")
        try:
            interval = self._sampler.collect()
        except Exception as error:  # keep profiling; one bad read must not stop the agent
            self.log.exception("could not read this interval's counts from the kernel", error=str(error))
            return
        self.unwind.note_running({stack.tgid for stack in interval.stacks if stack.cpu})
        if self.live_heap is not None:  # (what is alive now: the in-use profiles are a snapshot, not this interval's)
            interval.stacks.extend(self.live_heap.read())
        if self.thread_stacks is not None:  # (where each thread sits now: a reading too)
            self._report_progress.stage("counting the threads by stack")
            interval.stacks.extend(self.thread_stacks.read(self._profiled_processes()))
            interval.stacks.extend(self.go_programs.stacks())  # (read on their own thread: the last reading)
        data = self.reports.build(interval, on_error=self._process_failed, final=final, on_dropped=self._samples_dropped)
        self._record_counters(interval.counters)
        self._report_progress.stage("forgetting exited processes")
        if self.targeting is not None:
            self.targeting.tick()
        self.processes.forget_exited()  # its watchers forget what they held of each
        self._reports += 1
        if self._reports % PRUNE_EVERY_REPORTS == 0:
            self._sampler.prune_off_cpu_waits()
        self._processes_gauge.set(len(self.processes))
        if self._held is not None:
            data = merge(self._held, data)
            self._held = None
        if not data.resource_profiles:
            # The idle task is never reported, so an idle host sends nothing; say so once, or a
            # person watching the console would think the profiler is broken.
            log_once(self.log, ("idle", id(self)), "info", "no process used the CPU in this interval; nothing to report until one does")
            return
        self._push(data)

    def _push(self, data) -> None:
        self._report_progress.stage("handing the profile downstream")
        try:
            self.next_consumer.consume(data)
            self._held_intervals = 0
        except RefusedError as error:
            self._hold(data, error)
        except Exception as error:  # rejected, or a bug downstream: the thread must live on
            # The engine counts these samples as otelcol_receiver_failed_profile_samples.
            self._held_intervals = 0
            self.log.error("pipeline failed this interval's profile; dropped", samples=sample_count(data), reason=str(error), permanent=isinstance(error, PermanentError))

    def _process_failed(self, tgid: int, samples: int, off_cpu_ns: int, error: Exception) -> None:
        """One process's stacks could not be turned into a profile (e.g. an unreadable ELF file)."""
        self._dropped.labels(reason="build_error").inc(samples)
        self._dropped_off_cpu.labels(reason="build_error").inc(off_cpu_ns / 1e9)
        log_once(self.log, ("build-error", tgid), "error", "could not build this process's profile; its samples are dropped", pid=tgid, samples=samples,
                 off_cpu_seconds=round(off_cpu_ns / 1e9, 3), error=repr(error))

    def _samples_dropped(self, tgid: int, samples: int, off_cpu_ns: int, reason: str) -> None:
        """A process's stacks that no snapshot of it can name: it exited unknown and its pid is
        another process's (reason pid_reused), whose program and names are not its."""
        self._dropped.labels(reason=reason).inc(samples)
        self._dropped_off_cpu.labels(reason=reason).inc(off_cpu_ns / 1e9)
        log_once(self.log, ("dropped", reason), "info", "samples of a process gone unknown, whose pid another process holds, are dropped (counted in "
                 "pycollector_profiling_dropped_samples)", pid=tgid, samples=samples, reason=reason)

    def _drop(self, data, reason: str, why: str) -> None:
        dropped = sample_count(data)
        self._dropped.labels(reason=reason).inc(dropped)
        self.log.warning(f"{why}; dropped the held samples", samples=dropped)

    def _hold(self, data, error: RefusedError) -> None:
        """Keep a refused report for the next interval, unless it has grown past the bound."""
        self._held_intervals += 1
        if self._held_intervals > MAX_HELD_REPORTS:
            self._drop(data, "refused", f"downstream refused {self._held_intervals} intervals in a row ({error})")
            self._held_intervals = 0
            return
        self.log.info("downstream refused; holding this interval for the next one", samples=sample_count(data), reason=str(error))
        self._held = data

    def _record_counters(self, counters: dict[str, int]) -> None:
        for warning in counter_warnings(self._last_counters, counters):
            self.log.warning(warning)
        unwind_stats = dict(self.unwind.stats)
        for key, warning in unwind_warnings(self._last_unwind_stats, unwind_stats):
            log_once(self.log, ("unwind", key), "warning", warning)
        self._last_unwind_stats = unwind_stats
        for name, value in counters.items():
            delta = value - self._last_counters.get(name, 0)
            if delta > 0:
                self._bpf_counters.labels(event=name).inc(delta)
        self._last_counters = dict(counters)


def _publish(gauge, owner, prefix: str = "", names: tuple[str, ...] | None = None) -> None:
    """Each of ``owner.stats`` (or those ``names``, for counts that appear only once they happen)
    as the gauge's ``stat="<prefix><name>"``, read at scrape time."""
    for name in names if names is not None else tuple(owner.stats):
        gauge.labels(stat=prefix + name).set_function(lambda name=name: owner.stats.get(name, 0))
