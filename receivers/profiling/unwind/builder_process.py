"""The process that builds unwind rows for large files (RowSource's helper).

Building is pure Python and takes seconds for a large library; in a process of its own it runs on
another core and leaves the collector's GIL to the threads that read the perf buffers, and a
build past its time is ended by killing it. The helper opens no file: it is sent the bytes the
collector read and hashed (rows.CfiInput), so the rows it returns are those of the bytes that
key them.

Neither multiprocessing.Pool nor concurrent.futures fits: a Pool's task waits forever when its
process is killed (the OOM killer), and a ProcessPoolExecutor whose process was killed while
sending its answer leaves the interpreter's exit waiting for the rest of that answer. Here the
collector reads answers from a pipe whose other end only the helper holds: when the helper dies,
the read ends at once (EOF), whatever it was doing; and the helper is a daemon process, ended at
the collector's exit rather than waited for.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import signal
import time
from collections.abc import Callable

from receivers.profiling.unwind.rows import CfiInput, NoRows, rows_from

POLL_S = 0.2  # how often a waiting build checks whether the collector is stopping
# The longest one file's rows may take: libLLVM's (120 MB) take about 8 s. A file the sampled
# process crafted to take longer is given up (and not tried again: the registry marks it failed).
MAX_BUILD_S = 60.0


class HelperDied(RuntimeError):
    """The row builder's process ended while it was building a file's rows."""


class BuildTimeout(NoRows):
    """A file's rows took longer than their time budget: the build was abandoned."""


class BuilderProcess:
    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")  # not fork: the collector has threads and BPF maps
        requests_read, self._requests = context.Pipe(duplex=False)
        self._answers, answers_write = context.Pipe(duplex=False)
        self.process = context.Process(target=_serve, args=(requests_read, answers_write), name="pycollector-unwind-rows", daemon=True)
        self.process.start()
        requests_read.close()  # the helper's ends: closed here, so its death reads as EOF
        answers_write.close()
        # Set once a build saw it die: its pipe or sentinel tells before the kernel lets it be
        # reaped, and is_alive() (waitpid) says alive meanwhile, so the next file would have gone
        # to the dead helper too (ci18, the row builder test on a loaded host).
        self._died = False

    def alive(self) -> bool:
        return not self._died and self.process.is_alive()

    def _dead(self, message: str) -> HelperDied:
        self._died = True
        return HelperDied(message)

    def build(self, cfi: CfiInput, stopping: Callable[[], bool], timeout_s: float = MAX_BUILD_S) -> bytes:
        """The rows of ``cfi`` (ValueError when it has none); HelperDied if the helper ends first;
        NoRows("stopping") when ``stopping()`` turns true meanwhile; BuildTimeout past
        ``timeout_s``, the helper ended (the next build starts another). One build at a time."""
        deadline = time.monotonic() + timeout_s
        try:
            self._requests.send(cfi)
        except OSError:
            raise self._dead("the helper process building unwind rows is gone") from None
        while True:
            ready = multiprocessing.connection.wait([self._answers, self.process.sentinel], timeout=POLL_S)
            if self._answers in ready:
                try:
                    built, value = self._answers.recv()
                except (EOFError, OSError):
                    ready = [self.process.sentinel]  # it died mid-answer
                else:
                    if built:
                        return value
                    raise value
            if stopping():  # (stop() ends the helper: that death is no news)
                raise NoRows("stopping")
            if not ready and time.monotonic() > deadline:
                self.stop()
                raise BuildTimeout(f"its rows took more than {timeout_s:g} s to build; given up")
            if ready:  # the sentinel alone: it died without a word
                raise self._dead("the helper process building unwind rows died while building this file's")

    def stop(self) -> None:
        """End the helper, abandoning a build under way."""
        if self.process.is_alive():
            self.process.terminate()
        self.process.join(timeout=5)
        self._requests.close()
        self._answers.close()


def _serve(requests, answers) -> None:
    """The helper's loop: a request, its rows or the error that says why there are none."""
    # Ctrl-C in a terminal reaches the whole process group: the collector decides when the
    # helper stops (closing its end, or terminate()), not a KeyboardInterrupt traceback here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            cfi = requests.recv()
        except EOFError:  # the collector closed its end: stop
            return
        try:
            answer = (True, rows_from(cfi))
        except Exception as error:  # the collector raises it (NoRows, ValueError...)
            answer = (False, error)
        answers.send(answer)
