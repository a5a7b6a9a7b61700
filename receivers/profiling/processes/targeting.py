"""Which processes are profiled: the ``process_filter`` and ``filter_min_process_age`` settings.

With either set, the BPF program samples only the tgids in its ``target_tgids`` map, and this
module keeps that set: every process at start (a walk of /proc), every program that is exec'd
(the kernel's exec events), and, for ``filter_min_process_age``, a process once it is old enough.
A process forked by a target is made one by the kernel itself, before it could run unseen.
Excluded processes cost the kernel one map lookup per sample: no sample, no stack, no entry in any
other map, nothing read from their /proc.

A process is a target when every criterion that is set matches (regular expressions, searched):
its executable's name (``executable``: "java|python|go" as the standalone agent's
-process-filter), its command line joined by spaces (``command_line``), its container id
(``container_id``; ``container: true`` any container, ``false`` none) and its cgroup paths
(``cgroup``, each line of /proc/PID/cgroup), and it has run for ``filter_min_process_age``.
"""

from __future__ import annotations

import heapq
import os
import re
import threading
import time
from typing import Any

import pydantic

from pycollector.component import ComponentConfig

from .proc import MAX_CMDLINE_BYTES, container_id_from_cgroup


class ProcessFilter(ComponentConfig):
    executable: str | None = None
    command_line: str | None = None
    container: bool | None = None
    container_id: str | None = None
    cgroup: str | None = None

    @pydantic.field_validator("executable", "command_line", "container_id", "cgroup")
    @classmethod
    def _regular_expression(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as error:
                raise ValueError(f"not a regular expression: {error}") from None
        return value

    def is_set(self) -> bool:
        return any(value is not None for value in self.model_dump().values())


class Targeting:
    def __init__(self, tgids: Any, process_filter: ProcessFilter, min_age_s: float, logger: Any, proc: str = "/proc"):
        """``tgids``: the BPF map target_tgids (u32 -> u8)."""
        self._map = tgids
        self._filter = process_filter
        self._patterns = {name: re.compile(value) for name, value in process_filter.model_dump().items()
                          if value is not None and name != "container"}
        self._min_age_s = min_age_s
        self.log = logger
        self._proc = proc
        self._lock = threading.Lock()
        self._targets: set[int] = set()
        # (when old enough, tgid), a heap; times since boot (CLOCK_BOOTTIME), which is what
        # /proc/PID/stat's start time counts, to the tick (btime, in whole seconds, is not)
        self._too_young: list[tuple[float, int]] = []
        self._ticks = os.sysconf("SC_CLK_TCK")
        self.stats = {"targets": 0, "considered": 0, "excluded": 0}

    def start(self) -> None:
        """Every process running now."""
        for name in os.listdir(self._proc):
            if name.isdigit():
                self.consider(int(name))
        self.log.info("profiling only the processes the settings select", targets=len(self._targets),
                      considered=self.stats["considered"])

    def consider(self, tgid: int) -> bool:
        """Decide (again, after an exec) whether ``tgid`` is a target; True if it is one now."""
        facts = self._facts(tgid)
        with self._lock:
            self.stats["considered"] += 1
            if facts is None or not self._matches(facts):
                self.stats["excluded"] += facts is not None
                self._remove(tgid)
                return False
            ready_at = facts["started"] + self._min_age_s
            if ready_at > time.clock_gettime(time.CLOCK_BOOTTIME):
                heapq.heappush(self._too_young, (ready_at, tgid))
                self._remove(tgid)  # an exec'd target starts its age again
                return False
            self._add(tgid)
            return True

    def tick(self) -> None:
        """Called now and then (each report): processes that came of age become targets; those
        that exited leave the set (the kernel forgets nothing by itself)."""
        now = time.clock_gettime(time.CLOCK_BOOTTIME)
        with self._lock:
            ready = []
            while self._too_young and self._too_young[0][0] <= now:
                ready.append(heapq.heappop(self._too_young)[1])
        for tgid in ready:
            self.consider(tgid)
        with self._lock:
            in_kernel = {key.value for key in self._map.keys()}  # forked ones too
            for tgid in in_kernel:
                if not os.path.exists(f"{self._proc}/{tgid}"):
                    self._remove(tgid)
                elif tgid not in self._targets:
                    self._targets.add(tgid)
            self.stats["targets"] = len(self._targets)

    def forget(self, tgid: int) -> None:
        """The process exited (the process table says so): its pid is not a target any more; a
        process reusing it is considered on its own."""
        with self._lock:
            self._remove(tgid)

    # -- inside ---------------------------------------------------------------------------------

    def _facts(self, tgid: int) -> dict | None:
        base = f"{self._proc}/{tgid}"
        try:
            with open(f"{base}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            with open(f"{base}/cmdline", "rb") as cmdline:
                command_line = cmdline.read(MAX_CMDLINE_BYTES).rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
            with open(f"{base}/cgroup") as cgroup:
                cgroups = cgroup.read()
        except OSError:
            return None  # exited, or a kernel thread's parts are missing
        try:
            executable = os.path.basename(os.readlink(f"{base}/exe".encode()).decode("utf-8", "replace")).removesuffix(" (deleted)")
        except OSError:
            return None  # a kernel thread: never sampled with a user stack, never a target
        return {
            "executable": executable,
            "command_line": command_line,
            "cgroup": cgroups,
            "container_id": container_id_from_cgroup(cgroups),
            "started": int(fields[19]) / self._ticks,  # seconds after boot
        }

    def _matches(self, facts: dict) -> bool:
        if self._filter.container is not None and (facts["container_id"] is not None) != self._filter.container:
            return False
        for name, pattern in self._patterns.items():
            value = facts[name]
            lines = value.splitlines() if name == "cgroup" else [value or ""]
            if not any(pattern.search(line) for line in lines):
                return False
        return True

    def _add(self, tgid: int) -> None:
        if tgid not in self._targets:
            self._map[self._map.Key(tgid)] = self._map.Leaf(1)
            self._targets.add(tgid)
            self.stats["targets"] = len(self._targets)

    def _remove(self, tgid: int) -> None:
        self._targets.discard(tgid)
        try:
            del self._map[self._map.Key(tgid)]
        except KeyError:
            pass
        self.stats["targets"] = len(self._targets)

