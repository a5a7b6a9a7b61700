"""Asks each JVM for a fresh perf map now and then (the ``jvm_perf_map_interval`` setting).

A HotSpot JVM writes /tmp/perf-<pid>.map only when asked (``jcmd PID Compiler.perfmap``, JDK 17+),
with the methods compiled by then; methods compiled later stay unnamed until it is asked again.
When the setting is on, a thread runs that command for every JVM the receiver has seen, once per
interval. It is off by default: each jcmd starts a small JVM of its own (about half a second of
CPU) and makes the target JVM write its whole map, which a person should choose to pay for.

jcmd runs as the JVM's user (the attach mechanism refuses other users, root included), and is
the one beside the JVM's own ``java`` when the JVM shares our mount namespace, else the host's
(jcmd reaches a container's JVM through /proc/PID/root and its pid inside the namespace).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

from pycollector.logs import log_once

from .perfmap import process_jit_runtime
from .periodic import Periodic
from .processes import ProcessTable

JCMD_TIMEOUT_S = 30.0


class JvmPerfMapRequester:
    def __init__(self, processes: ProcessTable, interval_s: float, logger: Any):
        self.processes = processes
        self.interval_s = interval_s
        self.log = logger
        self.stats = {"requests": 0, "failures": 0}
        self._periodic = Periodic("profiling-jvm-perf-maps", interval_s, self._request_all)

    def start(self) -> None:
        self._periodic.start()

    def close(self) -> None:
        self._periodic.close(timeout=JCMD_TIMEOUT_S + 1)

    def _request_all(self) -> None:
        for tgid in self.processes.tgids():
            info = self.processes.lookup(tgid)
            if info is not None and not info.exited and process_jit_runtime(info) == "jvm":
                self.request(tgid, info.exe_path)
            if self._periodic.stopping:
                return

    def request(self, pid: int, exe_path: str | None) -> bool:
        """Ask JVM ``pid`` to write its perf map; False (counted, logged once per JVM) if it did not."""
        jcmd = _jcmd_for(pid, exe_path)
        if jcmd is None:
            log_once(self.log, ("jvm-perf-map-jcmd", pid), "warning", "no jcmd to ask this JVM for its perf map (install a JDK's jcmd on the host)", pid=pid)
            self.stats["failures"] += 1
            return False
        try:
            status = os.stat(f"/proc/{pid}")
            done = subprocess.run([jcmd, str(pid), "Compiler.perfmap"], capture_output=True, text=True, timeout=JCMD_TIMEOUT_S,
                                  user=status.st_uid, group=status.st_gid)
            failure = None if done.returncode == 0 else (done.stdout + done.stderr).strip()[-300:]
        except (OSError, subprocess.SubprocessError) as error:
            failure = str(error)
        self.stats["requests"] += 1
        if failure is not None:
            self.stats["failures"] += 1
            log_once(self.log, ("jvm-perf-map", pid), "warning", "a JVM did not write its perf map; its compiled Java frames stay unnamed", pid=pid, jcmd=jcmd, reason=failure)
            return False
        return True


def _jcmd_for(pid: int, exe_path: str | None) -> str | None:
    try:
        same_namespace = os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt")
    except OSError:
        return None
    if same_namespace and exe_path:
        beside = os.path.join(os.path.dirname(exe_path), "jcmd")
        if os.access(beside, os.X_OK):
            return beside
    return shutil.which("jcmd")
