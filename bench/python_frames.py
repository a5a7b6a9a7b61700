"""Python frames' cost, on a host running several Python processes, against py-spy.

The workload: one known_split.py per CPU, under different CPythons where pyenv has them (Debian's
python3 otherwise), running for the whole round. Each round runs, in a rotated order:

pycollector     the agent (Python frames on by default) at HZ: its CPU (the agent and its helper)
                and its BPF program's run time, which the kernel charges to the sampled processes,
                per second of the window; and that run time per sample.
py-spy          `py-spy record --rate HZ --pid PID` for each Python process, as a Python user
                profiles a process: the CPU of all of them per second of the window.

Target: pycollector's total CPU (agent + BPF) below py-spy's at the same rate.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench import bpf_stats, children, peers, procfs, rounds
from bench.figures import Row, Summary, per_round
from bench.peers import PycollectorAgent
from bench.rounds import Run
from bench.settings import Settings
from bench.sink import ProfilesSink
from bench.workload import WORKLOADS

SCRIPT = WORKLOADS / "known_split.py"
PYENV = Path(os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))) / "versions"
PY_SPY = "py-spy"
MODES = (PycollectorAgent.name, PY_SPY)
ATTACH_TIMEOUT_S = 30.0


def interpreters(count: int) -> list[str]:
    """``count`` CPythons, as varied as the host has: pyenv's newest first, then Debian's."""
    versions = sorted(PYENV.glob("3.*"), key=lambda path: [int(part) for part in path.name.split(".") if part.isdigit()], reverse=True)
    found = [path / "bin" / f"python{'.'.join(path.name.split('.')[:2])}" for path in versions]
    pool = [str(path) for path in found if path.exists()] + ["/usr/bin/python3"]
    return [pool[index % len(pool)] for index in range(count)]


class PySpy:
    """py-spy on each of the workload's processes (it profiles one process per instance)."""

    name = PY_SPY

    def __init__(self, workdir: Path, hz: int, pids: list[int]) -> None:
        self.workdir, self.hz, self.pids = workdir, hz, pids
        self.processes: list[subprocess.Popen] = []

    def launch(self) -> None:
        executable = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
        if executable is None:
            raise RuntimeError("py-spy is not installed (pip install py-spy; the test extras have it)")
        for pid in self.pids:
            log = (self.workdir / f"py-spy-{pid}.log").open("w")
            self.processes.append(children.start([executable, "record", "--rate", str(self.hz), "--pid", str(pid), "--format", "raw",
                                                  "--output", str(self.workdir / f"py-spy-{pid}.txt")], stdout=log, stderr=subprocess.STDOUT))

    def wait_until_sampling(self) -> None:
        """py-spy says "Sampling process ..." once attached."""
        deadline = time.monotonic() + ATTACH_TIMEOUT_S
        for pid in self.pids:
            log = self.workdir / f"py-spy-{pid}.log"
            while "Sampling process" not in log.read_text(errors="replace"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"py-spy did not attach to {pid}:\n{log.read_text()[-2000:]}")
                time.sleep(peers.POLL_S)

    def cpu_seconds(self) -> float:
        return sum(procfs.tree_run_seconds(process.pid) for process in self.processes)

    def stop(self) -> None:
        children.stop(*self.processes)


def run_rounds(settings: Settings, workdir: Path, sink: ProfilesSink) -> list[Run]:
    return rounds.rotated(settings.rounds, MODES, workdir, "python frames", lambda mode, index, rundir: _run(mode, index, settings, rundir, sink))


