"""What walking Java and JavaScript frames in the kernel costs, against native frames: the agent
on a host busy with one copy of a workload per CPU, C (known_split.c, frame pointers), Java
(KnownSplit under plain java: no frame pointers, no perf map) and Node.js (known_split.js under
plain node), in rotated order each round. Figures: the BPF program's run time per sample
(bpf_stats) and the agent's CPU per second (it names the frames), the C workload's the peer of
the others'.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from bench import children, peers, procfs, rounds
from bench.figures import Row, per_round
from bench.python_frames import measure_pycollector
from bench.rounds import Run
from bench.settings import Settings
from bench.sink import ProfilesSink
from bench.workload import WORKLOADS

C, JAVA, NODE = "C workload", "busy JVM", "busy Node.js"
MODES = (C, JAVA, NODE)
JDK = Path("/usr/lib/jvm/java-17-openjdk-amd64/bin")


def run_rounds(settings: Settings, c_binary: Path, workdir: Path, sink: ProfilesSink) -> list[Run]:
    classes = workdir / "java-classes"
    if not classes.exists():
        subprocess.run([str(JDK / "javac"), "-d", str(classes), str(WORKLOADS / "KnownSplit.java")], check=True)
    return rounds.rotated(settings.rounds, MODES, workdir, "runtime frames", lambda mode, index, rundir: _run(mode, index, settings, rundir, sink, c_binary, classes))


def _command(mode: str, seconds: float, c_binary: Path, classes: Path) -> list[str]:
    if mode == JAVA:
        return [str(JDK / "java"), "-cp", str(classes), "KnownSplit", f"{seconds:g}"]
    if mode == NODE:
        return [shutil.which("node") or "node", str(WORKLOADS / "known_split.js"), f"{seconds:g}"]
    return [str(c_binary), f"{seconds:g}"]


def _run(mode: str, index: int, settings: Settings, rundir: Path, sink: ProfilesSink, c_binary: Path, classes: Path) -> Run:
    seconds = peers.STARTUP_TIMEOUT_S + settings.settle_seconds + settings.workload_seconds
    copies = [children.start(_command(mode, seconds, c_binary, classes), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
              for _ in range(procfs.online_cpus())]
    try:
        time.sleep(2.0)  # the runtimes are up and compiling
        return measure_pycollector(index, settings, rundir, sink, mode=mode)
    finally:
        children.stop(*copies)


def rows(runs: list[Run]) -> list[Row]:
    section = "Java and JavaScript frames"
    out = []
    for mode in (JAVA, NODE):
        out.append(Row(section, f"BPF run time per sample, ns (bpf_stats), {mode}", per_round(runs, mode, "bpf_ns_per_sample"),
                       C, per_round(runs, C, "bpf_ns_per_sample"), "{:.0f}"))
        out.append(Row(section, f"Agent CPU seconds per second, {mode}", per_round(runs, mode, "agent_cpu_per_second"),
                       C, per_round(runs, C, "agent_cpu_per_second"), "{:.4f}"))
    return out
