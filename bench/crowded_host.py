"""The agent on a crowded host: 40 CPython processes (settings.crowded_processes) (Debian's python3 running the
known 75/25 workload, as an ordinary user) keep every CPU busy; pycollector starts with the
systemd unit's config (deploy/systemd/config.yaml, sending to the bench's sink), as root (it
raises its own priority, pycollector/priority.py; the unit gives it Nice= from exec). Figures:
seconds from launch to "pycollector started", and its CPU (process tree, % of one core) over
WINDOW after the start, when the start-up work is done. The peer: the same start on the same
host without the busy processes, in the same round."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import yaml

from bench import children, procfs
from bench.figures import Row, Summary
from bench.peers import PYCOLLECTOR
from bench.sink import ProfilesSink
from bench.workload import WORKLOADS

NOBODY = 65534
STARTED = "pycollector started"
START_TARGET_S = 5.0
CPU_TARGET = 0.01
SECTION = "Crowded host"
CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "systemd" / "config.yaml"


@dataclasses.dataclass
class CrowdedRound:
    crowded_start_s: float
    idle_start_s: float
    cpu_share: float  # of one core, over the window
    busy_processes: int


def _config(workdir: Path, sink: ProfilesSink) -> Path:
    config = yaml.safe_load(CONFIG.read_text())
    config["exporters"] = {"otlp_grpc": {"endpoint": sink.endpoint, "tls": {"insecure": True}}}
    config["service"]["pipelines"]["profiles"]["exporters"] = ["otlp_grpc"]
    config["service"]["telemetry"] = {"metrics": {"level": "none"}}
    config["extensions"]["health_check"]["endpoint"] = "127.0.0.1:0"
    config["extensions"]["file_storage"]["directory"] = str(workdir / "file_storage")
    path = workdir / "crowded-host.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _start(config: Path, log_path: Path) -> tuple[subprocess.Popen, float]:
    """The agent, and the seconds from its launch to its "started" line."""
    began = time.monotonic()
    with log_path.open("w") as log:
        agent = children.start([str(PYCOLLECTOR), "--config", str(config)], stdout=log, stderr=subprocess.STDOUT)
    while STARTED not in log_path.read_text():
        if agent.poll() is not None:
            raise RuntimeError(f"pycollector exited with {agent.returncode}:\n{log_path.read_text()[-3000:]}")
        if time.monotonic() - began > 300:
            raise RuntimeError("pycollector did not start in 300 s")
        time.sleep(0.05)
    return agent, time.monotonic() - began


def run_rounds(workdir: Path, rounds: int, window: tuple[float, float], busy_processes: int) -> list[CrowdedRound]:
    workdir.mkdir()
    script = WORKLOADS / "known_split.py"
    results = []
    with ProfilesSink(keep_requests=False) as sink:
        config = _config(workdir, sink)
        for index in range(rounds):
            idle_agent, idle_start = _start(config, workdir / "idle.log")
            children.stop(idle_agent)
            busy = [children.start(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "/usr/bin/python3", str(script), "3600"],
                                   stdout=subprocess.DEVNULL) for _ in range(busy_processes)]
            try:
                time.sleep(2.0)  # (all of them running)
                agent, crowded_start = _start(config, workdir / "crowded.log")
                launched = time.monotonic() - crowded_start
                time.sleep(max(0.0, launched + window[0] - time.monotonic()))
                cpu_before, measured_from = procfs.tree_cpu_seconds(agent.pid), time.monotonic()
                time.sleep(max(0.0, launched + window[1] - time.monotonic()))
                share = (procfs.tree_cpu_seconds(agent.pid) - cpu_before) / (time.monotonic() - measured_from)
                children.stop(agent)
            finally:
                for process in busy:
                    process.kill()
                    process.wait()
                    children.forget(process)
            results.append(CrowdedRound(crowded_start, idle_start, share, busy_processes))
            print(f"bench: crowded host, round {index + 1}/{rounds}: started in {crowded_start:.1f} s (idle host {idle_start:.1f} s), "
                  f"CPU {100 * share:.2f}% of a core {window[0]:g}-{window[1]:g} s after", file=sys.stderr)
    return results


def _start_target(ours: Summary, _peer: Summary, _ratio: Summary) -> str:
    verdict = "met" if ours.median <= START_TARGET_S else f"missed by {ours.median - START_TARGET_S:.1f} s"
    return f"≤ {START_TARGET_S:g} s: {verdict}"


def _cpu_target(ours: Summary, _peer: Summary, _ratio: Summary) -> str:
    verdict = "met" if ours.median <= 100 * CPU_TARGET else f"missed by {ours.median - 100 * CPU_TARGET:.2f}% of a core"
    return f"≤ {100 * CPU_TARGET:g}% of a core: {verdict}"


def rows(results: list[CrowdedRound], window: tuple[float, float]) -> list[Row]:
    if not results:
        return []
    return [
        Row(SECTION, f"Launch to started, s, {results[0].busy_processes} busy CPython processes on the CPUs", [r.crowded_start_s for r in results],
            "the same start, idle host", [r.idle_start_s for r in results], "{:.1f}", _start_target),
        Row(SECTION, f"CPU, % of a core, {window[0]:g}-{window[1]:g} s after the start", [100 * r.cpu_share for r in results], "", [], "{:.2f}", _cpu_target),
    ]