def _run(mode: str, index: int, settings: Settings, rundir: Path, sink: ProfilesSink) -> Run:
    # The copies run through the profiler's start-up, the settling time and the window.
    seconds = peers.STARTUP_TIMEOUT_S + settings.settle_seconds + settings.workload_seconds
    copies = [children.start([python, str(SCRIPT), f"{seconds:g}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
              for python in interpreters(procfs.online_cpus())]
    try:
        time.sleep(0.5)  # the interpreters are running their script
        if mode == PY_SPY:
            return _measure_py_spy(index, settings, rundir, [copy.pid for copy in copies])
        return measure_pycollector(index, settings, rundir, sink)
    finally:
        children.stop(*copies)


def measure_pycollector(index: int, settings: Settings, rundir: Path, sink: ProfilesSink, mode: str = PycollectorAgent.name) -> Run:
    """The agent's CPU, its BPF program's run time (per second and per sample) and its peak RSS
    over the window, the workload already running."""
    agent = PycollectorAgent(rundir, settings.hz, sink.endpoint, settings.reporter_interval_s, rounds.unwind_cache_dir(rundir))
    agent.launch()
    try:
        agent.wait_until_sampling()
        time.sleep(settings.settle_seconds)  # its first report has met every interpreter
        program = agent.sampling_program_id()
        bpf_before = bpf_stats.program_stats(program)
        cpu_before = procfs.tree_run_seconds(agent.pid)
        load = procfs.load_average()
        began = time.monotonic()
        time.sleep(settings.workload_seconds)
        window = time.monotonic() - began
        run_time_ns, run_count = (after - before for after, before in zip(bpf_stats.program_stats(program), bpf_before))
        agent_cpu = (procfs.tree_run_seconds(agent.pid) - cpu_before) / window
        peak_rss = procfs.memory_kib(agent.pid, "VmHWM") / procfs.KIB_PER_MIB
    finally:
        peers.stop(agent)
    sink.take()
    figures = {"agent_cpu_per_second": agent_cpu, "bpf_cpu_per_second": run_time_ns / 1e9 / window,
               "bpf_ns_per_sample": run_time_ns / run_count if run_count else float("nan"), "peak_rss_mib": peak_rss}
    figures["total_cpu_per_second"] = figures["agent_cpu_per_second"] + figures["bpf_cpu_per_second"]
    return Run(mode, index, load, figures)


def _measure_py_spy(index: int, settings: Settings, rundir: Path, pids: list[int]) -> Run:
    spy = PySpy(rundir, settings.hz, pids)
    spy.launch()
    try:
        spy.wait_until_sampling()
        time.sleep(settings.settle_seconds)
        cpu_before = spy.cpu_seconds()
        load = procfs.load_average()
        began = time.monotonic()
        time.sleep(settings.workload_seconds)
        window = time.monotonic() - began
        cpu = (spy.cpu_seconds() - cpu_before) / window
        peak_rss = sum(procfs.memory_kib(process.pid, "VmHWM") for process in spy.processes) / procfs.KIB_PER_MIB
    finally:
        spy.stop()
    return Run(PY_SPY, index, load, {"total_cpu_per_second": cpu, "peak_rss_mib": peak_rss})


def _below_py_spy(_ours: Summary, _peer: Summary, ratio: Summary) -> str:
    verdict = "met" if ratio.median < 1 else f"missed: {ratio.median:.2f}x"
    return f"below py-spy's: {verdict}"


def rows(runs: list[Run]) -> list[Row]:
    ours, section = PycollectorAgent.name, "Python frames"
    return [
        Row(section, "CPU seconds per second: agent + BPF, one Python process per CPU", per_round(runs, ours, "total_cpu_per_second"),
            PY_SPY, per_round(runs, PY_SPY, "total_cpu_per_second"), "{:.4f}", _below_py_spy),
        Row(section, "CPU seconds per second: the agent alone", per_round(runs, ours, "agent_cpu_per_second"), "", [], "{:.4f}"),
        Row(section, "BPF run time per sample, ns (bpf_stats), Python frames on", per_round(runs, ours, "bpf_ns_per_sample"), "", [], "{:.0f}"),
        Row(section, "Peak RSS (VmHWM), MiB (py-spy: all its processes)", per_round(runs, ours, "peak_rss_mib"), PY_SPY, per_round(runs, PY_SPY, "peak_rss_mib"), "{:.0f}"),
    ]
