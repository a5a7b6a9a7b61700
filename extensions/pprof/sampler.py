"""Samples this process's Python threads for CPU profiles, as Go's runtime does for goroutines.

A thread of its own wakes ``HZ`` times a second (Go's CPU profile rate) while at least one
recording wants samples, takes every Python thread's stack with ``sys._current_frames()`` (all but
its own) and reads each thread's CPU time.

Why CPU time, and how. Every Python thread has a stack at every tick, busy or not, so counting
stacks would give a wall-clock profile in which a thread blocked in ``select`` weighs as much as one
spinning. Go's CPU profile counts a sample per 10 ms of CPU a thread used; so does this. Each
thread's CPU clock is read with ``clock_gettime`` on the Linux per-thread CPU clock id made from
its kernel thread id (``Thread.native_id``); the CPU used since the last tick is added to the
thread's credit, and each whole ``PERIOD_NS`` of credit is one sample of the stack the thread is in
at the tick. Idle threads use no CPU and are never walked, which keeps the sampler cheap.

Chosen over the alternatives:
- ``/proc/self/task/<tid>/stat`` counts in clock ticks (10 ms, the sampling period itself), so a
  thread's use in one interval reads as 0 or 10 ms; and it costs an open, read and parse per thread
  per tick where ``clock_gettime`` is one system call with nanoseconds.
- ``time.thread_time()`` measures only the calling thread, not another one.
- ``time.pthread_getcpuclockid(ident)`` takes a pthread handle, which is undefined behaviour once
  the thread has exited (it may between taking the frames and reading the clock); a kernel thread
  id that is gone makes ``clock_gettime`` fail with EINVAL, and that thread is skipped.

The CPU time counted is exact whatever the sampler's jitter (a late tick just finds more credit);
what is sampled is which stack it is charged to: the one at the end of the interval. Threads that
no Python code runs on (gRPC's C-core pollers) have no Python stack and are not in these profiles;
neither is the sampler's own thread.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import threading
import time
from types import CodeType, FrameType

HZ = 100  # Go's runtime.SetCPUProfileRate default
PERIOD_NS = 1_000_000_000 // HZ

# A stack: (code object, line) per frame, leaf first, as OTLP stores stacks.
Stack = tuple[tuple[CodeType, int], ...]
# A thread as samples name it: (kernel thread id, thread name).
ThreadKey = tuple[int, str]


def thread_cpu_clock(native_id: int) -> int:
    """The clock id of a thread's CPU time: Linux's ``make_thread_cpuclock(tid, CPUCLOCK_SCHED)``
    (include/linux/posix-timers.h), what glibc's ``pthread_getcpuclockid`` returns."""
    return ((~native_id) << 3) | 0b110  # CPUCLOCK_PERTHREAD_MASK | CPUCLOCK_SCHED


def stack_of(frame: FrameType | None) -> Stack:
    stack = []
    while frame is not None:
        stack.append((frame.f_code, frame.f_lineno or 0))
        frame = frame.f_back
    return tuple(stack)


@dataclasses.dataclass(eq=False)
class Recording:
    """The samples taken between ``CpuSampler.begin`` and ``CpuSampler.end``."""

    start_unix_nano: int
    end_unix_nano: int = 0
    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # (ThreadKey, Stack) -> samples

    @property
    def samples(self) -> int:
        return sum(self.counts.values())

    def add(self, samples: list[tuple[ThreadKey, Stack, int]]) -> None:
        for thread, stack, count in samples:
            self.counts[(thread, stack)] += count


class CpuSampler:
    """One sampling thread for all the recordings of the extension; it sleeps while there is none."""

    def __init__(self, hz: int = HZ):
        self.interval = 1.0 / hz
        self.period_ns = 1_000_000_000 // hz
        self._recordings: list[Recording] = []
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Per thread, (ident, native_id): its CPU clock at the last tick and the CPU time not yet
        # charged as a sample.
        self._cpu: dict[tuple[int, int], int] = {}
        self._credit: dict[tuple[int, int], int] = {}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pprof-sampler", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the sampling thread; safe before ``start`` and safe twice."""
        self._stop.set()
        self._wanted.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def begin(self) -> Recording:
        recording = Recording(start_unix_nano=time.time_ns())
        with self._lock:
            self._recordings.append(recording)
            self._wanted.set()
        return recording

    def end(self, recording: Recording) -> Recording:
        """Stop adding to ``recording``; once this returns, nothing changes it any more."""
        with self._lock:
            if recording in self._recordings:
                self._recordings.remove(recording)
        recording.end_unix_nano = time.time_ns()
        return recording

    # -- the sampling thread -------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wanted.wait()
            # CPU used while nobody was recording is nobody's: start each thread afresh.
            self._cpu.clear()
            self._credit.clear()
            next_tick = time.monotonic()
            while not self._stop.is_set():
                with self._lock:
                    if not self._recordings:
                        self._wanted.clear()
                        break
                self._tick()
                next_tick += self.interval
                delay = next_tick - time.monotonic()
                if delay < 0:  # fell behind (the GIL, a loaded host): carry on, do not catch up in a burst
                    next_tick, delay = time.monotonic(), 0
                self._stop.wait(delay)

    def _tick(self) -> None:
        me = threading.get_ident()
        threads = {thread.ident: thread for thread in threading.enumerate()}
        frames = sys._current_frames()
        samples: list[tuple[ThreadKey, Stack, int]] = []
        seen = set()
        for ident, frame in frames.items():
            thread = threads.get(ident)
            native_id = getattr(thread, "native_id", None)
            if ident == me or native_id is None:  # no kernel id: started outside the threading module
                continue
            key = (ident, native_id)
            try:
                cpu = time.clock_gettime_ns(thread_cpu_clock(native_id))
            except OSError:  # exited since the frames were taken
                continue
            seen.add(key)
            previous = self._cpu.get(key)
            self._cpu[key] = cpu
            if previous is None:
                continue
            count, self._credit[key] = divmod(self._credit.get(key, 0) + cpu - previous, self.period_ns)
            if count:
                samples.append(((native_id, thread.name), stack_of(frame), count))
        frames = frame = None  # frames keep their locals alive
        for gone in self._cpu.keys() - seen:
            del self._cpu[gone]
            self._credit.pop(gone, None)
        if samples:
            with self._lock:
                for recording in self._recordings:
                    recording.add(samples)


@dataclasses.dataclass
class ThreadStack:
    native_id: int | None
    name: str
    daemon: bool
    frame: FrameType


def thread_stacks() -> list[ThreadStack]:
    """Every Python thread and the frame it is in now, by kernel thread id."""
    threads = {thread.ident: thread for thread in threading.enumerate()}
    found = []
    for ident, frame in sys._current_frames().items():
        thread = threads.get(ident)
        found.append(ThreadStack(getattr(thread, "native_id", None), thread.name if thread else f"thread {ident:#x}",
                                 bool(thread and thread.daemon), frame))
    return sorted(found, key=lambda entry: (entry.native_id is None, entry.native_id or 0))
