"""Asks each JVM for a fresh perf map now and then (the ``jvm_perf_map_interval`` setting).

A HotSpot JVM writes /tmp/perf-<pid>.map only when asked (the diagnostic command
``Compiler.perfmap``, JDK 17+), with the methods compiled by then; methods compiled later stay
unnamed until it is asked again. When the setting is on, a thread asks every JVM the receiver has
seen, once per interval, through the JVM's attach socket as jcmd would (jvm_attach.py: about
40 ms, where starting jcmd cost half a second of CPU), containers' JVMs included. It is off
by default: the first request starts the JVM's attach listener (SIGQUIT), and each makes it write
its whole map into its /tmp, which a person should choose. A JVM whose listener cannot start is
not asked again once it has run a minute (a younger one may still be installing its handlers).
"""

from __future__ import annotations

from typing import Any

from pycollector.logs import log_once
from pycollector.periodic import Periodic

from ..processes.table import ProcessTable
from .jvm_attach import HELPER_GRACE_S, AttachError, NoListener, run_jcmd
from .perfmap import process_jit_runtime

REQUEST_TIMEOUT_S = 10.0
# A JVM younger than this may not have its SIGQUIT handler yet: its missing listener is not final.
SETTLED_AFTER_S = 60.0


class JvmPerfMapRequester:
    def __init__(self, processes: ProcessTable, interval_s: float, logger: Any):
        self.processes = processes
        self.interval_s = interval_s
        self.log = logger
        self.stats = {"requests": 0, "failures": 0}
        self._periodic = Periodic("profiling-jvm-perf-maps", interval_s, self._request_all, logger)
        self._no_listener: set[tuple[int, int | None]] = set()  # (pid, start time): not asked again

    def start(self) -> None:
        self._periodic.start()

    def close(self) -> None:
        self._periodic.close(timeout=REQUEST_TIMEOUT_S + HELPER_GRACE_S + 1)

    def _request_all(self) -> None:
        jvms = set()
        for tgid in self.processes.tgids():
            info = self.processes.lookup(tgid)
            if info is None or info.exited or process_jit_runtime(info) != "jvm":
                continue
            key = (tgid, info.start_time_ticks)
            jvms.add(key)
            if key in self._no_listener:
                continue
            try:
                self.request(tgid)
            except NoListener:
                if info.age_s() >= SETTLED_AFTER_S:
                    self._no_listener.add(key)
            if self._periodic.stopping:
                return
        self._no_listener &= jvms  # the exited ones

    def request(self, pid: int) -> bool:
        """Ask JVM ``pid`` to write its perf map; False if it did not (counted, and logged once
        per JVM). NoListener is raised on, for the caller to decide whether to ask again."""
        self.stats["requests"] += 1
        try:
            run_jcmd(pid, "Compiler.perfmap", REQUEST_TIMEOUT_S)
        except AttachError as error:
            self.stats["failures"] += 1
            log_once(self.log, ("jvm-perf-map", pid), "warning", "a JVM did not write its perf map; its compiled Java frames stay unnamed",
                     pid=pid, reason=str(error))
            if isinstance(error, NoListener):
                raise
            return False
        return True

