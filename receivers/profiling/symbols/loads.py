"""Work on files done off the report thread, waited for only so long.

Reading a file's symbols takes milliseconds, and up to its deadline for a large or crafted one;
a read of a file whose file system stops answering may not return at all. The report thread
hands that work to these threads and waits for it at most ``wait_s``, and ``report_wait_s`` in
all for one report: what is not done by then is used by a later report (its frames stay unnamed
in this one, counted), and no report waits for a file past its allowance.

``parallel`` threads take the queue, so that one long read (a runtime's 100 MB binary: seconds
on a loaded host) does not hold every small file queued behind it past its report. A thread
that stays on one job longer than ``stuck_s`` is left to it (it cannot be stopped) and another
takes the queue, up to ``max_threads`` threads: a file that never answers holds one thread, not
the symbolization of every file after it.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any


class _Job:
    __slots__ = ("work", "done", "value", "error")

    def __init__(self, work: Callable[[], Any]) -> None:
        self.work = work
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class BackgroundLoads:
    def __init__(self, name: str, *, wait_s: float = 2.0, report_wait_s: float = 3.0, stuck_s: float = 30.0,
                 parallel: int = 2, max_threads: int = 4, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.wait_s, self.report_wait_s, self.stuck_s = wait_s, report_wait_s, stuck_s
        self.parallel, self.max_threads = parallel, max(max_threads, parallel)
        self._clock = clock
        self._lock = threading.Condition()
        self._jobs: dict[Hashable, _Job] = {}
        self._queue: collections.deque[Hashable] = collections.deque()
        self._busy: dict[int, tuple[Hashable, float]] = {}  # worker number -> (its job's key, since)
        self._workers = 0  # started, the stuck ones included
        self._stuck: set[int] = set()
        self._closed = False
        self._wait_left = float("inf")  # (until the first report: a caller outside reports waits wait_s a job)
        self.stats = {"loads": 0, "loads_deferred": 0, "loads_stuck": 0}

    def new_report(self) -> None:
        """A report starts: it may wait report_wait_s in all."""
        self._wait_left = self.report_wait_s

    def result(self, key: Hashable, work: Callable[[], Any], *, wait: bool = True) -> tuple[bool, Any]:
        """(True, what ``work`` returned) once the job for ``key`` is done, starting it if it is
        not under way; (False, None) while it is not, after waiting what this report may (not at
        all with ``wait`` False). The job's exception, if it raised, is raised here."""
        with self._lock:
            if self._closed:  # (no threads any more: a caller after close() does the work itself)
                return True, work()
            job = self._jobs.get(key)
            if job is None:
                job = self._jobs[key] = _Job(work)
                self._queue.append(key)
                self.stats["loads"] += 1
                self._ensure_worker()
                self._lock.notify()
        if wait and not job.done.is_set() and self._wait_left > 0:
            started = self._clock()
            job.done.wait(min(self.wait_s, self._wait_left))
            self._wait_left -= self._clock() - started
        if not job.done.is_set():
            if wait:
                self.stats["loads_deferred"] += 1
            self._replace_stuck()
            return False, None
        with self._lock:
            self._jobs.pop(key, None)
        if job.error is not None:
            raise job.error
        return True, job.value

    def discard(self, key: Hashable) -> None:
        """Forget the finished job for ``key`` (its result taken another way)."""
        with self._lock:
            job = self._jobs.get(key)
            if job is not None and job.done.is_set():
                del self._jobs[key]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def _ensure_worker(self) -> None:
        """A thread for the job just queued: an idle one, or a new one while fewer than
        ``parallel`` are working (the lock held)."""
        working = self._workers - len(self._stuck)
        idle = working - sum(1 for number in self._busy if number not in self._stuck)
        if len(self._queue) > idle and working < self.parallel and self._workers < self.max_threads:
            self._start_worker()

    def _start_worker(self) -> None:
        number = self._workers
        self._workers += 1
        threading.Thread(target=self._work, args=(number,), name=f"{self.name}-{number}", daemon=True).start()

    def _replace_stuck(self) -> None:
        """Leave a worker that has been on one job past stuck_s to it, and start another."""
        now = self._clock()
        with self._lock:
            for number, (_key, since) in list(self._busy.items()):
                if number not in self._stuck and now - since > self.stuck_s:
                    self._stuck.add(number)
                    self.stats["loads_stuck"] += 1
            self._ensure_worker()

    def _work(self, number: int) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed and number not in self._stuck:
                    self._lock.wait()
                if self._closed or number in self._stuck:
                    return
                key = self._queue.popleft()
                job = self._jobs[key]
                self._busy[number] = (key, self._clock())
            try:
                job.value = job.work()
            except BaseException as error:  # noqa: BLE001 - handed to the one waiting for it
                job.error = error
            finally:
                with self._lock:
                    self._busy.pop(number, None)
                job.done.set()
