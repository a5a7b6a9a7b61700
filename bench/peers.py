"""The profilers under test, each launched as a user would run it, at the same frequency:

pycollector     the installed console script with the profiling receiver, exporting OTLP/gRPC to
                the bench's sink (so building, encoding and sending each report is included)
perf            `perf record -F HZ -a -g -o FILE`
perf dwarf      `perf record -F HZ -a --call-graph dwarf -o FILE`: copies 8 KiB of each sampled
                user stack and unwinds it afterwards, the cost eBPF unwinding avoids
profile-bpfcc   BCC's profile tool, `profile-bpfcc -F HZ`, its output to a file
offcputime-bpfcc
                BCC's off-CPU tool, `offcputime-bpfcc -f`, its output to a file; on a kernel
                without kprobes through bench/offcputime_sched_switch.py (see there)

Each knows when it is sampling, so the bench can measure start-up (launch to first sample) apart
from the steady state.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from bench import children, procfs

PYCOLLECTOR = Path(sys.executable).with_name("pycollector")
PROFILE_BPFCC = "/usr/sbin/profile-bpfcc"
OFFCPUTIME_BPFCC = "/usr/sbin/offcputime-bpfcc"
OFFCPUTIME_SCHED_SWITCH = Path(__file__).resolve().with_name("offcputime_sched_switch.py")
# The kprobe PMU: without it BCC cannot attach offcputime-bpfcc's kprobe.
KPROBE_PMU = Path("/sys/bus/event_source/devices/kprobe")
STARTUP_TIMEOUT_S = 120.0
POLL_S = 0.01


class Profiler:
    """One launch of a profiler: ``launch``, ``wait_until_sampling``, then ``stop(profiler)``."""

    name = ""
    # The types of BPF program that do the profiler's work (see sampling_program_id).
    program_types = (procfs.BPF_PROG_TYPE_PERF_EVENT,)

    def __init__(self, workdir: Path, hz: int) -> None:
        self.workdir = workdir
        self.hz = hz
        self.process: subprocess.Popen | None = None
        self.log_path = workdir / f"{self.name.replace(' ', '-')}.log"
        self._launched_at = 0.0

    def argv(self) -> list[str]:
        raise NotImplementedError

    def sampling(self) -> bool:
        raise NotImplementedError

    @property
    def pid(self) -> int:
        return self.process.pid

    def launch(self) -> None:
        with self.log_path.open("w") as log:
            self.process = children.start(self.argv(), stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        self._launched_at = time.monotonic()

    def wait_until_sampling(self) -> tuple[float, float]:
        """(seconds, CPU seconds) from launch to the first sample."""
        deadline = self._launched_at + STARTUP_TIMEOUT_S
        while not self.sampling():
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode} before sampling:\n{self.log_path.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start sampling within {STARTUP_TIMEOUT_S:g} s")
            time.sleep(POLL_S)
        return time.monotonic() - self._launched_at, procfs.tree_cpu_seconds(self.pid)

    def sampling_program_id(self, program_types: tuple[int, ...] | None = None) -> int | None:
        """The id of the BPF program that takes the samples, for a BPF profiler: the one that
        runs, among its programs of ``program_types`` (default: the profiler's own).
        pycollector's unwinder also holds the programs it tail-calls, whose time is counted in the
        caller's and whose run count stays 0."""
        programs = procfs.sampling_bpf_programs(self.pid, program_types or self.program_types)
        return max(programs, key=lambda program: program["run_cnt"])["prog_id"] if programs else None


class _BpfProfiler(Profiler):
    def sampling(self) -> bool:
        # The program's run count moves once it is attached and a CPU has ticked (bpf stats on).
        return any(program["run_cnt"] > 0 for program in procfs.sampling_bpf_programs(self.pid, self.program_types))


# Where every pycollector agent keeps its compiled BPF program when set (the quick bench: the
# host's default cache), rather than a folder of the bench's.
HOST_BPF_CACHE: Path | None = None


class PycollectorAgent(_BpfProfiler):
    name = "pycollector"

    def __init__(self, workdir: Path, hz: int, sink_endpoint: str, reporter_interval_s: float, unwind_cache_dir: Path, metrics_port: int = 0,
                 off_cpu_threshold: float = 0.0, bpf_cache_dir: Path | None = None, receiver_settings: dict | None = None) -> None:
        super().__init__(workdir, hz)
        self.config_path = workdir / "pycollector-bench.yaml"
        # The compiled BPF program is kept beside the rows unless told, in a folder of the bench's
        # (never the host's default, which tests may have filled): the first start compiles, the
        # others load. The quick bench, a smoke test, uses the host's (HOST_BPF_CACHE): its
        # compiles would cost more than all its rounds (8 s each, five configurations).
        bpf_cache_dir = bpf_cache_dir or HOST_BPF_CACHE or unwind_cache_dir.parent / "bpf-cache"
        receiver = {"samples_per_second": hz, "reporter_interval": f"{reporter_interval_s:g}s", "unwind_cache_dir": str(unwind_cache_dir),
                    "bpf_cache_dir": str(bpf_cache_dir)}
        if off_cpu_threshold:
            receiver["off_cpu_threshold"] = off_cpu_threshold
        receiver.update(receiver_settings or {})
        config = {
            "receivers": {"profiling": receiver},
            "exporters": {"otlp_grpc": {"endpoint": sink_endpoint, "tls": {"insecure": True}}},
            "service": {
                "pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["otlp_grpc"]}},
                # Port 0 picks a free one (runs may overlap others'): the bench reads it only when it asks.
                "telemetry": {"metrics": {"address": f"127.0.0.1:{metrics_port}"}},
            },
        }
        self.metrics_port = metrics_port
        self.config_path.write_text(yaml.safe_dump(config))

    def argv(self) -> list[str]:
        return [str(PYCOLLECTOR), "--config", str(self.config_path)]


class PycollectorWaitsAgent(PycollectorAgent):
    """The agent with lock and I/O waits on (lock_profiling, io_profiling: issue 44) besides
    whatever else it is given, every lock and I/O wait recorded (the highest budget)."""

    name = "pycollector +lock +io"
    WAITS = {"lock_profiling": True, "io_profiling": True, "wait_events_per_second": 100_000}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs, receiver_settings=self.WAITS)


