"""JIT-compiled frames: their names from the process's perf map, their type from its runtime.

Code a runtime compiles at run time lives in anonymous executable memory, where no ELF file has a
symbol for it. A runtime that writes a perf map names it there (see perfmap.py): Node.js with
``--perf-basic-prof``, a JVM on ``jcmd PID Compiler.perfmap``. Frames in such memory are typed
after the runtime, as OpenTelemetry's profiling conventions do (``v8js``, ``jvm``), named or not;
any other process's perf map (LuaJIT, .NET, a custom JIT) still names its frames, typed native.
"""

from __future__ import annotations

import threading

from ..processes.proc import ProcessInfo
from .perfmap import PerfMaps, process_jit_runtime

# The runtimes' frame types, and the tracer name (the Go receiver's) that turns each on.
TRACER_OF_RUNTIME = {"v8js": "v8", "jvm": "hotspot"}


class JitNames:
    def __init__(self, perf_maps: PerfMaps, runtimes: set[str]):
        """``runtimes``: the frame types whose processes are named (the others' JIT frames stay
        native and unnamed); processes of no known runtime are always looked up."""
        self.perf_maps = perf_maps
        self._runtimes = runtimes
        self._lock = threading.Lock()
        self._runtime_of: dict[int, tuple[ProcessInfo, str | None]] = {}

    def frame(self, info: ProcessInfo, addr: int) -> tuple[str | None, int, str]:
        """(name or None, start of the named code, frame type) of a JIT address."""
        name, start = self.name(info, addr) or (None, 0)
        runtime = self._runtime(info)
        return name, start, runtime if runtime in self._runtimes else "native"

    def name(self, info: ProcessInfo, addr: int) -> tuple[str, int] | None:
        """The perf map's name for an address no ELF symbol covers (V8's builtins are in the
        node executable, named in the map when the executable is stripped)."""
        runtime = self._runtime(info)
        if runtime is not None and runtime not in self._runtimes:
            return None
        return self.perf_maps.lookup_process(info, addr)

    def state(self, info: ProcessInfo) -> tuple | None:
        """A value that changes when the process's JIT names may have (PerfMaps.state); None
        for a process whose runtime's frames are not named."""
        runtime = self._runtime(info)
        if runtime is not None and runtime not in self._runtimes:
            return None
        return self.perf_maps.state(info)

    def new_report(self) -> None:
        self.perf_maps.new_report()

    def forget(self, pid: int) -> None:
        with self._lock:
            self._runtime_of.pop(pid, None)
        self.perf_maps.forget(pid)

    def _runtime(self, info: ProcessInfo) -> str | None:
        with self._lock:
            known = self._runtime_of.get(info.pid)
            if known is not None and known[0] is info:
                return known[1]
        runtime = process_jit_runtime(info)  # a scan of its mappings: once per snapshot
        with self._lock:
            self._runtime_of[info.pid] = (info, runtime)
        return runtime