class ProfileBpfcc(_BpfProfiler):
    name = "profile-bpfcc"

    def argv(self) -> list[str]:
        return [PROFILE_BPFCC, "-F", str(self.hz)]


class OffCpuTimeBpfcc(_BpfProfiler):
    """Off-CPU time by stack for every thread on the host, printed (folded) when interrupted.
    Its program runs on every context switch: on finish_task_switch (a kprobe), or on the
    sched_switch raw tracepoint where the kernel has no kprobes."""

    name = "offcputime-bpfcc"
    program_types = (procfs.BPF_PROG_TYPE_KPROBE, procfs.BPF_PROG_TYPE_RAW_TRACEPOINT)

    def argv(self) -> list[str]:
        if KPROBE_PMU.exists():
            return [OFFCPUTIME_BPFCC, "-f"]
        return ["/usr/bin/python3", str(OFFCPUTIME_SCHED_SWITCH), "-f"]  # the tool's own #! interpreter


class PerfRecord(Profiler):
    name = "perf"

    def __init__(self, workdir: Path, hz: int) -> None:
        super().__init__(workdir, hz)
        self.data_path = workdir / "perf.data"

    def argv(self) -> list[str]:
        return [shutil.which("perf") or "perf", "record", "-F", str(self.hz), "-a", "-g", "-o", str(self.data_path)]

    def sampling(self) -> bool:
        # perf maps a ring buffer per CPU once its events are open, right before enabling them.
        return procfs.perf_event_mappings(self.pid) >= procfs.online_cpus()


class PerfDwarf(PerfRecord):
    name = "perf dwarf"

    def argv(self) -> list[str]:
        return [shutil.which("perf") or "perf", "record", "-F", str(self.hz), "-a", "--call-graph", "dwarf", "-o", str(self.data_path)]


def stop(*profilers: Profiler) -> None:
    """Interrupt them together, so that profilers run side by side stop sampling at once."""
    codes = children.stop(*(profiler.process for profiler in profilers))
    for profiler, code in zip(profilers, codes):
        if code not in (0, -signal.SIGINT):  # perf re-raises SIGINT once its file is written
            raise RuntimeError(f"{profiler.name} exited with {code} when stopped:\n{profiler.log_path.read_text()[-3000:]}")
